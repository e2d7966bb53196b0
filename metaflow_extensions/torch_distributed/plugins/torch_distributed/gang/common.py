"""What the leader, the agents and the ranks share: a line to the task's log, best-effort
questions to node 0's store while a gang stops (it may already be gone), and the wait for
every node's check before the step's code runs."""

import sys
import time
from typing import Any, Callable

# Seconds node 0 waits, once a round failed, for every other node to say that its ranks
# stopped before it restarts the gang in place; a node silent for longer is lost. An agent
# waits this long, beyond the rendezvous timeout, for node 0's word after a round.
NODES_STOP_WAIT = 30.0
# Seconds between two looks of a process that waits for every node's check (wait_for_nodes).
CHECK_POLL = 0.05


def wait_for_nodes(control: Any, nodes: int, timeout: float,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> bool:
    """(A gang of `nodes` nodes, before its first round's ranks run the step's code.) True
    once every node but node 0 said that what it runs with matches node 0's
    (ControlPlane.report_checked); False once node 0 aborted the gang (a node that differs
    reported its refusal, or one never came), or after `timeout` s. Reads the flags again
    only when a news token changed, or once a second."""
    pending = set(range(1, nodes))
    deadline, seen, looked = clock() + timeout, None, 0.0
    while True:
        news = (control.nodes_news(), control.leader_news())
        if news != seen or clock() - looked >= 1.0:
            seen, looked = news, clock()
            pending = {n for n in pending if not control.checked(n)}
            if not pending:
                return True
            if control.aborted():
                return False
        if clock() >= deadline:
            return False
        sleep(CHECK_POLL)


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
