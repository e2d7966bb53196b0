"""The emulated metadata service (metadata_service.py) under Metaflow's own provider and client:
a local 2-node gang run with `--metadata service` is read back from it, and requests the real
service refuses are refused the same way. The Batch and Kubernetes @checkpoint tests use it for
their remote tasks (test_batch_checkpoint.py, test_k8s_gang.py)."""

from __future__ import annotations

import json

import pytest
import requests

from tests.support import FlowRunner

from .metadata_service import MetadataService


@pytest.fixture
def service():
    started = MetadataService()
    yield started
    started.close()


def test_a_local_gang_run_with_the_service_is_read_back_from_it(service, tmp_path):
    runner = FlowRunner(tmp_path)
    env = dict(service.env, TD_NODES="2", TD_NPROC="1")
    res = runner.run("gang_flow.py", "--tag", "mine", env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    # no local metadata was written (Metaflow's local provider keeps it in _meta folders):
    # all of it went to the service
    assert not list(tmp_path.glob(".metaflow/**/_meta")), list(tmp_path.glob(".metaflow/**/_meta"))

    seen = runner.client(
        "run = Flow('GangFlow').latest_run\n"
        "train = run['train'].task\n"
        "result = dict(id=run.id, ok=run.successful, tags=sorted(run.user_tags),\n"
        "              steps=sorted(s.id for s in run), total=train['total'].data,\n"
        "              world=train['info'].data['world_size'],\n"
        "              attempt=train.metadata_dict.get('attempt'))", env=env)
    # total: the all_reduce of rank + 1 over both ranks, as rank 0's artifact
    assert seen == {"id": "1", "ok": True, "tags": ["mine"], "steps": ["end", "start", "train"],
                    "total": 3.0, "world": 2, "attempt": "0"}, seen

    # the gang is one task of the step (node 1 is an agent, not a task of its own), with
    # the heartbeat of its sidecar and the metadata of every attempt
    train = [key for key in service.tasks if key[2] == "train"]
    assert len(train) == 1, train
    assert service.tasks[train[0]]["last_heartbeat_ts"], service.tasks[train[0]]
    fields = {m["field_name"] for m in service.metadata[train[0]]}
    assert {"attempt", "origin-run-id"} <= fields, fields
    # every answer the run got was a success, or the 404 of a get-or-create's first look
    failed = [r for r in service.requests if r[2] >= 300]
    assert all(method == "GET" and status == 404 for method, _, status, _ in failed), failed


def test_tags_mutated_through_the_client_are_the_runs_on_the_service(service, tmp_path):
    runner = FlowRunner(tmp_path)
    res = runner.run("gang_flow.py", env=service.env)
    assert res.returncode == 0, res.stderr[-3000:]
    tags = runner.client("run = Run('GangFlow/1')\nrun.add_tag('best')\nrun.remove_tag('best')\n"
                         "run.add_tags(['kept', 'also'])\n"
                         "result = sorted(Run('GangFlow/1').user_tags)", env=service.env)
    assert tags == ["also", "kept"]
    assert sorted(service.runs[("GangFlow", "1")]["tags"]) == ["also", "kept"]


def test_what_the_service_refuses_is_refused_with_its_reason(service):
    url = service.url

    def post(path, body):
        return requests.post(url + path, data=json.dumps(body), timeout=10)

    assert requests.get(url + "/ping", timeout=10).headers["METADATA_SERVICE_VERSION"] == "2.5.1"
    assert post("/flows/F", {"user_name": "u", "tags": [], "system_tags": []}).ok
    assert post("/flows/F", {}).status_code == 409
    numeric = post("/flows/F/run", {"run_number": "12"})
    assert (numeric.status_code, numeric.json()["message"]) == (
        400, "provided run_id may not be a numeric")
    bad_tags = post("/flows/F/run", {"tags": "one"})
    assert (bad_tags.status_code, bad_tags.json()["message"]) == (
        400, "run.tags must be a list of strings, not 'one'")
    run = post("/flows/F/run", {"user_name": "u", "tags": ["t"], "system_tags": ["user:u"]})
    assert run.json()["run_number"] == 1  # a number, as the service's serial column
    assert post("/flows/F/runs/1/steps/s/step", {}).ok
    task = post("/flows/F/runs/1/steps/s/task", {})
    assert task.json()["task_id"] == 1 and task.json()["tags"] == ["t"]  # the run's tags
    unknown = post("/flows/F/runs/1/steps/s/tasks/9/artifact", [])
    assert (unknown.status_code, unknown.json()["message"]) == (
        400, "need to register run_id and task_id first")
    artifact = {"name": "x", "location": "s3://b/x", "ds_type": "s3", "sha": "0",
                "type": "metaflow.artifact", "content_type": "gzip+pickle-v2",
                "attempt_id": "0"}
    string_attempt = post("/flows/F/runs/1/steps/s/tasks/1/artifact", [artifact])
    assert (string_attempt.status_code, string_attempt.json()["message"]) == (
        400, "artifact 'x'.attempt_id must be an integer, not '0'")
    incomplete = post("/flows/F/runs/1/steps/s/tasks/1/metadata", [{"field_name": "a"}])
    assert (incomplete.status_code, incomplete.json()["message"]) == (
        400, "a metadata needs value, type")
    listed = post("/flows/F/runs/1/steps/s/tasks/1/metadata",
                  [{"field_name": "a", "value": ["x"], "type": "a"}])
    assert (listed.status_code, listed.json()["message"]) == (
        400, "metadata 'a'.value must be a string or a number, not ['x']")
    # a number is kept as its text, as the service's text column keeps what Metaflow sends
    # as one (AWS Batch's parallel-node-index)
    assert post("/flows/F/runs/1/steps/s/tasks/1/metadata",
                [{"field_name": "parallel-node-index", "value": 0, "type": "n"}]).ok
    assert [m["value"] for m in requests.get(url + "/flows/F/runs/1/steps/s/tasks/1/metadata",
                                             timeout=10).json()] == ["0"]
    for attempt in (0, 1):
        assert post("/flows/F/runs/1/steps/s/tasks/1/artifact",
                    [dict(artifact, attempt_id=attempt, sha=str(attempt))]).ok
    latest = requests.get(url + "/flows/F/runs/1/steps/s/tasks/1/artifacts", timeout=10).json()
    assert [a["sha"] for a in latest] == ["1"]  # the latest attempt's, as the service filters
    first = requests.get(url + "/flows/F/runs/1/steps/s/tasks/1/attempt/0/artifacts",
                         timeout=10).json()
    assert [a["sha"] for a in first] == ["0"]
    system = requests.patch(url + "/flows/F/runs/1/tag/mutate",
                            data=json.dumps({"tags_to_remove": ["user:u"]}), timeout=10)
    assert (system.status_code, system.json()["message"]) == (
        422, "Cannot remove tags that are existing system tags {'user:u'}")
    beat = post("/flows/F/runs/1/steps/s/tasks/1/heartbeat", {})
    assert json.loads(beat.json()) == {"wait_time_in_seconds": 10}  # a JSON string, as sent
    assert requests.get(url + "/flows/F/runs/2", timeout=10).status_code == 404
    assert requests.patch(url + "/flows/F", data="{}", timeout=10).status_code == 405
