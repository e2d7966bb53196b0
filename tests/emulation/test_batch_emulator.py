"""The Batch emulator through a real boto3 client, with real processes."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from . import netns
from .aws import client
from .batch_jobs import MAIN_NODE_EXITED_REASON
from .hosts import is_node_address
from .probes import processes_of, wait_for

IMAGE = "python:3.11"
# A node's marks for the test, through moto's S3 (s3_mark.py: put NAME / wait NAME...), as nodes
# on separate instances would leave them: no folder of the test is a node's.
MARK = "python %s" % (Path(__file__).with_name("s3_mark.py"))


def batch_client(emulator):
    return client(emulator.endpoint_url, "batch")


def register_container(batch, name: str, command: list[str], environment=()) -> str:
    return batch.register_job_definition(
        jobDefinitionName=name,
        type="container",
        containerProperties={"image": IMAGE, "command": command, "environment": list(environment)},
    )["jobDefinitionArn"]


def register_multinode(batch, name: str, num_nodes: int, ranges: dict, environment=()) -> str:
    """`ranges` maps targetNodes to the command of that node range."""
    return batch.register_job_definition(
        jobDefinitionName=name,
        type="multinode",
        nodeProperties={
            "numNodes": num_nodes,
            "mainNode": 0,
            "nodeRangeProperties": [
                {
                    "targetNodes": target,
                    "container": {
                        "image": IMAGE,
                        "command": command,
                        "environment": list(environment),
                    },
                }
                for target, command in ranges.items()
            ],
        },
    )["jobDefinitionArn"]


def describe(batch, job_id: str) -> dict:
    return batch.describe_jobs(jobs=[job_id])["jobs"][0]


def wait_status(batch, job_id: str, *statuses: str, timeout_s: float = 10.0) -> dict:
    def probe():
        detail = describe(batch, job_id)
        return detail if detail["status"] in statuses else None

    return wait_for(probe, timeout_s, "%s to reach %s" % (job_id, "/".join(statuses)))


def env_var(name: str, value: str) -> dict:
    return {"name": name, "value": value}


def read_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines())


def sleeping_multinode_job(batch, aws, name: str, num_nodes: int) -> str:
    register_multinode(batch, name, num_nodes, {"0:": ["sleep", "60"]})
    return batch.submit_job(jobName=name, jobQueue=aws.queue, jobDefinition=name)["jobId"]


def test_single_node_job_runs_command_with_overrides(aws, batch):
    client_ = batch_client(batch)
    script = (
        "python -c 'import sys, requests; print(sys.prefix); "
        'print(requests.get("http://169.254.169.254/latest/meta-data/", timeout=5).status_code)\'; '
        'pwd; echo "greeting=$GREETING queue=$AWS_BATCH_JQ_NAME id=$AWS_BATCH_JOB_ID"'
    )
    register_container(client_, "single", ["false"], [env_var("GREETING", "from-definition")])
    job_id = client_.submit_job(
        jobName="single",
        jobQueue=aws.queue,
        jobDefinition="single",
        containerOverrides={
            "command": ["bash", "-c", script],
            "environment": [env_var("GREETING", "from-override")],
        },
    )["jobId"]

    detail = wait_status(client_, job_id, "SUCCEEDED", "FAILED")

    log = batch.node_log(job_id)
    assert detail["status"] == "SUCCEEDED", log
    assert detail["container"]["exitCode"] == 0
    assert detail["attempts"][-1]["container"]["exitCode"] == 0
    assert detail["container"]["logStreamName"].startswith("single/default/")
    assert detail["startedAt"] <= detail["stoppedAt"]
    lines = log.splitlines()
    assert lines[0] == sys.prefix  # `python` is the test's interpreter
    assert lines[1] == "404"  # instance metadata is answered locally
    assert lines[2] == str(batch.node_dir(job_id) / "work")
    assert lines[3] == "greeting=from-override queue=%s id=%s" % (aws.queue, job_id)
    assert any("169.254.169.254" in request for request in batch.sunk_requests)


def test_single_node_job_fails_with_exit_code(aws, batch):
    client_ = batch_client(batch)
    register_container(client_, "failing", ["bash", "-c", "echo about to fail; exit 7"])
    job_id = client_.submit_job(jobName="failing", jobQueue=aws.queue, jobDefinition="failing")[
        "jobId"
    ]

    detail = wait_status(client_, job_id, "SUCCEEDED", "FAILED")

    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "Essential container in task exited"
    assert detail["container"]["exitCode"] == 7
    assert batch.node_log(job_id) == "about to fail\n"


def test_multinode_nodes_get_layout_and_per_node_overrides(aws, batch, marks):
    client_ = batch_client(batch)
    dump = ('env | grep -E "^(AWS_BATCH_|ROLE=)" | sort | %s put "node-$AWS_BATCH_JOB_NODE_INDEX.env"'
            % MARK)
    wait_children = "%s wait node-1.env node-2.env" % MARK
    # As Metaflow does: placeholder commands in the definition, real ones as node overrides,
    # and an open-ended range so that numNodes can be overridden at submit time.
    register_multinode(
        client_,
        "gang",
        2,
        {"0:0": ["false"], "1:": ["false"]},
        [env_var("MARKS", marks.url), env_var("ROLE", "default")],
    )
    job_id = client_.submit_job(
        jobName="gang",
        jobQueue=aws.queue,
        jobDefinition="gang",
        nodeOverrides={
            "numNodes": 3,
            "nodePropertyOverrides": [
                {
                    "targetNodes": "0:0",
                    "containerOverrides": {
                        "command": ["bash", "-c", dump + " && " + wait_children],
                        "environment": [env_var("ROLE", "main")],
                    },
                },
                {
                    "targetNodes": "1:2",
                    "containerOverrides": {
                        "command": ["bash", "-c", dump],
                        "environment": [env_var("ROLE", "child")],
                    },
                },
            ],
        },
    )["jobId"]

    # (python and boto3 start in each node: seconds on a loaded machine)
    detail = wait_status(client_, job_id, "SUCCEEDED", "FAILED", timeout_s=60)

    assert detail["status"] == "SUCCEEDED", batch.node_log(job_id)
    assert detail["nodeProperties"]["numNodes"] == 3
    assert "container" not in detail
    assert detail["attempts"][-1]["container"]["exitCode"] == 0
    nodes = [read_env(marks.read("node-%d.env" % index)) for index in range(3)]
    for index, env in enumerate(nodes):
        assert env["AWS_BATCH_JOB_ID"] == "%s#%d" % (job_id, index)
        assert env["AWS_BATCH_JOB_NODE_INDEX"] == str(index)
        assert env["AWS_BATCH_JOB_NUM_NODES"] == "3"
        assert env["AWS_BATCH_JOB_MAIN_NODE_INDEX"] == "0"
        assert env["ROLE"] == ("main" if index == 0 else "child")
    assert "AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS" not in nodes[0]
    # the main node's private address (this host's own, or node 0's as a host of its own)
    main = client_.describe_jobs(jobs=["%s#0" % job_id])["jobs"][0]
    main_address = main["container"]["networkInterfaces"][0]["privateIpv4Address"]
    assert is_node_address(main_address)
    assert nodes[1]["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == main_address
    assert nodes[2]["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"] == main_address

    node_details = client_.describe_jobs(jobs=["%s#%d" % (job_id, i) for i in range(3)])["jobs"]
    assert [d["nodeDetails"] for d in node_details] == [
        {"nodeIndex": 0, "isMainNode": True},
        {"nodeIndex": 1, "isMainNode": False},
        {"nodeIndex": 2, "isMainNode": False},
    ]
    # The main node is launched first, the children once it runs.
    assert all(node_details[0]["startedAt"] <= d["startedAt"] for d in node_details[1:])
    assert batch.submissions[-1]["nodeOverrides"]["numNodes"] == 3


@pytest.mark.skipif(not netns.enabled(), reason="nodes as hosts only (TD_EMULATION_HOSTS=1):"
                    " as processes of one host every node sees every folder")
def test_a_node_as_a_host_sees_no_other_nodes_folder(aws, batch):
    """Separate instances share no disk: node 1 sees neither node 0's work folder nor any
    folder of the job's but its own, although node 0 wrote there before node 1 looked."""
    client_ = batch_client(batch)
    register_multinode(client_, "apart", 2, {
        "0:0": ["bash", "-c", "echo zero > here; sleep 8"],
        "1:1": ["bash", "-c", "sleep 3; date +%s.%N; "
                "[ -e ../../node-0/work/here ] && echo 'sees node 0' || echo 'blind to node 0'; "
                "ls -A ../.. | tr '\\n' ' '; echo"]})
    job_id = client_.submit_job(jobName="apart", jobQueue=aws.queue,
                                jobDefinition="apart")["jobId"]

    detail = wait_status(client_, job_id, "SUCCEEDED", "FAILED", timeout_s=30)
    assert detail["status"] == "SUCCEEDED", batch.node_log(job_id, 1)
    looked_at, seen, listed = batch.node_log(job_id, 1).splitlines()
    written = batch.node_dir(job_id, 0) / "work" / "here"
    assert written.read_text() == "zero\n"  # on this machine, node 0's file is there
    assert written.stat().st_mtime < float(looked_at)
    assert seen == "blind to node 0"
    assert listed.split() == ["node-1"]


