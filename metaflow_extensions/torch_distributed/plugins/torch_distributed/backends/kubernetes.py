"""Kubernetes: a gang of N > 1 nodes runs as one JobSet (`--with kubernetes`, `@kubernetes`).

Metaflow's Kubernetes path stays in charge (image, resources, code package, log tailing,
metadata sync, retries); its `@parallel` already builds JobSets. In the process that submits
the step (`kubernetes step`, the trampoline) we make `Kubernetes.launch_job` build the JobSet
Metaflow builds for `@parallel` with N nodes (replicated jobs `control` x 1 and `worker` x N-1),
then keep the control pod's command, the task's own and unchanged (its task id and split
index, also inside a foreach), and give the worker pods the node agent's command, a hidden
`spin-step` of the same task, built from data (trampoline.py holds what both remote backends build).

On the pods: node 0 is the Metaflow task and hosts the gang's store on a port fixed by run,
step, task and attempt (`naming.remote_port`). A worker's node is its job index + 1; the
master address is the control pod's stable DNS name (`MF_MASTER_ADDR`), resolved with retries:
a worker may start before node 0, whose name resolves only once its pod runs.
"""

import os
import socket
import sys
import time
from typing import Any, Callable, Dict, Mapping, NoReturn, Optional

from ..core import naming
from ..core.errors import TorchDistributedEnvironmentError
from ..core.errors import TorchDistributedException
from ..core.gangspec import AgentOrder, NodeZero, TaskIdentity
from ..mf import internals
from ..mf.spinstep import spin_env_additions
from ..runtime import preempt
from . import address, isolation, trampoline
from .base import AgentPlace, Backend, GangStep

# Set by the decorator's launch_env on the trampoline of a multi-node step (the step's name).
TRAMPOLINE_ENV = "METAFLOW_TORCH_DISTRIBUTED_KUBERNETES_STEP"
# In the control pod's environment: the gang's plan (trampoline.plan_env).
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_KUBERNETES_MAIN"

# Set by Metaflow on every pod of its JobSets (Kubernetes.create_jobset).
WORKER_INDEX = "MF_WORKER_REPLICA_INDEX"  # downward API: the worker Job's index, 0..N-2
MASTER_ADDR = "MF_MASTER_ADDR"  # the control pod's FQDN
NUM_NODES = "MF_WORLD_SIZE"  # replicas of control + worker
# A worker pod's node index, as the shell of its container computes it.
NODE_INDEX_WORD = "$((%s+1))" % WORKER_INDEX
# Seconds between two lookups of a name that does not resolve yet.
RESOLVE_RETRY_S = 1.0
# NCCL keeps its buffers in /dev/shm, which a pod gets at the container runtime's default size
# (64 MiB) unless @kubernetes(shared_memory=...) mounts more (MiB): below this, warn.
MIN_SHARED_MEMORY_MIB = 1024


# -- pure parts: what the JobSet's pods know ----------------------------------------------------

def planned_nodes(environ: Mapping[str, str], step_name: str) -> Optional[int]:
    """The nodes of the gang when this process is node 0 (the control pod) of `step_name`'s
    JobSet, else None; a JobSet of another size than planned is refused."""
    return trampoline.checked_plan(environ, MAIN_NODE_ENV, step_name, NUM_NODES,
                                   "Kubernetes JobSet", made="created")


class KubernetesBackend(Backend):
    """Kubernetes: a gang of N > 1 nodes is one JobSet (its control pod node 0, its N-1 worker
    pods the node agents)."""

    name = "kubernetes"

    def __init__(self, resolve: Callable[[str], str] = socket.gethostbyname) -> None:
        self.resolve = resolve  # a DNS name to its address

    def launch_env(self, step: GangStep) -> Dict[str, str]:
        if step.decorated_with("kubernetes") and step.topology.nodes > 1:
            return {TRAMPOLINE_ENV: step.step_name}
        return {}

    def install(self, step: GangStep, environ: Mapping[str, str],
                deploy_target: Optional[str]) -> None:
        if step.topology.nodes > 1 and environ.get(TRAMPOLINE_ENV) == step.step_name:
            install_trampoline(step)

    def node_zero(self, step: GangStep, environ: Mapping[str, str],
                  identity: TaskIdentity) -> Optional[NodeZero]:
        """The port is derived from the task, as the worker pods derive it; the control pod's
        address is its DNS name, resolved; the attempt's secret is drawn here."""
        nodes = planned_nodes(environ, step.step_name)
        if nodes is None:
            return None
        master_addr = address.check_resolved(
            step.step_name, nodes, environ.get(MASTER_ADDR, ""),
            resolve_master(step.step_name, 0, environ, step.blueprint.rendezvous_timeout_s,
                           self.resolve))
        return NodeZero(master_addr, trampoline.attempt_port(step.step_name, identity),
                        naming.new_secret(), self.name)

    def agent_place(self, order: AgentOrder, environ: Mapping[str, str]) -> AgentPlace:
        step_name = order.blueprint.step_name
        node = worker_node(step_name, environ)
        return AgentPlace(node, resolve_master(step_name, node, environ,
                                               order.blueprint.rendezvous_timeout_s,
                                               self.resolve))

    def agent_misplaced(self, error: TorchDistributedException) -> NoReturn:
        leave_to_node_0(error)


BACKEND = KubernetesBackend()


