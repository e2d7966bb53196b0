"""`torch-distributed preflight` on Kubernetes against the loopback API (k8s_api.py with
k8s_cluster.py): with and without the JobSet CRD, with an RBAC refusal, with and without the
named Kueue LocalQueue, with and without GPU nodes; each failure naming its fix. The checks
call the API in-process through the official client; two runs go through Metaflow's CLI."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from kubernetes import client, config

from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight import common as preflight
from metaflow_extensions.torch_distributed.plugins.torch_distributed.preflight.cli import \
    kubernetes_findings

from .k8s_api import KubernetesEmulator
from .k8s_cluster import ClusterApi, LocalQueue
from tests.support import isolated_env, metaflow

FLOWS = Path(__file__).parent / "flows"
GPU_NODE = {"name": "gpu-1", "allocatable": {"cpu": "96", "memory": "1Ti", "nvidia.com/gpu": "8"}}
QUEUE = "kueue.x-k8s.io/queue-name"


@pytest.fixture
def cluster(tmp_path):
    started = []

    def start(**options):
        emulator = KubernetesEmulator(workdir=tmp_path / ("k8s-%d" % len(started)),
                                      cluster=ClusterApi(**options))
        emulator.start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.close()  # raises on a request it does not emulate


def findings(emulator, nodes=2, gpu=0, shared_memory=None, labels=None, namespace="default"):
    needs = preflight.GangNeeds("train", "kubernetes", nodes, 1, 1, 1024, gpu, shared_memory,
                                options={"namespace": namespace, "labels": labels or {}})
    api = config.new_client_from_config(str(emulator.kubeconfig))
    return {f.check: f for f in kubernetes_findings(needs, "", client, api)}


def test_a_cluster_that_can_run_the_gang_passes(cluster):
    emulator = cluster()
    found = findings(emulator)
    assert {c: f.status for c, f in found.items()} == {
        "JobSet": "ok", "RBAC": "ok", "NetworkPolicy": "ok", "image": "unknown"}, found
    assert "JobSet v0.6 or later" in found["JobSet"].message
    assert "create jobsets.jobset.x-k8s.io" in found["RBAC"].message
    assert len(emulator.cluster.reviews) == 5  # one review per verb and resource


def test_no_right_to_create_network_policies_warns_and_names_the_role(cluster):
    found = findings(cluster(denied={("create", "networking.k8s.io", "networkpolicies")}),
                     namespace="ml")
    assert found["RBAC"].status == "ok"  # the gang still runs
    assert found["NetworkPolicy"].status == "warning"
    assert found["NetworkPolicy"].message.startswith(
        "in namespace ml you may not create networkpolicies.networking.k8s.io")
    assert found["NetworkPolicy"].fix.startswith(
        "kubectl create role metaflow-gang-isolation -n ml --verb=create "
        "--resource=networkpolicies.networking.k8s.io")


def test_without_the_jobset_crd_names_the_install(cluster):
    found = findings(cluster(jobset_installed=False))["JobSet"]
    assert found.status == "FAILED"
    assert "the JobSet controller is not installed" in found.message
    assert found.fix.startswith("kubectl apply --server-side -f https://github.com/"
                                "kubernetes-sigs/jobset/releases/download/v0.12.0/")


def test_a_crd_the_caller_may_not_read_still_says_jobsets_are_served(cluster):
    found = findings(cluster(denied={("get", "apiextensions.k8s.io",
                                      "customresourcedefinitions")}))["JobSet"]
    assert found.status == "ok" and "could not be read: 403" in found.message


def test_an_rbac_refusal_names_the_role_to_create(cluster):
    found = findings(cluster(denied={("create", "jobset.x-k8s.io", "jobsets"),
                                     ("list", "", "pods")}), namespace="ml")["RBAC"]
    assert found.status == "FAILED"
    assert found.message == ("in namespace ml you may not create jobsets.jobset.x-k8s.io, "
                             "list pods")
    assert found.fix.startswith("kubectl create role metaflow-gang -n ml --verb=create,list "
                                "--resource=jobsets.jobset.x-k8s.io,pods")


def test_a_one_node_gang_needs_jobs_not_jobsets(cluster):
    found = findings(cluster(jobset_installed=False), nodes=1)
    assert "JobSet" not in found
    assert "create jobs.batch" in found["RBAC"].message


def test_a_named_local_queue_that_exists(cluster):
    emulator = cluster(kueue_installed=True,
                       local_queues=[LocalQueue("default", "team-a", "cluster-a")])
    found = findings(emulator, labels={QUEUE: "team-a"})["Kueue"]
    assert found.status == "ok" and "ClusterQueue cluster-a" in found.message


def test_a_named_local_queue_that_does_not_exist(cluster):
    emulator = cluster(kueue_installed=True,
                       local_queues=[LocalQueue("other", "team-a", "cluster-a")])
    found = findings(emulator, labels={QUEUE: "team-a"})["Kueue"]
    assert found.status == "FAILED" and "does not exist in namespace default" in found.message
    assert "kubectl get localqueues -n default" in found.fix


def test_an_inactive_local_queue(cluster):
    emulator = cluster(kueue_installed=True,
                       local_queues=[LocalQueue("default", "team-a", "gone", active=False)])
    found = findings(emulator, labels={QUEUE: "team-a"})["Kueue"]
    assert found.status == "FAILED" and "ClusterQueueDoesNotExist" in found.message


def test_a_queue_label_without_kueue(cluster):
    found = findings(cluster(), labels={QUEUE: "team-a"})["Kueue"]
    assert found.status == "FAILED" and "Kueue is not installed" in found.message


def test_gpus_advertised_by_a_node(cluster):
    found = findings(cluster(nodes=[GPU_NODE]), gpu=8, shared_memory=16000)
    assert found["GPUs"].status == "ok" and found["shared memory"].status == "ok"


def test_gpus_no_node_advertises(cluster):
    found = findings(cluster(), gpu=1)
    assert found["GPUs"].status == "FAILED" and "device plugin" in found["GPUs"].fix
    assert found["shared memory"].status == "FAILED"
    assert "@kubernetes(shared_memory=1024)" in found["shared memory"].fix


def test_nodes_the_caller_may_not_list_are_unknown(cluster):
    found = findings(cluster(denied={("list", "", "nodes")}), gpu=1)["GPUs"]
    assert found.status == "unknown" and "403" in found.message


# -- through Metaflow's CLI ----------------------------------------------------------------

def preflight_cli(aws, emulator, tmp_path, *extra, timeout_s=120, **td):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / "preflight_k8s_flow.py", workdir)
    home = tmp_path / "home"
    home.mkdir()
    env = isolated_env(aws.env, emulator.env, {"METAFLOW_KUBERNETES_NAMESPACE": "default"},
                       {k: str(v) for k, v in td.items()}, home=home)
    res = metaflow("preflight_k8s_flow.py", ["--with", "kubernetes", "torch-distributed",
                                             "preflight", *extra], workdir, env,
                   timeout_s=timeout_s)
    res.output = res.stdout + res.stderr
    return res


def test_the_command_fails_naming_each_fix(aws, cluster, tmp_path):
    emulator = cluster(jobset_installed=False, denied={("delete", "jobset.x-k8s.io", "jobsets")})
    res = preflight_cli(aws, emulator, tmp_path, TD_QUEUE="team-a")
    assert res.returncode != 0, res
    assert "@torch_distributed preflight failed" in res.output, res
    for fix in ("fix: kubectl apply --server-side", "fix: kubectl create role metaflow-gang",
                "fix: install Kueue"):
        assert fix in res.output, res


# -- --smoke: one real 2-node JobSet on the emulated cluster ------------------------------------

def test_the_checks_pass_then_the_smoke_job_forms_a_gang_across_two_pods(aws, kubernetes,
                                                                        tmp_path):
    """The whole command on a cluster that can run the gang: every check passes, then it says
    it runs a job, runs it (a JobSet of 2 pods on the emulated controller) and reports every
    node."""
    res = preflight_cli(aws, kubernetes, tmp_path, "--smoke", "--yes", "--smoke-timeout", "240",
                        timeout_s=300)
    output = res.output
    assert res.returncode == 0, output[-6000:]
    assert "checking step start: a gang of 2 nodes x (1 CPU, 1024 MiB) on Kubernetes" in output
    assert "[ok] JobSet: JobSet v0.6 or later is installed" in output, output[-6000:]
    announced = output.index("smoke: this RUNS one job: a gang of 2 nodes x (1 CPU, 1024 MiB) "
                             "on Kubernetes namespace default")
    assert announced < output.index("Workflow starting"), output[-6000:]
    for node in (0, 1):
        assert "[ok] smoke node %d: torch " % node in output, output[-6000:]
    assert "[ok] smoke: a process group formed across 2 nodes and all-reduced once" in output
    [jobset] = kubernetes.created  # the smoke step's; start and end are plain Jobs
    assert [r["replicas"] for r in jobset["spec"]["replicatedJobs"]] == [1, 1]
