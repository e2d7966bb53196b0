"""AWS Batch: a gang of N > 1 nodes runs as one multi-node parallel job.

Metaflow's Batch path stays in charge (job queue, image, resources, code package, log tailing,
metadata sync, retries). In the process that submits the job (`batch step`, the trampoline)
we wrap `Batch.create_job`: Metaflow builds the job with N nodes, then node 0 keeps the task's
own, unchanged command (right task id and split index, also inside a foreach) and nodes
1..N-1 get the node agent's command, a hidden `spin-step` of the same task. Nothing is edited
in a command string; see reference/metaflow_internals.md, sections 4 and 5 (option D).

On the nodes: node 0 is the Metaflow task and hosts the gang's store on a port fixed by run,
step, task and attempt (`naming.remote_port`); the agents find it through
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS, which AWS Batch sets on child nodes only. The
port is predictable, and anyone who reaches it can read the store; what the package reads
from it is sealed under a secret node 0 draws for each attempt and the agents read from the
run's datastore (sealed.py, attempt_secret.py), never from the job.
"""

import copy
import json
import os
import socket
import tempfile
from dataclasses import replace

from ..mf import internals
from ..core import naming
from ..runtime import preempt
from ..backends import trampoline
from ..core.errors import TorchDistributedConfigError, TorchDistributedEnvironmentError
from ..core.gangspec import GangSpec, NodeZero
from ..mf.spinstep import spin_env_additions

# Set by the decorator's runtime_step_cli on the trampoline of a multi-node step (the step's name).
TRAMPOLINE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_STEP"
# In node 0's job environment: {"step": .., "nodes": N, "master_port": P} (P None in a job
# compiled before its run existed); the agents find the same in their GangSpec.
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_MAIN"

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"

# The shell words of an agent's command that bash expands on its node.
AGENT_TASK_ID = "%s-node-$" + NODE_INDEX


# -- pure parts: what the job looks like ------------------------------------------------------

def gang_payload(payload, nodes, main_env, agent_command, agent_env):
    """The SubmitJob payload of an N-node gang from the one Metaflow built for the task (whose
    job definition already has N nodes): node 0 runs the task's own command, nodes 1..N-1 the
    node agent's, each under preempt.FORWARDING (a SIGTERM to the container reaches the node's
    supervisor). With one node the payload is the task's, its command under FORWARDING."""
    payload = copy.deepcopy(payload)
    if nodes == 1:
        return forwarding_payload(payload)
    task = payload.pop("containerOverrides")
    main = copy.deepcopy(task)
    main["command"] = preempt.forwarding(task["command"])
    main["environment"] = _merged_env(main.get("environment", []), main_env)
    agent = copy.deepcopy(task)
    agent["command"] = preempt.forwarding(agent_command)
    agent["environment"] = _merged_env(agent.get("environment", []), agent_env)
    payload["nodeOverrides"] = {"nodePropertyOverrides": [
        {"targetNodes": "0:0", "containerOverrides": main},
        {"targetNodes": "1:%d" % (nodes - 1), "containerOverrides": agent},
    ]}
    return payload


def forwarding_payload(payload):
    """A single-node job's payload with its command under preempt.FORWARDING."""
    payload = copy.deepcopy(payload)
    overrides = payload["containerOverrides"]
    overrides["command"] = preempt.forwarding(overrides["command"])
    return payload


def _plain(tree):
    """BatchJob.payload is a defaultdict tree: plain dicts, so nothing appears by reading."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain(v) for v in tree]
    return tree


def _merged_env(entries, extra):
    """`entries` with the variables of `extra` set; an entry may be Step Functions' JSONPath
    form ({"name", "value.$"}), kept as it is."""
    merged = {e["name"]: e for e in entries}
    merged.update((k, {"name": k, "value": v}) for k, v in extra.items())
    return list(merged.values())


def main_node_plan(environ, step_name):
    """(nodes, port) when this process is node 0 of this step's multi-node job, else
    None. The port is None when the job was compiled before its run existed (Step Functions):
    node 0 derives it from its task (naming.remote_port), as its agents do (resolve_node)."""
    plan = trampoline.main_node_env(environ, MAIN_NODE_ENV, step_name)
    if plan is None:
        return None
    found = int(environ.get(NUM_NODES, "0") or 0)
    if found != plan["nodes"]:
        raise TorchDistributedEnvironmentError(
            step_name, "the gang needs %d nodes but this AWS Batch job has %s (%s=%r). The "
            "job was not submitted by this version of @torch_distributed; rerun the step."
            % (plan["nodes"], found, NUM_NODES, environ.get(NUM_NODES)))
    return plan["nodes"], plan["master_port"]


def node_zero(step_name, environ, identity, settings):
    """The NodeZero of this process when it is node 0 of `step_name`'s AWS Batch multi-node
    job (the task `identity`), else None. The port comes from the submission, which gave the
    agents the same; a job compiled before its run existed (Step Functions) carries none, and
    node 0 derives it from its task, as its agents do. The attempt's secret is drawn here."""
    plan = main_node_plan(environ, step_name)
    if plan is None:
        return None
    _, port = plan
    if port is None:  # compiled before the run existed
        port = trampoline.attempt_port(step_name, identity)
    return NodeZero(main_node_address(environ), port, naming.new_secret(), "batch")


