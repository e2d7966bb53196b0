"""What the process that submits a multi-node step (`batch step` or `kubernetes step`, the
trampoline) builds for every remote backend alike: the node agent's GangSpec and shell command,
and the plan node 0 finds in its environment."""

import json
import os
import re
import sys
from dataclasses import replace

from ..core import naming
from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import GangSpec, TaskIdentity
from ..mf.spinstep import nested_word, spin_step_options
from ..mf.versions import compile_error

_INPUT_PATHS_VAR = re.compile(r"^METAFLOW_INPUT_PATHS_(\d+)$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


def agent_shell_command(entrypoint, top_args, step_name, identity, input_path_vars,
                        hidden_pattern):
    """The shell text that starts the node agent on nodes 1..N-1: a hidden spin-step of the
    task, under the id `hidden_pattern % <task id>` (`<task id>-node-<node index>`, the index
    a shell expansion on the node), reading the task's inputs from the same
    METAFLOW_INPUT_PATHS_<i> variables the task's own command reads."""
    if not _SAFE_ID.match(identity.task_id):
        raise compile_error(step_name, "the task id %r is not one Metaflow makes (letters, "
                            "digits, '-', '_' and '.')" % identity.task_id)
    inputs = "".join("${%s}" % name for name in input_path_vars)
    hidden = hidden_pattern % identity.task_id
    words = spin_step_options(step_name, replace(identity, input_paths=inputs), hidden)
    # bash expands these two words on the node; every other word is quoted
    quoted = [w if w in (inputs, hidden) else nested_word(w) for w in words]
    return " ".join([entrypoint, *top_args, "spin-step", *quoted])


def input_path_vars(env):
    """Names of the METAFLOW_INPUT_PATHS_<i> variables Metaflow's `batch step`/`kubernetes step` split the inputs into, in order."""
    found = [(int(m.group(1)), name) for name in env for m in [_INPUT_PATHS_VAR.match(name)] if m]
    return [name for _, name in sorted(found)]


def main_node_env(environ, name, step_name):
    """The gang's plan that the submission put in node 0's environment variable `name`, when
    this process is node 0 of `step_name`'s job (AWS Batch or a Kubernetes JobSet), else None."""
    raw = environ.get(name)
    if raw is None:
        return None
    plan = json.loads(raw)
    return plan if plan["step"] == step_name else None


def trampoline_agent_spec(cli, step_name, spec_fields, backend):
    """(TaskIdentity, agent GangSpec) of the task a `batch step` or `kubernetes step` process
    (`cli`, internals.TrampolineCli) submits; the agent's node and master address are filled
    in on its node. The store's port is fixed by run, step, task and attempt; the attempt's
    secret is drawn by node 0 when the attempt starts, and the agent reads it from the run's
    datastore on its node (attempt_secret.py): the submission never holds it."""
    params = cli.params
    retry_count = int(params.get("retry_count") or 0)
    identity = TaskIdentity(
        run_id=str(params["run_id"]),
        task_id=str(params["task_id"]),
        input_paths="",  # each agent takes its own command line's (see resolve_node)
        split_index=None if params.get("split_index") is None else int(params["split_index"]),
        retry_count=retry_count,
        max_user_code_retries=int(params.get("max_user_code_retries") or 0),
        namespace=params.get("namespace"),
        orig_datastore=cli.orig_datastore,
    )
    port = naming.remote_port(identity.run_id, step_name, identity.task_id, retry_count)
    spec = GangSpec(**spec_fields, role="agent", node=-1, master_addr="", master_port=port,
                    gang_id=naming.gang_id(identity.run_id, step_name, identity.task_id,
                                           retry_count), secret="",
                    restart_count=0, work_dir="", task=identity.__dict__,
                    top_args=[], backend=backend)
    return identity, spec


def trampoline_entrypoint(cli, step_name):
    """(entrypoint, top-level options) of the step's command in its container, as Metaflow's
    `batch step` and `kubernetes step` build them."""
    return "%s -u %s" % (cli.executable, os.path.basename(sys.argv[0])), cli.top_args


# -- jobs compiled before their runs exist (Step Functions, Argo Workflows) ----------------------

def compiled_agent_spec(spec_fields, backend):
    """The GangSpec every agent node of a job compiled at deploy time is given: what is known
    before the run exists; its empty gang_id says so (compiled_place). Like every remote
    agent's, it holds no secret: the agent reads the attempt's from the run's datastore."""
    return GangSpec(**spec_fields, role="agent", node=-1, master_addr="", master_port=0,
                    gang_id="", secret="", restart_count=0, work_dir="", task={}, top_args=[],
                    backend=backend)


def attempt_port(step_name, identity):
    """The store port of the attempt `identity` of a job compiled before its run existed: node
    0 and every agent derive the same from the task's run, id and attempt; a retry another."""
    return naming.remote_port(identity.run_id, step_name, identity.task_id,
                              identity.retry_count)


def compiled_place(spec, params, node, task):
    """The GangSpec fields an agent of a job compiled before its run existed (`spec.gang_id`
    empty) takes from its spin-step's options `params` (its hidden task id ends in
    `-node-<node>`): the task's identity, the gang id and the attempt's port. {} for an agent
    whose submission already knew them."""
    if spec.gang_id:
        return {}
    task_id = str(params["task_id"])
    suffix = "-node-%d" % node
    if not task_id.endswith(suffix):
        raise TorchDistributedEnvironmentError(
            spec.step_name, "unexpected task id %r for the agent of node %d." % (task_id, node))
    retry = int(params.get("retry_count") or 0)
    split = params.get("split_index")
    task.update(run_id=str(params["run_id"]), task_id=task_id[:-len(suffix)],
                split_index=None if split in (None, "") else int(split), retry_count=retry,
                max_user_code_retries=int(params.get("max_user_code_retries") or 0),
                # spin-step's click name for --namespace
                namespace=params.get("opt_namespace"),
                orig_datastore=params["orig_flow_datastore"])
    return dict(gang_id=naming.gang_id(task["run_id"], spec.step_name, task["task_id"], retry),
                master_port=attempt_port(spec.step_name, TaskIdentity(**task)),
                restart_count=0)
