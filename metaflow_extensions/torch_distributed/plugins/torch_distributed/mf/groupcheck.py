"""Did every rank's framework join the gang? The checks around one rank's step body.

The environment of envcontract.py makes torch, Lightning, Fabric, Accelerate and the HF Trainer
form the gang's process group with no arguments. A few choices in user code defeat it without
any error from the framework: a subclass of Lightning's Trainer reads PL_<SUBCLASS>_* instead of
PL_TRAINER_*, and code that never calls init_process_group (or runs Accelerate with
ACCELERATE_USE_CPU=false) runs alone. Every rank then trains by itself on the full data.

`run_body` runs a rank's step body while recording the process groups the rank joins through
torch's rendezvous (env://, tcp://, file://, whatever the caller imported), then reports a rank
of a gang that never joined a group of the gang's size: an error by default, a warning or
nothing as METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK says. It also turns Lightning's own error for
explicit `devices=`/`num_nodes=` that contradict the gang into one that names the fix, and
refuses a Lightning strategy that starts processes of its own (`LauncherGuard`) before they start.
`diagnose` and `explain_error` are pure; docs/frameworks/ documents every message.
"""

import importlib
import os
import re
import sys
from types import ModuleType
from typing import (Any, Callable, Dict, Iterator, List, Literal, Mapping, Optional, Sequence,
                    Tuple)

from ..core.errors import TorchDistributedConfigError, TorchDistributedFrameworkError
from ..core.topology import Topology

CHECK_ENV = "METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK"
CHECK_MODES = ("error", "warn", "off")

# A rendezvous handler of torch (torch.distributed.rendezvous): for a URL, the (store, rank,
# world size) it forms.
_Handler = Callable[..., Iterator[Tuple[Any, int, int]]]

# Modules whose presence in a rank says that the step used Lightning (Trainer or Fabric).
_LIGHTNING = ("lightning.pytorch", "pytorch_lightning", "lightning.fabric", "lightning_fabric")

# lightning/pytorch/plugins/environments/torchelastic.py, validate_settings (2.x)
_LIGHTNING_MISMATCH = re.compile(
    r"You set `devices=(?P<devices>[^`]+)` and `num_nodes=(?P<num_nodes>[^`]+)` in Lightning, "
    r"but the product .* does not match the world size \((?P<world>\d+)\)")


def check_mode(step_name: str, environ: Mapping[str, str], default_mode: str = "error") -> str:
    """The group check's mode from METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK, else `default_mode`:
    "error" where the user wrote the decorator, "warn" where --with put it on the step."""
    raw: Optional[str] = environ.get(CHECK_ENV)
    if raw is None:  # Metaflow's configuration (a config profile), else the default
        from metaflow.metaflow_config import TORCH_DISTRIBUTED_GROUP_CHECK

        raw = TORCH_DISTRIBUTED_GROUP_CHECK
    mode = str(raw if raw is not None else "").strip().lower() or default_mode
    if mode not in CHECK_MODES:
        raise TorchDistributedConfigError(
            step_name, "%s=%r is not one of %s. Unset it, or set it to warn or off for steps "
            "whose ranks are meant to work without a process group."
            % (CHECK_ENV, raw, ", ".join(CHECK_MODES)))
    return mode


def run_body(step_func: Callable[..., object], args: Sequence[object], step_name: str,
             topology: Topology, environ: Optional[Mapping[str, str]] = None,
             default_mode: str = "error",
             on_join: Optional[Callable[[int], None]] = None) -> None:
    """Run one rank's step body `step_func(*args)` and check that it joined the gang.
    `on_join(world_size)` is called as the rank enters the rendezvous of a process group."""
    environ = os.environ if environ is None else environ
    if topology.world_size == 1:
        step_func(*args)
        return None
    mode = check_mode(step_name, environ, default_mode)
    with GroupWatch(enabled=mode != "off" or on_join is not None, on_join=on_join) as watch, \
            LauncherGuard(step_name, topology):
        try:
            step_func(*args)
        except ValueError as ex:
            hint = explain_error(str(ex), topology)
            if hint is None:
                raise
            raise TorchDistributedFrameworkError(step_name, hint) from ex
        if mode == "off":
            return None
        rank = int(environ.get("RANK", "0"))
        problem = diagnose(rank, topology, watch.group_sizes(), loaded_frameworks(sys.modules),
                           lightning_trainer_subclasses(sys.modules),
                           accelerate_processes(sys.modules))
    if problem is None:
        return None
    if mode == "error":
        raise TorchDistributedFrameworkError(step_name, problem + _opt_out())
    print("@torch_distributed on step *%s*: WARNING: %s" % (step_name, problem),
          file=sys.stderr, flush=True)
    return None


