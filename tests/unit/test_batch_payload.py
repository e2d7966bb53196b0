"""The AWS Batch job of a gang: pure payload building, checked against golden values and
against the AWS Batch API model that ships with botocore."""

import inspect
import json
import os
import shlex
import socket
import subprocess

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedCompileError,
)

import metaflow  # noqa: F401  (loads the extension)
from metaflow.plugins.aws.batch.batch import Batch
from metaflow.plugins.aws.batch.batch_client import BatchJob
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    batch,
    trampoline,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import spinstep
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedEnvironmentError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    AgentOrder,
    TaskIdentity,
)
from tests import records
from tests.emulation.aws import validate_request

MAIN_ENV = trampoline.plan_env(batch.MAIN_NODE_ENV, "train", 2)
AGENT_ENV = {"METAFLOW_TORCH_DISTRIBUTED_AGENT_ORDER": "{}", "METAFLOW_SPIN_ALLOWED_DECORATORS": "[]"}
AGENT_CMD = ["bash", "-c", "agent"]


def metaflow_payload():
    """A single-node SubmitJob payload as Metaflow's own BatchJob builder makes it."""
    job = (BatchJob(client=None).job_name("u-F-5-train-7-0").job_queue("q")
           .command(["bash", "-c", "task"]).image("img").cpu(4).gpu(1).memory(4096)
           .timeout_in_secs(3600).environment_variable("METAFLOW_RUN_ID", "5")
           .parameter("metaflow.step_name", "train").task_id("7"))
    job.payload["jobDefinition"] = "arn:aws:batch:us-east-1:1:job-definition/mf:1"
    return batch._plain(job.payload)


def validate(operation, params):
    validate_request("batch", operation, params)


def test_one_node_keeps_the_tasks_payload_its_command_under_the_sigterm_forwarder():
    payload = metaflow_payload()
    got = batch.gang_payload(payload, 1, MAIN_ENV, AGENT_CMD, AGENT_ENV)
    forwarded = dict(payload["containerOverrides"],
                     command=preempt.forwarding(["bash", "-c", "task"]))
    assert got == dict(payload, containerOverrides=forwarded)
    assert batch.forwarding_payload(payload) == got
    validate("SubmitJob", got)


def test_two_nodes_golden():
    got = batch.gang_payload(metaflow_payload(), 2, MAIN_ENV, AGENT_CMD, AGENT_ENV)
    task = metaflow_payload()["containerOverrides"]
    assert got == {
        "jobName": "u-F-5-train-7-0",
        "jobQueue": "q",
        "jobDefinition": "arn:aws:batch:us-east-1:1:job-definition/mf:1",
        "timeout": {"attemptDurationSeconds": 3600},
        "parameters": {"metaflow.step_name": "train"},
        "nodeOverrides": {"nodePropertyOverrides": [
            {"targetNodes": "0:0", "containerOverrides": {
                **task,
                "command": preempt.forwarding(task["command"]),
                "environment": task["environment"] + [
                    {"name": batch.MAIN_NODE_ENV, "value": MAIN_ENV[batch.MAIN_NODE_ENV]}]}},
            {"targetNodes": "1:1", "containerOverrides": {
                **task,
                "command": preempt.forwarding(AGENT_CMD),
                "environment": task["environment"] + [
                    {"name": k, "value": v} for k, v in AGENT_ENV.items()]}},
        ]},
    }
    assert "containerOverrides" not in got
    validate("SubmitJob", got)


def test_four_nodes_golden():
    got = batch.gang_payload(metaflow_payload(), 4, MAIN_ENV, AGENT_CMD, AGENT_ENV)
    ranges = got["nodeOverrides"]["nodePropertyOverrides"]
    assert [r["targetNodes"] for r in ranges] == ["0:0", "1:3"]
    assert ranges[0]["containerOverrides"]["command"] == preempt.forwarding(
        ["bash", "-c", "task"])
    assert ranges[1]["containerOverrides"]["command"] == preempt.forwarding(AGENT_CMD)
    validate("SubmitJob", got)


def test_the_input_payload_is_not_modified():
    payload = metaflow_payload()
    batch.gang_payload(payload, 3, MAIN_ENV, AGENT_CMD, AGENT_ENV)
    assert payload == metaflow_payload()


IDENTITY = TaskIdentity(run_id="5", task_id="7", input_paths="5/start/1", split_index=None,
                        retry_count=1, max_user_code_retries=2, namespace="user:me",
                        orig_datastore="s3@s3://bucket/mf")


