"""Step Functions' multi-node gang (stepfunctions.py): the pure parts, and the contract of the
Metaflow internals it wraps (a change in Metaflow fails here, by name)."""

import inspect
import json
import subprocess

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedCompileError,
)

import metaflow  # noqa: F401  (loads the extension)
from metaflow.plugins.aws.batch.batch import Batch
from metaflow.plugins.aws.batch.batch_client import BatchJob
from metaflow.plugins.aws.step_functions import step_functions
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    batch,
    stepfunctions,
    trampoline,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import gangspec, naming
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedConfigError
from tests import records
from tests.unit.test_batch_payload import AGENT_ENV

# Metaflow's step command for Step Functions (StepFunctions._step_cli), inside a foreach.
STEP_CLI = (
    "python flow.py --with 'batch:cpu=1' --quiet --datastore=s3 --with=step_functions_internal "
    "step train --run-id sfn-$METAFLOW_RUN_ID --task-id ${AWS_BATCH_JOB_ID} "
    "--retry-count $((AWS_BATCH_JOB_ATTEMPT-1)) --max-user-code-retries 2 "
    "--input-paths sfn-${METAFLOW_RUN_ID}/start/${METAFLOW_PARENT_TASK_ID} "
    "--split-index $METAFLOW_SPLIT_INDEX --tag a --namespace=user:me")


def test_agent_words_golden():
    words = stepfunctions.agent_words(STEP_CLI, "train", "s3@s3://bucket/mf")
    assert " ".join(words) == (
        "python flow.py --with 'batch:cpu=1' --quiet --datastore=s3 "
        "--with=step_functions_internal spin-step train "
        "--run-id sfn-$METAFLOW_RUN_ID "
        "--task-id ${AWS_BATCH_JOB_ID}-node-${AWS_BATCH_JOB_NODE_INDEX} "
        "--input-paths sfn-${METAFLOW_RUN_ID}/start/${METAFLOW_PARENT_TASK_ID} "
        "--retry-count $((AWS_BATCH_JOB_ATTEMPT-1)) --max-user-code-retries 2 "
        "--orig-flow-datastore s3@s3://bucket/mf --no-persist "
        "--split-index $METAFLOW_SPLIT_INDEX --namespace user:me")


@pytest.mark.parametrize("step_cli", [
    "python flow.py init --run-id x && python flow.py step train --run-id x",  # start's
    "python flow.py step other --run-id x",
    "python flow.py dump x",
])
def test_agent_words_refuse_what_is_not_the_steps_single_command(step_cli):
    with pytest.raises(TorchDistributedCompileError, match=r"step \*train\*: the step's Step "
                       "Functions command"):
        stepfunctions.agent_words(step_cli, "train", "s3@s3://bucket/mf")


def test_every_node_runs_with_the_bare_job_id():
    out = subprocess.run(stepfunctions.BARE_JOB_ID + ["bash", "-c", 'echo "$AWS_BATCH_JOB_ID"'],
                         env={"AWS_BATCH_JOB_ID": "0f1e-2d#1", "PATH": "/usr/bin:/bin"},
                         capture_output=True, text=True, check=True)
    assert out.stdout == "0f1e-2d\n"


def sfn_payload():
    """A SubmitJob payload as Metaflow's BatchJob builder makes it for Step Functions."""
    job = (BatchJob(client=None).job_name("SFN-F--train--").job_queue("q")
           .command(["bash", "-c", "task"]).image("img")
           .environment_variable("METAFLOW_RUN_ID", "$.Parameters.['metaflow.run_id']")
           .environment_variable("SFN_STATE_MACHINE", "F"))
    return batch._plain(job.payload)


def test_node_payload_keeps_step_functions_paths_and_tells_node_0_its_plan():
    got = stepfunctions.node_payload(sfn_payload(), 2, "train", ["bash", "-c", "agent"],
                                     AGENT_ENV)
    main, agent = got["nodeOverrides"]["nodePropertyOverrides"]
    # the bare job id's bash execs the SIGTERM forwarder, which stays the main process
    assert main["containerOverrides"]["command"] == stepfunctions.BARE_JOB_ID + \
        preempt.forwarding(["bash", "-c", "task"])
    assert agent["containerOverrides"]["command"] == stepfunctions.BARE_JOB_ID + \
        preempt.forwarding(["bash", "-c", "agent"])
    for node in (main, agent):
        env = node["containerOverrides"]["environment"]
        assert {"name": "METAFLOW_RUN_ID", "value.$": "$.Parameters.['metaflow.run_id']"} in env
    plan = {e["name"]: e.get("value") for e in main["containerOverrides"]["environment"]}
    assert json.loads(plan[batch.MAIN_NODE_ENV]) == {"step": "train", "nodes": 2}
    assert batch.planned_nodes({batch.MAIN_NODE_ENV: plan[batch.MAIN_NODE_ENV],
                                batch.NUM_NODES: "2"}, "train") == 2


