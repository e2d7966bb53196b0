"""Deploy commands that compile the flow for another scheduler: a gang of N > 1 nodes that the
scheduler cannot run as N machines is refused before anything is deployed; one-node gangs keep
deploying. S3 and Step Functions are moto's (the compilers need an S3 datastore)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .mfrun import isolated_env, metaflow

FLOWS = Path(__file__).parent / "flows"
FLOW = "deploy_gang_flow.py"

# Each command, and how to find what it deployed or wrote.
COMMANDS = {
    "step-functions": ["step-functions", "create"],
    "argo-workflows": ["argo-workflows", "create", "--only-json"],
    "airflow": ["airflow", "create", "dag.py"],
}
TARGETS = {"step-functions": "AWS Step Functions", "argo-workflows": "Argo Workflows",
           "airflow": "Airflow"}


@pytest.fixture
def deploy(aws, tmp_path):
    shutil.copy(FLOWS / FLOW, tmp_path)
    home = tmp_path / "metaflow-home"
    home.mkdir()
    # the least `step-functions create` needs: the roles of the state machine and its schedule
    roles = {"METAFLOW_SFN_IAM_ROLE": aws.role_arn,
             "METAFLOW_EVENTS_SFN_ACCESS_IAM_ROLE": aws.role_arn}
    env = isolated_env(aws.env, roles, home=home)

    def run(command, nodes):
        return metaflow(FLOW, ["--datastore=s3", *COMMANDS[command]], tmp_path,
                        dict(env, TD_NODES=str(nodes)))

    return run


def _bucket_keys(aws):
    listing = aws.client("s3").list_objects_v2(Bucket=aws.bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_multi_node_gang_is_refused_before_anything_is_deployed(aws, deploy, tmp_path,
                                                                  command):
    stored = _bucket_keys(aws)
    res = deploy(command, nodes=2)
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert ("@torch_distributed on step train: a gang of 2 nodes (2 nodes x 2 processes per "
            "node = world size 4) cannot be deployed to %s" % TARGETS[command]) in output, output
    assert "nodes=1" in output and "--with batch" in output
    # nothing compiled, uploaded or deployed
    assert _bucket_keys(aws) == stored, "a code package was uploaded"
    assert not (tmp_path / "dag.py").exists()
    assert '"kind"' not in res.stdout  # no Argo manifest
    assert aws.client("stepfunctions").list_state_machines()["stateMachines"] == []


def test_one_node_gangs_keep_deploying(aws, deploy, tmp_path):
    res = deploy("argo-workflows", nodes=1)
    assert res.returncode == 0, res.stdout + res.stderr
    manifest = json.loads(res.stdout[res.stdout.index("{"):])
    assert manifest["kind"] == "WorkflowTemplate"
    assert "train" in {t["name"] for t in manifest["spec"]["templates"]}

    res = deploy("airflow", nodes=1)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "DeployGangFlow" in (tmp_path / "dag.py").read_text()

    res = deploy("step-functions", nodes=1)
    assert res.returncode == 0, res.stdout + res.stderr
    machines = aws.client("stepfunctions").list_state_machines()["stateMachines"]
    assert [m["name"] for m in machines] == ["DeployGangFlow"]
