"""Who gives a gang its nodes: the deploy-time and run-time guards for multi-node gangs.

A gang of N > 1 nodes needs a backend that starts N machines for one task. `python flow.py run`
emulates the nodes on the user's own machine (on purpose), `--with batch` submits one AWS
Batch multi-node job (batch.py) and `--with kubernetes` creates one JobSet (kubernetes.py).
Everywhere else the nodes would silently share one machine, so:

* at deploy time, a command that compiles the flow for another scheduler (`airflow create`,
  any other deployer's `create`) refuses such a gang before anything is deployed;
  `step-functions create` compiles it into one multi-node AWS Batch job (stepfunctions.py),
  `argo-workflows create` into one JobSet (argo.py);
* at run time, a task on a remote backend (its container carries the backend's markers) that
  was not given its nodes fails before any rank starts.

The pure parts take plain data; `cli_words` and `deployer_commands` read Metaflow internals
through internals.py (tests/unit/test_schedulers.py pins both).
"""

from typing import Mapping, Optional, Sequence

from ..core.errors import TorchDistributedConfigError, TorchDistributedEnvironmentError
from ..core.topology import Topology
from ..mf import internals

# Commands of Metaflow's CLI that compile the flow for another scheduler, and what they target.
COMPILERS = {
    "step-functions": "AWS Step Functions",
    "argo-workflows": "Argo Workflows",
    "airflow": "Airflow",
}
# The schedulers that run a gang of N > 1 nodes as N machines (one AWS Batch multi-node job,
# one JobSet).
MULTI_NODE = ("step-functions", "argo-workflows")
# The subcommand that compiles (and deploys) the flow, for every scheduler above and for every
# deployer (Metaflow's Deployer API runs `<type> create`).
COMPILE_ACTION = "create"

# Variables a remote backend sets in a task's container, most specific first. AWS Batch sets
# AWS_BATCH_JOB_ID itself; the others are set by Metaflow's compilers and @kubernetes.
REMOTE_MARKERS = (
    ("SFN_STATE_MACHINE", "AWS Step Functions"),
    ("ARGO_WORKFLOW_NAME", "Argo Workflows"),
    ("METAFLOW_AIRFLOW_DAG_RUN_ID", "Airflow"),
    ("AWS_BATCH_JOB_ID", "AWS Batch"),
    ("METAFLOW_KUBERNETES_WORKLOAD", "Kubernetes"),
    ("SLURM_JOB_ID", "Slurm"),
)
# Metaflow's own signal (what @parallel reads): "local" unless a remote backend runs the task.
RUNTIME_ENVIRONMENT = "METAFLOW_RUNTIME_ENVIRONMENT"


# -- pure parts -----------------------------------------------------------------------------

def deploy_target(words: Sequence[str], deployers: Sequence[str] = ()) -> Optional[str]:
    """The scheduler that `python flow.py <words>` compiles the flow for, or None.
    `words` are the command line after the flow's top-level options; `deployers` are the
    commands of the installed deployers (Metaflow's Deployer API)."""
    if not words or words[0] not in set(COMPILERS) | set(deployers):
        return None
    return words[0] if COMPILE_ACTION in words[1:] else None


def check_deploy_target(step_name: str, target: Optional[str], topology: Topology) -> None:
    """Refuse a gang of `topology` that `target` would deploy where it cannot run as N
    machines."""
    if target is None or topology.nodes == 1 or target in MULTI_NODE:
        return
    raise TorchDistributedConfigError(
        step_name, "a gang of %d nodes (%s) cannot be deployed to %s: it runs each task on one "
        "machine, so every node would share it. Deploy with nodes=1 (several processes on one "
        "machine, e.g. nproc_per_node=8 with gpu=8), or run the gang with "
        "`python flow.py run --with batch` (or `--with kubernetes`) or deploy it with "
        "`step-functions create` or `argo-workflows create`."
        % (topology.nodes, topology.describe(), COMPILERS.get(target, "`%s`" % target)))


def remote_backend(environ: Mapping[str, str]) -> Optional[str]:
    """The remote backend whose container this task runs in, or None on the user's machine."""
    for name, backend in REMOTE_MARKERS:
        if environ.get(name):
            return backend
    runtime = environ.get(RUNTIME_ENVIRONMENT, "local")
    return None if runtime in ("", "local") else runtime


def check_single_host(step_name: str, topology: Topology, environ: Mapping[str, str],
                      rehearsal: bool) -> None:
    """Called where no backend gave the gang its nodes, before any rank starts: refuse to
    emulate them on this machine when it is a remote backend's (unless rehearsing on purpose)."""
    backend = remote_backend(environ)
    if topology.nodes == 1 or rehearsal or backend is None:
        return
    raise TorchDistributedEnvironmentError(
        step_name, "a gang of %d nodes (%s) runs here in one task on %s, which did not give it "
        "%d machines; its nodes would share this one. Run multi-node gangs with `python flow.py "
        "run --with batch` or `--with kubernetes`; elsewhere use nodes=1. To emulate the nodes "
        "on this machine on purpose, set METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1."
        % (topology.nodes, topology.describe(), backend, topology.nodes))


# Step decorators of other packages that run a step as one task on one machine, whatever its
# gang's size: metaflow-slurm's @slurm (one srun of one task).
SINGLE_TASK_SENDERS = {"slurm": "metaflow-slurm's @slurm"}


def check_single_task_senders(step_name: str, decorator_names: Sequence[str],
                              topology: Topology) -> None:
    """Refuse, when the flow is validated, a gang of N > 1 nodes that a decorator of another
    package would run as one task on one machine."""
    for name in decorator_names:
        if name in SINGLE_TASK_SENDERS and topology.nodes > 1:
            raise TorchDistributedConfigError(
                step_name, "a gang of %d nodes (%s) cannot run under %s: it runs the step as "
                "one Slurm task on one node, so every node would share it. Remove @%s and run "
                "the flow with `python flow.py run --with torch_slurm` (one job of %d nodes), "
                "or use nodes=1." % (topology.nodes, topology.describe(),
                                     SINGLE_TASK_SENDERS[name], name, topology.nodes))


def check_deploy(step_name: str, topology: Topology) -> Optional[str]:
    """In step_init: refuse a gang the command being run would deploy where it cannot run.
    Returns the scheduler the command deploys to (None for any other command)."""
    target = deploy_target(cli_words(), deployer_commands())
    check_deploy_target(step_name, target, topology)
    return target


# -- Metaflow internals (internals.py) --------------------------------------------------------

# The words after the flow's top-level options (`step-functions create --only-json`).
cli_words = internals.command_words
# The commands of the installed deployers; each deploys with `<command> create`.
deployer_commands = internals.deployer_commands
