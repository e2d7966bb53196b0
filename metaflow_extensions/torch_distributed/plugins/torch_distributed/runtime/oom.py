"""Evidence, not guesses, for a SIGKILL: was it the kernel's OOM killer?

A rank killed by SIGKILL may have been ended by the OOM killer, a `kill -9`, or its container's
end. The kernel counts its OOM kills per memory cgroup: `oom_kill` in `memory.events` (cgroup v2)
or in `memory.oom_control` (cgroup v1). A node's watch reads the count of the cgroup its process
is in (a container's, a pod's, a Batch job's) when it starts, and again when a rank of its node
is found killed by SIGKILL: a count that went up is the OOM killer's doing, and the failure says
so. Where the count cannot be read (no cgroup, macOS), nothing is claimed.
"""

import os
from typing import Optional

CGROUP_ROOT = "/sys/fs/cgroup"


def memory_cgroup(proc_cgroup: str = "/proc/self/cgroup",
                  root: str = CGROUP_ROOT) -> Optional[str]:
    """The directory of this process's memory cgroup, or None."""
    try:
        with open(proc_cgroup) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    for line in lines:  # "hierarchy-id:controllers:path"
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # cgroup v1's memory hierarchy
            return _existing(os.path.join(root, "memory"), path)
    for line in lines:
        hierarchy, controllers, path = line.split(":", 2)
        if hierarchy == "0" and controllers == "":  # cgroup v2's unified hierarchy
            return _existing(root, path)
    return None


def _existing(mount: str, path: str) -> Optional[str]:
    # inside a cgroup namespace the path may be shown from the namespace's root: then the
    # mount point itself is this process's cgroup
    for candidate in (os.path.join(mount, path.lstrip("/")), mount):
        if os.path.exists(os.path.join(candidate, "memory.events")) or \
                os.path.exists(os.path.join(candidate, "memory.oom_control")):
            return candidate
    return None


def oom_kills(cgroup: Optional[str]) -> Optional[int]:
    """The cgroup's count of OOM kills, or None when it cannot be read."""
    if cgroup is None:
        return None
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(cgroup, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return None


class OomWatch:
    """The OOM kills of this node's cgroup since the watch began."""

    def __init__(self, cgroup: Optional[str] = None) -> None:
        self.cgroup = memory_cgroup() if cgroup is None else cgroup
        self.baseline = oom_kills(self.cgroup)

    def evidence(self) -> Optional[str]:
        """A sentence when the kernel's OOM killer ended a process of this cgroup since the
        start (the count went up), else None."""
        now = oom_kills(self.cgroup)
        if self.baseline is None or now is None or now <= self.baseline:
            return None
        return ("the kernel's OOM killer: the memory cgroup's oom_kill count went from %d to "
                "%d while the gang ran (%s)" % (self.baseline, now, self.cgroup))
