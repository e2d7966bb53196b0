"""What every remote backend builds alike, derived in one place: the plan node 0 finds in its
environment, the node agent's command, and the agent's place in its task and attempt.

A gang on other machines is submitted (`batch step`, `kubernetes step`: the trampoline) or
compiled (`step-functions create`, `argo-workflows create`) as one job whose node 0 runs the
task's own command, with the plan in its environment, and whose other nodes run the node
agent: a hidden spin-step of the same task, given an AgentOrder. Nothing else is passed: node
0 and every agent derive the attempt's id and store port from the task and attempt they run
(`naming`), and the agents read the attempt's secret from the run's datastore.
"""

import json
import re
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..core import naming
from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import AgentOrder, Attempt, GangSpec, Role, TaskIdentity
from ..mf.spinstep import Shell, SpinOptions, shell_text, spin_step_words
from ..core.supported import compile_error
from .base import AgentPlace

_INPUT_PATHS_VAR = re.compile(r"^METAFLOW_INPUT_PATHS_(\d+)$")
_SAFE_ID = re.compile(r"^[A-Za-z0-9_.-]+$")


# -- node 0's plan -------------------------------------------------------------------------------

def plan_env(name: str, step_name: str, nodes: int) -> Dict[str, str]:
    """The variable `name` of node 0's environment that says: this process is node 0 of
    `step_name`'s gang of `nodes` nodes."""
    return {name: json.dumps({"step": step_name, "nodes": nodes})}


def planned_nodes(environ: Mapping[str, str], name: str, step_name: str) -> Optional[int]:
    """The nodes of the gang whose node 0 this process is, by the plan the submission put in
    its environment variable `name` (plan_env), or None when it is not node 0 of
    `step_name`'s gang (another step's job, or no job of ours)."""
    raw = environ.get(name)
    if raw is None:
        return None
    plan = json.loads(raw)
    return int(plan["nodes"]) if plan["step"] == step_name else None


def checked_plan(environ: Mapping[str, str], name: str, step_name: str, count_var: str,
                 job: str, made: str = "submitted",
                 decorator: str = "@torch_distributed") -> Optional[int]:
    """planned_nodes, with the size the scheduler gave the job (its variable `count_var`)
    checked against the plan: a `job` (e.g. "AWS Batch job") of another size is refused."""
    nodes = planned_nodes(environ, name, step_name)
    if nodes is None:
        return None
    found = environ.get(count_var)
    if found != str(nodes):
        raise TorchDistributedEnvironmentError(
            step_name, "the gang needs %d nodes but this %s has %s (%s=%r). The %s was not %s "
            "by this version of %s; rerun the step." % (
                nodes, job, found, count_var, found, job.split()[-1], made, decorator))
    return nodes


def attempt_port(step_name: str, identity: TaskIdentity) -> int:
    """The store port of the attempt `identity` of a gang whose nodes are other machines: node
    0 and every agent derive the same from the task's run, id and attempt; a retry another."""
    return naming.remote_port(identity.run_id, step_name, identity.task_id,
                              identity.retry_count)


def attempt_of(step_name: str, identity: TaskIdentity, backend: str, master_addr: str,
               secret: str, top_args: Sequence[str],
               checkpoint: Optional[dict] = None) -> Attempt:
    """The attempt `identity` of `step_name`'s gang on `backend`, as each of its nodes knows it."""
    return Attempt(gang_id=naming.gang_id(identity.run_id, step_name, identity.task_id,
                                          identity.retry_count),
                   task=identity, backend=backend, master_addr=master_addr,
                   master_port=attempt_port(step_name, identity), secret=secret,
                   top_args=tuple(top_args), checkpoint=checkpoint)


# -- the node agent's command --------------------------------------------------------------------

def agent_shell_command(entrypoint: str, top_args: Sequence[str], step_name: str,
                        options: SpinOptions) -> str:
    """The shell text that starts the node agent on nodes 1..N-1: `entrypoint` and `top_args`
    as Metaflow writes them in the step's own command, then a hidden spin-step of the task."""
    return " ".join([entrypoint, *top_args, shell_text(spin_step_words(step_name, options))])


