"""Deploy commands that compile the flow for another scheduler: a gang of N > 1 nodes that the
scheduler cannot run as N machines is refused before anything is deployed (Airflow); Step
Functions compiles it into one multi-node AWS Batch job, Argo Workflows into one JobSet. One- and
two-node gangs' Step Functions state machines and Argo WorkflowTemplates are kept as golden files
(regenerate them with TD_UPDATE_GOLDEN=1 after a deliberate change); test_sfn_gang.py and
test_argo_gang.py run one. S3 and Step Functions are moto's (the compilers need an S3
datastore)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import os
import subprocess
import sys

import pytest

from . import argo, sfn
from .aws import validate_request
from .jobset_controller import validate_jobset
from .k8s_policies import validate_object
from tests.support import isolated_env, metaflow

FLOWS = Path(__file__).parent / "flows"
GOLDEN = Path(__file__).parent / "golden"
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
    home = tmp_path / "metaflow-home"
    home.mkdir()
    # the least `step-functions create` needs: the roles of the state machine and its schedule,
    # and for a foreach the DynamoDB table (named only: --only-json never reaches it)
    sfn_settings = {"METAFLOW_SFN_IAM_ROLE": aws.role_arn,
                    "METAFLOW_EVENTS_SFN_ACCESS_IAM_ROLE": aws.role_arn,
                    "METAFLOW_SFN_DYNAMO_DB_TABLE": "metaflow-sfn"}
    env = isolated_env(aws.env, sfn_settings, home=home)

    def run(command, nodes, flow=FLOW, args=None, extra_env=None):
        shutil.copy(FLOWS / flow, tmp_path)
        return metaflow(flow, ["--datastore=s3", *(args or COMMANDS[command])], tmp_path,
                        dict(env, TD_NODES=str(nodes), **(extra_env or {})))

    run.env = env
    return run


def _bucket_keys(aws):
    listing = aws.client("s3").list_objects_v2(Bucket=aws.bucket)
    return sorted(o["Key"] for o in listing.get("Contents", []))


@pytest.mark.parametrize("command", ["airflow"])
def test_a_multi_node_gang_is_refused_before_anything_is_deployed(aws, deploy, tmp_path,
                                                                  command):
    stored = _bucket_keys(aws)
    res = deploy(command, nodes=2)
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert ("@torch_distributed on step train: a gang of 2 nodes (2 nodes x 2 processes per "
            "node = world size 4) cannot be deployed to %s" % TARGETS[command]) in output, output
    assert "nodes=1" in output and "--with batch" in output and "--with kubernetes" in output
    # nothing compiled, uploaded or deployed
    assert _bucket_keys(aws) == stored, "a code package was uploaded"
    assert not (tmp_path / "dag.py").exists()
    assert '"kind"' not in res.stdout  # no Argo manifest
    assert aws.client("stepfunctions").list_state_machines()["stateMachines"] == []


DEPLOYER = """
from metaflow import Deployer
Deployer(%r).step_functions().create()
print("deployed")
"""


def test_the_deployer_api_deploys_a_multi_node_gang_to_step_functions(aws, deploy, tmp_path):
    # In a fresh interpreter: the Deployer loads the flow (and torch) into its own process.
    shutil.copy(FLOWS / FLOW, tmp_path)
    env = dict(deploy.env, TD_NODES="2", METAFLOW_DEFAULT_DATASTORE="s3")
    res = subprocess.run([sys.executable, "-c", DEPLOYER % FLOW], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "deployed" in res.stdout, res.stdout + res.stderr
    client = aws.client("stepfunctions")
    [machine] = client.list_state_machines()["stateMachines"]
    definition = json.loads(client.describe_state_machine(
        stateMachineArn=machine["stateMachineArn"])["definition"])
    train = sfn.state(definition, "train")["Parameters"]
    assert [n["TargetNodes"] for n in train["NodeOverrides"]["NodePropertyOverrides"]] == [
        "0:0", "1:1"]


@pytest.mark.parametrize("flow, name, step", [
    ("deploy_start_gang_flow.py", "DeployStartGangFlow", "start"),
    ("deploy_join_gang_flow.py", "DeployJoinGangFlow", "join"),
])
def test_a_gang_on_the_start_step_or_a_join_is_refused_on_step_functions(aws, deploy, flow,
                                                                         name, step):
    stored = _bucket_keys(aws)
    res = deploy("step-functions", nodes=2, flow=flow)
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert ("@torch_distributed on step %s: a gang of 2 nodes cannot be deployed to AWS "
            "Step Functions on a %s step" % (step, step)) in output, output
    assert _bucket_keys(aws) == stored, "a code package was uploaded"
    machines = aws.client("stepfunctions").list_state_machines()["stateMachines"]
    assert name not in [m["name"] for m in machines]


def test_a_fargate_queue_is_refused_by_step_functions_create(aws, deploy):
    # AWS Batch runs multi-node jobs on EC2 only; refused while the state machine is compiled
    client = aws.client("stepfunctions")
    before = client.list_state_machines()["stateMachines"]
    res = deploy("step-functions", nodes=2,
                 extra_env={"METAFLOW_BATCH_JOB_QUEUE": aws.fargate_queue,
                            "METAFLOW_ECS_FARGATE_EXECUTION_ROLE": aws.role_arn})
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert ("@torch_distributed on step train: the gang needs 2 nodes, and AWS Batch runs "
            "multi-node jobs on EC2 compute environments only; job queue %r is Fargate"
            % aws.fargate_queue) in output, output
    assert client.list_state_machines()["stateMachines"] == before, "a state machine was deployed"


def test_retry_and_catch_are_the_multi_node_jobs_own_attempts(aws, deploy):
    # Step Functions leaves retries to AWS Batch: every attempt reruns the whole multi-node job,
    # and every node reads its attempt from AWS_BATCH_JOB_ATTEMPT
    res = deploy("step-functions", nodes=2, args=[
        "--with", "retry:times=2,minutes_between_retries=0", "--with", "catch",
        "step-functions", "create", "--only-json"])
    assert res.returncode == 0, res.stdout + res.stderr
    params = sfn.state(sfn.state_machine(res.stdout), "train")["Parameters"]
    # the first attempt, 2 retries of @retry and the attempts @catch keeps for its fallback
    from metaflow.plugins.catch_decorator import NUM_FALLBACK_RETRIES

    assert params["RetryStrategy"] == {"Attempts": 1 + 2 + NUM_FALLBACK_RETRIES}
    main, agent = params["NodeOverrides"]["NodePropertyOverrides"]
    for node in (main, agent):
        command = node["ContainerOverrides"]["Command"][-1]
        assert "--retry-count $((AWS_BATCH_JOB_ATTEMPT-1))" in command, command
        assert "--max-user-code-retries 2" in command, command


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


@pytest.mark.parametrize("nodes, flow, golden", [
    (1, "deploy_gang_flow.py", "sfn_gang_1_node_linear.json"),
    (1, "deploy_foreach_flow.py", "sfn_gang_1_node_foreach.json"),
    (2, "deploy_gang_flow.py", "sfn_gang_2_nodes_linear.json"),
    (2, "deploy_foreach_flow.py", "sfn_gang_2_nodes_foreach.json"),
])
def test_a_gang_compiles_to_one_batch_job_on_step_functions(aws, deploy, nodes, flow, golden):
    res = deploy("step-functions", nodes=nodes, flow=flow,
                 args=["step-functions", "create", "--only-json"])
    assert res.returncode == 0, res.stdout + res.stderr
    compiled = sfn.normalised(res.stdout, aws.endpoint_url)
    if os.environ.get("TD_UPDATE_GOLDEN"):
        (GOLDEN / golden).write_text(compiled)
    assert compiled == (GOLDEN / golden).read_text(), "the compiled state machine changed"

    train = sfn.state(sfn.state_machine(res.stdout), "train")
    assert train["Resource"].endswith(":states:::batch:submitJob.sync")
    params = train["Parameters"]
    assert params["RetryStrategy"] == {"Attempts": 1}
    if nodes == 1:
        assert "NodeOverrides" not in params
    else:  # one multi-node job: node 0 the task's own step command, node 1 the node agent
        assert "ContainerOverrides" not in params
        main, agent = params["NodeOverrides"]["NodePropertyOverrides"]
        assert (main["TargetNodes"], agent["TargetNodes"]) == ("0:0", "1:1")
        assert " step train " in main["ContainerOverrides"]["Command"][-1]
        assert " spin-step train " in agent["ContainerOverrides"]["Command"][-1]
    # what Step Functions sends to AWS Batch is valid SubmitJob input
    filled = {"$.JobId": "parent-job", "$.Parameters.['metaflow.run_id']": "exec-1",
              "$.Index": "0", "$.SplitParentTaskId": "start-job",
              "$.Parameters.split_parent_task_id_start": "start-job"}
    validate_request("batch", "SubmitJob", sfn.submit_job_input(params, filled))


@pytest.mark.parametrize("nodes, flow, golden", [
    (1, "deploy_gang_flow.py", "argo_gang_1_node_linear.json"),
    (2, "deploy_gang_flow.py", "argo_gang_2_nodes_linear.json"),
    (2, "deploy_foreach_collect_flow.py", "argo_gang_2_nodes_foreach_retry.json"),
])
def test_a_gang_compiles_to_one_jobset_on_argo_workflows(aws, deploy, nodes, flow, golden):
    res = deploy("argo-workflows", nodes=nodes, flow=flow)
    assert res.returncode == 0, res.stdout + res.stderr
    compiled = argo.normalised(res.stdout, aws.endpoint_url)
    if os.environ.get("TD_UPDATE_GOLDEN"):
        (GOLDEN / golden).write_text(compiled)
    assert compiled == (GOLDEN / golden).read_text(), "the compiled workflow changed"

    wf = argo.workflow(res.stdout)
    argo.validate_workflow(wf)  # against Argo's published JSON schema
    train = argo.template(wf, "train")
    if nodes == 1:  # as without @torch_distributed: one pod
        assert "container" in train and "resource" not in train
        return
    assert "container" not in train and train["resource"]["action"] == "create"
    foreach = "foreach" in flow
    parameters = {"input-paths": "argo-w/start/t-1", "retryCount": "1"}
    if foreach:
        parameters["split-index"] = "1"
    jobset = argo.jobset(wf, "train", "w", parameters)
    validate_jobset(jobset)  # against the JobSet CRD's published schema, as the API server would
    assert [(r["name"], r["replicas"]) for r in jobset["spec"]["replicatedJobs"]] == [
        ("control", 1), ("worker", nodes - 1)]
    control, worker = (r["template"]["spec"]["template"]["spec"]["containers"][0]["command"][-1]
                       for r in jobset["spec"]["replicatedJobs"])
    # the attempt Argo passed in (a step without @retry compiles the first one)
    attempt = "1" if foreach else "0"
    assert (" step train --run-id argo-w --task-id $METAFLOW_TASK_ID --retry-count %s "
            % attempt) in control
    assert " spin-step train --run-id 'argo-w' " in worker and " step train " not in worker
    # the agent loads the flow as the task does: the same entrypoint and top-level options
    loader = control.split(" step train ")[0].rsplit("&& (", 1)[1].split(" && ", 1)[1]
    assert worker.split(" spin-step train ")[0].endswith(loader), (loader, worker)
    # the attempt: Argo's {{retries}} where the template retries (@retry), else the first
    [task] = [t for tpl in wf["spec"]["templates"] for t in (tpl.get("dag") or {}).get(
        "tasks", []) if t.get("template") == "train"]
    retry = {p["name"]: p["value"] for p in task["arguments"]["parameters"]}["retryCount"]
    assert retry == ("{{retries}}" if foreach else "0")
    assert ("retryStrategy" in train) == foreach
    # the gang's NetworkPolicy, created by the task before the gang's: valid for the API
    # server, and it selects (and admits) every pod of the JobSet by labels they carry
    [before] = [t for tpl in wf["spec"]["templates"] for t in (tpl.get("dag") or {}).get(
        "tasks", []) if t.get("template") == "train-gang-policy"]
    assert "train-gang-policy.Succeeded" in task["depends"]
    assert before["continueOn"] == {"failed": True}
    policy = argo.network_policy(wf, "train", "w", parameters)
    validate_object(policy, "V1NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": selector}}]}]
    for job in jobset["spec"]["replicatedJobs"]:
        assert job["template"]["spec"]["template"]["metadata"]["labels"].items() >= \
            selector.items()


def test_a_gang_on_the_last_step_of_a_foreach_is_refused_on_argo_workflows(deploy):
    res = deploy("argo-workflows", nodes=2, flow="deploy_foreach_flow.py")
    output = res.stdout + res.stderr
    assert res.returncode != 0, output
    assert ("@torch_distributed on step train: a gang of 2 nodes cannot be deployed to Argo "
            "Workflows on the last step of a foreach") in output, output
    assert "Add a step between the gang and join" in output and '"kind"' not in res.stdout


def test_two_gang_steps_compile_to_two_gangs_on_step_functions(aws, deploy):
    res = deploy("step-functions", nodes=2, flow="deploy_two_gangs_flow.py",
                 args=["step-functions", "create", "--only-json"])
    assert res.returncode == 0, res.stdout + res.stderr
    machine = sfn.state_machine(res.stdout)
    for step in ("pretrain", "finetune"):
        params = sfn.state(machine, step)["Parameters"]
        assert "ContainerOverrides" not in params
        main, agent = params["NodeOverrides"]["NodePropertyOverrides"]
        # each gang's job runs its own step on both nodes
        assert " step %s " % step in main["ContainerOverrides"]["Command"][-1]
        assert " spin-step %s " % step in agent["ContainerOverrides"]["Command"][-1]
        env = {e["Name"]: e.get("Value") for e in agent["ContainerOverrides"]["Environment"]}
        assert json.loads(env["METAFLOW_TORCH_DISTRIBUTED_AGENT_ORDER"])["blueprint"][
            "step_name"] == step
    for step in ("start", "end"):  # plain steps stay single-node jobs
        assert "NodeOverrides" not in sfn.state(machine, step)["Parameters"]


def test_two_gang_steps_compile_to_two_jobsets_on_argo_workflows(aws, deploy):
    res = deploy("argo-workflows", nodes=2, flow="deploy_two_gangs_flow.py")
    assert res.returncode == 0, res.stdout + res.stderr
    wf = argo.workflow(res.stdout)
    argo.validate_workflow(wf)
    for step in ("pretrain", "finetune"):
        manifest = json.loads(argo.template(wf, step)["resource"]["manifest"])
        assert manifest["kind"] == "JobSet"
        worker = [r for r in manifest["spec"]["replicatedJobs"] if r["name"] == "worker"][0]
        command = worker["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
        assert " spin-step %s " % step in command[-1]
