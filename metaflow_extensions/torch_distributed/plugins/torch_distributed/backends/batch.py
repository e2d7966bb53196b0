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
import os
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..core import naming
from ..core.errors import TorchDistributedConfigError, TorchDistributedEnvironmentError
from ..core.gangspec import AgentOrder, NodeZero, TaskIdentity
from ..mf import internals
from ..mf.spinstep import spin_env_additions
from ..runtime import preempt
from . import address, trampoline
from .base import AgentPlace, Backend, GangStep

# Set by the decorator's launch_env on the trampoline of a gang's step (the step's name).
TRAMPOLINE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_STEP"
# In node 0's job environment: the gang's plan (trampoline.plan_env).
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_MAIN"

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"
# A child node's index, as the shell of its container expands it.
NODE_INDEX_WORD = "$" + NODE_INDEX


# -- pure parts: what the job looks like ------------------------------------------------------

def gang_payload(payload: Dict[str, Any], nodes: int, main_env: Mapping[str, str],
                 agent_command: List[str], agent_env: Mapping[str, str]) -> Dict[str, Any]:
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


def forwarding_payload(payload: Dict[str, Any]) -> Dict[str, Any]:
    """A single-node job's payload with its command under preempt.FORWARDING."""
    payload = copy.deepcopy(payload)
    overrides = payload["containerOverrides"]
    overrides["command"] = preempt.forwarding(overrides["command"])
    return payload


def _plain(tree: Any) -> Any:
    """BatchJob.payload is a defaultdict tree: plain dicts, so nothing appears by reading."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain(v) for v in tree]
    return tree


def _merged_env(entries: Sequence[Dict[str, Any]],
                extra: Mapping[str, str]) -> List[Dict[str, Any]]:
    """`entries` with the variables of `extra` set; an entry may be Step Functions' JSONPath
    form ({"name", "value.$"}), kept as it is."""
    merged = {e["name"]: e for e in entries}
    merged.update((k, {"name": k, "value": v}) for k, v in extra.items())
    return list(merged.values())


def planned_nodes(environ: Mapping[str, str], step_name: str) -> Optional[int]:
    """The nodes of the gang when this process is node 0 of `step_name`'s multi-node job, else
    None; a job of another size than planned is refused."""
    return trampoline.checked_plan(environ, MAIN_NODE_ENV, step_name, NUM_NODES, "AWS Batch job")


def main_node_address(step_name: str, nodes: int, environ: Mapping[str, str]) -> str:
    """node 0's private IP: the address child nodes are given, found the way Metaflow's
    @batch finds it on the main node (which AWS does not tell its own address); a loopback
    address is refused (address.batch_main_address)."""
    return address.batch_main_address(step_name, nodes, environ)


def child_place(step_name: str, environ: Mapping[str, str]) -> AgentPlace:
    """A child node's place: its index and node 0's address, which AWS Batch sets on child
    nodes only."""
    try:
        return AgentPlace(int(environ[NODE_INDEX]), environ[MAIN_NODE_ADDRESS])
    except (KeyError, ValueError):
        raise TorchDistributedEnvironmentError(
            step_name, "this node agent runs outside an AWS Batch multi-node job (%s=%r, "
            "%s=%r)." % (NODE_INDEX, environ.get(NODE_INDEX), MAIN_NODE_ADDRESS,
                         environ.get(MAIN_NODE_ADDRESS)))


class BatchBackend(Backend):
    """AWS Batch: a gang of N > 1 nodes is one multi-node parallel job; a one-node gang's job
    runs its command under preempt.FORWARDING."""

    name = "batch"

    def launch_env(self, step: GangStep) -> Dict[str, str]:
        return {TRAMPOLINE_ENV: step.step_name} if step.decorated_with("batch") else {}

    def install(self, step: GangStep, environ: Mapping[str, str],
                deploy_target: Optional[str]) -> None:
        if environ.get(TRAMPOLINE_ENV) != step.step_name:
            return  # not the process that submits this step's job
        if step.topology.nodes > 1:
            install_trampoline(step)
        else:
            install_forwarding(step.step_name)

    def node_zero(self, step: GangStep, environ: Mapping[str, str],
                  identity: TaskIdentity) -> Optional[NodeZero]:
        """The port is derived from the task, as the agents derive it; the attempt's secret
        is drawn here."""
        nodes = planned_nodes(environ, step.step_name)
        if nodes is None:
            return None
        return NodeZero(main_node_address(step.step_name, nodes, environ), trampoline.attempt_port(step.step_name,
                                                                            identity),
                        naming.new_secret(), self.name)

    def agent_place(self, order: AgentOrder, environ: Mapping[str, str]) -> AgentPlace:
        return child_place(order.blueprint.step_name, environ)


BACKEND = BatchBackend()


# -- the trampoline: wrapping Metaflow's job construction ---------------------------------------

def install_trampoline(step: GangStep) -> None:
    """In the `batch step` process of this step: make Batch submit an N-node job whose child
    nodes run the node agent."""
    nodes = step.topology.nodes

    def build(create: Callable[..., Any], batch: Any, create_args: Dict[str, Any]) -> Any:
        job = create_gang_job(create, step.step_name, nodes, create_args["queue"])
        _make_gang_job(batch, job, create_args, step)
        return job

    internals.wrap_batch_create_job(step.step_name, build)
    internals.show_child_nodes(step.step_name, nodes)


def install_forwarding(step_name: str) -> None:
    """In the `batch step` process of a one-node gang's step: its job's command runs under
    preempt.FORWARDING, so that a TerminateJob's SIGTERM reaches the gang."""

    def build(create: Callable[..., Any], batch: Any, create_args: Dict[str, Any]) -> Any:
        job = create()
        internals.submit_as_built(job, forwarding_payload(_plain(internals.job_payload(job))))
        return job

    internals.wrap_batch_create_job(step_name, build)


def create_gang_job(create: Callable[..., Any], step_name: str, nodes: int, queue: str) -> Any:
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


def _make_gang_job(batch: Any, job: Any, a: Dict[str, Any], step: GangStep) -> None:
    cli = internals.TrampolineCli(step.step_name)
    identity = trampoline.submitted_identity(cli)
    entrypoint, top_args = trampoline.trampoline_entrypoint(cli)
    options = trampoline.submitted_options(step.step_name, identity,
                                           trampoline.input_path_vars(a["env"]), NODE_INDEX_WORD)
    agent_cli = trampoline.agent_shell_command(entrypoint, top_args, step.step_name, options)
    agent_task_spec = dict(a["task_spec"], task_id=str(options.task_id))
    agent_command = internals.batch_command(batch, a, step.step_name, agent_cli, agent_task_spec)
    agent_env = spin_env_additions(os.environ, AgentOrder(step.blueprint, BACKEND.name),
                                   step.decorator_name)
    built = gang_payload(_plain(internals.job_payload(job)), step.topology.nodes,
                         trampoline.plan_env(MAIN_NODE_ENV, step.step_name, step.topology.nodes),
                         agent_command, agent_env)
    internals.submit_as_built(job, built)  # no command rewriting in execute()
