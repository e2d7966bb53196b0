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

import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import replace

from ..mf import internals
from ..core import naming
from ..runtime import preempt
from ..backends import trampoline
from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import NodeZero
from ..mf.spinstep import spin_env_additions

# Set by the decorator's runtime_step_cli on the trampoline of a multi-node step (the step's name).
TRAMPOLINE_ENV = "METAFLOW_TORCH_DISTRIBUTED_KUBERNETES_STEP"
# In the control pod's environment: {"step": .., "nodes": N, "master_port": P} (P None in a
# JobSet compiled before its run existed).
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_KUBERNETES_MAIN"

# Set by Metaflow on every pod of its JobSets (Kubernetes.create_jobset).
WORKER_INDEX = "MF_WORKER_REPLICA_INDEX"  # downward API: the worker Job's index, 0..N-2
MASTER_ADDR = "MF_MASTER_ADDR"  # the control pod's FQDN
NUM_NODES = "MF_WORLD_SIZE"  # replicas of control + worker
# The agent's hidden task id: bash computes the node index on the worker pod.
_AGENT_TASK_ID = "%s-node-$((" + WORKER_INDEX + "+1))"
# Seconds between two lookups of a name that does not resolve yet.
RESOLVE_RETRY_S = 1.0
# NCCL keeps its buffers in /dev/shm, which a pod gets at the container runtime's default size
# (64 MiB) unless @kubernetes(shared_memory=...) mounts more (MiB): below this, warn.
MIN_SHARED_MEMORY_MIB = 1024


# -- pure parts: what the JobSet's pods know ----------------------------------------------------

def main_node_plan(environ, step_name):
    """(nodes, port) when this process is node 0 (the control pod) of this step's JobSet, else
    None. The port is None in a JobSet compiled before its run existed (argo.py)."""
    plan = trampoline.main_node_env(environ, MAIN_NODE_ENV, step_name)
    if plan is None:
        return None
    found = environ.get(NUM_NODES)
    if found != str(plan["nodes"]):
        raise TorchDistributedEnvironmentError(
            step_name, "the gang needs %d nodes but this Kubernetes JobSet has %s (%s=%r). The "
            "JobSet was not created by this version of @torch_distributed; rerun the step."
            % (plan["nodes"], found, NUM_NODES, found))
    return plan["nodes"], plan["master_port"]


def node_zero(step_name, environ, identity, settings):
    """The NodeZero of this process when it is the control pod of `step_name`'s JobSet, else
    None: the port the worker pods got from the same submission (or derive, in a JobSet
    compiled before its run existed), the control pod's own address as its DNS name resolves,
    and the attempt's secret, drawn here."""
    plan = main_node_plan(environ, step_name)
    if plan is None:
        return None
    _, port = plan
    if port is None:  # compiled before the run existed (Argo Workflows)
        port = trampoline.attempt_port(step_name, identity)
    master_addr = resolve_master(step_name, 0, environ, settings.rendezvous_timeout_s)
    return NodeZero(master_addr, port, naming.new_secret(), "kubernetes")


def resolve_master(step_name, node, environ, timeout, resolve=socket.gethostbyname,
                   clock=time.monotonic, sleep=time.sleep):
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


def shared_memory_warning(step_name, shared_memory):
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


def worker_node(step_name, environ):
    """A worker pod's node index: its Job's index in the `worker` replicated job, plus one."""
    try:
        return int(environ[WORKER_INDEX]) + 1
    except (KeyError, ValueError):
        raise TorchDistributedEnvironmentError(
            step_name, "this node agent runs outside a Kubernetes JobSet of Metaflow (%s=%r)."
            % (WORKER_INDEX, environ.get(WORKER_INDEX)))


def resolve_node(spec, environ, params, top_args, resolve=socket.gethostbyname):
    """An agent's GangSpec as created (the same for every worker pod) completed on its pod.
    `params` are its spin-step's options."""
    node = worker_node(spec.step_name, environ)
    master_addr = resolve_master(spec.step_name, node, environ, spec.rendezvous_timeout_s, resolve)
    task = dict(spec.task, input_paths=params.get("input_paths") or "")
    fields = trampoline.compiled_place(spec, params, node, task)  # Argo Workflows' agents
    return replace(spec, node=node, master_addr=master_addr, task=task, top_args=top_args,
                   work_dir=tempfile.mkdtemp(prefix="torch-distributed-"), **fields)


def leave_to_node_0(error):
    """A worker pod that cannot take its place in the gang says why and exits 0: a failed
    worker Job fails the whole JobSet at once, and its controller then stops the control pod
    before node 0 has written the task's error. Node 0 decides: it fails with its own error
    or, missing this node, at the rendezvous timeout naming it."""
    print("%s\n%s" % (error.headline, error), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(0)


# -- the trampoline ----------------------------------------------------------------------------

def install_trampoline(step_name, nodes, spec_fields, decorator_name):
    """In the `kubernetes step` process of this step: make Kubernetes create one JobSet of
    `nodes` pods whose workers run the node agent (internals.wrap_kubernetes_jobset)."""

    def build(kube, jobset, create_args):
        cli = internals.TrampolineCli(step_name)
        identity, spec = trampoline.trampoline_agent_spec(cli, step_name, spec_fields, "kubernetes")
        entrypoint, top_args = trampoline.trampoline_entrypoint(cli, step_name)
        gang_jobset(kube, jobset, create_args, identity, spec, entrypoint, top_args, nodes,
                    decorator_name)

    internals.wrap_kubernetes_jobset(step_name, nodes, build)


def gang_jobset(kube, jobset, kw, identity, spec, entrypoint, top_args, nodes, decorator_name):
    """Make the JobSet Metaflow built for the task (`Kubernetes.create_jobset(**kw)` with
    num_parallel=nodes) the gang's: the worker pods run the node agent of `spec`, the control
    pod keeps the task's command and learns the gang's plan (both come from this submission,
    and a retry is another one; neither holds the attempt's secret: attempt_secret.py)."""
    step_name = kw["step_name"]
    agent_cli = trampoline.agent_shell_command(entrypoint, top_args, step_name, identity,
                                          trampoline.input_path_vars(kw["env"]),
                                          hidden_pattern=_AGENT_TASK_ID)
    agent_command = internals.kubernetes_command(kube, kw, _AGENT_TASK_ID % identity.task_id,
                                                 [agent_cli])
    plan = {"step": step_name, "nodes": nodes, "master_port": spec.master_port}
    internals.jobset_pods(jobset, preempt.forwarding(agent_command),
                          spin_env_additions(os.environ, spec, decorator_name),
                          {MAIN_NODE_ENV: json.dumps(plan)})
    # a deleted pod's SIGTERM reaches the node's supervisor, which needs time to pass it on
    jobset.control.command(preempt.forwarding(internals.jobset_control_command(jobset)))
    internals.jobset_stop_grace(jobset, preempt.scheduler_grace(spec.preempt_grace_s))
