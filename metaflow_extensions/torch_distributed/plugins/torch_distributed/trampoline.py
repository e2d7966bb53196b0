"""What the process that submits a multi-node step (`batch step` or `kubernetes step`, the
trampoline) builds for every remote backend alike: the node agent's GangSpec and shell command,
and the plan node 0 finds in its environment."""

import json
import os
import re
import shlex
import sys
from dataclasses import replace

from . import naming
from .gangspec import GangSpec, TaskIdentity
from .spinstep import spin_step_options

_INPUT_PATHS_VAR = re.compile(r"^METAFLOW_INPUT_PATHS_(\d+)$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


def agent_shell_command(entrypoint, top_args, step_name, identity, input_path_vars,
                        hidden_pattern):
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
    secret is drawn here and reaches the nodes in their job's environment only, never through
    the store."""
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
                                           retry_count), secret=naming.new_secret(),
                    restart_count=retry_count, work_dir="", task=identity.__dict__,
                    top_args=[], backend=backend)
    return identity, spec


def trampoline_entrypoint(cli, step_name):
    """(entrypoint, top-level options) of the step's command in its container, as Metaflow's
    `batch step` and `kubernetes step` build them."""
    return "%s -u %s" % (cli.executable, os.path.basename(sys.argv[0])), cli.top_args
