"""AWS Batch: a gang of N > 1 nodes runs as one multi-node parallel job.

Metaflow's Batch path stays in charge (job queue, image, resources, code package, log tailing,
metadata sync, retries). In the process that submits the job (`batch step`, the trampoline)
we wrap `Batch.create_job`: Metaflow builds the job with N nodes, then node 0 keeps the task's
own, unchanged command (right task id and split index, also inside a foreach) and nodes
1..N-1 get the node agent's command, a hidden `spin-step` of the same task. Nothing is edited
in a command string; see reference/metaflow_internals.md, sections 4 and 5 (option D).

On the nodes: node 0 is the Metaflow task and hosts the gang's store on a port fixed by run,
step, task and attempt (`naming.remote_port`); the agents find it through
AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS, which AWS Batch sets on child nodes only.
"""

import copy
import errno
import inspect
import json
import os
import re
import shlex
import socket
import sys
import tempfile
from dataclasses import replace

from . import naming
from .errors import TorchDistributedConfigError, TorchDistributedEnvironmentError
from .launch import GangSpec, TaskIdentity, spin_env_additions, spin_step_options

# Set by the decorator's runtime_step_cli on the trampoline of a multi-node step (the step's name).
TRAMPOLINE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_STEP"
# In node 0's job environment: {"step": .., "nodes": N, "master_port": P}.
MAIN_NODE_ENV = "METAFLOW_TORCH_DISTRIBUTED_BATCH_MAIN"

NODE_INDEX = "AWS_BATCH_JOB_NODE_INDEX"
NUM_NODES = "AWS_BATCH_JOB_NUM_NODES"
MAIN_NODE_ADDRESS = "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"