def test_command_that_cannot_start_fails_the_job(aws, batch):
    client_ = batch_client(batch)
    register_container(client_, "missing", ["/no/such/entrypoint"])
    job_id = client_.submit_job(jobName="missing", jobQueue=aws.queue, jobDefinition="missing")[
        "jobId"
    ]

    detail = wait_status(client_, job_id, "FAILED", "SUCCEEDED")

    assert detail["status"] == "FAILED"
    assert detail["container"]["reason"].startswith("CannotStartContainerError:")
    assert "exitCode" not in detail["container"]


def test_attempt_duration_timeout_stops_the_job(aws, start_emulator):
    batch = start_emulator(stop_grace_s=0.5)
    client_ = batch_client(batch)
    register_container(client_, "slow", ["sleep", "60"])
    job_id = client_.submit_job(
        jobName="slow",
        jobQueue=aws.queue,
        jobDefinition="slow",
        timeout={"attemptDurationSeconds": 1},
    )["jobId"]

    detail = wait_status(client_, job_id, "FAILED", "SUCCEEDED", timeout_s=5)

    assert detail["statusReason"] == "Job attempt duration exceeded timeout"
    # sleep, the container's PID 1, has no SIGTERM handler: only the SIGKILL stops it
    assert detail["container"]["exitCode"] == 137


