"""The gang's records: plain data, each with a JSON round-trip.

* `Blueprint`: the gang as the decorator planned it, the same for every node of every attempt.
* `AgentOrder`: what a node agent on another machine is submitted (or compiled) with. It knows
  nothing of the attempt: the agent finds its place on its node (backends.base.Backend).
* `TaskIdentity` and `Attempt`: the Metaflow task a gang belongs to, and the attempt every
  node of it shares once it runs (its id, where node 0's store is, the attempt's secret).
* `GangSpec`: what travels to a member node 0 or an agent starts (an exec'd rank, a local
  agent): the blueprint, the attempt, and the member's own place (its node, round, work dir,
  devices).
* `NodeZero`: where node 0 hosts the gang's store, as its backend placed it.
"""

import dataclasses
import json
from dataclasses import asdict, dataclass
from enum import Enum
import typing
from typing import Any, Dict, Mapping, Optional, Tuple, Type, TypeVar

# The backend whose gangs run every node on this host (Attempt.backend).
LOCAL = "local"
# Attempt.backend of a gang placed by backends/slurm.py (its nodes pin gloo's and NCCL's
# interface: gang/runner.py).
SLURM_BACKEND = "slurm"
# The environment variable that carries a GangSpec into an exec'd member.
SPEC_ENV = "METAFLOW_TORCH_DISTRIBUTED_MEMBER"
# The environment variable that carries an AgentOrder to a node agent on another machine.
ORDER_ENV = "METAFLOW_TORCH_DISTRIBUTED_AGENT_ORDER"

_T = TypeVar("_T")


class Role(str, Enum):
    """What a process of the gang is (its value is its form in JSON)."""

    LEADER = "leader"  # node 0: the Metaflow task
    AGENT = "agent"  # a node agent: runs one other node
    RANK = "rank"  # one rank started with exec

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Blueprint:
    """The gang as the decorator planned it (settings.GangSettings says what each duration
    means): the same for every node of every attempt."""

    step_name: str
    nodes: int
    nproc_per_node: int
    rendezvous_timeout_s: float
    finish_timeout_s: float
    # as set (auto, fork or exec); each node resolves it (GangSpec.start_method)
    start_method: str
    heartbeat_timeout_s: Optional[float]
    # hang detection (stacks.py): how long no collective may complete while a rank waits in
    # one; None: off. Every rank's probe samples at an interval derived from it
    hang_timeout_s: Optional[float]
    # once preempted, how long the ranks may save (preempt.py)
    preempt_grace_s: float
    # how many restarts in place an attempt may make (TORCHELASTIC_MAX_RESTARTS)
    max_restarts: int
    # the group check's mode when METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK is not set: "error"
    # where the user wrote the decorator, "warn" where it came from --with (groupcheck.py)
    group_check_default: str
    # over how many seconds node 0 names the straggler (core/stragglers.py); None: off
    straggler_window_s: Optional[float] = 120.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Blueprint":
        return _build(cls, json.loads(text))


@dataclass(frozen=True)
class TaskIdentity:
    """The Metaflow task a gang belongs to, as the spin-step command needs it."""

    run_id: str
    task_id: str
    input_paths: str
    split_index: Optional[int]
    retry_count: int
    max_user_code_retries: int
    namespace: Optional[str]
    orig_datastore: str  # "<type>@<root>"


@dataclass(frozen=True)
class Attempt:
    """One attempt of a gang, as every node of it knows it once it runs."""

    gang_id: str
    task: TaskIdentity
    # "local" (every node on this host), "batch" (the nodes of an AWS Batch multi-node job)
    # or "kubernetes" (the pods of a JobSet): backends.base.Backend.name
    backend: str
    master_addr: str
    master_port: int
    # The secret the values of the gang's store are sealed under (sealed.py); never logged,
    # never in a job or pod spec: remote nodes read it from the run's datastore
    secret: str
    top_args: Tuple[str, ...]  # the task's top-level CLI options
    # What node 0's @checkpoint resolved, for members (checkpoints.gang_fields); None without it
    checkpoint: Optional[Dict[str, Any]] = None

    @property
    def local(self) -> bool:
        """Whether every node of the gang runs on this host (the user's own machine)."""
        return self.backend == LOCAL