class GroupWatch:
    """Records the world size of every process group this process joins through torch's
    rendezvous while the `with` block runs.

    torch looks its rendezvous handlers up by URL scheme at every init_process_group call
    (torch/distributed/rendezvous.py), so wrapping them sees every group formed by
    init_process_group, however the caller imported it; a group created with an explicit
    `store=` skips the rendezvous and is seen only while it is still initialised at the end.
    """

    def __init__(self, enabled: bool = True,
                 on_join: Optional[Callable[[int], None]] = None) -> None:
        self.enabled = enabled
        self.on_join = on_join
        self.joined: List[int] = []
        # torch's handlers by URL scheme, and the ones found there before the watch
        self._handlers: Optional[Dict[str, _Handler]] = None
        self._originals: Dict[str, _Handler] = {}

    def __enter__(self) -> "GroupWatch":
        global _active_watch
        _active_watch = self
        if not self.enabled or not _distributed_available():
            return self
        # the module, not the function torch.distributed re-exports under the same name
        rendezvous = importlib.import_module("torch.distributed.rendezvous")
        self._handlers = rendezvous._rendezvous_handlers
        self._originals = dict(self._handlers)
        for scheme, handler in self._originals.items():
            self._handlers[scheme] = self._watching(handler)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        global _active_watch
        _active_watch = None
        if self._handlers is not None:
            self._handlers.update(self._originals)
        return False

    def note_join(self, world_size: int) -> None:
        """A group of `world_size` processes was joined (here, or by a child: joined_in_child)."""
        if self.on_join is not None:
            self.on_join(world_size)
        self.joined.append(world_size)

    def _watching(self, handler: _Handler) -> _Handler:
        def watched(url: str, **kwargs: Any) -> Iterator[Tuple[Any, int, int]]:
            for store, rank, world_size in handler(url, **kwargs):
                self.note_join(world_size)
                yield store, rank, world_size

        return watched

    def group_sizes(self) -> List[int]:
        """World sizes of the groups joined, and of the default group still initialised."""
        sizes = list(self.joined)
        if _distributed_available():
            import torch.distributed as dist

            if dist.is_initialized():
                sizes.append(dist.get_world_size())
        return sizes


class LauncherGuard:
    """Refuses, while the `with` block runs, Lightning's (Trainer's or Fabric's) start of
    processes of its own: strategy="ddp_spawn", "ddp_fork" or "ddp_notebook" start `devices`
    children in every rank of the gang, which would all train again on top of the gang (and
    with "ddp_spawn", a LightningModule defined in the step cannot even be pickled to them).

    Lightning's _MultiProcessingLauncher starts them with torch.multiprocessing.start_processes,
    looked up on the module at each launch; the guard replaces it there and raises, before any
    child starts, when the function to start is that launcher's. Every other caller (the
    user's own torch.multiprocessing.spawn included) goes through unchanged.
    """

    def __init__(self, step_name: str, topology: Topology) -> None:
        self.step_name = step_name
        self.topology = topology
        self._module: Optional[ModuleType] = None
        self._original: Optional[Callable[..., Any]] = None

    def __enter__(self) -> "LauncherGuard":
        if not _distributed_available():
            return self
        self._module = importlib.import_module("torch.multiprocessing")
        self._original = self._module.start_processes
        setattr(self._module, "start_processes", self._guarded)
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        if self._module is not None:
            setattr(self._module, "start_processes", self._original)
        return False

    def _guarded(self, fn: Callable[..., object], *args: Any, **kwargs: Any) -> Any:
        launcher = getattr(fn, "__self__", None)
        if _is_lightning_launcher(launcher):
            # Lightning passes both; without one, torch's start_processes would spawn
            raise TorchDistributedFrameworkError(self.step_name, spawn_message(
                kwargs.get("start_method", "spawn"), kwargs.get("nprocs"), self.topology))
        original = self._original
        assert original is not None  # installed by __enter__, which keeps the original
        return original(fn, *args, **kwargs)


