"""The preflight's checks as pure functions of what the APIs answered (tables), and its report.
The same checks against moto and the loopback Kubernetes API: tests/emulation/test_preflight_*."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import common as preflight
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import batch as pb
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import kubernetes as pk
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import smoke as ps
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedPreflightFailed
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.cli import (
    gang_steps, run_preflight)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology


def needs(nodes=2, cpu=4, memory=1024, gpu=0, shared_memory=None, **options):
    options.setdefault("queue", "q")
    options.setdefault("iam_role", "arn:aws:iam::1:role/job")
    return preflight.GangNeeds("train", "batch", nodes, 1, cpu, memory, gpu, shared_memory,
                               options=options)


def env(name="ce", kind="EC2", max_vcpus=64, types=("optimal",), groups=("sg-1",),
        state="ENABLED", status="VALID"):
    return {"computeEnvironmentName": name, "state": state, "status": status,
            "computeResources": {"type": kind, "maxvCpus": max_vcpus,
                                 "instanceTypes": list(types),
                                 "securityGroupIds": list(groups)}}


def statuses(findings):
    return [(f.check, f.status) for f in findings]


@pytest.mark.parametrize("queue, refused, expected", [
    ({"state": "ENABLED", "status": "VALID"}, {}, "ok"),
    ({"state": "DISABLED", "status": "VALID"}, {}, "FAILED"),
    ({"state": "ENABLED", "status": "INVALID", "statusReason": "x"}, {}, "FAILED"),
    (None, {}, "FAILED"),
    (None, {"queue": "AccessDenied: no"}, "unknown"),
])
def test_queue(queue, refused, expected):
    [found] = pb.check_queue(needs(), pb.BatchFacts(queue=queue, refused=refused))
    assert found.status == expected, found


def test_no_queue_configured_names_the_setting():
    [found] = pb.check_queue(needs(queue=None), pb.BatchFacts())
    assert found.status == "FAILED" and "METAFLOW_BATCH_JOB_QUEUE" in found.fix


@pytest.mark.parametrize("nodes, cpu, environments, expected", [
    (2, 4, [env(max_vcpus=8)], [("capacity", "ok")]),
    (2, 4, [env(max_vcpus=7)], [("capacity", "FAILED")]),
    (2, 4, [env("a", max_vcpus=4), env("b", max_vcpus=16)], [("capacity", "ok")]),
    (2, 1, [env(kind="FARGATE")], [("compute environment", "FAILED")]),
    (1, 1, [env(kind="FARGATE_SPOT")], [("capacity", "ok")]),  # one node: Fargate may run it
    # AWS Batch runs no multi-node parallel job on Spot (issue 42): one node may use it
    (2, 1, [env(kind="SPOT")], [("compute environment", "FAILED")]),
    (1, 1, [env(kind="SPOT")], [("capacity", "ok")]),
    (2, 1, [env("a", kind="SPOT"), env("b")], [("compute environment", "warning"),
                                              ("capacity", "ok")]),
    (2, 1, [env(state="DISABLED")], [("compute environment", "FAILED"), ("capacity", "ok")]),
    (2, 1, [{"computeEnvironmentName": "u", "state": "ENABLED", "status": "VALID"}],
     [("capacity", "unknown")]),
])
def test_environments(nodes, cpu, environments, expected):
    assert statuses(pb.check_environments(needs(nodes, cpu), environments)) == expected


def test_capacity_fix_rounds_the_vcpus_up():
    [found] = pb.check_environments(needs(3, 1.5), [env(max_vcpus=2)])
    assert found.fix.endswith("--compute-environment ce --compute-resources maxvCpus=5")


SELF_IN = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]}
ALL_OUT = {"IpProtocol": "-1", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}
SELF_OUT = {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-1"}]}
TCP_IN = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
          "UserIdGroupPairs": [{"GroupId": "sg-1"}]}


@pytest.mark.parametrize("ingress, egress, expected, fixes", [
    ([SELF_IN], [ALL_OUT], "ok", 0),
    ([SELF_IN], [SELF_OUT], "ok", 0),
    ([TCP_IN], [ALL_OUT], "FAILED", 1),
    ([], [], "FAILED", 2),
    ([SELF_IN], [], "FAILED", 1),
    ([{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": "sg-other"}]}], [ALL_OUT],
     "FAILED", 1),
])
def test_security_group_self_rule(ingress, egress, expected, fixes):
    group = {"GroupId": "sg-1", "IpPermissions": ingress, "IpPermissionsEgress": egress}
    [found] = pb.check_security_groups(needs(), pb.BatchFacts(
        environments=[env()], security_groups=[group]))
    assert found.status == expected, found
    assert len([f for f in found.fix.split("; ") if f]) == fixes, found.fix


def test_security_groups_unknown_when_none_is_named_or_refused():
    [none] = pb.check_security_groups(needs(), pb.BatchFacts(environments=[env(groups=())]))
    [refused] = pb.check_security_groups(needs(), pb.BatchFacts(
        environments=[env()], refused={"security_groups": "UnauthorizedOperation: no"}))
    assert (none.status, refused.status) == ("unknown", "unknown")
    assert pb.check_security_groups(needs(nodes=1), pb.BatchFacts(environments=[env()])) == []


def itype(name, vcpus, mib, gpus=0):
    entry = {"InstanceType": name, "VCpuInfo": {"DefaultVCpus": vcpus},
             "MemoryInfo": {"SizeInMiB": mib}}
    if gpus:
        entry["GpuInfo"] = {"Gpus": [{"Count": gpus}]}
    return entry


@pytest.mark.parametrize("types, known, cpu, gpu, expected, says", [
    (["optimal"], None, 4, 0, "ok", "Batch chooses"),
    (["optimal"], None, 4, 1, "FAILED", "never have GPUs"),
    (["g5"], [itype("g5.xlarge", 4, 16384, 1)], 4, 1, "ok", "g5.xlarge holds one node"),
    (["m5"], [itype("m5.large", 2, 8192)], 4, 0, "FAILED", "is large enough for one node"),
    (["m5"], [itype("m5.xlarge", 4, 16384)], 4, 1, "FAILED", "has GPUs, and the step asks"),
    (["g5"], None, 4, 1, "unknown", "could not be read"),
])
def test_instance_types(types, known, cpu, gpu, expected, says):
    [found] = pb.check_instance_types(needs(cpu=cpu, gpu=gpu), pb.BatchFacts(
        environments=[env(types=types)], instance_types=known))
    assert found.status == expected and says in found.message, found


def test_instance_type_patterns_ask_for_families_and_types():
    assert pb.instance_type_patterns([env(types=["optimal", "g5", "p4d.24xlarge"])]) == [
        "g5.*", "p4d.24xlarge"]


TRUST = {"Statement": [{"Effect": "Allow", "Principal": {"Service": "ecs-tasks.amazonaws.com"},
                        "Action": "sts:AssumeRole"}]}


def allow(action, resource, effect="Allow"):
    return {"Statement": [{"Effect": effect, "Action": action, "Resource": resource}]}


@pytest.mark.parametrize("policies, expected", [
    ([allow("s3:*", "*")], "ok"),
    ([allow("*", "*")], "ok"),
    ([allow(["s3:Get*", "s3:Put*", "s3:List*"], ["arn:aws:s3:::b", "arn:aws:s3:::b/*"])], "ok"),
    ([allow("s3:*", "arn:aws:s3:::b/root/*"), allow("s3:ListBucket", "arn:aws:s3:::b")], "ok"),
    ([allow("s3:*", "arn:aws:s3:::other/*")], "FAILED"),
    ([allow("s3:GetObject", "*")], "FAILED"),
    ([allow("s3:*", "*"), allow("s3:PutObject", "*", "Deny")], "FAILED"),
    ([], "FAILED"),
])
def test_role_datastore_access(policies, expected):
    facts = pb.BatchFacts(role={"AssumeRolePolicyDocument": TRUST}, policies=policies,
                          datastore_root="s3://b/root")
    [found] = pb.check_role(needs(), facts)
    assert found.status == expected, found


def test_role_trust_and_existence():
    untrusted = pb.BatchFacts(role={"AssumeRolePolicyDocument": {"Statement": []}})
    [found] = pb.check_role(needs(), untrusted)
    assert found.status == "FAILED" and "update-assume-role-policy" in found.fix
    [missing] = pb.check_role(needs(), pb.BatchFacts())
    assert missing.status == "FAILED" and "does not exist" in missing.message
    [unset] = pb.check_role(needs(iam_role=None), pb.BatchFacts())
    assert "METAFLOW_ECS_S3_ACCESS_IAM_ROLE" in unset.fix
    # the query API's URL-encoded trust policy
    encoded = pb.BatchFacts(role={"AssumeRolePolicyDocument": "%7B%22Statement%22%3A%5B%5D%7D"})
    assert pb.check_role(needs(), encoded)[0].status == "FAILED"


@pytest.mark.parametrize("gpu, shared_memory, expected", [
    (0, None, []),
    (1, None, [("shared memory", "FAILED")]),
    (1, "512", [("shared memory", "FAILED")]),
    (1, 1024, [("shared memory", "ok")]),
])
def test_shared_memory(gpu, shared_memory, expected):
    assert statuses(preflight.check_shared_memory(
        needs(gpu=gpu, shared_memory=shared_memory), "batch")) == expected


def deco(name, **attributes):
    return SimpleNamespace(name=name, attributes=attributes)


def test_step_needs_reads_the_backend_decorator():
    ours = SimpleNamespace(name="torch_distributed", active=True, topology=Topology(2, 8))
    decorators = [ours, deco("batch", cpu="8", memory="30000", gpu="8", queue="gpu-q",
                             shared_memory="8000", image="img")]
    [(name, topology, decos)] = gang_steps([("train", decorators), ("end", [])])
    found = preflight.step_needs(name, topology, decos)
    assert (found.backend, found.nodes, found.cpu, found.memory, found.gpu, found.image) == (
        "batch", 2, 8.0, 30000, 8, "img")
    assert found.options["queue"] == "gpu-q"
    assert preflight.step_needs("train", topology, [ours]).backend == ""
    inactive = SimpleNamespace(name="torch_distributed", active=False)
    assert gang_steps([("start", [inactive])]) == []


def test_run_preflight_reports_and_fails_naming_the_checks():
    ours = SimpleNamespace(name="torch_distributed", active=True, topology=Topology(2, 1))
    steps = [("train", [ours, deco("batch", cpu="1", memory="1024", gpu="0")])]
    lines = []

    def backend(needs, root):
        return [preflight.passed(needs.step, "job queue", "fine"),
                preflight.failed(needs.step, "capacity", "too small", "do this")]

    with pytest.raises(TorchDistributedPreflightFailed) as raised:
        run_preflight(steps, "s3://b", lines.append, {"batch": backend})
    assert "1 check failed: capacity (train)" in str(raised.value)
    assert lines[1:] == ["step train:", "  [ok] job queue: fine",
                         "  [FAILED] capacity: too small", "       fix: do this"]
    ok = run_preflight(steps, "s3://b", lines.append, {"batch": lambda n, r: []})
    assert ok == []


def test_run_preflight_without_a_backend_or_a_gang():
    ours = SimpleNamespace(name="torch_distributed", active=True, topology=Topology(2, 1))
    lines = []
    with pytest.raises(TorchDistributedPreflightFailed, match="backend"):
        run_preflight([("train", [ours])], "", lines.append, {})
    assert "fix: python flow.py --with batch torch-distributed preflight" in lines[-1]
    with pytest.raises(TorchDistributedPreflightFailed, match="nothing to check"):
        run_preflight([("start", [])], "", lambda line: None, {})


# -- Kubernetes ---------------------------------------------------------------------------------

def kneeds(nodes=2, gpu=0, **options):
    options.setdefault("namespace", "ml")
    return preflight.GangNeeds("train", "kubernetes", nodes, 1, 1, 1024, gpu, options=options)


def crd(spec=("startupPolicy",), status=("terminalState",), version="v1alpha2"):
    props = {"spec": {"properties": {k: {} for k in spec}},
             "status": {"properties": {k: {} for k in status}}}
    return {"spec": {"versions": [{"name": version,
                                   "schema": {"openAPIV3Schema": {"properties": props}}}]}}


@pytest.mark.parametrize("facts, expected, says", [
    (pk.KubernetesFacts(jobset_resources=["jobsets"], jobset_crd=crd()), "ok", "v0.6 or later"),
    (pk.KubernetesFacts(jobset_resources=["jobsets"], jobset_crd=crd(status=())), "ok",
     "older than v0.6"),
    (pk.KubernetesFacts(jobset_resources=["jobsets"], jobset_crd=crd(spec=())), "FAILED",
     "older than v0.4"),
    (pk.KubernetesFacts(jobset_resources=["jobsets"], refused={"jobset_crd": "403 Forbidden"}),
     "ok", "could not be read: 403 Forbidden"),
    (pk.KubernetesFacts(), "FAILED", "not installed"),
    (pk.KubernetesFacts(jobset_resources=["other"]), "FAILED", "not installed"),
    (pk.KubernetesFacts(refused={"jobset_api": "403 Forbidden"}), "unknown", "could not be read"),
])
def test_jobset(facts, expected, says):
    [found] = pk.check_jobset(kneeds(), facts)
    assert found.status == expected and says in found.message, found
    assert pk.check_jobset(kneeds(nodes=1), facts) == []


def granted(denied=(), wanted=pk.GANG_ACCESS):
    return {a: (a not in denied, "") for a in wanted}


@pytest.mark.parametrize("nodes, access, refused, expected", [
    (2, granted(), {}, "ok"),
    (2, granted({("delete", "jobset.x-k8s.io", "jobsets")}), {}, "FAILED"),
    (2, {}, {}, "FAILED"),  # no answer is no permission
    (1, granted(wanted=pk.JOB_ACCESS), {}, "ok"),
    (1, granted({("create", "batch", "jobs")}, pk.JOB_ACCESS), {}, "FAILED"),
    (2, {}, {"access": "403 Forbidden"}, "unknown"),
])
def test_access(nodes, access, refused, expected):
    [found] = pk.check_access(kneeds(nodes), pk.KubernetesFacts(access=access, refused=refused))
    assert found.status == expected, found


def test_access_fix_names_only_what_is_denied():
    [found] = pk.check_access(kneeds(), pk.KubernetesFacts(access=granted(
        {("list", "", "pods")})))
    assert found.fix.startswith("kubectl create role metaflow-gang -n ml --verb=list "
                                "--resource=pods, then kubectl create rolebinding")


def local_queue(active="True"):
    return {"spec": {"clusterQueue": "cq"},
            "status": {"conditions": [{"type": "Active", "status": active, "reason": "R",
                                       "message": "m"}]}}


@pytest.mark.parametrize("facts, expected, says", [
    (pk.KubernetesFacts(kueue_served=True, local_queue=local_queue()), "ok", "ClusterQueue cq"),
    (pk.KubernetesFacts(kueue_served=True, local_queue=local_queue("False")), "FAILED",
     "is not active"),
    (pk.KubernetesFacts(kueue_served=True), "FAILED", "does not exist in namespace ml"),
    (pk.KubernetesFacts(kueue_served=False), "FAILED", "Kueue is not installed"),
    (pk.KubernetesFacts(refused={"local_queue": "403 Forbidden"}), "unknown", "could not be read"),
])
def test_kueue_queue(facts, expected, says):
    labelled = kneeds(labels={pk.QUEUE_LABEL: "q"})
    [found] = pk.check_queue(labelled, facts)
    assert found.status == expected and says in found.message, found
    assert pk.check_queue(kneeds(), facts) == []  # no label, no queue to check


def node(**allocatable):
    return {"status": {"allocatable": allocatable}}


@pytest.mark.parametrize("gpu, vendor, nodes, expected", [
    (8, None, [node(**{"nvidia.com/gpu": "8"})], "ok"),
    (8, None, [node(**{"nvidia.com/gpu": "4"}), node()], "FAILED"),
    (1, "amd", [node(**{"nvidia.com/gpu": "8"})], "FAILED"),
    (1, "amd", [node(**{"amd.com/gpu": "1"})], "ok"),
    (1, None, [], "FAILED"),
])
def test_gpus(gpu, vendor, nodes, expected):
    [found] = pk.check_gpus(kneeds(gpu=gpu, gpu_vendor=vendor), pk.KubernetesFacts(nodes=nodes))
    assert found.status == expected, found
    assert pk.check_gpus(kneeds(gpu=0), pk.KubernetesFacts(nodes=nodes)) == []


# -- --smoke ------------------------------------------------------------------------------------

def rank(node, cuda=False, shm=64, total=2.0):
    return {"rank": node, "node": node, "torch": "2.13.0", "cuda": cuda,
            "cuda_version": "12.8" if cuda else None, "nccl": cuda,
            "nccl_version": "2.27.3" if cuda else None, "shm_mib": shm, "all_reduce": total}


def output_of(*ranks, world_size=2):
    return "[rank 0] %s%s\n" % (ps.REPORT_MARK, json.dumps(
        {"world_size": world_size, "ranks": list(ranks)}))


@pytest.mark.parametrize("gpu, returncode, output, expected", [
    (0, 0, output_of(rank(0), rank(1)), [("smoke node 0", "ok"), ("smoke node 1", "ok"),
                                         ("smoke", "ok")]),
    (1, 0, output_of(rank(0, True, 4096), rank(1, True, 4096)),
     [("smoke node 0", "ok"), ("smoke node 1", "ok"), ("smoke", "ok")]),
    (1, 0, output_of(rank(0, True, 4096), rank(1, False, 4096)),
     [("smoke node 0", "ok"), ("smoke node 1", "ok"), ("smoke", "FAILED"), ("smoke", "ok")]),
    (1, 0, output_of(rank(0, True, 64), rank(1, True, 4096)),
     [("smoke node 0", "ok"), ("smoke node 1", "ok"), ("smoke", "FAILED"), ("smoke", "ok")]),
    (0, 0, output_of(rank(0, total=1.0), rank(1)),
     [("smoke node 0", "ok"), ("smoke node 1", "ok"), ("smoke", "FAILED")]),
    (0, 1, "ModuleNotFoundError: No module named 'torch'\n", [("smoke", "FAILED")]),
    (0, 1, "something else broke\n", [("smoke", "FAILED")]),
    (0, None, "Job is waiting\n", [("smoke", "FAILED")]),
])
def test_smoke_verdict(gpu, returncode, output, expected):
    found = ps.verdict(needs(gpu=gpu), returncode, output, 600)
    assert statuses(found) == expected, found


def test_smoke_verdict_messages_say_what_happened():
    [missing] = ps.verdict(needs(), 1, "E: No module named 'torch'\n", 600)
    assert "lacks the Python module torch" in missing.message
    [late] = ps.verdict(needs(), None, "a\nb\n", 600)
    assert "did not finish in 600 s" in late.message and late.message.endswith("a\nb")
    cpu_build = ps.verdict(needs(gpu=1), 0, output_of(rank(0, False, 4096), rank(1, False, 4096)),
                           600)
    assert "torch sees no CUDA device on node 0, 1" in cpu_build[2].message


def test_smoke_flow_keeps_the_backend_attributes():
    batch = preflight.GangNeeds("train", "batch", 2, 1, 8, 1024, 1, options={
        "queue": "gpu-q", "iam_role": "arn:role", "image": "img:1", "cpu": "8", "gpu": "1",
        "host_volumes": None, "aws_batch_tags": {"a": "b"}})
    assert ps.kept_attributes(batch) == {"queue": "gpu-q", "iam_role": "arn:role",
                                         "image": "img:1", "cpu": "8", "gpu": "1"}
    source = ps.flow_source(batch, 600)
    compile(source, "smoke_flow.py", "exec")
    assert "@batch(**{'queue': 'gpu-q'" in source
    assert "@torch_distributed(nodes=2, nproc_per_node=1, rendezvous_timeout=300)" in source
    k8s = kneeds(labels={pk.QUEUE_LABEL: "q"}, shared_memory=None)
    assert "@kubernetes(**{'namespace': 'ml', 'labels': {'kueue.x-k8s.io/queue-name': 'q'}})" \
        in ps.flow_source(k8s, 600)


def test_a_slurm_smoke_job_asks_for_the_cpus_of_the_steps_nodes():
    slurm = preflight.GangNeeds("train", "torch_slurm", 2, 4, 4, 0, 0,
                                options={"partition": "cpu", "cpu": None})
    assert ps.kept_attributes(slurm) == {"partition": "cpu", "cpu": 4}
    named = preflight.GangNeeds("train", "torch_slurm", 2, 4, 16, 0, 0, options={"cpu": 16})
    assert ps.kept_attributes(named) == {"cpu": 16}


def test_smoke_announces_then_runs_and_keeps_a_failed_job_folder():
    said, ran = [], []

    def runner(argv, cwd, env, timeout_s, echo):
        ran.append((argv[1:], timeout_s))
        assert said and said[0].startswith("smoke: this RUNS one job: a gang of 2 nodes")
        return 1, "No module named 'torch'\n"

    found = ps.smoke(needs(queue="q"), said.append, 300, runner, environ={})
    assert ran == [(ran[0][0], 300)] and ran[0][0][1:] == ["--no-pylint", "run"]
    assert found[0].status == "FAILED"
    assert "its flow is kept in" in said[-1]
    folder = said[-1].rsplit(" ", 1)[-1]
    assert os.path.isfile(folder + "/smoke_flow.py")
    shutil.rmtree(folder)


def test_run_preflight_smokes_only_steps_whose_checks_passed():
    ours = SimpleNamespace(name="torch_distributed", active=True, topology=Topology(2, 1))
    steps = [("good", [ours, deco("batch")]), ("bad", [ours, deco("batch")])]
    smoked, lines = [], []

    def backend(n, root):
        if n.step == "bad":
            return [preflight.failed(n.step, "capacity", "too small", "fix")]
        return [preflight.passed(n.step, "capacity", "fine")]

    def smoke(n, placement):
        smoked.append(n.step)
        return [preflight.failed(n.step, "smoke", "no torch", "install it")]

    with pytest.raises(TorchDistributedPreflightFailed) as raised:
        run_preflight(steps, "", lines.append, {"batch": backend}, smoke)
    assert smoked == ["good"]
    assert "smoke: not run for step bad: fix the failed checks first" in lines
    assert "2 checks failed" in str(raised.value)


def test_unreachable_apis_fail_the_preflight_with_the_setting_to_fix():
    from botocore.exceptions import NoCredentialsError
    from kubernetes import client as kube_client

    from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.cli import (
        batch_findings, kubernetes_findings)

    def no_credentials(service):
        raise NoCredentialsError()

    with pytest.raises(TorchDistributedPreflightFailed, match="AWS could not be reached "
                       r"\(NoCredentialsError: Unable to locate credentials\)"):
        batch_findings(needs(), "s3://b", no_credentials)
    configuration = kube_client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # the discard port: nothing listens
    configuration.retries = False
    with pytest.raises(TorchDistributedPreflightFailed, match="the Kubernetes API could not be "
                       "reached"):
        kubernetes_findings(kneeds(), "", kube_client, kube_client.ApiClient(configuration))


class Refused(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.response = {"Error": {"Code": code, "Message": "not for you"}}


class FakeBatch:
    """describe_job_queues answers; describe_compute_environments is refused."""

    def describe_job_queues(self, jobQueues):
        return {"jobQueues": [{"jobQueueName": "q", "state": "ENABLED", "status": "VALID",
                               "computeEnvironmentOrder": [{"order": 1,
                                                            "computeEnvironment": "arn:ce"}]}]}

    def describe_compute_environments(self, computeEnvironments):
        raise Refused("AccessDeniedException")


class FakeIam:
    def get_role(self, RoleName):
        raise Refused("NoSuchEntity")


def test_gather_records_refusals_and_check_reports_them_as_unknown():
    clients = {"batch": FakeBatch(), "iam": FakeIam()}
    facts = pb.gather(needs(), clients.__getitem__, "s3://b", Refused)
    assert facts.refused == {"environments": "AccessDeniedException: not for you"}
    assert facts.role is None  # NoSuchEntity is an answer: the role does not exist
    found = {f.check: f for f in pb.check(needs(), facts)}
    assert found["job queue"].status == "ok"
    assert found["compute environment"].status == "unknown"
    assert "could not be read (AccessDeniedException: not for you)" in \
        found["compute environment"].message
    assert found["IAM role"].status == "FAILED" and "does not exist" in found["IAM role"].message


def test_a_one_node_gang_is_smoked_on_one_node():
    source = ps.flow_source(needs(nodes=1), 600)
    assert "@torch_distributed(nodes=1, nproc_per_node=1" in source
    assert ps.announcement(needs(nodes=1), 600).startswith("smoke: this RUNS one job: a gang "
                                                           "of 1 node x")


@pytest.mark.parametrize("max_vcpus, expected, says", [
    (192, "ok", "(2 nodes x g5.24xlarge of 96 vCPUs)"),
    (100, "FAILED", "the gang needs 192 vCPUs at once (2 nodes x g5.24xlarge of 96 vCPUs)"),
])
def test_capacity_counts_whole_instances_where_their_types_are_known(max_vcpus, expected, says):
    types = [itype("g5.24xlarge", 96, 393216, 4), itype("g5.48xlarge", 192, 786432, 8),
             itype("g5.xlarge", 4, 16384, 1)]
    [found] = pb.check_environments(needs(2, cpu=8, gpu=4), [env(max_vcpus=max_vcpus,
                                                                 types=["g5"])], types)
    assert found.status == expected and says in found.message, found


@pytest.mark.parametrize("image, found, refused, expected", [
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/trainer:v1", {"imageSizeInBytes": 2 ** 30},
     {}, [("image in ECR", "ok")]),
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainer", None, {}, [("image in ECR",
                                                                         "FAILED")]),
    ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainer@sha256:" + "0" * 64, None,
     {"image": "AccessDeniedException: no"}, [("image in ECR", "unknown")]),
    ("python:3.11", None, {}, []),
    ("ghcr.io/org/trainer:v1", None, {}, []),
])
def test_ecr_image(image, found, refused, expected):
    batch = preflight.GangNeeds("train", "batch", 2, 1, 1, 1024, 0, image=image)
    result = pb.check_ecr_image(batch, pb.BatchFacts(image=found, refused=refused))
    assert statuses(result) == expected, result


def test_ecr_image_is_looked_up_in_its_region_by_tag_or_digest():
    asked = []

    class Ecr:
        def describe_images(self, **request):
            asked.append(request)
            return {"imageDetails": [{"imageSizeInBytes": 5 * 2 ** 20}]}

    def clients(service, region=None):
        assert (service, region) == ("ecr", "eu-west-1")
        return Ecr()

    for image in ("123456789012.dkr.ecr.eu-west-1.amazonaws.com/team/trainer:v1",
                  "123456789012.dkr.ecr.eu-west-1.amazonaws.com/trainer@sha256:" + "0" * 64):
        facts = pb.gather(preflight.GangNeeds("train", "batch", 2, 1, 1, 1024, 0, image=image),
                          clients, "", Refused)
        assert facts.image == {"imageSizeInBytes": 5 * 2 ** 20}
    assert asked == [
        {"registryId": "123456789012", "repositoryName": "team/trainer",
         "imageIds": [{"imageTag": "v1"}]},
        {"registryId": "123456789012", "repositoryName": "trainer",
         "imageIds": [{"imageDigest": "sha256:" + "0" * 64}]}]
