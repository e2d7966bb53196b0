"""AWS Step Functions: a gang of N > 1 nodes is one multi-node AWS Batch job in the state machine.

`step-functions create` builds each step's job with Metaflow's own `Batch.create_job` and turns
it into a `batch:submitJob.sync` state with `State.batch`. In that process we wrap both, for the
gang's step only: the job gets N nodes, node 0 runs Metaflow's own step command and nodes
1..N-1 the node agent (batch.gang_payload, as `run --with batch` does), and the state sends
NodeOverrides instead of ContainerOverrides. Both wrappers are in internals.py
(tests/unit/test_stepfunctions.py and tests/unit/test_internals_contract.py pin them).

At run time every node of a multi-node job sees AWS_BATCH_JOB_ID as `<job id>#<node index>`,
while the next state reads the task id from the job's `JobId` (no suffix): every node's command
first drops the suffix. The run id, task id and attempt exist only then, so node 0 and the
agents derive the gang's id and store port from them on their node, as on every remote backend
(trampoline.attempt_of).
"""

from typing import Any, Callable, Dict, List, Mapping, Optional

from ..core import naming
from ..core.errors import TorchDistributedConfigError
from ..core.gangspec import AgentOrder
from ..mf import internals
from ..mf.spinstep import Shell, SpinOptions, shell_text, spin_env_additions, spin_step_words
from ..core.supported import compile_error
from . import batch, trampoline
from .base import Backend, GangStep

# Runs the command after it with AWS_BATCH_JOB_ID stripped of its `#<node index>` suffix.
BARE_JOB_ID = ["bash", "-c", 'export AWS_BATCH_JOB_ID="${AWS_BATCH_JOB_ID%%#*}"; exec "$@"',
               "bash"]
# The agent's hidden task id, in shell words its node expands.
AGENT_TASK_ID = naming.hidden_task_id("${AWS_BATCH_JOB_ID}", "${%s}" % batch.NODE_INDEX)
# Options of Metaflow's `step` command the agent's spin-step takes too: SpinOptions' field.
_STEP_OPTIONS = {"--run-id": "run_id", "--input-paths": "input_paths",
                 "--retry-count": "retry_count", "--max-user-code-retries":
                 "max_user_code_retries", "--split-index": "split_index"}


# -- pure parts -----------------------------------------------------------------------------

def check_step(step_name: str, graph: Any, nodes: int) -> None:
    """Refuse a gang on the steps whose Step Functions command does more than run the task."""
    node = graph[step_name]
    if step_name == graph.start_step or node.type == "join":
        raise TorchDistributedConfigError(
            step_name, "a gang of %d nodes cannot be deployed to AWS Step Functions on a %s "
            "step: its state sets up the task's inputs before the step runs, where the gang's "
            "other nodes would not see them. Give the gang a linear step of its own, or use "
            "nodes=1." % (nodes, "start" if step_name == graph.start_step else "join"))


def agent_words(step_cli: str, step_name: str, orig_datastore: str) -> List[str]:
    """The node agent's command, as shell words, from Metaflow's step command for Step
    Functions (`<python> <flow> <top-level options> step <name> --option value ...`). Its
    values are shell words the node expands (`sfn-$METAFLOW_RUN_ID`,
    `$((AWS_BATCH_JOB_ATTEMPT-1))`); they are kept as they are."""
    words = step_cli.split()
    if "&&" in words or "step" not in words:
        raise compile_error(step_name, "the step's Step Functions command is not a single "
                            "`step` command: %r" % step_cli)
    at = words.index("step")
    if words[at + 1] != step_name:
        raise compile_error(step_name, "the step's Step Functions command runs another step: "
                            "%r" % step_cli)
    options = words[at + 2:]
    values = {field: Shell(options[options.index(name) + 1])
              for name, field in _STEP_OPTIONS.items() if name in options}
    missing = sorted(name for name, field in _STEP_OPTIONS.items()
                     if field not in values and field != "split_index")
    if missing:
        raise compile_error(step_name, "the step's Step Functions command has no %s: %r"
                            % (", ".join(missing), step_cli))
    namespaces = [w[len("--namespace="):] for w in options if w.startswith("--namespace=")]
    spin = SpinOptions(task_id=Shell(AGENT_TASK_ID), orig_datastore=orig_datastore,
                       namespace=Shell(namespaces[0]) if namespaces else None, **values)
    return [*map(Shell, words[:at]), *spin_step_words(step_name, spin)]


def node_payload(payload: Dict[str, Any], nodes: int, step_name: str, agent_command: List[str],
                 agent_env: Mapping[str, str]) -> Dict[str, Any]:
    """The SubmitJob payload of the gang's state: batch.gang_payload, with every node's
    command run under BARE_JOB_ID."""
    built = batch.gang_payload(payload, nodes,
                               trampoline.plan_env(batch.MAIN_NODE_ENV, step_name, nodes),
                               agent_command, agent_env)
    for override in built["nodeOverrides"]["nodePropertyOverrides"]:
        container = override["containerOverrides"]
        container["command"] = BARE_JOB_ID + list(container["command"])
    return built


# -- the compiler's job and state (through internals.py) -------------------------------------

class StepFunctionsBackend(Backend):
    """`step-functions create`: a gang of N > 1 nodes is one multi-node AWS Batch job of the
    state machine; at run time its nodes are placed as AWS Batch's (batch.BatchBackend)."""

    name = "step-functions"

    def install(self, step: GangStep, environ: Mapping[str, str],
                deploy_target: Optional[str]) -> None:
        if deploy_target == self.name and step.topology.nodes > 1:
            install(step)


BACKEND = StepFunctionsBackend()


def install(step: GangStep) -> None:
    """In the `step-functions create` process: compile this step into one N-node Batch job."""
    step_name, nodes = step.step_name, step.topology.nodes
    check_step(step_name, step.graph, nodes)

    def build(create: Callable[..., Any], batch_obj: Any, create_args: Dict[str, Any]) -> Any:
        job = batch.create_gang_job(create, step_name, nodes, create_args["queue"])
        words = agent_words(create_args["step_cli"], step_name,
                            internals.batch_orig_datastore(batch_obj))
        agent_command = internals.batch_command(
            batch_obj, create_args, step_name, shell_text(words),
            dict(create_args["task_spec"], task_id=AGENT_TASK_ID))
        agent_env = spin_env_additions({}, AgentOrder(step.blueprint, batch.BACKEND.name),
                                       step.decorator_name)
        built = node_payload(batch._plain(internals.job_payload(job)), nodes, step_name,
                             agent_command, agent_env)
        internals.submit_as_built(job, built)  # no command rewriting in execute()
        return job

    def node_overrides(payload: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
        if "nodeOverrides" not in payload:
            return None
        return batch._plain(payload["nodeOverrides"])

    internals.wrap_batch_create_job(step_name, build)
    internals.wrap_state_machine_job(node_overrides)