def submitted_options(step_name: str, identity: TaskIdentity, input_path_vars: Sequence[str],
                      node_word: str) -> SpinOptions:
    """The agent's spin-step options in a job submitted for the task `identity`: its id hidden
    under the node index its node expands (`node_word`), its inputs read from the same
    METAFLOW_INPUT_PATHS_<i> variables the task's own command reads."""
    if not _SAFE_ID.match(identity.task_id):
        raise compile_error(step_name, "the task id %r is not one Metaflow makes (letters, "
                            "digits, '-', '_' and '.')" % identity.task_id)
    return SpinOptions.of_task(
        identity, Shell(naming.hidden_task_id(identity.task_id, node_word)),
        input_paths=Shell("".join("${%s}" % name for name in input_path_vars)))


def input_path_vars(env: Mapping[str, str]) -> List[str]:
    """Names of the METAFLOW_INPUT_PATHS_<i> variables Metaflow's `batch step` and
    `kubernetes step` split the inputs into, in order."""
    found = [(int(m.group(1)), name) for name in env for m in [_INPUT_PATHS_VAR.match(name)] if m]
    return [name for _, name in sorted(found)]


def submitted_identity(cli: Any) -> TaskIdentity:
    """The task a `batch step` or `kubernetes step` process (`cli`, internals.TrampolineCli)
    submits; each agent takes its input paths from its own command line."""
    params = cli.params
    return TaskIdentity(
        run_id=str(params["run_id"]),
        task_id=str(params["task_id"]),
        input_paths="",
        split_index=None if params.get("split_index") is None else int(params["split_index"]),
        retry_count=int(params.get("retry_count") or 0),
        max_user_code_retries=int(params.get("max_user_code_retries") or 0),
        namespace=params.get("namespace"),
        orig_datastore=cli.orig_datastore,
    )


def trampoline_entrypoint(cli: Any) -> Tuple[str, List[str]]:
    """(entrypoint, top-level options) of the step's command in its container, as Metaflow's
    `batch step` and `kubernetes step` build them."""
    return "%s -u %s" % (cli.executable, cli.script), list(cli.top_args)


# -- the agent, on its node -----------------------------------------------------------------------

def agent_identity(step_name: str, params: Mapping[str, object], node: int) -> TaskIdentity:
    """The task the node agent of `node` belongs to, from its spin-step's options `params`
    (its hidden task id ends in `-node-<node>`)."""
    task_id = naming.task_of_agent(str(params["task_id"]), node)
    if task_id is None:
        raise TorchDistributedEnvironmentError(
            step_name, "unexpected task id %r for the agent of node %d." % (params["task_id"],
                                                                           node))
    split = params.get("split_index")
    return TaskIdentity(
        run_id=str(params["run_id"]), task_id=task_id,
        input_paths=str(params.get("input_paths") or ""),
        split_index=None if split in (None, "") else int(str(split)),
        retry_count=int(str(params.get("retry_count") or 0)),
        max_user_code_retries=int(str(params.get("max_user_code_retries") or 0)),
        namespace=_optional_str(params.get("opt_namespace")),  # spin-step's name for it
        orig_datastore=str(params["orig_flow_datastore"]))


def agent_spec(order: AgentOrder, place: AgentPlace, identity: TaskIdentity,
               top_args: Sequence[str], secret: str, accelerator: str,
               start_method: str) -> GangSpec:
    """The GangSpec of a node agent of `order` that found its `place` on its node, in the task
    `identity` (agent_identity)."""
    return GangSpec(Role.AGENT, order.blueprint,
                    attempt_of(order.blueprint.step_name, identity, order.backend,
                               place.master_addr, secret, top_args),
                    node=place.node, work_dir=tempfile.mkdtemp(prefix="torch-distributed-"),
                    accelerator=accelerator, start_method=start_method)


def _optional_str(value: object) -> Optional[str]:
    return None if value is None else str(value)
