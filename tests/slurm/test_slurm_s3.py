"""`run --with torch_slurm` with Metaflow's S3 datastore (issue 43, point 2): the nodes read the
flow from the shared folder and write every artifact to S3, here a moto server on this
machine's end of the cluster's bridge, reached by every host as a real S3 endpoint would be."""

import logging
from pathlib import Path

import boto3
import pytest
import requests
from moto.server import ThreadedMotoServer

from tests.support import run_bounded

from .test_slurm_flows import NODES, job_ids

BUCKET = "td-slurm"
KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3_on_bridge(slurm_cluster):
    """(endpoint URL, the flows' environment for the S3 datastore there)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address=slurm_cluster.host_address, port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        url = "http://%s:%d" % (host, port)
        requests.post(url + "/moto-api/reset", timeout=10).raise_for_status()
        s3(url).create_bucket(Bucket=BUCKET)
        yield url, {**KEYS, "METAFLOW_DEFAULT_DATASTORE": "s3",
                    "METAFLOW_DATASTORE_SYSROOT_S3": "s3://%s/metaflow" % BUCKET,
                    "METAFLOW_S3_ENDPOINT_URL": url, "no_proxy": host, "NO_PROXY": host}
    finally:
        server.stop()


def s3(url):
    return boto3.client("s3", endpoint_url=url, region_name=KEYS["AWS_DEFAULT_REGION"],
                        aws_access_key_id=KEYS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=KEYS["AWS_SECRET_ACCESS_KEY"])


def test_a_gang_writes_its_artifacts_to_s3(slurm_runner, slurm_cluster, s3_on_bridge):
    url, env = s3_on_bridge
    result = slurm_runner.run("slurm_gang_flow.py", env=env)
    assert result.returncode == 0, result
    assert "NumNodes=2 " in slurm_cluster.job(job_ids(result.output)[1])
    # read back through Metaflow's client, from S3
    data = slurm_runner.client(
        "t = Flow('SlurmGangFlow').latest_run['train'].task\n"
        "result = dict(places=t.data.places, total=t.data.total,\n"
        "              where=t['total']._object['location'])",
        env=env)
    assert data["total"] == 10.0 and data["where"] == ":root:s3://%s/metaflow" % BUCKET, data
    hosts = [p["host"] for p in sorted(data["places"], key=lambda p: p["rank"])]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= NODES, hosts
    # every step's artifacts are in the bucket, and none in a local datastore
    keys = [o["Key"] for page in s3(url).get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix="metaflow/SlurmGangFlow/") for o in page.get("Contents", [])]
    assert any("/data/" in k for k in keys), keys
    for step in ("start", "train", "end"):
        assert any("/%s/" % step in k for k in keys), (step, keys)
    local = Path(slurm_runner.root, "SlurmGangFlow", "data")
    assert not local.exists(), sorted(local.rglob("*"))[:10]


def test_the_preflight_and_its_smoke_job_use_the_s3_datastore_chosen_on_the_command_line(
        slurm_runner, slurm_cluster, s3_on_bridge):
    """--datastore=s3 on the command line, the root and endpoint by configuration: the checks
    leave S3 to the smoke job, and the smoke job writes its artifacts there."""
    url, env = s3_on_bridge
    env = {k: v for k, v in env.items() if k != "METAFLOW_DEFAULT_DATASTORE"}
    argv = slurm_runner.argv("slurm_gang_flow.py", "--datastore=s3", "--with", "torch_slurm",
                             "torch-distributed", "preflight", "--smoke", "--yes",
                             "--smoke-timeout", "120")
    proc, _ = run_bounded(argv, slurm_runner.root, slurm_runner.env(env), 180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[??] datastore: whether every compute node reaches s3://%s/metaflow" % BUCKET in out
    assert "[ok] smoke: a process group formed across 2 nodes" in out, out
    assert "[ok] datastore: the smoke job's nodes read its flow from %s, beside this flow's, " \
        "and wrote its artifacts to s3://%s/metaflow" % (slurm_runner.root / ".torch_slurm",
                                                         BUCKET) in out, out
    keys = [o["Key"] for o in s3(url).list_objects_v2(
        Bucket=BUCKET, Prefix="metaflow/TorchDistributedSmokeFlow/").get("Contents", [])]
    assert any("/data/" in k for k in keys), keys
    assert slurm_cluster.wait_queue_empty(timeout=10) == []
