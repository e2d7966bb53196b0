"""The preflight's account of Metaflow's own AWS configuration and of where each value it checks
came from (preflight/config.py), what a node would run on (batch.check_placement), and what
--smoke says before it starts (issue 42). Pure: settings and decorators are stand-ins; the
real CLI runs are in tests/emulation/test_preflight_batch.py."""

from types import SimpleNamespace

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import (
    batch as pb,
    common as preflight,
    config as pc,
    smoke as ps,
)


def settings(**values):
    """setting(name) -> (value, source), as internals.metaflow_setting answers."""
    def setting(name):
        if name in values:
            return values[name], "the environment variable METAFLOW_%s" % name
        return (("local", "Metaflow's default, as METAFLOW_DEFAULT_DATASTORE is not set")
                if name == "DEFAULT_DATASTORE" else (None, "METAFLOW_%s is not set" % name))
    return setting


def by_check(findings):
    return {f.check: f for f in findings}


def test_an_unconfigured_machine_is_told_what_metaflow_needs_and_how_to_get_it():
    found = by_check(pc.metaflow_findings(settings(), "local", ["datastore local"], {}, None,
                                          None))
    assert {c: f.status for c, f in found.items()} == {
        "datastore": "FAILED", "datastore root": "FAILED", "job queue": "FAILED",
        "IAM role": "FAILED", "AWS credentials": "FAILED", "AWS region": "FAILED"}
    assert "The @batch decorator requires --datastore=s3." in found["datastore"].message
    assert "(Metaflow's default, as METAFLOW_DEFAULT_DATASTORE is not set)" in \
        found["datastore"].message
    for check in ("datastore", "datastore root", "job queue", "IAM role"):
        assert found[check].fix.startswith("metaflow configure aws"), found[check]
    assert "METAFLOW_DATASTORE_SYSROOT_S3=s3://<bucket>/metaflow" in found["datastore root"].fix
    assert "AWS_DEFAULT_REGION" in found["AWS region"].fix


def test_a_configured_machine_shows_each_value_and_its_source():
    found = by_check(pc.metaflow_findings(
        settings(DEFAULT_DATASTORE="s3", DATASTORE_SYSROOT_S3="s3://b/mf", BATCH_JOB_QUEUE="q",
                 ECS_S3_ACCESS_IAM_ROLE="arn:aws:iam::1:role/r"),
        "s3", [], {}, "shared-credentials-file", "eu-west-1"))
    assert all(f.status == "ok" for f in found.values()), found
    assert found["datastore root"].message == \
        "s3://b/mf (the environment variable METAFLOW_DATASTORE_SYSROOT_S3)"
    assert found["AWS credentials"].message == "found (shared-credentials-file)"


def test_datastore_s3_from_the_command_line_and_queues_named_by_every_step():
    found = by_check(pc.metaflow_findings(settings(DATASTORE_SYSROOT_S3="s3://b"), "s3", [],
                                          {"queue": True, "iam_role": False}, "env", "r"))
    assert found["datastore"].message == "S3 (--datastore=s3 on the command line)"
    assert found["job queue"].status == "ok" and "@batch(queue=...)" in \
        found["job queue"].message
    assert found["IAM role"].status == "FAILED"


def deco(name, given=(), **attributes):
    return SimpleNamespace(name=name, attributes=attributes, given=set(given))


def given(d):
    return d.given


@pytest.mark.parametrize("decorators,setting,source", [
    ([deco("batch", ("queue",), queue="mine")], settings(BATCH_JOB_QUEUE="q"),
     "@batch(queue='mine')"),
    ([deco("batch", queue="q")], settings(BATCH_JOB_QUEUE="q"),
     "the environment variable METAFLOW_BATCH_JOB_QUEUE"),
    ([deco("batch")], settings(),
     "not set: neither @batch(queue=...) nor METAFLOW_BATCH_JOB_QUEUE names one"),
])
def test_where_the_queue_came_from(decorators, setting, source):
    assert pc.source_of("queue", decorators, given, setting) == source


def test_where_the_image_and_the_resources_came_from():
    decorators = [deco("resources", ("cpu",), cpu=4), deco("batch", cpu="4", memory="4096",
                                                             image="python:3.11")]
    assert pc.source_of("cpu", decorators, given, settings()) == "@resources(cpu=4)"
    assert pc.source_of("memory", decorators, given, settings()) == \
        "Metaflow's default for @batch(memory=...)"
    assert pc.source_of("image", decorators, given, settings()).startswith(
        "Metaflow's default for @batch: python:")
    assert pc.source_of("image", decorators, given, settings(
        BATCH_CONTAINER_IMAGE="team/torch")) == \
        "the environment variable METAFLOW_BATCH_CONTAINER_IMAGE"
    needs = preflight.GangNeeds("train", "batch", 2, 2, 4, 4096, 0, image="python:3.11",
                                options={"queue": "q"})
    lines = pc.value_lines(needs, decorators + [deco("torch_distributed", nproc_per_node=2)],
                           given, settings(), "s3://b")
    assert "per node cpu: 4 vCPUs (@resources(cpu=4))" in lines
    assert "processes per node: 2 (@torch_distributed(nproc_per_node=2))" in lines
    assert "datastore root: s3://b" in lines


@pytest.mark.parametrize("nproc,cpu,gpu,warned", [(4, 2, 0, True), (2, 2, 0, False),
                                                   (8, 2, 8, False)])
def test_more_processes_than_vcpus_on_a_cpu_node_is_a_warning(nproc, cpu, gpu, warned):
    needs = preflight.GangNeeds("train", "batch", 1, nproc, cpu, 1024, gpu)
    found = pc.check_node_size(needs)
    assert bool(found) == warned
    if warned:
        assert found[0].status == "warning" and "@batch(cpu=4)" in found[0].fix


def instance(name, vcpus, memory, gpus=0):
    return {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus},
            "MemoryInfo": {"SizeInMiB": memory},
            "GpuInfo": {"Gpus": [{"Count": gpus}]} if gpus else None}


def test_placement_names_the_smallest_type_that_holds_a_node():
    needs = preflight.GangNeeds("train", "batch", 2, 1, 4, 16000, 1, options={"queue": "q"})
    environments = [{"computeEnvironmentName": "ce", "computeResources": {
        "type": "EC2", "instanceTypes": ["g5"]}}]
    facts = pb.BatchFacts(environments=environments, instance_types=[
        instance("g5.2xlarge", 8, 32768, 1), instance("g5.xlarge", 4, 16384, 1),
        instance("t3.micro", 2, 1024)])
    [found] = pb.check_placement(needs, facts)
    assert found.message.startswith("each node on a g5.xlarge (4 vCPUs, 16384 MiB, 1 GPUs)")
    assert ps.announcement(needs, 600, found.message).splitlines()[1] == (
        "smoke: it starts 2 instances (each node on a g5.xlarge (4 vCPUs, 16384 MiB, 1 GPUs), "
        "the smallest instance type of queue q that holds 4 CPU, 16000 MiB, 1 GPU); expect "
        "about 5 to 15 minutes: instances to start, the image to pull on each, then about a "
        "minute of work; billed for that time")


def test_the_smoke_job_is_not_submitted_unless_confirmed():
    needs = preflight.GangNeeds("train", "batch", 2, 1, 2, 1024, 0, options={"queue": "q"})
    said, ran = [], []
    found = ps.smoke(needs, said.append, 300, lambda *a: ran.append(a), environ={},
                     confirm=lambda question: False)
    assert not ran and [f.message for f in found] == ["not run: the job was not confirmed"]
    assert said[0].startswith("smoke: this RUNS one job")