def resolve_master(step_name: str, node: int, environ: Mapping[str, str], timeout: float,
                   resolve: Callable[[str], str] = socket.gethostbyname,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> str:
    """The IP address of the control pod's DNS name. The name resolves once the control pod
    runs (and, with a JobSet queued by Kueue, only after admission): retry until `timeout`."""
    name = environ.get(MASTER_ADDR)
    if not name:
        raise TorchDistributedEnvironmentError(
            step_name, "node %d runs outside a Kubernetes JobSet of Metaflow (%s is not set)."
            % (node, MASTER_ADDR))
    deadline = clock() + timeout
    while True:
        try:
            return resolve(name)
        except OSError as ex:
            if clock() >= deadline:
                raise TorchDistributedEnvironmentError(
                    step_name, "node %d could not resolve node 0's address %s in %d s (%s). "
                    "Node 0's pod never ran, or the cluster's DNS does not serve the JobSet's "
                    "headless service; see docs/kubernetes.md, \"Cluster needs\"."
                    % (node, name, timeout, ex)) from ex
        sleep(RESOLVE_RETRY_S)


def shared_memory_warning(step_name: str, shared_memory: Any) -> Optional[str]:
    """The warning for a GPU gang whose pods get less shared memory than NCCL needs, or None.
    `shared_memory` is @kubernetes' attribute (MiB, None for the runtime's default)."""
    mib = None if shared_memory in (None, "") else int(float(shared_memory))
    if mib is not None and mib >= MIN_SHARED_MEMORY_MIB:
        return None
    return ("@torch_distributed on step %s: its GPU gang runs in pods with %s of shared memory "
            "(/dev/shm), and NCCL may fail or hang with that little. Give the pods more with "
            "@kubernetes(shared_memory=%d) (MiB) or more."
            % (step_name, "the default 64 MiB" if mib is None else "%d MiB" % mib,
               MIN_SHARED_MEMORY_MIB))


def worker_node(step_name: str, environ: Mapping[str, str]) -> int:
    """A worker pod's node index: its Job's index in the `worker` replicated job, plus one."""
    try:
        return int(environ[WORKER_INDEX]) + 1
    except (KeyError, ValueError):
        raise TorchDistributedEnvironmentError(
            step_name, "this node agent runs outside a Kubernetes JobSet of Metaflow (%s=%r)."
            % (WORKER_INDEX, environ.get(WORKER_INDEX)))


def leave_to_node_0(error: TorchDistributedException) -> NoReturn:
    """A worker pod that cannot take its place in the gang says why and exits 0: a failed
    worker Job fails the whole JobSet at once, and its controller then stops the control pod
    before node 0 has written the task's error. Node 0 decides: it fails with its own error
    or, missing this node, at the rendezvous timeout naming it."""
    print("%s\n%s" % (error.headline, error), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)


# -- the trampoline ----------------------------------------------------------------------------

def install_trampoline(step: GangStep) -> None:
    """In the `kubernetes step` process of this step: make Kubernetes create one JobSet of
    N pods whose workers run the node agent (internals.wrap_kubernetes_jobset)."""

    def build(kube: Any, jobset: Any, create_args: Dict[str, Any]) -> None:
        gang_jobset(kube, jobset, create_args, step, internals.TrampolineCli(step.step_name))

    internals.wrap_kubernetes_jobset(step.step_name, step.topology.nodes, build)


def gang_jobset(kube: Any, jobset: Any, kw: Dict[str, Any], step: GangStep, cli: Any) -> None:
    """Make the JobSet Metaflow built for the task (`Kubernetes.create_jobset(**kw)` with
    num_parallel=nodes) the gang's: the worker pods run the node agent, the control pod keeps
    the task's command and learns the gang's plan (neither holds the attempt's secret:
    attempt_secret.py)."""
    identity = trampoline.submitted_identity(cli)
    entrypoint, top_args = trampoline.trampoline_entrypoint(cli)
    options = trampoline.submitted_options(step.step_name, identity,
                                           trampoline.input_path_vars(kw["env"]), NODE_INDEX_WORD)
    agent_cli = trampoline.agent_shell_command(entrypoint, top_args, step.step_name, options)
    agent_command = internals.kubernetes_command(kube, kw, str(options.task_id), [agent_cli])
    internals.jobset_pods(jobset, preempt.forwarding(agent_command),
                          spin_env_additions(os.environ, AgentOrder(step.blueprint, BACKEND.name),
                                             step.decorator_name),
                          trampoline.plan_env(MAIN_NODE_ENV, step.step_name, step.topology.nodes))
    # a deleted pod's SIGTERM reaches the node's supervisor, which needs time to pass it on
    jobset.control.command(preempt.forwarding(internals.jobset_control_command(jobset)))
    internals.jobset_stop_grace(jobset, preempt.scheduler_grace(step.blueprint.preempt_grace_s))
    internals.after_jobset_created(jobset, lambda name, namespace: isolate_jobset(
        step.step_name, name, namespace))


def isolate_jobset(step_name: str, jobset_name: str, namespace: str) -> None:
    """Give the JobSet just created its NetworkPolicy (isolation.py); a refusal is a warning
    in the task's log, never the run's failure."""
    from kubernetes.client.rest import ApiException

    isolation.isolate(internals.kubernetes_client(), ApiException, step_name, jobset_name,
                      namespace, lambda warning: print(warning, file=sys.stderr, flush=True))
