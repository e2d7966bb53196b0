"""The gang's wire format: what node 0 tells every exec'd member (node agent or exec'd rank),
as plain JSON-able data in one environment variable, and the Metaflow task the gang belongs to."""

import json
from dataclasses import asdict, dataclass
from typing import Optional


# The environment variable that carries a GangSpec into an exec'd member.
SPEC_ENV = "METAFLOW_TORCH_DISTRIBUTED_MEMBER"


@dataclass(frozen=True)
class GangSpec:
    """What an exec'd member needs to know to take its place: plain JSON-able data."""

    role: str  # "agent" (runs a whole node) or "rank" (one exec'd rank)
    step_name: str
    nodes: int
    nproc_per_node: int
    node: int
    master_addr: str
    master_port: int
    gang_id: str
    # The attempt's secret, under which the values of the gang's store are sealed (sealed.py);
    # never logged. "" in what a remote agent is submitted with: it reads it on its node
    # (attempt_secret.py)
    secret: str
    # The gang's round within its attempt: 0, then one more on each restart in place
    # (TORCHELASTIC_RESTART_COUNT, current.torch_distributed.restart_count)
    restart_count: int
    accelerator: str
    rendezvous_timeout_s: float  # settings.GangSettings says what each duration means
    finish_timeout_s: float
    start_method: str
    work_dir: str
    task: dict  # TaskIdentity fields: what a spin-step member command needs
    top_args: list  # the task's top-level CLI options
    local_rank: Optional[int] = None
    cuda_visible_devices: Optional[str] = None
    # "local" (every node on this host) or "batch" (nodes are the nodes of an AWS Batch
    # multi-node job; a node agent's place is filled in on its node, see batch.resolve_node)
    backend: str = "local"
    heartbeat_timeout_s: Optional[float] = None
    # hang detection (stacks.py): how long no collective may complete while a rank waits in
    # one; None: off. Every rank's probe samples at an interval derived from it
    hang_timeout_s: Optional[float] = None
    # once preempted, how long the ranks may save (preempt.py)
    preempt_grace_s: float = 25.0
    # The group check's mode when METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK is not set: "error"
    # where the user wrote the decorator, "warn" where it came from --with (groupcheck.py)
    group_check_default: str = "error"
    # What node 0's @checkpoint resolved, for members (checkpoints.gang_fields); None without it
    checkpoint: Optional[dict] = None
    # How many restarts in place the attempt may make (TORCHELASTIC_MAX_RESTARTS)
    max_restarts: int = 0

    def identity(self):
        return TaskIdentity(**self.task)

    def to_env(self):
        return {SPEC_ENV: json.dumps(asdict(self))}

    @classmethod
    def from_env(cls, environ):
        raw = environ.get(SPEC_ENV)
        return None if raw is None else cls(**json.loads(raw))


@dataclass(frozen=True)
class NodeZero:
    """Where node 0 hosts the gang's store, as its backend placed it: the address the other
    nodes reach, the port (0: any free one, on this host), the attempt's secret, the backend
    ("local", "batch" or "kubernetes")."""

    master_addr: str
    port: int
    secret: str
    backend: str


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


def current_task_identity(step_kwargs, retry_count, max_user_code_retries, orig_datastore):
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
