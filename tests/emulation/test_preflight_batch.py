"""`torch-distributed preflight` on AWS Batch against moto (Batch, EC2 security groups and
instance types, IAM): a queue that passes, and one for each failing case, each failure naming
its fix. The checks read moto in-process; two runs go through Metaflow's CLI end to end."""

from __future__ import annotations

import inspect
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import common as preflight
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.cli import \
    batch_findings

from tests.support import REPO, isolated_env, metaflow

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
        "placement": "ok", "IAM role": "ok", "image": "unknown"}, found


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
    assert "is large enough for one node" in found["instance types"].message


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


def documented_policy():
    """The IAM policy of docs/aws-batch.md's 'IAM: one policy for the launching identity'."""
    text = (REPO / "docs" / "aws-batch.md").read_text()
    section = text.split("## IAM: one policy for the launching identity", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)```", section.split("\n## ", 1)[0], re.S)[1])


def test_the_documented_iam_policy_allows_every_call_the_package_makes(account):
    """Valid JSON, and it allows what the preflight calls (recorded from its botocore clients
    on the emulated account, every check that reads the API on) and what Metaflow's AWS Batch
    client calls to submit and follow a gang's job (run --with batch, --smoke)."""
    import boto3
    from metaflow.plugins.aws.batch import batch_client

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import \
        batch as pb

    policy = documented_policy()
    called = set()

    def record(model, **_):
        called.add("%s:%s" % (model.service_model.signing_name, model.name))

    def clients(service, region=None):
        client = account.aws.client(service)
        client.meta.events.register("before-call.*.*", record)
        return client

    needs = preflight.GangNeeds(
        "train", "batch", 2, 1, 2, 1024, 0, image="123456789012.dkr.ecr.us-east-1.amazonaws.com"
        "/team/torch:1", options={"queue": "preflight-tiny-types", "iam_role": account.role})
    batch_findings(needs, ROOT, clients)
    assert {"batch:DescribeJobQueues", "batch:DescribeComputeEnvironments",
            "ec2:DescribeSecurityGroups", "ec2:DescribeInstanceTypes", "ecr:DescribeImages",
            "iam:GetRole", "iam:ListAttachedRolePolicies", "iam:ListRolePolicies",
            "iam:GetRolePolicy"} <= called, called
    methods = boto3.client("batch", region_name="us-east-1").meta.method_to_api_mapping
    source = inspect.getsource(batch_client)
    used = set(re.findall(r"_client\.([a-z_]+)\(", source)) | set(
        re.findall(r'get_paginator\(\s*"([a-z_]+)"', source))
    metaflows = {"batch:" + methods[m] for m in used if m in methods}
    assert {"batch:SubmitJob", "batch:DescribeJobs", "batch:TerminateJob"} <= metaflows, used
    missing = sorted(a for a in called | metaflows if not pb._allowed([policy], a, "*"))
    assert not missing, "docs/aws-batch.md's policy does not allow %s" % missing
    # and it names the job role it passes and the datastore, which only their ARNs should get
    assert pb._allowed([policy], "iam:PassRole", "arn:aws:iam::ACCOUNT_ID:role/JOB_ROLE")
    assert pb._allowed([policy], "s3:PutObject", "arn:aws:s3:::BUCKET/metaflow/x")
    assert not pb._allowed([policy], "iam:PassRole", "arn:aws:iam::ACCOUNT_ID:role/admin")


# -- through Metaflow's CLI ----------------------------------------------------------------

def preflight_cli(aws, tmp_path, queue, role, *extra, config=None, **td):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / "preflight_flow.py", workdir)
    home = tmp_path / "home"
    home.mkdir()
    if config:  # Metaflow's config file, as `metaflow configure aws` writes it
        (home / "config.json").write_text(json.dumps(config))
    env = isolated_env(aws.env, {"METAFLOW_BATCH_JOB_QUEUE": queue,
                                 "METAFLOW_ECS_S3_ACCESS_IAM_ROLE": role},
                       {k: str(v) for k, v in td.items()}, home=home)
    res = metaflow("preflight_flow.py", ["--with", "batch", "torch-distributed", "preflight",
                                         *extra], workdir, env, timeout_s=120)
    res.output = res.stdout + res.stderr
    return res


def test_the_command_fails_naming_each_fix(account, tmp_path):
    res = preflight_cli(account.aws, tmp_path, "preflight-small", account.no_s3_role, TD_CPU=4)
    assert res.returncode != 0, res
    assert "@torch_distributed preflight failed" in res.output, res
    assert "fix: aws batch update-compute-environment" in res.output, res
    assert "fix: aws iam put-role-policy" in res.output, res


def test_the_command_says_every_value_it_checks_and_where_it_came_from(account, tmp_path):
    res = preflight_cli(account.aws, tmp_path, account.ok_queue, account.role,
                        config={"METAFLOW_BATCH_CONTAINER_IMAGE": "team/torch:2.13"})
    assert res.returncode == 0, res.output
    out = res.output
    # Metaflow's own configuration first, then the step's values, then its checks
    assert out.index("Metaflow's AWS configuration:") < out.index("checking step train") \
        < out.index("step train:"), out
    for line in (
            "[ok] datastore: S3 (the environment variable METAFLOW_DEFAULT_DATASTORE)",
            "[ok] datastore root: s3://mf-bucket/metaflow (the environment variable "
            "METAFLOW_DATASTORE_SYSROOT_S3)",
            "[ok] job queue: preflight-ok (the environment variable METAFLOW_BATCH_JOB_QUEUE)",
            "[ok] AWS credentials: found (env)",
            "  job queue: preflight-ok (the environment variable METAFLOW_BATCH_JOB_QUEUE)",
            "  image: team/torch:2.13 (Metaflow's config ",
            "METAFLOW_BATCH_CONTAINER_IMAGE)",
            "  per node cpu: 2 vCPUs (@resources(cpu=2))",
            "  processes per node: 1 (@torch_distributed(nproc_per_node=1))",
            "[ok] placement: each node on an instance AWS Batch chooses (optimal"):
        assert line in out, (line, out)
    assert "[??] image: image team/torch:2.13" in out, out


def test_the_default_image_is_named_with_its_source(account, tmp_path):
    res = preflight_cli(account.aws, tmp_path, account.ok_queue, account.role)
    assert "  image: python:%d.%d (Metaflow's default for @batch: python:%d.%d, the version " \
        "of the Python that launches the flow" % (sys.version_info[:2] * 2) in res.output, \
        res.output


def test_a_node_the_queue_cannot_place_is_said_before_anything_is_submitted(account, tmp_path):
    # t3.micro: 2 vCPUs and 1 GiB, a node of 4 vCPUs does not fit: no smoke job is submitted
    res = preflight_cli(account.aws, tmp_path, "preflight-tiny-types", account.role,
                        "--smoke", "--yes", TD_CPU=4)
    assert res.returncode != 0, res.output
    assert "[FAILED] instance types: no instance type of queue preflight-tiny-types " \
        "(t3.micro) is large enough for one node (4 CPU, 1024 MiB)" in res.output, res.output
    assert "smoke: not run for step train: fix the failed checks first" in res.output
    assert "smoke: this RUNS" not in res.output and "Workflow starting" not in res.output


def test_the_smoke_job_is_said_and_asked_for_before_it_is_submitted(account, tmp_path):
    # no --yes, and no terminal to answer on: nothing is submitted
    res = preflight_cli(account.aws, tmp_path, account.ok_queue, account.role, "--smoke")
    assert res.returncode == 0, res.output
    said = res.output.index("smoke: it starts 2 instances (each node on an instance AWS Batch "
                            "chooses (optimal: C, M or R families) for 2 CPU, 1024 MiB); expect "
                            "about 5 to 15 minutes")
    assert said < res.output.index("smoke: submit it?"), res.output
    assert "[??] smoke: not run: the job was not confirmed" in res.output, res.output
    assert "Workflow starting" not in res.output


def test_on_a_machine_without_metaflows_aws_configuration_it_says_what_metaflow_needs(
        tmp_path):
    """No `metaflow configure aws`, no AWS credentials: Metaflow itself would stop at `The
    @batch decorator requires --datastore=s3.` (or, with --datastore=s3, at `Could not find
    the location of the datastore`) before any check; the preflight says what Metaflow needs
    and how to get it, then what it can check without an account."""
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / "preflight_flow.py", workdir)
    home = tmp_path / "home"
    home.mkdir()
    env = isolated_env({"HOME": str(home)}, home=home)
    for top in ([], ["--datastore=s3"]):
        res = metaflow("preflight_flow.py", [*top, "--with", "batch", "torch-distributed",
                                             "preflight"], workdir, env, timeout_s=120)
        out = res.stdout + res.stderr
        assert res.returncode != 0, out
        assert "requires --datastore=s3" not in out.split("Metaflow's AWS configuration:")[0]
        assert "Could not find the location of the datastore" not in out, out
        assert out.index("Metaflow's AWS configuration:") < out.index("checking step train")
        for fragment in ("[FAILED] datastore root: no S3 datastore root "
                         "(METAFLOW_DATASTORE_SYSROOT_S3 is not set)",
                         "[FAILED] job queue: none",
                         "[FAILED] IAM role: none",
                         "[FAILED] AWS credentials: boto3 found none",
                         "fix: metaflow configure aws",
                         "export METAFLOW_DATASTORE_SYSROOT_S3=s3://<bucket>/metaflow",
                         "  image: python:",
                         "[??] account: not checked: no AWS credentials",
                         "@torch_distributed preflight failed", "Internal error"):
            assert (fragment in out) == (fragment != "Internal error"), (fragment, out)
        assert ("[FAILED] datastore: Metaflow's datastore here is local" in out) == (not top)


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
                                         "--smoke", "--yes", "--smoke-timeout", "240"],
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