@dataclass(frozen=True)
class GangSpec:
    """What an exec'd member (a node agent or an exec'd rank) needs to take its place."""

    role: Role
    blueprint: Blueprint
    attempt: Attempt
    node: int
    work_dir: str
    accelerator: str  # "cpu" or "cuda", decided where the node's GPUs are seen
    start_method: str  # "fork" or "exec" (devices.resolve_start_method)
    # the gang's round within its attempt: 0, then one more on each restart in place
    # (TORCHELASTIC_RESTART_COUNT, current.torch_distributed.restart_count)
    restart_count: int = 0
    local_rank: Optional[int] = None
    cuda_visible_devices: Optional[str] = None
    # node 0's rank 0, exec'd: where it hands its results back to the task (mf/handback.py),
    # and whether a failed body's are handed back too (@catch keeps them)
    handback_path: Optional[str] = None
    keep_failed: bool = False

    def with_attempt(self, **changes: Any) -> "GangSpec":
        return dataclasses.replace(self, attempt=dataclasses.replace(self.attempt, **changes))

    def to_env(self) -> Dict[str, str]:
        return {SPEC_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["GangSpec"]:
        return _from_env(cls, SPEC_ENV, environ)


@dataclass(frozen=True)
class AgentOrder:
    """What a node agent on another machine starts with: the gang's blueprint and its
    backend. Its place (node, node 0's address, the task and attempt, the secret) is found on
    its node, from its scheduler's variables and its own spin-step command."""

    blueprint: Blueprint
    backend: str

    def to_env(self) -> Dict[str, str]:
        return {ORDER_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Optional["AgentOrder"]:
        return _from_env(cls, ORDER_ENV, environ)


@dataclass(frozen=True)
class NodeZero:
    """Where node 0 hosts the gang's store, as its backend placed it: the address the other
    nodes reach, the port (0: any free one, on this host), the attempt's secret, the backend,
    and the longest preemption grace the scheduler leaves the gang (None: no limit known), with
    why."""

    master_addr: str
    port: int
    secret: str
    backend: str
    grace_limit_s: Optional[float] = None
    grace_limit_why: str = ""


def current_task_identity(step_kwargs: Mapping[str, Any], retry_count: int,
                          max_user_code_retries: int, orig_datastore: str) -> TaskIdentity:
    """The TaskIdentity of the running `step` (or `spin-step`) process, from the options of its
    command (internals.step_kwargs); `orig_datastore` is the task's flow datastore."""
    kw = step_kwargs
    input_paths = kw.get("input_paths")
    if not input_paths and kw.get("input_paths_filename"):
        with open(kw["input_paths_filename"], encoding="utf-8") as f:
            input_paths = f.read().strip(" \n\"'")
    return TaskIdentity(
        run_id=str(kw["run_id"]),
        task_id=str(kw["task_id"]),
        input_paths=input_paths or "",
        split_index=kw.get("split_index"),
        retry_count=retry_count,
        max_user_code_retries=max_user_code_retries,
        namespace=kw.get("namespace"),
        orig_datastore=kw.get("orig_flow_datastore") or orig_datastore,
    )


def _from_env(cls: Type[_T], name: str, environ: Mapping[str, str]) -> Optional[_T]:
    """The record of `cls` in the environment variable `name` (its to_env), or None."""
    raw = environ.get(name)
    return None if raw is None else _build(cls, json.loads(raw))


def _build(cls: Type[_T], data: Mapping[str, Any]) -> _T:
    """`cls` (a record of this module) from its asdict() form, read back from JSON: nested
    records, enums and tuples rebuilt from their field's type."""
    hints = typing.get_type_hints(cls)
    return cls(**{name: _value(hints[name], value) for name, value in data.items()})


def _value(kind: Any, value: Any) -> Any:
    if value is None:
        return None
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if dataclasses.is_dataclass(kind):
        return _build(kind, value)  # type: ignore[arg-type]
    if isinstance(kind, type) and issubclass(kind, Enum):
        return kind(value)
    if typing.get_origin(kind) is tuple:
        return tuple(value)
    return value