def main_node_address(environ):
    """node 0's private IP: the address child nodes are given, found the way Metaflow's
    @batch finds it on the main node (which AWS does not tell its own address)."""
    if environ.get("MF_PARALLEL_MAIN_IP"):
        return environ["MF_PARALLEL_MAIN_IP"]
    addresses = socket.gethostbyname_ex(socket.gethostname())[-1]
    return addresses[0] if addresses else "127.0.0.1"


def resolve_node(spec, environ, params, top_args):
    """An agent's GangSpec as submitted (the same for every child node) completed on its node.
    `params` are its spin-step's options. A spec submitted without the task's identity (Step
    Functions compiles the job before the run exists: gang_id "") takes it from them."""
    try:
        node = int(environ[NODE_INDEX])
        master_addr = environ[MAIN_NODE_ADDRESS]
    except (KeyError, ValueError):
        raise TorchDistributedEnvironmentError(
            spec.step_name, "this node agent runs outside an AWS Batch multi-node job (%s=%r, "
            "%s=%r)." % (NODE_INDEX, environ.get(NODE_INDEX), MAIN_NODE_ADDRESS,
                         environ.get(MAIN_NODE_ADDRESS)))
    task = dict(spec.task, input_paths=params.get("input_paths") or "")
    fields = trampoline.compiled_place(spec, params, node, task)
    return replace(spec, node=node, master_addr=master_addr, task=task, top_args=top_args,
                   work_dir=tempfile.mkdtemp(prefix="torch-distributed-"), **fields)


# -- the trampoline: wrapping Metaflow's job construction ---------------------------------------

def install_trampoline(step_name, nodes, spec_fields, decorator_name):
    """In the `batch step` process of this step: make Batch submit an N-node job whose child
    nodes run the node agent. `spec_fields` are the GangSpec fields known before submission."""

    def build(create, batch, create_args):
        job = create_gang_job(create, step_name, nodes, create_args["queue"])
        _make_gang_job(batch, job, create_args, step_name, nodes, spec_fields, decorator_name)
        return job

    internals.wrap_batch_create_job(step_name, build)
    internals.show_child_nodes(step_name, nodes)


def install_forwarding(step_name):
    """In the `batch step` process of a one-node gang's step: its job's command runs under
    preempt.FORWARDING, so that a TerminateJob's SIGTERM reaches the gang."""

    def build(create, batch, create_args):
        job = create()
        internals.submit_as_built(job, forwarding_payload(_plain(internals.job_payload(job))))
        return job

    internals.wrap_batch_create_job(step_name, build)


def create_gang_job(create, step_name, nodes, queue):
    """Metaflow's `Batch.create_job` of an N-node job (`create(num_parallel=nodes)`: its job
    definition has N nodes, node 0 the main one). AWS Batch runs multi-node jobs on EC2 only:
    a Fargate queue is refused with the fix."""
    try:
        return create(num_parallel=nodes)
    except Exception as ex:  # noqa: BLE001 - re-raised unless it is the Fargate refusal
        if not internals.is_fargate_refusal(ex):
            raise
        raise TorchDistributedConfigError(
            step_name, "the gang needs %d nodes, and AWS Batch runs multi-node jobs "
            "on EC2 compute environments only; job queue %r is Fargate. Use a queue "
            "on an EC2 compute environment (@batch(queue=...) or METAFLOW_BATCH_JOB_"
            "QUEUE), or nodes=1." % (nodes, queue)) from ex


def _make_gang_job(batch, job, a, step_name, nodes, spec_fields, decorator_name):
    cli = internals.TrampolineCli(step_name)
    identity, spec = trampoline.trampoline_agent_spec(cli, step_name, spec_fields, "batch")
    port = spec.master_port
    agent_cli = trampoline.agent_shell_command(
        *trampoline.trampoline_entrypoint(cli, step_name), step_name, identity,
        trampoline.input_path_vars(a["env"]), AGENT_TASK_ID)
    agent_task_spec = dict(a["task_spec"], task_id=AGENT_TASK_ID % identity.task_id)
    agent_command = internals.batch_command(batch, a, step_name, agent_cli, agent_task_spec)
    main_env = {MAIN_NODE_ENV: json.dumps({"step": step_name, "nodes": nodes,
                                           "master_port": port})}
    agent_env = spin_env_additions(os.environ, spec, decorator_name)
    built = gang_payload(_plain(internals.job_payload(job)), nodes, main_env, agent_command,
                         agent_env)
    internals.submit_as_built(job, built)  # no command rewriting in execute()