def test_an_agent_takes_its_task_from_its_spin_step_and_meets_node_0():
    order = gangspec.AgentOrder(records.blueprint(), "batch")
    params = {"run_id": "sfn-x", "task_id": "0f1e-node-1", "input_paths": "sfn-x/start/a",
              "retry_count": 1, "max_user_code_retries": 2, "split_index": 3,
              "opt_namespace": "user:ana", "orig_flow_datastore": "s3@s3://b/mf"}
    env = {batch.NODE_INDEX: "1", batch.MAIN_NODE_ADDRESS: "10.0.0.5"}
    place = batch.BACKEND.agent_place(order, env)
    identity = trampoline.agent_identity("train", params, place.node)
    got = trampoline.agent_spec(order, place, identity, [], "secret", "cpu", "fork")
    # what node 0 computes from its own task (decorator._leader_step)
    assert got.attempt.gang_id == naming.gang_id("sfn-x", "train", "0f1e", 1)
    assert got.attempt.master_port == naming.remote_port("sfn-x", "train", "0f1e", 1)
    assert got.restart_count == 0  # the round within the attempt, as node 0's
    assert got.attempt.task.task_id == "0f1e" and got.attempt.task.split_index == 3
    assert got.attempt.task.namespace == "user:ana"  # exec'd members get the run's namespace
    retried = trampoline.agent_identity("train", dict(params, retry_count=2), 1)
    assert trampoline.attempt_port("train", retried) != got.attempt.master_port
    # node 0 places itself from the same job's plan and its own task: the same port, and a
    # secret it draws itself
    node_env = dict(trampoline.plan_env(batch.MAIN_NODE_ENV, "train", 2),
                    **{batch.NUM_NODES: "2", "MF_PARALLEL_MAIN_IP": "10.0.0.5"})
    node_zero = batch.BACKEND.node_zero(records.gang_step(), node_env,
                                        gangspec.TaskIdentity(
                                            run_id="sfn-x", task_id="0f1e", input_paths="",
                                            split_index=3, retry_count=1,
                                            max_user_code_retries=2, namespace=None,
                                            orig_datastore="s3@s3://b/mf"))
    assert (node_zero.master_addr, node_zero.port, node_zero.backend) == (
        "10.0.0.5", got.attempt.master_port, "batch")
    assert len(node_zero.secret) == 64


class _Node:
    def __init__(self, type_):
        self.type = type_


class _Graph(dict):
    start_step = "start"


@pytest.mark.parametrize("step, kind", [("start", "start"), ("join", "join")])
def test_gangs_on_start_and_joins_are_refused(step, kind):
    graph = _Graph(start=_Node("start"), join=_Node("join"), train=_Node("linear"))
    with pytest.raises(TorchDistributedConfigError) as refused:
        stepfunctions.check_step(step, graph, 2)
    assert ("step *%s*: a gang of 2 nodes cannot be deployed to AWS Step Functions on a %s "
            "step" % (step, kind)) in str(refused.value)
    stepfunctions.check_step("train", graph, 2)


# -- the contract with Metaflow -------------------------------------------------------------

def test_metaflow_builds_step_functions_jobs_as_wrapped():
    # StepFunctions._batch calls Batch(...).create_job(**keywords) with these
    params = inspect.signature(Batch.create_job).parameters
    for name in ("step_name", "step_cli", "task_spec", "code_package_metadata",
                 "code_package_url", "queue", "offload_command_to_s3", "num_parallel"):
        assert name in params, "Batch.create_job lost %r" % name
    source = inspect.getsource(step_functions.StepFunctions._batch)
    assert ".create_job(\n                step_name=node.name," in source, \
        "StepFunctions._batch no longer calls create_job with keywords only"
    assert list(inspect.signature(Batch._command).parameters) == [
        "self", "environment", "code_package_metadata", "code_package_url", "step_name",
        "step_cmds", "task_spec", "offload_command_to_s3"]
    # the step command the agent's is built from
    cli = inspect.getsource(step_functions.StepFunctions._step_cli)
    for part in ('"step",', '"--run-id sfn-$METAFLOW_RUN_ID"', '"--task-id %s" % task_id',
                 '"--retry-count $((AWS_BATCH_JOB_ATTEMPT-1))"', '"--input-paths %s" % paths',
                 '"--split-index $METAFLOW_SPLIT_INDEX"', 'return " && ".join(cmds)'):
        assert part in cli, "StepFunctions._step_cli changed: %s" % part


def test_metaflow_states_send_the_jobs_container_overrides(monkeypatch):
    monkeypatch.setattr(step_functions, "SFN_IAM_ROLE", "arn:aws:iam::1:role/sfn")
    job = BatchJob(client=None).job_name("j").job_queue("q").command(["x"]).attempts(1)
    job.payload["jobDefinition"] = "d"
    state = step_functions.State("train").batch(job)
    assert state.payload["Parameters"]["ContainerOverrides"] == {"Command": ["x"]}
    assert state.payload["Resource"].endswith(":states:::batch:submitJob.sync")
