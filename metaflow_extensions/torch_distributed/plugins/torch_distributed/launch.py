"""Commands and environments of exec'd gang processes (node agents and exec'd ranks).

An exec'd member runs Metaflow's hidden `spin-step` command: it loads the flow and the step's
real inputs from the original datastore, runs our decorator's hooks (which read the gang spec
from the environment), and leaves no trace in the run's metadata or datastore
(reference/metaflow_internals.md, section 5, option D).
"""

import json
import os
import sys
from dataclasses import asdict, dataclass
from typing import Optional

from . import internals

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
    # The attempt's secret, under which the gang's store keys lie (naming.Keys); never logged
    secret: str
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
    # The group check's mode when METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK is not set: "error"
    # where the user wrote the decorator, "warn" where it came from --with (frameworks.py)
    group_check_default: str = "error"
    # What node 0's @checkpoint resolved, for members (checkpoints.gang_fields); None without it
    checkpoint: Optional[dict] = None

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


def member_command(spec, hidden_task_id, decorator_name, base_env):
    """(argv, env) of an exec'd member (agent or rank) described by `spec`."""
    argv = spin_step_argv(interpreter(), script_path(), spec.top_args, spec.step_name,
                          spec.identity(), hidden_task_id)
    env = spin_env(base_env, spec, decorator_name, os.path.join(spec.work_dir, "spin"))
    return argv, env


def spin_step_argv(executable, script, top_args, step_name, identity, hidden_task_id):
    """argv of a spin-step process running `step_name` of the same task under a hidden id."""
    return [executable, "-u", script, *top_args, "spin-step",
            *spin_step_options(step_name, identity, hidden_task_id)]


def spin_step_options(step_name, identity, hidden_task_id):
    """What follows `spin-step` in a member's command line."""
    argv = [step_name,
            "--run-id", identity.run_id,
            "--task-id", hidden_task_id,
            "--input-paths", identity.input_paths,
            "--retry-count", str(identity.retry_count),
            "--max-user-code-retries", str(identity.max_user_code_retries),
            "--orig-flow-datastore", identity.orig_datastore,
            "--no-persist"]
    if identity.split_index is not None:
        argv += ["--split-index", str(identity.split_index)]
    if identity.namespace is not None:
        argv += ["--namespace", identity.namespace]
    return argv


def spin_env(base_env, spec, decorator_name, spin_root):
    """The environment of a spin-step member: the task's own, plus what spin-step needs to run
    our decorator and to keep its bookkeeping out of the user's directories."""
    env = dict(base_env)
    env.update(spin_env_additions(base_env, spec, decorator_name))
    env[internals.SPIN_SYSROOT_ENV] = spin_root
    return env


def spin_env_additions(base_env, spec, decorator_name):
    """The variables a spin-step member needs on top of `base_env`: its GangSpec, and the
    spin-step decorator allow-list extended by our decorator."""
    # The variable wins over Metaflow's configuration (its config file included), as in Metaflow.
    allowed = json.loads(base_env.get(internals.SPIN_ALLOWED_ENV, "null") or "null")
    allowed = list(allowed or internals.spin_allowed_decorators())
    if decorator_name not in allowed:
        allowed.append(decorator_name)
    return {**spec.to_env(), internals.SPIN_ALLOWED_ENV: json.dumps(allowed)}


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


def interpreter():
    # Not environment.executable(): it returns "python", which a non-activated venv lacks.
    return sys.executable


def script_path():
    return os.path.abspath(sys.argv[0])
