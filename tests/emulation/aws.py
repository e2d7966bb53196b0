"""A moto server on 127.0.0.1 (with TD_EMULATION_HOSTS=1, on the bridge nodes reach: netns.py)
with what Metaflow's `--with batch` needs already created.

    with moto_aws() as aws:
        aws.env            # for the test's Metaflow run (client side)
        aws.container_env  # what a Batch container gets from its host (credentials, endpoint)

moto keeps its state per process, so `moto_aws` resets it on entry: one at a time.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import requests
from moto.core.config import default_user_config
from moto.server import ThreadedMotoServer

from . import netns

REGION = "us-east-1"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
BUCKET = "mf-bucket"
QUEUE = "metaflow-queue"
FARGATE_QUEUE = "metaflow-fargate-queue"


@dataclass(frozen=True)
class AwsEmulation:
    endpoint_url: str
    bucket: str
    role_arn: str
    queue: str
    fargate_queue: str
    env: dict[str, str]
    container_env: dict[str, str]

    def client(self, service: str):
        return client(self.endpoint_url, service)


class Marks:
    """What a flow's tasks leave for the test, through moto's S3 as a remote task would write
    it (no folder is shared with a node): `url` is the flow's TD_MARKS, an S3 prefix under
    which a task's `mark(name, value)` puts an object `name` holding repr(value)."""

    def __init__(self, aws: AwsEmulation, name: str) -> None:
        self._s3 = aws.client("s3")
        self._bucket = aws.bucket
        self._prefix = "marks/%s/" % name
        self.url = "s3://%s/%s" % (aws.bucket, self._prefix.rstrip("/"))

    def exists(self, name: str) -> bool:
        listed = self._s3.list_objects_v2(Bucket=self._bucket, Prefix=self._prefix + name)
        return any(o["Key"] == self._prefix + name for o in listed.get("Contents", ()))

    def read(self, name: str) -> str:
        return self._s3.get_object(Bucket=self._bucket,
                                   Key=self._prefix + name)["Body"].read().decode()


def validate_request(service: str, operation: str, params: dict) -> None:
    """Fails unless `params` is valid input of `operation` in botocore's model of `service`."""
    import botocore.session
    from botocore.validate import ParamValidator

    model = botocore.session.get_session().get_service_model(service)
    report = ParamValidator().validate(params, model.operation_model(operation).input_shape)
    assert not report.has_errors(), report.generate_report()


def client(endpoint_url: str, service: str):
    return boto3.client(
        service,
        endpoint_url=endpoint_url,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def _aws_env(endpoint_url: str) -> dict[str, str]:
    return {
        **CREDENTIALS,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL": endpoint_url,
        # Never fall back to the instance metadata service for credentials or region.
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def metaflow_env(endpoint_url: str, role_arn: str, queue: str) -> dict[str, str]:
    """Metaflow settings (metaflow_config.py) that send `--with batch` to the emulation."""
    return {
        **_aws_env(endpoint_url),
        "METAFLOW_DEFAULT_DATASTORE": "s3",
        # DATATOOLS_S3ROOT and CARD_S3ROOT default to paths under it.
        "METAFLOW_DATASTORE_SYSROOT_S3": "s3://%s/metaflow" % BUCKET,
        # Passed on to the job (batch.py), which downloads the code package with it.
        "METAFLOW_S3_ENDPOINT_URL": endpoint_url,
        "METAFLOW_DEFAULT_METADATA": "local",
        "METAFLOW_BATCH_JOB_QUEUE": queue,
        "METAFLOW_ECS_S3_ACCESS_IAM_ROLE": role_arn,
    }


def container_env(endpoint_url: str) -> dict[str, str]:
    """What a Batch container gets from its image and host rather than from Metaflow."""
    return {
        **_aws_env(endpoint_url),
        # Read by the job's own bash script: no `pip install boto3 requests` in the job.
        "METAFLOW_SKIP_INSTALL_DEPENDENCIES": "1",
    }


def _create_network(endpoint_url: str) -> dict:
    ec2 = client(endpoint_url, "ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="batch", Description="batch", VpcId=vpc)
    return {"subnets": [subnet], "securityGroupIds": [group["GroupId"]]}


def _create_queue(endpoint_url: str, name: str, resources: dict, role_arn: str) -> None:
    batch = client(endpoint_url, "batch")
    environment = batch.create_compute_environment(
        computeEnvironmentName=name + "-ce",
        # Metaflow reads computeResources.type, which UNMANAGED environments lack.
        type="MANAGED",
        state="ENABLED",
        computeResources=resources,
        serviceRole=role_arn,
    )
    batch.create_job_queue(
        jobQueueName=name,
        state="ENABLED",
        priority=1,
        computeEnvironmentOrder=[
            {"order": 1, "computeEnvironment": environment["computeEnvironmentArn"]}
        ],
    )


def _provision(endpoint_url: str) -> AwsEmulation:
    iam = client(endpoint_url, "iam")
    role = iam.create_role(RoleName="metaflow-batch", AssumeRolePolicyDocument="{}")
    role_arn = role["Role"]["Arn"]
    profile = iam.create_instance_profile(InstanceProfileName="ecsInstanceRole")
    client(endpoint_url, "s3").create_bucket(Bucket=BUCKET)
    network = _create_network(endpoint_url)
    ec2_resources = {
        "type": "EC2",
        "minvCpus": 0,
        "maxvCpus": 64,
        "desiredvCpus": 0,
        "instanceTypes": ["optimal"],
        "instanceRole": profile["InstanceProfile"]["Arn"],
        **network,
    }
    _create_queue(endpoint_url, QUEUE, ec2_resources, role_arn)
    fargate_resources = {"type": "FARGATE", "maxvCpus": 64, **network}
    _create_queue(endpoint_url, FARGATE_QUEUE, fargate_resources, role_arn)
    return AwsEmulation(
        endpoint_url=endpoint_url,
        bucket=BUCKET,
        role_arn=role_arn,
        queue=QUEUE,
        fargate_queue=FARGATE_QUEUE,
        env=metaflow_env(endpoint_url, role_arn, QUEUE),
        container_env=container_env(endpoint_url),
    )


@contextlib.contextmanager
def moto_aws() -> Iterator[AwsEmulation]:
    # moto's docker-free Batch backend: it never runs a container (the emulator does).
    default_user_config["batch"] = {"use_docker": False}
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address=netns.listen_address(), port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint_url = "http://%s:%d" % (host, port)
        # moto's backends are process-wide: start from an empty account.
        requests.post(endpoint_url + "/moto-api/reset", timeout=10).raise_for_status()
        yield _provision(endpoint_url)
    finally:
        server.stop()
