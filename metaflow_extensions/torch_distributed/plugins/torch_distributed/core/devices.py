"""Which accelerator a gang's ranks use, and which GPUs each node sees: pure functions of what
the step asked for and what the machine shows (no CUDA initialised, nothing written)."""

import math
import os
import sys
from typing import Any, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core.envcontract import node_gpu_block, parse_visible_devices
from ..core.errors import TorchDistributedConfigError, TorchDistributedEnvironmentError
from ..core.topology import Topology

# Decorators that may say how many GPUs each node has, in the order Metaflow honours them.
GPU_DECORATORS = ("resources", "batch", "kubernetes", "torch_slurm")


def visible_gpu_ids(environ: Optional[Mapping[str, str]] = None,
                    proc_root: str = "/proc/driver/nvidia/gpus") -> List[str]:
    """GPU ids this process may use, found without initialising CUDA (so forking stays safe)."""
    environ = os.environ if environ is None else environ
    try:
        count = len(os.listdir(proc_root))
    except OSError:
        count = 0
    if count == 0:
        return []
    return parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"), count)


def _count(step_name: str, decorator: str, attribute: str, value: Any, kind: Any = int) -> Any:
    """@decorator's `attribute` as a number of `kind`; a value that is none is the step's
    configuration error, raised where the flow is validated (not Metaflow's Internal error)."""
    try:
        return kind(float(value))
    except (TypeError, ValueError):
        raise TorchDistributedConfigError(
            step_name, "@%s(%s=%r) is not a number, and @torch_distributed plans the gang from it. "
            "Give a number, e.g. @%s(%s=2)." % (decorator, attribute, value, decorator,
                                                attribute)) from None


def requested_gpus(decorators: Sequence[Any],
                   step_name: str = "") -> Tuple[Optional[int], Optional[str]]:
    """(GPUs per node, "@deco(gpu=N)") of the step's decorators that ask for the most GPUs,
    or (None, None)."""
    best: Optional[int] = None
    source: Optional[str] = None
    for deco in decorators:
        if deco.name in GPU_DECORATORS:
            value = deco.attributes.get("gpu")
            if value not in (None, 0, "0", ""):
                gpus = _count(step_name, deco.name, "gpu", value)
                if best is None or gpus > best:
                    best, source = gpus, "@%s(gpu=%d)" % (deco.name, gpus)
    return best, source


def node_cpus(decorators: Sequence[Any], remote: bool,
              affinity: Optional[Collection[int]] = None,
              step_name: str = "") -> Tuple[int, str]:
    """(CPUs of one node, where that came from), for nproc_per_node="auto" without GPUs. On a
    remote backend, the most `cpu=` that @resources, @batch or @kubernetes give the step
    (Metaflow's default of 1 when none does): the node's size, known when the flow is launched.
    Locally, the CPUs this process may use (usable_cpus)."""
    if remote:
        best, source = 1, "Metaflow's default of cpu=1 per node"
        for deco in decorators:
            value = deco.attributes.get("cpu") if deco.name in GPU_DECORATORS else None
            if value not in (None, ""):
                cpus = max(1, int(_count(step_name, deco.name, "cpu", value, float)))
                if cpus > best or source.startswith("Metaflow"):
                    best, source = cpus, "@%s(cpu=%s)" % (deco.name, value)
        return best, source
    return usable_cpus(affinity)