def _is_lightning_launcher(obj: object) -> bool:
    cls = type(obj)
    return cls.__name__ == "_MultiProcessingLauncher" and cls.__module__.split(".")[0] in (
        "lightning", "pytorch_lightning", "lightning_fabric")


# Lightning's strategy names for each start method of its multiprocessing launcher.
_SPAWN_STRATEGIES = {"spawn": '"ddp_spawn"', "fork": '"ddp_fork" or "ddp_notebook"'}


def spawn_message(start_method: str, nprocs: Optional[int], topology: Topology) -> str:
    """What to do about Lightning starting processes of its own in a rank. Pure."""
    named = _SPAWN_STRATEGIES.get(start_method)
    strategy = ("strategy=%s" % named if named
                else 'a strategy with start_method="%s"' % start_method)
    return (
        "Lightning was given %s, which starts %s process%s of its own in every rank (with "
        "torch.multiprocessing, start method %s): each rank of the gang's %s would train again "
        "in them. The gang's ranks already are the processes Lightning needs: remove strategy= "
        "from Trainer(...) (or Fabric(...)), or pass strategy=\"ddp\". Stopped before any of "
        "them started."
        % (strategy, nprocs if nprocs is not None else "more",
           "" if nprocs == 1 else "es", start_method, topology.describe()))


# The GroupWatch of the rank body running in this process, if any.
_active_watch: Optional[GroupWatch] = None


def joined_in_child(world_size: int) -> None:
    """A child of this rank (a script run with run_script) joined a group of `world_size`
    processes and ended well: the rank counts as having joined it."""
    if _active_watch is not None:
        _active_watch.note_join(world_size)


def _distributed_available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return dist.is_available()


def loaded_frameworks(modules: Mapping[str, ModuleType]) -> List[str]:
    """Which of Lightning, Accelerate (the HF Trainer included) and fastai this process used,
    judged from `modules` (sys.modules). Lightning imports parts of transformers, so Accelerate
    counts only once it has set up its state (Accelerator(), TrainingArguments)."""
    found = []
    if any(name in modules for name in _LIGHTNING):
        found.append("lightning")
    state = modules.get("accelerate.state")
    if state is not None and getattr(getattr(state, "PartialState", None), "_shared_state", None):
        found.append("accelerate")
    if "fastai.learner" in modules:
        found.append("fastai")
    return found


def accelerate_processes(modules: Mapping[str, ModuleType]) -> Optional[int]:
    """The number of processes Accelerate's state says it trains with, or None before any
    Accelerator() or TrainingArguments was built. It can be 1 in a group of the gang's size:
    with LOCAL_RANK set and ACCELERATE_USE_CPU off, Accelerate initialises the default group on
    CPU and then runs the process alone (DistributedType.NO)."""
    state = modules.get("accelerate.state")
    shared = getattr(getattr(state, "PartialState", None), "_shared_state", None)
    return shared.get("num_processes") if shared else None


def lightning_trainer_subclasses(modules: Mapping[str, ModuleType]) -> List[str]:
    """Names of the subclasses of Lightning's Trainer defined in this process, sorted."""
    names = set()
    for module_name in ("lightning.pytorch", "pytorch_lightning"):
        module = modules.get(module_name)
        trainer = getattr(module, "Trainer", None)
        if trainer is None:
            continue
        pending = list(trainer.__subclasses__())
        while pending:
            cls = pending.pop()
            names.add(cls.__name__)
            pending.extend(cls.__subclasses__())
    return sorted(names)


