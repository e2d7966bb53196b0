"""Running a gang: node 0's leader (in the Metaflow task, which runs no user code), the node
agents of the other nodes, each node's ranks, and what rank 0 hands back to the task."""

from .agent import Agent
from .leader import Leader, users_own
from .rank import HandBack, run_exec_rank

__all__ = ["Agent", "HandBack", "Leader", "run_exec_rank", "users_own"]