def test_main_node_exit_stops_child_nodes(aws, start_emulator, marks):
    batch = start_emulator(stop_grace_s=0.5)
    client_ = batch_client(batch)
    started = '%s put "started-$AWS_BATCH_JOB_NODE_INDEX" < /dev/null' % MARK
    register_multinode(
        client_,
        "main-exits",
        3,
        {
            "0:0": ["bash", "-c", "%s wait started-1 started-2" % MARK],
            # As PID 1 it gets the SIGTERM because it handles it (docker stop's way).
            "1:1": ["bash", "-c", "trap 'exit 143' TERM; %s; while true; do sleep 0.1; done"
                    % started],
            # Ignores SIGTERM, so only the SIGKILL after the grace period stops it.
            "2:2": ["bash", "-c", "trap '' TERM; %s; while true; do sleep 0.1; done" % started],
        },
        [env_var("MARKS", marks.url)],
    )
    job_id = client_.submit_job(
        jobName="main-exits", jobQueue=aws.queue, jobDefinition="main-exits"
    )["jobId"]

    detail = wait_status(client_, job_id, "SUCCEEDED", "FAILED", timeout_s=60)
    assert detail["status"] == "SUCCEEDED", batch.node_log(job_id)

    stopped = [wait_status(client_, "%s#%d" % (job_id, i), "FAILED", timeout_s=5) for i in (1, 2)]
    assert [node["container"]["exitCode"] for node in stopped] == [143, 137]
    assert all(node["statusReason"] == MAIN_NODE_EXITED_REASON for node in stopped)
    assert all(node["stoppedAt"] - detail["stoppedAt"] < 3000 for node in stopped)
    assert processes_of(batch.endpoint_url) == []


