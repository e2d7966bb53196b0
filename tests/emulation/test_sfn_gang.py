"""A multi-node gang deployed with `step-functions create`, run the way Step Functions runs it:
each state's SubmitJob parameters are taken from the compiled state machine, the JSONPath values
Step Functions fills in (execution name, the previous state's JobId) are filled, and the job is
submitted to the AWS Batch emulator, state after state (start, train, end; in a foreach, each
item of the Map state and the join)."""

from __future__ import annotations

import ast
import json
import re
import shutil
import time
from pathlib import Path

import pytest

from . import sfn
from .aws import client, validate_request
from tests.support import isolated_env, metaflow
from .probes import batch_views, frozen_node, published_secret, wait_for
from .test_batch_emulator import wait_status

FLOWS = Path(__file__).parent / "flows"
FLOW = "batch_gang_flow.py"
EXECUTION = "exec-1"
TABLE = "metaflow-sfn"  # Step Functions' foreach state (DynamoDB)


class Execution:
    """What Step Functions does with a linear state machine, one state at a time."""

    def __init__(self, aws, batch, machine):
        self.batch = batch
        self.api = client(batch.endpoint_url, "batch")
        self.machine = machine
        self.filled = {"$$.Execution.Name": EXECUTION,
                       "$.Parameters.['metaflow.run_id']": EXECUTION}
        self.jobs = {}

    def submit_state(self, name, **filled):
        """Submit the state's job; its id."""
        self.filled.update(filled)
        job = sfn.submit_job_input(sfn.state(self.machine, name)["Parameters"], self.filled)
        validate_request("batch", "SubmitJob", job)
        self.jobs[name] = job_id = self.api.submit_job(**job)["jobId"]
        return job_id

    def wait_state(self, name, timeout_s=240):
        """The description of the state's job once it has ended."""
        job_id = self.jobs[name]
        try:
            detail = wait_status(self.api, job_id, "SUCCEEDED", "FAILED", timeout_s=timeout_s)
        except pytest.fail.Exception as timed_out:  # what each node said, to tell why
            logs = []
            for node in (0, 1):
                try:
                    logs.append("node %d:\n%s" % (node, self.batch.node_log(job_id, node)[-3000:]))
                except (OSError, IndexError) as ex:
                    logs.append("node %d: no log (%s)" % (node, ex))
            pytest.fail("%s\n%s" % (timed_out, "\n----\n".join(logs)))
        self.filled["$.JobId"] = job_id  # the next state's input: this job's description
        return detail

    def run_state(self, name, timeout_s=240, **filled):
        self.submit_state(name, **filled)
        return self.wait_state(name, timeout_s)


def compile_flow(aws, batch, tmp_path, flow, flow_env=None):
    """(state machine, environment) of `step-functions create --only-json` of `flow`;
    `flow_env` (TD_* variables) is compiled into the job by the flow's @environment."""
    shutil.copy(FLOWS / flow, tmp_path)
    home = tmp_path / "metaflow-home"
    home.mkdir()
    env = isolated_env(aws.env, batch.env, {"METAFLOW_SFN_IAM_ROLE": aws.role_arn,
                                            "METAFLOW_EVENTS_SFN_ACCESS_IAM_ROLE": aws.role_arn,
                                            "METAFLOW_SFN_DYNAMO_DB_TABLE": TABLE},
                       flow_env or {}, home=home)
    res = metaflow(flow, ["--datastore=s3", "step-functions", "create", "--only-json"],
                   tmp_path, env)
    assert res.returncode == 0, res.stdout + res.stderr
    return sfn.state_machine(res.stdout), env


