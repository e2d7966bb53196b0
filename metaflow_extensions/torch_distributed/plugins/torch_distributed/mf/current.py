"""`current.torch_distributed`: where this process sits in the gang, and `gather`."""

import threading
from datetime import timedelta
from typing import TYPE_CHECKING, Any, List, NoReturn, Optional, Union

from ..core.errors import NotInTorchDistributedStep, TorchDistributedConfigError
from ..core.topology import Topology

if TYPE_CHECKING:  # imported where they are used: a rank pays for them only if it calls them
    import torch

    from ..mf.scripts import ScriptArgs, ScriptPath
    from ..runtime.control import ControlPlane

# How long rank 0 waits in gather() for the slowest rank. A rank that dies instead is seen by
# the supervisor, which stops the gang long before this.
GATHER_TIMEOUT = timedelta(minutes=30)
# Seconds between two looks for the other ranks' values in gather().
GATHER_POLL = 0.02


class TorchDistributedInfo:
    """Where this process sits in the gang of a @torch_distributed step.

    Every value is computed by the decorator from the step's topology; the same values are in
    the rank's environment (RANK, LOCAL_RANK, WORLD_SIZE, ...), so code that reads either agrees.
    """

    def __init__(self, topology: Topology, node: int, local_rank: int, master_addr: str,
                 master_port: int, accelerator: str, gang_id: str, secret: str,
                 restart_count: int = 0) -> None:
        self._topology = topology
        self._node = node
        self._local_rank = local_rank
        self._master_addr = master_addr
        self._master_port = master_port
        self._accelerator = accelerator
        self._gang_id = gang_id
        self._secret = secret  # gather's values are sealed under the attempt's secret
        self._restart_count = restart_count
        self._control: Optional["ControlPlane"] = None
        self._gather_seq = 0

    @property
    def rank(self) -> int:
        """Global rank: node_rank * local_world_size + local_rank (RANK)."""
        return self._topology.rank(self._node, self._local_rank)

    @property
    def local_rank(self) -> int:
        """Rank within this node, 0 .. local_world_size - 1 (LOCAL_RANK)."""
        return self._local_rank

    @property
    def world_size(self) -> int:
        """Processes in the gang: num_nodes * local_world_size (WORLD_SIZE)."""
        return self._topology.world_size

    @property
    def local_world_size(self) -> int:
        """Processes on each node (LOCAL_WORLD_SIZE)."""
        return self._topology.nproc_per_node

    @property
    def node_rank(self) -> int:
        """Index of this node, 0 .. num_nodes - 1 (NODE_RANK and GROUP_RANK)."""
        return self._node

    @property
    def num_nodes(self) -> int:
        """Nodes in the gang (GROUP_WORLD_SIZE)."""
        return self._topology.nodes

    @property
    def master_addr(self) -> str:
        """Address of node 0, which hosts the rendezvous store (MASTER_ADDR)."""
        return self._master_addr

    @property
    def master_port(self) -> int:
        """Port of the rendezvous store, unique per gang attempt (MASTER_PORT)."""
        return self._master_port

    @property
    def is_main(self) -> bool:
        """True on rank 0, the process whose `self.x` become the step's artifacts."""
        return self.rank == 0

    @property
    def device(self) -> "torch.device":
        """torch.device this rank should use: cuda:LOCAL_RANK on GPU nodes, else cpu."""
        import torch

        if self._accelerator == "cuda":
            return torch.device("cuda", self._local_rank)
        return torch.device("cpu")

    @property
    def restart_count(self) -> int:
        """How many times the gang was restarted in place within this attempt before this
        round (0 in the first; TORCHELASTIC_RESTART_COUNT): with @checkpoint, the latest
        checkpoint is in current.checkpoint.directory whenever it is above 0."""
        return self._restart_count

    @property
    def preempted(self) -> threading.Event:
        """A threading.Event set once the gang is preempted (a SIGTERM to any of its nodes):
        save what must survive and return; the attempt fails as preempted after the step's
        preempt_grace, and the next attempt (@retry) starts from what was saved."""
        from ..runtime.preempt import PREEMPTED

        return PREEMPTED

    def gather(self, obj: object) -> Optional[List[Any]]:
        """Collect a small picklable `obj` from every rank onto rank 0.

        Every rank must call it, the same number of times, in the same order. Rank 0 gets the
        list of all ranks' values, indexed by rank; the other ranks get None. It goes through
        the gang's rendezvous store, so it works before, after or without init_process_group.
        """
        control = self._connect()
        seq = self._gather_seq
        self._gather_seq += 1
        control.put_gathered(seq, self.rank, obj)
        if not self.is_main:
            return None
        return control.take_gathered(seq, range(self.world_size), GATHER_TIMEOUT, GATHER_POLL)

    def run_script(self, path: "ScriptPath", args: "ScriptArgs" = None,
                   python: Optional[str] = None) -> None:
        """Run an existing torchrun-style script in this rank, e.g.
        run_script("train.py", {"epochs": 2}) or run_script("train.py", ["--epochs", "2"]).

        Call it on every rank: each runs `python path args...` (this interpreter unless
        `python` is given) with the rank's environment, so the script's init_process_group()
        joins the gang, and its output goes into the rank's log lines. A non-zero exit fails
        the step (and the gang) with TorchDistributedScriptFailed."""
        from metaflow import current

        from ..mf.scripts import run_script

        run_script(current.step_name, self.rank, self.world_size, path, args, python)

    def save_sharded(self, path: str, **options: Any) -> Any:
        """Save a sharded checkpoint: every rank must call it, each with the directory its
        shard was written to (e.g. by torch.distributed.checkpoint). Needs @checkpoint on the
        step. The shards of all ranks become one checkpoint, the task's latest once every shard
        is stored; a retry finds all of them in current.checkpoint.directory on every node.
        `options` (name, metadata) as @checkpoint's save. Rank 0 gets its reference."""
        from ..mf.checkpoints import save_sharded

        return save_sharded(self, path, options)

    def record(self, name: str, value: float) -> None:
        """Record a number for the gang's card, e.g. record("samples_per_s", 1234.5).

        Any rank may call it, as often as it likes (the last 1000 values of each name are
        kept); the card of a step with @card plots the last value of each name per rank, so a
        straggler stands out. It costs no communication: the values travel with the rank's
        other events after its body ended, and, while the gang runs, the last value of each
        name (and rank 0's values, to plot) with the rank's hang probe to the live card."""
        from ..mf import events

        try:
            value = float(value)
        except (TypeError, ValueError):
            from metaflow import current

            raise TorchDistributedConfigError(
                current.step_name, "current.torch_distributed.record(%r, %r): the value must be "
                "a number (an int or a float; for a tensor pass tensor.item())."
                % (name, value)) from None
        log = events.current_rank_log()
        if log is not None:
            log.record(name, value)

    def progress(self, step: float, total: Optional[float] = None) -> None:
        """Say how far this rank is, e.g. progress(step, total=num_steps) once per training
        step: the gang's live card shows each rank's step and step rate, and rank 0's percent
        done and time left. Call it as often as you like; it costs no communication (the hang
        probe, which samples every rank while hang detection is on, carries the last value)."""
        from metaflow import current

        def number(value: Any) -> Optional[float]:
            if isinstance(value, bool):
                return None
            try:
                number = float(value)
            except (TypeError, ValueError):
                return None
            return number if number == number and abs(number) != float("inf") else None

        done, whole = number(step), None if total is None else number(total)
        if done is None or done < 0 or (total is not None and (whole is None or whole <= 0)):
            raise TorchDistributedConfigError(
                current.step_name, "current.torch_distributed.progress(%r, total=%r): the step "
                "must be a number >= 0 and the total, if given, a number > 0 (e.g. "
                "progress(step, total=num_steps); for a tensor pass tensor.item())."
                % (step, total))
        from ..mf import events

        log = events.current_rank_log()
        if log is not None:
            log.report_progress(done, whole)

    def _connect(self) -> "ControlPlane":
        if self._control is None:
            from ..runtime.control import ControlPlane

            self._control = ControlPlane.client(self._master_addr, self._master_port,
                                                self._gang_id, self._secret, GATHER_TIMEOUT,
                                                self._restart_count)
        return self._control

    def __repr__(self) -> str:
        return "TorchDistributedInfo(rank=%d, local_rank=%d, world_size=%d, node_rank=%d)" % (
            self.rank, self.local_rank, self.world_size, self.node_rank)


class _Unavailable:
    """Stands in for current.torch_distributed outside a decorated step."""

    def __getattr__(self, name: str) -> NoReturn:
        raise NotInTorchDistributedStep()

    def __bool__(self) -> bool:
        return False


UNAVAILABLE = _Unavailable()


def install(info: Union[TorchDistributedInfo, _Unavailable]) -> None:
    """Make `info` visible as current.torch_distributed in this process (UNAVAILABLE: none)."""
    from ..mf import internals

    internals.set_current("torch_distributed", info)
