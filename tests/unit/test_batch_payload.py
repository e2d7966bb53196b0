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
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import GangSpec, \
    TaskIdentity
from tests.emulation.aws import validate_request

MAIN_ENV = {batch.MAIN_NODE_ENV: '{"step": "train", "nodes": 2, "master_port": 23456}'}
AGENT_ENV = {"METAFLOW_TORCH_DISTRIBUTED_MEMBER": "{}", "METAFLOW_SPIN_ALLOWED_DECORATORS": "[]"}
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


def test_agent_command_golden():
    cmd = trampoline.agent_shell_command(
        "python -u flow.py", ["--datastore", "s3", "--with", "'batch:cpu=1'"], "train",
        IDENTITY, ["METAFLOW_INPUT_PATHS_0", "METAFLOW_INPUT_PATHS_1"], batch.AGENT_TASK_ID)
    assert cmd == (
        "python -u flow.py --datastore s3 --with 'batch:cpu=1' spin-step train --run-id 5 "
        "--task-id 7-node-$AWS_BATCH_JOB_NODE_INDEX "
        "--input-paths ${METAFLOW_INPUT_PATHS_0}${METAFLOW_INPUT_PATHS_1} "
        "--retry-count 1 --max-user-code-retries 2 --orig-flow-datastore s3@s3://bucket/mf "
        "--no-persist --namespace user:me")


def test_agent_command_quotes_what_bash_must_not_expand():
    identity = TaskIdentity(**{**IDENTITY.__dict__, "namespace": "a b$c", "split_index": 3})
    cmd = trampoline.agent_shell_command("python -u flow.py", [], "train", identity,
                                         ["METAFLOW_INPUT_PATHS_0"], batch.AGENT_TASK_ID)
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
    text = trampoline.agent_shell_command("printf '%s\\n'", [spinstep.nested_word(value)],
                                          "train", identity, ["METAFLOW_INPUT_PATHS_0"],
                                          batch.AGENT_TASK_ID)
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
        trampoline.agent_shell_command("python", [], "train", identity, [], batch.AGENT_TASK_ID)


def test_input_path_variables_in_numeric_order():
    env = {"METAFLOW_INPUT_PATHS_10": "", "METAFLOW_INPUT_PATHS_2": "", "OTHER": "",
           "METAFLOW_INPUT_PATHS_0": ""}
    assert trampoline.input_path_vars(env) == ["METAFLOW_INPUT_PATHS_0", "METAFLOW_INPUT_PATHS_2",
                                          "METAFLOW_INPUT_PATHS_10"]


def test_main_node_plan():
    env = {batch.MAIN_NODE_ENV: MAIN_ENV[batch.MAIN_NODE_ENV], batch.NUM_NODES: "2"}
    assert batch.main_node_plan(env, "train") == (2, 23456)
    assert batch.main_node_plan(env, "other") is None
    assert batch.main_node_plan({}, "train") is None
    with pytest.raises(TorchDistributedEnvironmentError, match="needs 2 nodes but this AWS "
                       "Batch job has 3"):
        batch.main_node_plan(dict(env, **{batch.NUM_NODES: "3"}), "train")


def agent_spec():
    return GangSpec(role="agent", step_name="train", nodes=2, nproc_per_node=2, node=-1,
                    master_addr="", master_port=23456, gang_id="g", secret="s", restart_count=0,
                    accelerator="auto", rendezvous_timeout_s=60.0, finish_timeout_s=60.0, start_method="auto",
                    work_dir="", task=dict(IDENTITY.__dict__, input_paths=""), top_args=[],
                    backend="batch")


def test_resolve_node_fills_in_the_nodes_place():
    env = {batch.NODE_INDEX: "1", batch.MAIN_NODE_ADDRESS: "10.0.0.5"}
    spec = batch.resolve_node(agent_spec(), env, {"input_paths": "5/start/1"}, ["--quiet"])
    assert (spec.node, spec.master_addr, spec.top_args) == (1, "10.0.0.5", ["--quiet"])
    assert spec.task["input_paths"] == "5/start/1" and spec.work_dir
    with pytest.raises(TorchDistributedEnvironmentError, match="outside an AWS Batch"):
        batch.resolve_node(agent_spec(), {batch.NODE_INDEX: "1"}, {}, [])


def test_remote_port_is_fixed_per_attempt_and_in_range():
    low, high = naming.REMOTE_PORT_RANGE
    ports = {naming.remote_port("5", "train", "7", a) for a in range(20)}
    assert all(low <= p <= high for p in ports)
    assert len(ports) > 15  # attempts move to other ports
    assert naming.remote_port("5", "train", "7", 0) == naming.remote_port("5", "train", "7", 0)


def test_a_busy_port_is_a_clear_error():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        Topology

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        leader = Leader("train", Topology(2, 1), {"backend": "batch", "master_addr": "127.0.0.1"},
                        1.0, "torch_distributed", port=port)
        with pytest.raises(TorchDistributedEnvironmentError, match="port %d on node 0" % port):
            leader._bind()
    finally:
        holder.close()


def test_node_0_listens_on_its_own_address_only_and_says_so_when_it_is_not_its_own():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import Leader
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        Topology

    leader = Leader("train", Topology(2, 1), {"backend": "batch", "master_addr": "127.0.0.1"},
                    1.0, "torch_distributed", port=0)
    with leader._bind() as listener:
        assert listener.getsockname()[0] == "127.0.0.1"  # not 0.0.0.0
    # an address of no interface of this machine (TEST-NET-3, RFC 5737)
    leader = Leader("train", Topology(2, 1), {"backend": "batch", "master_addr": "203.0.113.9"},
                    1.0, "torch_distributed", port=0)
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