def test_a_two_node_gang_runs_as_one_multi_node_job_of_the_state_machine(aws, batch, tmp_path):
    machine, env = compile_flow(aws, batch, tmp_path, FLOW)
    run = Execution(aws, batch, machine)

    for state in ("start", "train", "end"):
        detail = run.run_state(state)
        assert detail["status"] == "SUCCEEDED", "%s: %s" % (
            state, batch.node_log(run.jobs[state], 0)[-4000:])
    train = run.jobs["train"]
    [submitted] = [s for s in batch.submissions if s["jobName"].endswith("--train--")]
    assert len(submitted["nodeOverrides"]["nodePropertyOverrides"]) == 2

    # the gang formed across both nodes, and node 1's ranks are in the task's log (node 0's)
    task_log = batch.node_log(train, 0)
    for rank in range(4):
        assert "[rank %d] rank %d says hello from batch node %d" % (rank, rank, rank // 2) \
            in task_log, task_log
    assert "[node 1 agent] joined the gang of node 0" in batch.node_log(train, 1)

    # rank 0's artifacts are the task's whose id is the bare job id: where `end` read them
    assert "total 10.0 over 4 ranks" in batch.node_log(run.jobs["end"], 0)
    dump = metaflow(FLOW, ["--datastore=s3", "dump", "sfn-%s/train/%s" % (EXECUTION, train)],
                    tmp_path, env)
    assert dump.returncode == 0, dump.stdout + dump.stderr
    shown = dump.stdout + dump.stderr
    assert "total [size" in shown and "] = 10.0" in shown, shown
    assert shown.count("'job': '%s'" % train) == 4 and "'world_size': 4" in shown, shown
    # no other task of train was stored: the agents' spin-steps persist nothing; each node
    # agent's own log is kept beside the task, under its hidden id (as with `run --with batch`)
    keys = [k["Key"] for k in aws.client("s3").list_objects_v2(
        Bucket=aws.bucket, Prefix="metaflow/BatchGangFlow/sfn-%s/train/" % EXECUTION)["Contents"]]
    assert {k.split("/")[4] for k in keys} == {train, train + "-node-1"}, keys
    assert {k.split("/")[5] for k in keys if "-node-1/" in k} == {
        "0.task_stdout.log", "0.task_stderr.log"}, keys
    # node 0 drew the attempt's secret and put it beside its files, where node 1 read it; the
    # compiled state machine and what Batch shows hold neither it nor anything to derive it
    secret = published_secret(env, "BatchGangFlow", "sfn-%s" % EXECUTION, "train", train, 0)
    assert len(secret) == 64
    assert secret not in json.dumps(machine) and secret not in batch_views(batch)
    assert "METAFLOW_TORCH_DISTRIBUTED_AGENT_ORDER" in json.dumps(machine)  # the agents' order


def test_a_failing_rank_on_node_1_fails_the_gangs_job_with_its_root_cause(aws, batch,
                                                                         tmp_path):
    machine, _ = compile_flow(aws, batch, tmp_path, FLOW, {"TD_FAIL_RANK": "2"})
    run = Execution(aws, batch, machine)
    assert run.run_state("start")["status"] == "SUCCEEDED"
    detail = run.run_state("train")
    task_log = batch.node_log(run.jobs["train"], 0)
    assert detail["status"] == "FAILED", task_log[-4000:]
    # the task's log (node 0's) names the rank on node 1 that failed first, with its traceback
    # and last words, as with `run --with batch`
    assert "rank 2 (node 1, local rank 0) raised ValueError: injected failure on rank 2" \
        in task_log, task_log[-4000:]
    assert 'raise ValueError("injected failure on rank %d" % rank)' in task_log
    assert "[rank 2] last words of rank 2" in task_log
    # the job failed on node 0's verdict; it did not wait for a timeout
    assert "rendezvous timeout" not in task_log and "heartbeat" not in task_log


def test_a_failing_rank_on_node_1_restarts_the_gang_in_place_within_the_states_job(
        aws, batch, tmp_path):
    """max_restarts=1 on a deployed gang: rank 2 (node 1) raises in round 0; both nodes start
    their ranks again inside the state's one multi-node job, and the state succeeds."""
    machine, env = compile_flow(aws, batch, tmp_path, FLOW, {
        "TD_FAIL_RANK": "2", "TD_FAIL_ROUND": "0", "TD_MAX_RESTARTS": "1"})
    run = Execution(aws, batch, machine)
    assert run.run_state("start")["status"] == "SUCCEEDED"
    detail = run.run_state("train")
    train = run.jobs["train"]
    task_log = batch.node_log(train, 0)
    assert detail["status"] == "SUCCEEDED", task_log[-4000:]
    assert "restart 1 of 1 after rank 2 (node 1) raised ValueError: injected failure on rank " \
           "2" in task_log, task_log[-4000:]
    assert "[rank 2] last words of rank 2" in task_log
    # the same job: Step Functions submitted the state once, and no attempt was retried
    assert len([s for s in batch.submissions if s["jobName"].endswith("--train--")]) == 1
    assert run.run_state("end")["status"] == "SUCCEEDED"
    assert "total 10.0 over 4 ranks" in batch.node_log(run.jobs["end"], 0)
    dump = metaflow(FLOW, ["--datastore=s3", "dump", "sfn-%s/train/%s" % (EXECUTION, train)],
                    tmp_path, env)
    shown = dump.stdout + dump.stderr
    assert dump.returncode == 0, shown
    assert re.search(r"\brestarts \[[^\]]*\] = 1\b", shown), shown  # rank 0's, round 1
    assert re.search(r"\battempt \[[^\]]*\] = 0\b", shown), shown


def test_a_node_that_stops_answering_is_caught_by_its_heartbeat(aws, batch, tmp_path):
    machine, _ = compile_flow(aws, batch, tmp_path, FLOW, {
        "TD_BUSY": "120", "METAFLOW_TORCH_DISTRIBUTED_HEARTBEAT_TIMEOUT": "3"})
    run = Execution(aws, batch, machine)
    assert run.run_state("start")["status"] == "SUCCEEDED"
    job_id = run.submit_state("train")
    with frozen_node(batch.node_dir(job_id, 1), 180) as stopped_at:
        detail = run.wait_state("train", timeout_s=150)
    detected = time.monotonic() - stopped_at
    task_log = batch.node_log(job_id, 0)
    assert detail["status"] == "FAILED", task_log[-4000:]
    # node 0's heartbeat timeout is the job's (the flow's @environment, compiled in)
    assert "node 1 stopped sending heartbeats 3.0s ago" in task_log, task_log[-4000:]
    assert detected < 60, detected



def test_a_foreach_of_multi_node_gangs_keeps_each_gangs_input_and_meets_at_the_join(
        aws, batch, tmp_path):
    aws.client("dynamodb").create_table(
        TableName=TABLE, BillingMode="PAY_PER_REQUEST",
        KeySchema=[{"AttributeName": "pathspec", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pathspec", "AttributeType": "S"}])
    machine, env = compile_flow(aws, batch, tmp_path, "batch_foreach_flow.py")
    run = Execution(aws, batch, machine)
    assert run.run_state("start")["status"] == "SUCCEEDED"
    start = run.jobs["start"]
    trains = []
    for index in (0, 1):  # the Map state's items, one after the other
        detail = run.run_state("train", **{"$.Index": str(index), "$.JobId": start,
                                           "$.SplitParentTaskId": start})
        assert detail["status"] == "SUCCEEDED", batch.node_log(run.jobs["train"], 0)[-4000:]
        trains.append(run.jobs["train"])
    detail = run.run_state("join", **{"$.Parameters.split_parent_task_id_start": start})
    assert detail["status"] == "SUCCEEDED", batch.node_log(run.jobs["join"], 0)[-4000:]
    dump = metaflow("batch_foreach_flow.py", ["--datastore=s3", "dump",
                                              "sfn-%s/join/%s" % (EXECUTION, run.jobs["join"])],
                    tmp_path, env)
    shown = dump.stdout + dump.stderr
    assert dump.returncode == 0, shown
    results = ast.literal_eval(shown.split("results [", 1)[1].split("] = ", 1)[1].split("\n")[0])
    # each gang: its own item on both nodes (summed over its 2 ranks); every rank saw the gang's
    # task id, the bare job id the join got from DynamoDB
    assert [(lr, round(total, 4)) for lr, total, _ in results] == [(0.1, 0.2), (0.2, 0.4)]
    for (lr, _, seen), job in zip(results, trains):
        assert [(item, job_id) for item, _, job_id in seen] == [(lr, job), (lr, job)]