# The shell words of an agent's command that bash expands on its node.
_AGENT_TASK_ID = "%s-node-$" + NODE_INDEX
_INPUT_PATHS_VAR = re.compile(r"^METAFLOW_INPUT_PATHS_(\d+)$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


# -- pure parts: what the job looks like ------------------------------------------------------

def gang_payload(payload, nodes, main_env, agent_command, agent_env):
    """The SubmitJob payload of an N-node gang from the one Metaflow built for the task (whose
    job definition already has N nodes): node 0 runs the task's own command, nodes 1..N-1 the
    node agent's. With one node the payload is the task's, unchanged."""
    payload = copy.deepcopy(payload)
    if nodes == 1:
        return payload
    task = payload.pop("containerOverrides")
    main = copy.deepcopy(task)
    main["environment"] = _merged_env(main.get("environment", []), main_env)
    agent = copy.deepcopy(task)
    agent["command"] = list(agent_command)
    agent["environment"] = _merged_env(agent.get("environment", []), agent_env)
    payload["nodeOverrides"] = {"nodePropertyOverrides": [
        {"targetNodes": "0:0", "containerOverrides": main},
        {"targetNodes": "1:%d" % (nodes - 1), "containerOverrides": agent},
    ]}
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


def agent_shell_command(entrypoint, top_args, step_name, identity, input_path_vars,
                        hidden_pattern=_AGENT_TASK_ID):
    """The shell text that starts the node agent on nodes 1..N-1: a hidden spin-step of the
    task, under the id `hidden_pattern % <task id>` (`<task id>-node-<node index>`, the index
    a shell expansion on the node), reading the task's inputs from the same
    METAFLOW_INPUT_PATHS_<i> variables the task's own command reads."""
    if not _SAFE_ID.match(identity.task_id):
        raise ValueError("unexpected task id %r" % identity.task_id)
    inputs = "".join("${%s}" % name for name in input_path_vars)
    hidden = hidden_pattern % identity.task_id
    words = spin_step_options(step_name, replace(identity, input_paths=inputs), hidden)
    # bash expands these two words on the node; every other word is quoted
    quoted = [w if w in (inputs, hidden) else shlex.quote(w) for w in words]
    return " ".join([entrypoint, *top_args, "spin-step", *quoted])


def input_path_vars(env):
    """Names of the METAFLOW_INPUT_PATHS_<i> variables batch_cli split the inputs into, in order."""
    found = [(int(m.group(1)), name) for name in env for m in [_INPUT_PATHS_VAR.match(name)] if m]
    return [name for _, name in sorted(found)]


def main_node_plan(environ, step_name):
    """(nodes, port) when this process is node 0 of this step's multi-node job, else None.
    The port is None when the job was compiled before its run existed (Step Functions): node 0
    derives it from its task (naming.remote_port), as its agents do (resolve_node)."""
    raw = environ.get(MAIN_NODE_ENV)
    if raw is None:
        return None
    plan = json.loads(raw)
    if plan["step"] != step_name:
        return None
    found = int(environ.get(NUM_NODES, "0") or 0)
    if found != plan["nodes"]:
        raise TorchDistributedEnvironmentError(
            step_name, "the gang needs %d nodes but this AWS Batch job has %s (%s=%r). The "
            "job was not submitted by this version of @torch_distributed; rerun the step."
            % (plan["nodes"], found, NUM_NODES, environ.get(NUM_NODES)))
    return plan["nodes"], plan["master_port"]


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
    fields = {}
    if not spec.gang_id:
        task_id = str(params["task_id"])
        suffix = "-node-%d" % node
        if not task_id.endswith(suffix):
            raise ValueError("unexpected agent task id %r" % task_id)
        retry = int(params.get("retry_count") or 0)
        task.update(run_id=str(params["run_id"]), task_id=task_id[:-len(suffix)],
                    split_index=params.get("split_index"), retry_count=retry,
                    max_user_code_retries=int(params.get("max_user_code_retries") or 0),
                    namespace=params.get("namespace"),
                    orig_datastore=params["orig_flow_datastore"])
        fields = dict(
            gang_id=naming.gang_id(task["run_id"], spec.step_name, task["task_id"], retry),
            master_port=naming.remote_port(task["run_id"], spec.step_name, task["task_id"],
                                           retry),
            restart_count=retry)
    return replace(spec, node=node, master_addr=master_addr, task=task, top_args=top_args,
                   work_dir=tempfile.mkdtemp(prefix="torch-distributed-"), **fields)


def port_in_use_error(step_name, port):
    return TorchDistributedEnvironmentError(
        step_name, "port %d on node 0, where the gang's rendezvous store listens, is taken by "
        "another process on this instance. The port is derived from the run, step, task and "
        "attempt: a @retry moves to another one. If instances are shared between jobs, keep "
        "ports %d-%d free for gangs." % ((port,) + naming.REMOTE_PORT_RANGE))


def is_port_in_use(ex):
    return isinstance(ex, OSError) and ex.errno == errno.EADDRINUSE


# -- the trampoline: wrapping Metaflow's job construction ---------------------------------------

def install_trampoline(step_name, nodes, spec_fields, decorator_name):
    """In the `batch step` process of this step: make Batch submit an N-node job whose child
    nodes run the node agent. `spec_fields` are the GangSpec fields known before submission."""
    from metaflow.plugins.aws.batch.batch import Batch

    create_job = Batch.create_job
    launch_job = Batch.launch_job
    create_sig = inspect.signature(create_job)

    def gang_create_job(self, *args, **kwargs):
        call = create_sig.bind(self, *args, **kwargs)
        call.apply_defaults()
        a = call.arguments
        if a["step_name"] != step_name:
            return create_job(self, *args, **kwargs)
        job = create_gang_job(create_job, self, {k: v for k, v in a.items() if k != "self"},
                              step_name, nodes)
        _make_gang_job(self, job, a, step_name, nodes, spec_fields, decorator_name)
        return job

    def gang_launch_job(self, *args, **kwargs):
        result = launch_job(self, *args, **kwargs)
        if self.job is not None and getattr(self, "_torch_distributed_nodes", None):
            self.num_parallel = self._torch_distributed_nodes  # wait() shows child nodes
        return result

    Batch.create_job = gang_create_job
    Batch.launch_job = gang_launch_job


def create_gang_job(create_job, batch, kwargs, step_name, nodes):
    """Metaflow's `Batch.create_job(**kwargs)` of an N-node job (its job definition has N
    nodes, node 0 the main one). AWS Batch runs multi-node jobs on EC2 only: a Fargate queue
    is refused with the fix."""
    from metaflow.plugins.aws.batch.batch_client import BatchJobException

    try:
        return create_job(batch, **dict(kwargs, num_parallel=nodes))
    except BatchJobException as ex:
        if "Fargate" in str(ex):
            raise TorchDistributedConfigError(
                step_name, "the gang needs %d nodes, and AWS Batch runs multi-node jobs "
                "on EC2 compute environments only; job queue %r is Fargate. Use a queue "
                "on an EC2 compute environment (@batch(queue=...) or METAFLOW_BATCH_JOB_"
                "QUEUE), or nodes=1." % (nodes, kwargs["queue"])) from ex
        raise


def trampoline_agent_spec(ctx, step_name, spec_fields, backend):
    """(TaskIdentity, agent GangSpec) of the task a `batch step` or `kubernetes step` process
    (click context `ctx`) submits; the agent's node and master address are filled in on its
    node. The store's port is fixed by run, step, task and attempt."""
    params = ctx.params
    retry_count = int(params.get("retry_count") or 0)
    identity = TaskIdentity(
        run_id=str(params["run_id"]),
        task_id=str(params["task_id"]),
        input_paths="",  # each agent takes its own command line's (see resolve_node)
        split_index=None if params.get("split_index") is None else int(params["split_index"]),
        retry_count=retry_count,
        max_user_code_retries=int(params.get("max_user_code_retries") or 0),
        namespace=params.get("namespace"),
        orig_datastore="%s@%s" % (ctx.obj.flow_datastore.TYPE,
                                  ctx.obj.flow_datastore.datastore_root),
    )
    port = naming.remote_port(identity.run_id, step_name, identity.task_id, retry_count)
    spec = GangSpec(**spec_fields, role="agent", node=-1, master_addr="", master_port=port,
                    gang_id=naming.gang_id(identity.run_id, step_name, identity.task_id,
                                           retry_count),
                    restart_count=retry_count, work_dir="", task=identity.__dict__,
                    top_args=[], backend=backend)
    return identity, spec


def trampoline_entrypoint(ctx, step_name):
    """(entrypoint, top-level options) of the step's command in its container, as Metaflow's
    `batch step` and `kubernetes step` build them."""
    from metaflow import util

    executable = ctx.obj.environment.executable(step_name, ctx.params.get("executable"))
    entrypoint = "%s -u %s" % (executable, os.path.basename(sys.argv[0]))
    return entrypoint, list(util.dict_to_cli_options(ctx.parent.parent.params))


def _make_gang_job(batch, job, a, step_name, nodes, spec_fields, decorator_name):
    from metaflow._vendor import click

    ctx = click.get_current_context()
    identity, spec = trampoline_agent_spec(ctx, step_name, spec_fields, "batch")
    port = spec.master_port
    agent_cli = agent_shell_command(*trampoline_entrypoint(ctx, step_name), step_name, identity,
                                    input_path_vars(a["env"]))
    agent_task_spec = dict(a["task_spec"], task_id=_AGENT_TASK_ID % identity.task_id)
    agent_command = batch._command(batch.environment, a["code_package_metadata"],
                                   a["code_package_url"], step_name, [agent_cli],
                                   agent_task_spec, a.get("offload_command_to_s3", False))
    main_env = {MAIN_NODE_ENV: json.dumps({"step": step_name, "nodes": nodes,
                                           "master_port": port})}
    agent_env = spin_env_additions(os.environ, spec, decorator_name)
    built = gang_payload(_plain(job.payload), nodes, main_env, agent_command, agent_env)
    job.payload.clear()
    job.payload.update(built)
    job.num_parallel = 0  # submit the payload as built: no command rewriting in execute()
    batch._torch_distributed_nodes = nodes
