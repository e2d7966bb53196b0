"""What a gang asks of node 0's process: the open files its store serves. Pure arithmetic;
runtime/control.py reads and raises the limit.

Every rank (torch's rendezvous, with the agent's store) and every node agent (its control
plane, its log shipper, its checkpoint lookup) holds a connection to node 0's store, and node
0's task holds its own ranks' pipes: with the common soft limit of 1,024 open files, a gang of
about 120 nodes of 8 would leave some connections refused (bench/scale_fdlimit.py).
"""

from typing import Optional

from .topology import Topology

# Open files of node 0's task besides the gang's: Metaflow's, Python's, torch's, the logs.
BASE_FILES = 256
# Connections each node agent holds to node 0's store, at most.
AGENT_CONNECTIONS = 4
# Files node 0 holds for each of its own ranks: its pipes (restarts in place keep both ends).
LOCAL_RANK_FILES = 6


def files_needed(topology: Topology) -> int:
    """Open files node 0's task may hold for a gang of `topology`."""
    others = topology.nodes - 1
    return (BASE_FILES + topology.world_size + AGENT_CONNECTIONS * others
            + LOCAL_RANK_FILES * topology.nproc_per_node)


def soft_limit_for(needed: int, soft: int, hard: int) -> Optional[int]:
    """The soft limit to set so that `needed` files fit (None: `soft` does already), or
    ValueError when even the hard limit is too low. A hard limit of -1 is unlimited."""
    if soft == -1 or soft >= needed:
        return None
    if hard != -1 and hard < needed:
        raise ValueError("needs %d open files and the hard limit is %d" % (needed, hard))
    return needed if hard == -1 else max(needed, min(hard, 4 * needed))