def usable_cpus(affinity: Optional[Collection[int]] = None, proc_dir: str = "/proc/self",
                root: str = "/") -> Tuple[int, str]:
    """(CPUs this process may use, how that was found): the CPUs it may run on (its affinity,
    as torchrun counts them: a cpuset, taskset, Slurm's cores), bounded by the CPU quota of its
    cgroup or any parent of it (a pod's CPU limit, `docker run --cpus`), rounded up.
    os.cpu_count() sees neither: in a pod limited to 4 CPUs on a 64-CPU machine it says 64."""
    count = len(affinity) if affinity is not None else (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    quota = cgroup_cpu_quota(proc_dir, root)
    if quota is not None and math.ceil(quota) < count:
        limited = max(1, math.ceil(quota))
        return limited, "%d CPU%s (this machine's cgroup CPU limit of %g, of the %d CPUs " \
            "it may run on)" % (limited, "" if limited == 1 else "s", quota, count)
    return count, "%d CPUs of this machine" % count


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _cgroup_dirs(proc_dir: str, root: str) -> List[Tuple[str, str, str]]:
    """("v1" or "v2", the hierarchy's mount point, the folder of this process's own cgroup in
    it) for each mounted hierarchy that may hold a CPU quota, from /proc/<pid>/cgroup and
    /proc/<pid>/mountinfo (a container sees its own cgroup as the root of the mount)."""
    paths: Dict[str, str] = {}  # "v2" or "v1" -> the cgroup's path within its hierarchy
    for line in (_read(os.path.join(proc_dir, "cgroup")) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths["v2"] = parts[2]
        elif "cpu" in parts[1].split(","):
            paths["v1"] = parts[2]
    found = []
    for line in (_read(os.path.join(proc_dir, "mountinfo")) or "").splitlines():
        left, _, right = line.partition(" - ")
        fields, fs = left.split(), right.split()
        if len(fields) < 5 or len(fs) < 3:
            continue
        mount_root, mount_point = fields[3], fields[4]
        if fs[0] == "cgroup2":
            kind = "v2"
        elif fs[0] == "cgroup" and "cpu" in fs[2].split(","):
            kind = "v1"
        else:
            continue
        path = paths.get(kind)
        if path is None or not (path + "/").startswith(mount_root.rstrip("/") + "/"):
            continue
        inside = os.path.relpath(path, mount_root)
        top = os.path.join(root, mount_point.lstrip("/"))
        found.append((kind, top, os.path.normpath(os.path.join(top, inside))))
    return found


def cgroup_cpu_quota(proc_dir: str = "/proc/self", root: str = "/") -> Optional[float]:
    """The tightest CPU quota, in CPUs, of this process's cgroup and its parents (cgroup v2's
    cpu.max, v1's cpu.cfs_quota_us over cpu.cfs_period_us), or None where none is set or none
    can be read."""
    tightest: Optional[float] = None
    for kind, top, folder in _cgroup_dirs(proc_dir, root):
        while True:
            if kind == "v2":
                words = (_read(os.path.join(folder, "cpu.max")) or "max").split()
                quota, period = (words + ["100000"])[:2]
            else:
                quota = (_read(os.path.join(folder, "cpu.cfs_quota_us")) or "-1").strip()
                period = (_read(os.path.join(folder, "cpu.cfs_period_us")) or "100000").strip()
            try:
                cpus = int(quota) / int(period) if quota not in ("max", "-1") else None
            except (ValueError, ZeroDivisionError):
                cpus = None
            if cpus is not None and cpus > 0 and (tightest is None or cpus < tightest):
                tightest = cpus
            if len(folder) <= len(top):
                break
            folder = os.path.dirname(folder)
    return tightest


def accelerator(step_name: str, topology: Topology, needed: int, where: str,
                visible: Sequence[str], rehearsal: bool, gpus_requested: Optional[str]) -> str:
    """"cuda" when `where` shows a GPU for each of its `needed` ranks, else "cpu"; raises when
    GPUs were asked for (`gpus_requested`, e.g. "@resources(gpu=4)") but are not all there, or
    when some GPUs are visible but too few to give each rank its own. A CPU `rehearsal` of a
    GPU topology is always "cpu"."""
    if rehearsal:
        return "cpu"
    if visible and len(visible) >= needed:
        return "cuda"
    if gpus_requested:
        raise TorchDistributedEnvironmentError(
            step_name,
            "the gang needs %d GPUs on %s (%s, from %s) but it shows %d. Run it where "
            "the GPUs are (e.g. --with batch), or rehearse it on CPU with gloo: "
            "METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1 python flow.py run"
            % (needed, where, topology.describe(), gpus_requested, len(visible)))
    if visible:
        raise TorchDistributedEnvironmentError(
            step_name,
            "%s shows %d GPUs, fewer than the %d ranks it would run (%s), so they cannot "
            "have one GPU each. Ask for at most %d processes per GPU machine (e.g. "
            "nproc_per_node=%d, or @resources(gpu=%d) and nodes), or run the gang on CPU "
            "on purpose: METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1."
            % (where, len(visible), needed, topology.describe(), len(visible),
               len(visible), len(visible)))
    return "cpu"


def local_devices(step_name: str, topology: Topology, visible: Sequence[str], rehearsal: bool,
                  gpus_requested: Optional[str]) -> Tuple[str, Dict[int, Optional[str]]]:
    """(accelerator, {node: CUDA_VISIBLE_DEVICES}) for a gang whose nodes share this host. A
    CPU gang on a GPU machine (a rehearsal) hides the GPUs, or torch would pick NCCL for
    init_process_group() with no backend."""
    chosen = accelerator(step_name, topology, topology.world_size, "this machine", visible,
                         rehearsal, gpus_requested)
    if chosen == "cpu":
        return "cpu", ({n: "" for n in range(topology.nodes)} if visible else {})
    return "cuda", {n: node_gpu_block(n, topology.nproc_per_node, visible, topology.nodes)
                    for n in range(topology.nodes)}


def node_devices(step_name: str, topology: Topology, visible: Sequence[str], rehearsal: bool,
                 gpus_requested: Optional[str]) -> Tuple[str, bool]:
    """(accelerator, whether to hide this node's GPUs) for one node of a gang whose nodes are
    separate machines; hiding them is the caller's (as in local_devices)."""
    chosen = accelerator(step_name, topology, topology.nproc_per_node, "this node", visible,
                         rehearsal, gpus_requested)
    return chosen, chosen == "cpu" and bool(visible)


def resolve_start_method(method: str, platform: Optional[str] = None,
                         modules: Optional[Mapping[str, Any]] = None) -> str:
    """The start method `auto` stands for here: fork on Linux while CUDA is untouched in this
    process (a forked child cannot use a CUDA context its parent created), else exec."""
    if method != "auto":
        return method
    platform = sys.platform if platform is None else platform
    if not platform.startswith("linux"):
        return "exec"
    torch = (sys.modules if modules is None else modules).get("torch")
    if torch is not None and bool(torch.cuda.is_initialized()):
        return "exec"
    return "fork"