def agent_command(entrypoint, top_args, identity, input_path_vars):
    options = trampoline.submitted_options("train", identity, input_path_vars,
                                           batch.NODE_INDEX_WORD)
    return trampoline.agent_shell_command(entrypoint, top_args, "train", options)


def test_agent_command_golden():
    cmd = agent_command("python -u flow.py", ["--datastore", "s3", "--with", "'batch:cpu=1'"],
                        IDENTITY, ["METAFLOW_INPUT_PATHS_0", "METAFLOW_INPUT_PATHS_1"])
    assert cmd == (
        "python -u flow.py --datastore s3 --with 'batch:cpu=1' spin-step train --run-id 5 "
        "--task-id 7-node-$AWS_BATCH_JOB_NODE_INDEX "
        "--input-paths ${METAFLOW_INPUT_PATHS_0}${METAFLOW_INPUT_PATHS_1} "
        "--retry-count 1 --max-user-code-retries 2 --orig-flow-datastore s3@s3://bucket/mf "
        "--no-persist --namespace user:me")


def test_agent_command_quotes_what_bash_must_not_expand():
    identity = TaskIdentity(**{**IDENTITY.__dict__, "namespace": "a b$c", "split_index": 3})
    cmd = agent_command("python -u flow.py", [], identity, ["METAFLOW_INPUT_PATHS_0"])
    assert "--namespace 'a b$c'" in cmd and "--split-index 3" in cmd


TRICKY = ["o'brien", 'say "hi"', "back\\slash", "$HOME", "`id`", "two  spaces", "a'\"b", "!x"]


def metaflow_runs(text, env=None):
    """The argv that `text` becomes on the node: Metaflow embeds it in
    shlex.split('bash -c "%s"' % command) (Batch._command, Kubernetes._command), then bash
    runs it; here with printf in place of the interpreter."""
    [bash, c, inner] = shlex.split('bash -c "%s"' % text)
    return subprocess.run([bash, c, inner], env=dict(os.environ, **(env or {})),
                          capture_output=True, text=True, check=True).stdout.splitlines()


@pytest.mark.parametrize("value", TRICKY)
def test_any_namespace_and_option_reach_the_agent_unchanged_through_metaflows_bash_c(value):
    identity = TaskIdentity(**{**IDENTITY.__dict__, "namespace": value,
                               "orig_datastore": "s3@s3://b/" + value})
    text = agent_command("printf '%s\\n'", [spinstep.nested_word(value)], identity,
                         ["METAFLOW_INPUT_PATHS_0"])
    words = metaflow_runs(text, {"METAFLOW_INPUT_PATHS_0": "5/start/1",
                                 "AWS_BATCH_JOB_NODE_INDEX": "1"})
    assert words[0] == value  # a top-level option's value
    assert words[words.index("--namespace") + 1] == value
    assert words[words.index("--orig-flow-datastore") + 1] == "s3@s3://b/" + value
    assert words[words.index("--task-id") + 1] == "7-node-1"  # still expanded on the node
    assert words[words.index("--input-paths") + 1] == "5/start/1"


def test_agent_command_refuses_an_unexpected_task_id():
    identity = TaskIdentity(**{**IDENTITY.__dict__, "task_id": "7; rm -rf /"})
    with pytest.raises(TorchDistributedCompileError, match=r"step \*train\*: the task id '7; rm -rf /' "
                       r"is not one Metaflow makes.*pip install 'metaflow>=2\.19\.0,<2\.20'"):
        agent_command("python", [], identity, [])


def test_input_path_variables_in_numeric_order():
    env = {"METAFLOW_INPUT_PATHS_10": "", "METAFLOW_INPUT_PATHS_2": "", "OTHER": "",
           "METAFLOW_INPUT_PATHS_0": ""}
    assert trampoline.input_path_vars(env) == ["METAFLOW_INPUT_PATHS_0", "METAFLOW_INPUT_PATHS_2",
                                          "METAFLOW_INPUT_PATHS_10"]


def test_the_plan_tells_node_0_of_its_step_and_the_nodes_it_needs():
    env = dict(MAIN_ENV, **{batch.NUM_NODES: "2"})
    assert batch.planned_nodes(env, "train") == 2
    assert batch.planned_nodes(env, "other") is None  # another step's job
    assert batch.planned_nodes({}, "train") is None
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 2 nodes but this AWS "
                       "Batch job has 3"):
        batch.planned_nodes(dict(env, **{batch.NUM_NODES: "3"}), "train")