def diagnose(rank: int, topology: Topology, group_sizes: Sequence[int],
             frameworks: Sequence[str] = (), trainer_subclasses: Sequence[str] = (),
             accelerate_processes: Optional[int] = None) -> Optional[str]:
    """What is wrong with a rank of `topology` that joined groups of `group_sizes`, or None.

    Pure. A rank is fine when it joined a group of the gang's world size, unless Accelerate
    (`accelerate_processes`, when it was used) trained with a different number of processes.
    """
    world = topology.world_size
    if accelerate_processes not in (None, world):
        group_sizes = []  # a group exists, but Accelerate trained this process alone
    if world == 1 or world in group_sizes:
        return None
    shape = topology.describe()
    if group_sizes:
        sizes = sorted(set(group_sizes))
        return (
            "rank %d joined a process group of %s process%s, not the gang's (%s): the ranks "
            "did not train together. Call init_process_group() with no world_size, rank or "
            "init_method (the gang's environment supplies them), and do not override "
            "WORLD_SIZE or RANK."
            % (rank, " and ".join(str(s) for s in sizes), "" if sizes == [1] else "es", shape))
    lines = [
        "rank %d finished the step without joining the gang's process group (%s): every rank "
        "ran the step alone, on all of the data, so rank 0's results are those of a single "
        "process. How to fix it:" % (rank, shape)]
    lines.extend("  - " + hint for hint in _hints(topology, frameworks, trainer_subclasses))
    return "\n".join(lines)


def _hints(topology: Topology, frameworks: Sequence[str],
           trainer_subclasses: Sequence[str]) -> List[str]:
    nodes, nproc = topology.nodes, topology.nproc_per_node
    hints = []
    if "lightning" in frameworks:
        for name in trainer_subclasses:
            hints.append(
                # no `*` in the text: Metaflow prints the step's error with *...* as bold
                "Lightning: %s subclasses Trainer, so it reads PL_%s_NUM_NODES and "
                "PL_%s_DEVICES, not the gang's PL_TRAINER_NUM_NODES=%d and "
                "PL_TRAINER_DEVICES=%d. Pass them: %s(..., "
                "num_nodes=current.torch_distributed.num_nodes, "
                "devices=current.torch_distributed.local_world_size)."
                % (name, name.upper(), name.upper(), nodes, nproc, name))
        if not trainer_subclasses:
            hints.append(
                "Lightning: the Trainer ended up with one device on one node "
                "(SingleDeviceStrategy). Build a plain Trainer() without num_nodes, devices or "
                "strategy; with LightningCLI leave JSONARGPARSE_DEFAULT_ENV unset (the gang sets "
                "it to true so that the CLI reads PL_FIT__TRAINER__NUM_NODES and "
                "PL_FIT__TRAINER__DEVICES).")
    if "accelerate" in frameworks:
        hints.append(
            "Accelerate / HF Trainer: on CPU they form the group only with "
            "ACCELERATE_USE_CPU=true, which the gang sets: do not set it to false, and create "
            "the Accelerator (or TrainingArguments) inside the step.")
    if "fastai" in frameworks:
        hints.append("fastai: train inside `with learn.distrib_ctx():`.")
    if not hints:
        hints.append(
            "Plain torch: call torch.distributed.init_process_group() (no arguments) in the step "
            "before the first collective, and wrap the model in DistributedDataParallel.")
    return hints


def _opt_out() -> str:
    return ("\nIf the ranks are meant to work without a process group (for example each "
            "handles its own shard and only uses current.torch_distributed.gather), set "
            "%s=warn (or off) in the step's environment, e.g. with "
            "@environment(vars={'%s': 'warn'})." % (CHECK_ENV, CHECK_ENV))


def explain_error(message: str, topology: Topology) -> Optional[str]:
    """The fix for a framework's own error about the gang's shape, or None. Pure."""
    match = _LIGHTNING_MISMATCH.search(message)
    if match is None:
        return None
    devices, num_nodes = match.group("devices"), match.group("num_nodes")
    nodes, nproc = topology.nodes, topology.nproc_per_node
    wrong = []
    if devices != str(nproc):
        wrong.append("devices=%s" % devices)
    if num_nodes != str(nodes):
        wrong.append("num_nodes=%s" % num_nodes)
    given = " and ".join(wrong) or "devices=%s, num_nodes=%s" % (devices, num_nodes)
    return (
        "Lightning's Trainer was given %s, which contradicts the gang's %s (Lightning found "
        "devices=%s and num_nodes=%s for a world size of %s). "
        "Remove %s from Trainer(...): the gang sets PL_TRAINER_NUM_NODES=%d and "
        "PL_TRAINER_DEVICES=%d, which a plain Trainer() reads. If you must pass them, pass "
        "num_nodes=current.torch_distributed.num_nodes and "
        "devices=current.torch_distributed.local_world_size."
        % (given, topology.describe(), devices, num_nodes, match.group("world"), given, nodes,
           nproc))
