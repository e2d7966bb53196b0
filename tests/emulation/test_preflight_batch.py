"""`torch-distributed preflight` on AWS Batch against moto (Batch, EC2 security groups and
instance types, IAM): a queue that passes, and one for each failing case, each failure naming
its fix. The checks read moto in-process; two runs go through Metaflow's CLI end to end."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import common as preflight
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.cli import \
    batch_findings

from tests.support import isolated_env, metaflow

FLOWS = Path(__file__).parent / "flows"
ROOT = "s3://mf-bucket/metaflow"
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ecs-tasks.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}
DATASTORE = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject"],
     "Resource": "arn:aws:s3:::mf-bucket/*"},
    {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": "arn:aws:s3:::mf-bucket"}]}


@dataclass
class Account:
    ok_queue: str
    role: str  # trusted by ECS tasks, reads and writes the datastore
    untrusted_role: str
    no_s3_role: str
    aws: object


def _queue(aws, name, group, **resources):
    batch, ec2 = aws.client("batch"), aws.client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    profile = aws.client("iam").list_instance_profiles()["InstanceProfiles"][0]["Arn"]
    env = batch.create_compute_environment(
        computeEnvironmentName=name + "-ce", type="MANAGED", state="ENABLED",
        serviceRole=aws.role_arn,
        computeResources={"type": "EC2", "minvCpus": 0, "maxvCpus": 64, "desiredvCpus": 0,
                          "instanceTypes": ["optimal"], "instanceRole": profile,
                          "subnets": [subnet], "securityGroupIds": [group], **resources})
    batch.create_job_queue(jobQueueName=name, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment":
                                                     env["computeEnvironmentArn"]}])
    return name


def _role(iam, name, trust, policy=None):
    arn = iam.create_role(RoleName=name, AssumeRolePolicyDocument=json.dumps(trust))["Role"]["Arn"]
    if policy:
        iam.put_role_policy(RoleName=name, PolicyName="datastore", PolicyDocument=json.dumps(policy))
    return arn


@pytest.fixture(scope="module")
def account(aws):
    ec2, iam = aws.client("ec2"), aws.client("iam")
    vpc = ec2.describe_vpcs(Filters=[{"Name": "cidr", "Values": ["10.0.0.0/16"]}])["Vpcs"][0]
    group = ec2.create_security_group(GroupName="gang", Description="gang",
                                      VpcId=vpc["VpcId"])["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}])
    ok = _queue(aws, "preflight-ok", group)
    # the self rule, and more: every TCP port from anywhere, SSH from anywhere (not the gang's)
    open_group = ec2.create_security_group(GroupName="gang-open", Description="open",
                                           VpcId=vpc["VpcId"])["GroupId"]
    ec2.authorize_security_group_ingress(GroupId=open_group, IpPermissions=[
        {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": open_group}]},
        {"IpProtocol": "tcp", "FromPort": 0, "ToPort": 65535,
         "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
        {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}])
    _queue(aws, "preflight-open", open_group)
    _queue(aws, "preflight-small", group, maxvCpus=2)
    _queue(aws, "preflight-gpu", group, instanceTypes=["g5"])
    _queue(aws, "preflight-tiny-types", group, instanceTypes=["t3.micro"])
    aws.client("batch").update_job_queue(jobQueue=_queue(aws, "preflight-off", group),
                                         state="DISABLED")
    return Account(ok, _role(iam, "gang-job", TRUST, DATASTORE),
                   _role(iam, "gang-untrusted", {"Version": "2012-10-17", "Statement": []},
                         DATASTORE),
                   _role(iam, "gang-no-s3", TRUST), aws)


def findings(account, queue=None, role=None, nodes=2, cpu=2, gpu=0, shared_memory=None,
             image=""):
    needs = preflight.GangNeeds("train", "batch", nodes, 1, cpu, 1024, gpu, shared_memory,
                                image=image, options={"queue": queue or account.ok_queue,
                                                      "iam_role": role or account.role})
    # moto serves every region at one endpoint: the region of an ECR image needs no client
    return {f.check: f for f in batch_findings(
        needs, ROOT, lambda service, region=None: account.aws.client(service))}


def test_a_queue_that_can_run_the_gang_passes_every_check(account):
    found = findings(account)
    assert {c: f.status for c, f in found.items()} == {
        "job queue": "ok", "capacity": "ok", "security group": "ok", "instance types": "ok",
        "IAM role": "ok", "image": "unknown"}, found


def test_a_gpu_gang_on_gpu_instances_with_shared_memory_passes(account):
    found = findings(account, queue="preflight-gpu", gpu=1, shared_memory=4096)
    assert found["instance types"].status == "ok", found["instance types"]
    assert found["instance types"].message.startswith("g5."), found["instance types"]
    assert found["shared memory"].status == "ok"


def test_a_fargate_queue_is_refused_with_the_fix(account):
    found = findings(account, queue=account.aws.fargate_queue)
    assert found["compute environment"].status == "FAILED"
    assert "is Fargate" in found["compute environment"].message
    assert "type=EC2" in found["compute environment"].fix


def test_too_few_vcpus_for_all_nodes_names_the_maximum_to_set(account):
    found = findings(account, queue="preflight-small", nodes=2, cpu=2)
    assert found["capacity"].status == "FAILED"
    assert "allows at most 2" in found["capacity"].message
    assert found["capacity"].fix == ("aws batch update-compute-environment --compute-environment "
                                    "preflight-small-ce --compute-resources maxvCpus=4")


def test_a_security_group_without_the_self_rule_names_the_command(account):
    found = findings(account, queue=account.aws.queue)  # aws.py's group has no self rule
    group = account.aws.client("batch").describe_compute_environments(
        computeEnvironments=["metaflow-queue-ce"])["computeEnvironments"][0][
        "computeResources"]["securityGroupIds"][0]
    assert found["security group"].status == "FAILED"
    assert found["security group"].fix == (
        "aws ec2 authorize-security-group-ingress --group-id %s --protocol all "
        "--source-group %s" % (group, group))


def test_a_group_admitting_only_itself_has_no_warning(account):
    assert "security group ingress" not in findings(account)


def test_a_group_open_to_the_world_on_the_gangs_ports_is_warned_naming_group_and_rule(account):
    found = findings(account, queue="preflight-open")
    assert found["security group"].status == "ok"  # the nodes reach each other: it runs
    warning = found["security group ingress"]
    group = warning.message.split()[2]
    assert warning.status == "warning"
    assert warning.message == (
        "security group %s admits TCP 0-65535 from 0.0.0.0/0: that reaches the gang's store "
        "and gloo's and NCCL's ports (20000-65535) on every node, where only the gang's own "
        "nodes should" % group)
    assert warning.fix.startswith(
        "aws ec2 revoke-security-group-ingress --group-id %s --ip-permissions "
        "'[{\"IpProtocol\":\"tcp\",\"FromPort\":0,\"ToPort\":65535,\"IpRanges\":"
        "[{\"CidrIp\":\"0.0.0.0/0\"}]}]'" % group)
    # SSH from anywhere is not on the gang's ports: one warning only
    checks = [f for f in batch_findings(
        preflight.GangNeeds("train", "batch", 2, 1, 2, 1024, 0, options={
            "queue": "preflight-open", "iam_role": account.role}), ROOT,
        lambda service, region=None: account.aws.client(service))
        if f.check == "security group ingress"]
    assert len(checks) == 1, checks


def test_a_one_node_gang_needs_no_self_rule(account):
    found = findings(account, queue=account.aws.queue, nodes=1)
    assert "security group" not in found


def test_a_gpu_gang_on_instances_batch_chooses_is_refused(account):
    found = findings(account, gpu=1)
    assert found["instance types"].status == "FAILED"
    assert "never have GPUs" in found["instance types"].message
    assert found["shared memory"].status == "FAILED"
    assert "@batch(shared_memory=1024)" in found["shared memory"].fix


def test_instance_types_too_small_for_a_node(account):
    found = findings(account, queue="preflight-tiny-types", cpu=4)
    assert found["instance types"].status == "FAILED"
    assert "too small for one node" in found["instance types"].message


def test_a_missing_or_disabled_queue(account):
    assert "does not exist" in findings(account, queue="no-such-queue")["job queue"].message
    off = findings(account, queue="preflight-off")["job queue"]
    assert off.status == "FAILED"
    assert off.fix == "aws batch update-job-queue --job-queue preflight-off --state ENABLED"


def test_a_role_ecs_tasks_may_not_assume(account):
    found = findings(account, role=account.untrusted_role)["IAM role"]
    assert found.status == "FAILED" and "update-assume-role-policy" in found.fix


def test_a_role_without_access_to_the_datastore(account):
    found = findings(account, role=account.no_s3_role)["IAM role"]
    assert found.status == "FAILED"
    assert "s3:GetObject, s3:PutObject, s3:ListBucket" in found.message
    assert "put-role-policy --role-name gang-no-s3" in found.fix


ECR = "123456789012.dkr.ecr.us-east-1.amazonaws.com/"
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType":
                       "application/vnd.docker.distribution.manifest.v2+json",
                       "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                                  "size": 7023, "digest": "sha256:" + "a" * 64},
                       "layers": []})


def test_an_image_in_ecr_is_looked_up(account):
    ecr = account.aws.client("ecr")
    ecr.create_repository(repositoryName="trainer")
    ecr.put_image(repositoryName="trainer", imageManifest=MANIFEST, imageTag="v1")
    assert findings(account, image=ECR + "trainer:v1")["image in ECR"].status == "ok"
    missing_tag = findings(account, image=ECR + "trainer:v2")["image in ECR"]
    assert missing_tag.status == "FAILED" and "CannotPullContainerError" in missing_tag.message
    assert missing_tag.fix.startswith("push it (docker push %strainer:v2" % ECR)
    no_repo = findings(account, image=ECR + "nothing")["image in ECR"]
    assert no_repo.status == "FAILED" and "(repository nothing, latest)" in no_repo.message
    assert "image in ECR" not in findings(account, image="python:3.11")


def test_a_role_that_does_not_exist(account):
    found = findings(account, role="arn:aws:iam::123456789012:role/nobody")["IAM role"]
    assert found.status == "FAILED" and "does not exist" in found.message


# -- through Metaflow's CLI ----------------------------------------------------------------

def preflight_cli(aws, tmp_path, queue, role, **td):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / "preflight_flow.py", workdir)
    home = tmp_path / "home"
    home.mkdir()
    env = isolated_env(aws.env, {"METAFLOW_BATCH_JOB_QUEUE": queue,
                                 "METAFLOW_ECS_S3_ACCESS_IAM_ROLE": role},
                       {k: str(v) for k, v in td.items()}, home=home)
    res = metaflow("preflight_flow.py", ["--with", "batch", "torch-distributed", "preflight"],
                   workdir, env, timeout_s=120)
    res.output = res.stdout + res.stderr
    return res


def test_the_command_fails_naming_each_fix(account, tmp_path):
    res = preflight_cli(account.aws, tmp_path, "preflight-small", account.no_s3_role, TD_CPU=4)
    assert res.returncode != 0, res
    assert "@torch_distributed preflight failed" in res.output, res
    assert "fix: aws batch update-compute-environment" in res.output, res
    assert "fix: aws iam put-role-policy" in res.output, res


# -- --smoke: one real 2-node job on the emulated AWS Batch -------------------------------------

def test_the_checks_pass_then_the_smoke_job_forms_a_gang_across_two_nodes(account, batch,
                                                                         tmp_path):
    """The whole command on a queue that can run the gang: every check passes, then it says
    it runs a job, runs it (a multi-node job on the emulator) and reports every node."""
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / "preflight_flow.py", workdir)
    home = tmp_path / "home"
    home.mkdir()
    env = isolated_env(account.aws.env, batch.env,
                       {"METAFLOW_BATCH_JOB_QUEUE": account.ok_queue,
                        "METAFLOW_ECS_S3_ACCESS_IAM_ROLE": account.role}, home=home)
    res = metaflow("preflight_flow.py", ["--with", "batch", "torch-distributed", "preflight",
                                         "--smoke", "--smoke-timeout", "240"],
                   workdir, env, timeout_s=300)
    output = res.stdout + res.stderr
    assert res.returncode == 0, output[-6000:]
    assert "checking step train: a gang of 2 nodes x (2 CPU, 1024 MiB) on AWS Batch" in output
    assert "[ok] security group" in output and "[ok] IAM role" in output, output[-6000:]
    announced = output.index("smoke: this RUNS one job: a gang of 2 nodes x (2 CPU, 1024 MiB) "
                             "on AWS Batch queue preflight-ok")
    assert announced < output.index("Workflow starting"), output[-6000:]
    for node in (0, 1):
        assert "[ok] smoke node %d: torch " % node in output, output[-6000:]
    assert "[ok] smoke: a process group formed across 2 nodes and all-reduced once" in output
    [job] = [s for s in batch.submissions if s["jobName"].split("-")[-3] == "smoke"]
    assert job["jobQueue"] == account.ok_queue and "nodeOverrides" in job
