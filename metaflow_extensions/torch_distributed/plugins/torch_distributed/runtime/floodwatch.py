"""Node 0's watch on the size of the gang's store (issue 37).

torch's TCPStore takes any number of keys, and values of any size, from whoever reaches its
port, and keeps them in the memory of the process that hosts it: node 0's task. A process
outside the gang could so grow node 0 until the OOM killer ends it, and the report would blame
the user's step. Node 0 therefore fails the gang, with "the store was flooded", once

- the store holds more keys than a gang ever writes: MAX_KEYS_BASE + MAX_KEYS_PER_RANK for
  each rank. A gang writes far fewer: torch's rendezvous writes a few keys a rank for each
  process group (an address record, barrier counters, NCCL's unique id), and the package a
  dozen a node and a few a rank each round (check-ins, heartbeats, progress, done, failure
  reports), gathered values and log chunks only while they are in flight (node 0 deletes each
  once taken). Measured: a local gang of 4 nodes x 4 ranks with 9 process groups (the world,
  one per node, one per local rank across nodes) and a gather holds 61 keys, about 4 a rank;
  torch's keys of a round are deleted when the next round starts (restarts in place);
- or node 0's task grew by more than MAX_GROWTH_MB since the gang started (its resident set,
  read from /proc/self/statm: where that is missing, only keys are counted). Node 0's task runs
  no user code (every rank is a process of its own), so its memory grows with the store's
  values, and the package's own values are small (gather is for small values).

Both limits can be set in the environment of node 0's task (STORE_MAX_KEYS_ENV,
STORE_MAX_MB_ENV), e.g. for a gang that gathers large values. Counting keys is one request to
the store (num_keys), done once a second; reading the resident set is one small file read.
"""

import os
from typing import Callable, Mapping, Optional

MAX_KEYS_BASE = 50_000
MAX_KEYS_PER_RANK = 500
MAX_GROWTH_MB = 1024
STORE_MAX_KEYS_ENV = "METAFLOW_TORCH_DISTRIBUTED_STORE_MAX_KEYS"
STORE_MAX_MB_ENV = "METAFLOW_TORCH_DISTRIBUTED_STORE_MAX_MB"
MIB = 1 << 20


def max_keys(world_size: int, env: Mapping[str, str] = os.environ) -> int:
    """The most keys a gang of `world_size` ranks may hold in its store."""
    configured = env.get(STORE_MAX_KEYS_ENV)
    return int(configured) if configured else MAX_KEYS_BASE + MAX_KEYS_PER_RANK * world_size


def max_growth_mb(env: Mapping[str, str] = os.environ) -> int:
    """How many MiB node 0's task may grow by while its gang runs."""
    configured = env.get(STORE_MAX_MB_ENV)
    return int(configured) if configured else MAX_GROWTH_MB


def resident_bytes(statm: str = "/proc/self/statm") -> Optional[int]:
    """This process's resident set in bytes, or None where /proc is missing (macOS)."""
    try:
        with open(statm) as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class FloodWatch:
    """Whether the store, counted by `num_keys()`, and this process, by `rss()`, stay within
    the limits for a gang of `world_size` ranks (check). `rss` is read first when made: growth
    counts from then."""

    def __init__(self, num_keys: Callable[[], int], world_size: int,
                 rss: Callable[[], Optional[int]] = resident_bytes,
                 env: Mapping[str, str] = os.environ) -> None:
        self.num_keys = num_keys
        self.rss = rss
        self.max_keys = max_keys(world_size, env)
        self.max_growth = max_growth_mb(env) * MIB
        self.baseline = rss()

    def check(self) -> Optional[str]:
        """What overflowed, or None."""
        keys = self.num_keys()
        if keys > self.max_keys:
            return ("it holds %d keys, more than the %d any gang of this size writes (%s)"
                    % (keys, self.max_keys, STORE_MAX_KEYS_ENV))
        now = self.rss()
        if self.baseline is not None and now is not None and (
                now - self.baseline > self.max_growth):
            return ("node 0's task, which hosts it, grew by %d MiB since the gang started "
                    "(%d keys), more than the %d MiB it may (%s)"
                    % ((now - self.baseline) // MIB, keys, self.max_growth // MIB,
                       STORE_MAX_MB_ENV))
        return None

    @staticmethod
    def message(what: str) -> str:
        """The failure's text, given what check said."""
        return ("hosts the gang's rendezvous store, and the store was flooded: %s. A process "
                "outside the gang writes keys to the store at MASTER_ADDR:MASTER_PORT (on a "
                "shared host, another user's process; remotely, whatever the network lets reach "
                "the port), and node 0 would run out of memory: the gang is failed first. Keep "
                "the port to the gang's own nodes (docs/security.md)" % what)