def test_node_0_derives_the_port_its_agents_derive():
    env = dict(MAIN_ENV, **{batch.NUM_NODES: "2", "MF_PARALLEL_MAIN_IP": "10.0.0.5"})
    step = records.gang_step(nodes=2)
    place = batch.BACKEND.node_zero(step, env, IDENTITY)
    assert (place.master_addr, place.backend, len(place.secret)) == ("10.0.0.5", "batch", 64)
    assert place.port == naming.remote_port("5", "train", "7", 1)
    assert batch.BACKEND.node_zero(step, {}, IDENTITY) is None


def test_a_child_node_finds_its_place_and_its_task():
    env = {batch.NODE_INDEX: "1", batch.MAIN_NODE_ADDRESS: "10.0.0.5"}
    order = AgentOrder(records.blueprint(), "batch")
    place = batch.BACKEND.agent_place(order, env)
    assert (place.node, place.master_addr) == (1, "10.0.0.5")
    params = {"run_id": "5", "task_id": "7-node-1", "input_paths": "5/start/1",
              "retry_count": 1, "max_user_code_retries": 2, "opt_namespace": "user:me",
              "orig_flow_datastore": "s3@s3://bucket/mf", "split_index": None}
    assert trampoline.agent_identity("train", params, 1) == IDENTITY
    spec = trampoline.agent_spec(order, place, IDENTITY, ["--quiet"], "secret", "cpu", "fork")
    assert (spec.node, spec.attempt.master_addr, spec.attempt.top_args) == (
        1, "10.0.0.5", ("--quiet",))
    assert spec.attempt.gang_id == naming.gang_id("5", "train", "7", 1) and spec.work_dir
    assert spec.attempt.master_port == naming.remote_port("5", "train", "7", 1)
    with pytest.raises(TorchDistributedEnvironmentError, match="outside an AWS Batch"):
        batch.BACKEND.agent_place(order, {batch.NODE_INDEX: "1"})
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="unexpected task id '7-node-1' for the agent of node 2"):
        trampoline.agent_identity("train", params, 2)


def test_remote_port_is_fixed_per_attempt_and_in_range():
    low, high = naming.REMOTE_PORT_RANGE
    ports = {naming.remote_port("5", "train", "7", a) for a in range(20)}
    assert all(low <= p <= high for p in ports)
    assert len(ports) > 15  # attempts move to other ports
    assert naming.remote_port("5", "train", "7", 0) == naming.remote_port("5", "train", "7", 0)


def test_a_busy_port_is_a_clear_error():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        Topology

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        leader = records.leader(Topology(2, 1), backend="batch", master_addr="127.0.0.1",
                                master_port=port)
        with pytest.raises(TorchDistributedEnvironmentError, match="port %d on node 0" % port):
            leader._bind()
    finally:
        holder.close()


def test_node_0_listens_on_its_own_address_only_and_says_so_when_it_is_not_its_own():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        Topology

    leader = records.leader(Topology(2, 1), backend="batch", master_addr="127.0.0.1",
                            master_port=0)
    with leader._bind() as listener:
        assert listener.getsockname()[0] == "127.0.0.1"  # not 0.0.0.0
    # an address of no interface of this machine (TEST-NET-3, RFC 5737)
    leader = records.leader(Topology(2, 1), backend="batch", master_addr="203.0.113.9",
                            master_port=0)
    with pytest.raises(TorchDistributedEnvironmentError,
                       match=r"cannot listen .* on 203\.0\.113\.9, the address its other nodes"):
        leader._bind()


def test_the_metaflow_internals_we_wrap_have_the_shape_we_rely_on():
    """Fails loudly when a Metaflow release changes what batch.install_trampoline relies on."""
    create = inspect.signature(Batch.create_job).parameters
    for name in ("step_name", "task_spec", "code_package_metadata", "code_package_url",
                 "queue", "env", "num_parallel", "offload_command_to_s3"):
        assert name in create, name
    command = list(inspect.signature(Batch._command).parameters)
    assert command == ["self", "environment", "code_package_metadata", "code_package_url",
                       "step_name", "step_cmds", "task_spec", "offload_command_to_s3"]
    assert "num_parallel" in inspect.signature(Batch.launch_job).parameters
    assert isinstance(BatchJob(client=None).payload, dict)
    json.dumps(metaflow_payload())
