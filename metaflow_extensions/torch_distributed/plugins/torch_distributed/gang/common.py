"""What the leader and the agents both say and ask while a gang stops: a line to the task's
log, and best-effort questions to node 0's store, which may already be gone."""

import sys
from typing import Any, Callable

# Seconds node 0 waits, once a round failed, for every other node to say that its ranks
# stopped before it restarts the gang in place; a node silent for longer is lost. An agent
# waits this long, beyond the rendezvous timeout, for node 0's word after a round.
NODES_STOP_WAIT = 30.0

def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def ask(fn: Callable[..., Any], *args: Any) -> Any:
    """A control-plane question while tearing down; False when the store cannot answer."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - the store may be gone; the answer only refines a report
        return False


def quietly(fn: Callable[..., object], *args: Any) -> None:
    """Best-effort control-plane calls while tearing down: the store may already be gone."""
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - teardown must go on; the root cause is reported elsewhere
        pass
