"""Restarts in place: which failure of a gang's round starts the next round, and what is said.

Pure: a function of the rounds' root causes (failures.Failure). A round is one run of every
rank of the gang; a restart stops every rank and starts each again as a fresh process on the
same machines, within the same Metaflow attempt (gang.Leader). Only a failure of the ranks'
own making is restarted: a lost or missing node, a preemption or the gang's own machinery
cannot be fixed by starting the same processes again on the same machines, and is left to
the attempt (@retry).
"""

from typing import List, Optional

from .failures import Failure, FailureKind

# Failures a fresh set of processes on the same machines may not meet again.
RESTARTABLE = frozenset({FailureKind.EXCEPTION, FailureKind.EXIT, FailureKind.SIGNAL,
                         FailureKind.HUNG, FailureKind.UNFINISHED})


# Why a round is not restarted when a SIGTERM reached the task as it stopped.
TERMINATED = ("Not restarted in place: a SIGTERM reached the task while the failed round "
              "stopped (a scheduler's stop, a spot reclaim: the machine may be going away), so "
              "the attempt fails (@retry starts a new one).")


def node_terminated(node: int) -> str:
    """Why a round is not restarted when a SIGTERM reached another node's agent as it stopped."""
    return ("Not restarted in place: a SIGTERM reached node %d while the failed round stopped "
            "(a scheduler's stop, a spot reclaim: its machine may be going away), so the "
            "attempt fails (@retry starts a new one)." % node)


def nodes_not_stopped(nodes: List[int], waited: float, gone: bool) -> str:
    """Why a round is not restarted when other nodes did not say their ranks stopped: their
    agents ended (`gone`), or said nothing within `waited` seconds."""
    which = "node %d" % nodes[0] if len(nodes) == 1 else \
        "nodes %s" % ", ".join(str(n) for n in nodes)
    what = "ended" if gone else "did not say within %ss that %s ranks of the failed round " \
        "stopped" % (_num(waited), "its" if len(nodes) == 1 else "their")
    return ("Not restarted in place: the agent of %s %s, so %s lost, and a restart in place "
            "needs every node: the attempt fails (@retry starts a new one)."
            % (which, what, "it is" if len(nodes) == 1 else "they are"))


def _num(seconds: float) -> str:
    return "%g" % seconds


def same_error(earlier: Failure, later: Failure) -> bool:
    """True when `later` is the error `earlier` was: the same rank raised the same exception
    type with the same message (a deterministic bug, which a restart only repeats)."""
    return (earlier.kind is FailureKind.EXCEPTION and later.kind is FailureKind.EXCEPTION
            and earlier.rank == later.rank and earlier.message == later.message)


def why_not_restart(root: Failure, earlier: List[Failure], max_restarts: int) -> Optional[str]:
    """None when the round that failed with `root` is restarted in place, else why not (a
    sentence; "" when restarts are off). `earlier` holds the root causes of the rounds
    restarted before it."""
    if max_restarts <= 0:
        return ""
    if root.kind not in RESTARTABLE:
        return ("A failure of this kind (%s) is not restarted in place: the same machines "
                "cannot fix it, so the attempt fails (@retry starts a new one)." % root.kind)
    if earlier and same_error(earlier[-1], root):
        return ("Restarts stopped early: %s raised the same error in rounds %d and %d, a "
                "deterministic failure that a restart would only repeat."
                % (root.where(), len(earlier) - 1, len(earlier)))
    if len(earlier) >= max_restarts:
        return "Restarts exhausted: the gang was restarted in place %s (max_restarts=%d)." \
            % ("once" if len(earlier) == 1 else "%d times" % len(earlier), max_restarts)
    return None


def restart_line(step_name: str, restart: int, max_restarts: int, root: Failure) -> str:
    """What the task's log says as it restarts the gang."""
    return ("@torch_distributed on step *%s*: restart %d of %d after %s %s; every rank is "
            "started again" % (step_name, restart, max_restarts, _place(root), root.brief()))


def rounds_note(earlier: List[Failure]) -> str:
    """One clause per restarted round, for the attempt's error."""
    if not earlier:
        return ""
    return "Earlier rounds of this attempt (restarted in place): %s." % "; ".join(
        "round %d: %s %s" % (n, _place(f), f.brief()) for n, f in enumerate(earlier))


def _place(failure: Failure) -> str:
    if failure.rank is None:
        return "node %d" % failure.node
    return "rank %d (node %d)" % (failure.rank, failure.node)