def test_terminate_job_stops_every_node(aws, batch):
    """Like `docker stop`, SIGTERM to each container's main process (PID 1) only, which gets it
    only if it handles it (node 0's bash traps it); SIGKILL to all after the stop timeout."""
    client_ = batch_client(batch)
    register_multinode(client_, "terminated", 3, {
        "0:0": ["bash", "-c", "trap 'exit 143' TERM; while true; do sleep 0.1; done"],
        "1:": ["sleep", "60"]})
    job_id = client_.submit_job(jobName="terminated", jobQueue=aws.queue,
                                jobDefinition="terminated")["jobId"]
    for index in range(3):
        wait_status(client_, "%s#%d" % (job_id, index), "RUNNING")

    client_.terminate_job(jobId=job_id, reason="stopped by the test")

    detail = wait_status(client_, job_id, "FAILED", "SUCCEEDED")
    assert detail["status"] == "FAILED"
    assert detail["statusReason"] == "stopped by the test"
    assert detail["isTerminated"] is True
    nodes = [wait_status(client_, "%s#%d" % (job_id, i), "FAILED", timeout_s=5) for i in range(3)]
    assert [node["container"]["exitCode"] for node in nodes] == [143, 137, 137]
    assert processes_of(batch.endpoint_url) == []


def test_held_node_stays_starting(aws, start_emulator):
    batch = start_emulator(hold_nodes={1})
    client_ = batch_client(batch)
    job_id = sleeping_multinode_job(client_, aws, "held", 3)
    wait_status(client_, "%s#2" % job_id, "RUNNING")

    for _ in range(10):
        assert describe(client_, "%s#1" % job_id)["status"] == "STARTING"
        assert describe(client_, job_id)["status"] == "RUNNING"
        time.sleep(0.1)

    client_.terminate_job(jobId=job_id, reason="node 1 never arrived")
    held = wait_status(client_, "%s#1" % job_id, "FAILED")
    assert "exitCode" not in held["container"]
    assert wait_status(client_, job_id, "FAILED")["statusReason"] == "node 1 never arrived"


def test_no_process_survives_its_container_or_the_emulator(aws, batch):
    client_ = batch_client(batch)
    # The container's main process exits at once and leaves a detached sleep behind.
    register_container(client_, "detaches", ["bash", "-c", "(sleep 60 &); echo detached"])
    detached = client_.submit_job(jobName="detaches", jobQueue=aws.queue, jobDefinition="detaches")
    assert wait_status(client_, detached["jobId"], "SUCCEEDED", "FAILED")["status"] == "SUCCEEDED"
    wait_for(lambda: not processes_of(batch.endpoint_url), 5, "the detached sleep to be killed")

    running = sleeping_multinode_job(client_, aws, "left-running", 2)
    wait_status(client_, "%s#1" % running, "RUNNING")
    assert len(processes_of(batch.endpoint_url)) == 2

    batch.close()

    assert processes_of(batch.endpoint_url) == []


def test_list_and_cancel_jobs(aws, start_emulator):
    slow = start_emulator(transition_s=30)
    client_ = batch_client(slow)
    register_container(client_, "queued", ["true"])
    job_id = client_.submit_job(jobName="queued", jobQueue=aws.queue, jobDefinition="queued")[
        "jobId"
    ]

    listed = client_.list_jobs(jobQueue=aws.queue, jobStatus="SUBMITTED")["jobSummaryList"]
    assert [summary["jobId"] for summary in listed] == [job_id]
    assert client_.list_jobs(jobQueue=aws.queue)["jobSummaryList"] == []  # RUNNING only

    client_.cancel_job(jobId=job_id, reason="not needed")

    detail = wait_status(client_, job_id, "FAILED")
    assert detail["statusReason"] == "not needed"
    assert detail["isCancelled"] is True
    assert detail["attempts"] == []


def test_queues_and_compute_environments_come_from_moto(aws, batch):
    client_ = batch_client(batch)
    queue = client_.describe_job_queues(jobQueues=[aws.fargate_queue])["jobQueues"][0]
    environment_arn = queue["computeEnvironmentOrder"][0]["computeEnvironment"]
    environments = client_.describe_compute_environments(computeEnvironments=[environment_arn])
    assert environments["computeEnvironments"][0]["computeResources"]["type"] == "FARGATE"


def _multinode_definition(name: str, ranges: list[str], **extra) -> dict:
    container = {"image": IMAGE, "command": ["true"], **extra.pop("container", {})}
    return {
        "jobDefinitionName": name,
        "type": "multinode",
        "nodeProperties": {
            "numNodes": 2,
            "mainNode": 0,
            "nodeRangeProperties": [{"targetNodes": t, "container": container} for t in ranges],
        },
        **extra,
    }


REJECTED_DEFINITIONS = {
    "reserved env": _multinode_definition(
        "reserved", ["0:1"], container={"environment": [env_var("AWS_BATCH_X", "1")]}
    ),
    "fargate multinode": _multinode_definition(
        "fargate", ["0:1"], platformCapabilities=["FARGATE"]
    ),
    "uncovered node": _multinode_definition("uncovered", ["0:0"]),
    "bad range": _multinode_definition("bad-range", ["1"]),
    "retries": _multinode_definition("retries", ["0:1"], retryStrategy={"attempts": 2}),
}


@pytest.mark.parametrize("definition", REJECTED_DEFINITIONS.values(), ids=REJECTED_DEFINITIONS)
def test_invalid_job_definitions_are_rejected(batch, definition):
    with pytest.raises(ClientError) as error:
        batch_client(batch).register_job_definition(**definition)
    assert error.value.response["Error"]["Code"] == "ClientException"


REJECTED_SUBMISSIONS = {
    "container overrides on multinode": ("closed", {"containerOverrides": {"command": ["true"]}}),
    "numNodes without open range": ("closed", {"nodeOverrides": {"numNodes": 3}}),
    "override outside the job": (
        "closed",
        {"nodeOverrides": {"nodePropertyOverrides": [{"targetNodes": "5:6"}]}},
    ),
    "ec2 job on fargate queue": ("closed", {"jobQueue": "metaflow-fargate-queue"}),
    "unknown queue": ("closed", {"jobQueue": "no-such-queue"}),
    "unknown definition": ("missing", {}),
}


@pytest.mark.parametrize(
    "definition_name, changes", REJECTED_SUBMISSIONS.values(), ids=REJECTED_SUBMISSIONS
)
def test_invalid_submissions_are_rejected(aws, batch, definition_name, changes):
    client_ = batch_client(batch)
    client_.register_job_definition(**_multinode_definition("closed", ["0:0", "1:1"]))
    request = {
        "jobName": "rejected",
        "jobQueue": aws.queue,
        "jobDefinition": definition_name,
        **changes,
    }
    with pytest.raises(ClientError) as error:
        client_.submit_job(**request)
    assert error.value.response["Error"]["Code"] == "ClientException"
    assert batch.submissions == []
