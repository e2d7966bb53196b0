"""The Kubernetes JobSet of a gang: the pure parts (node 0's plan, a worker's place, the master
address resolved with retries), and the JobSet built from Metaflow's own `create_jobset` and
checked against the JobSet CRD's schema (the contract tests of the Metaflow internals it wraps
are in test_internals_contract.py)."""

import json
import shlex
import socket
from types import SimpleNamespace

import pytest

import metaflow  # noqa: F401  (loads the extension)
from metaflow.plugins.kubernetes.kubernetes import Kubernetes
from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import (
    kubernetes,
    trampoline,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedEnvironmentError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import (
    ORDER_ENV,
    AgentOrder,
)
from tests import records
from tests.emulation.jobset_controller import pruned, validate_jobset


def test_the_plan_tells_the_control_pod_of_its_step_and_the_nodes_it_needs():
    assert kubernetes.planned_nodes({}, "train") is None
    env = dict(trampoline.plan_env(kubernetes.MAIN_NODE_ENV, "train", 2), MF_WORLD_SIZE="2")
    assert kubernetes.planned_nodes(env, "train") == 2
    assert kubernetes.planned_nodes(env, "other") is None  # another step's JobSet
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="the gang needs 2 nodes but this Kubernetes JobSet has 3"):
        kubernetes.planned_nodes(dict(env, MF_WORLD_SIZE="3"), "train")


def test_a_workers_node_is_its_job_index_plus_one():
    assert kubernetes.worker_node("train", {"MF_WORKER_REPLICA_INDEX": "0"}) == 1
    assert kubernetes.worker_node("train", {"MF_WORKER_REPLICA_INDEX": "6"}) == 7
    with pytest.raises(TorchDistributedEnvironmentError,
                       match="runs outside a Kubernetes JobSet of Metaflow"):
        kubernetes.worker_node("train", {})


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_the_master_address_is_resolved_with_retries_until_node_0_runs():
    clock = FakeClock()
    answers = iter([socket.gaierror(-2, "Name or service not known")] * 3 + ["10.0.0.7"])

    def resolve(name):
        assert name == "js-1-control-0-0.js-1.ns.svc.cluster.local"
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    env = {"MF_MASTER_ADDR": "js-1-control-0-0.js-1.ns.svc.cluster.local"}
    assert kubernetes.resolve_master("train", 1, env, 60, resolve, clock, clock.sleep) == \
        "10.0.0.7"
    assert clock.now == 3 * kubernetes.RESOLVE_RETRY_S


def test_a_name_that_never_resolves_fails_naming_the_node_and_the_name():
    clock = FakeClock()

    def resolve(name):
        raise socket.gaierror(-2, "Name or service not known")

    env = {"MF_MASTER_ADDR": "js-1-control-0-0.js-1.ns.svc.cluster.local"}
    with pytest.raises(TorchDistributedEnvironmentError) as caught:
        kubernetes.resolve_master("train", 2, env, 10, resolve, clock, clock.sleep)
    message = str(caught.value)
    assert "node 2 could not resolve node 0's address " \
           "js-1-control-0-0.js-1.ns.svc.cluster.local in 10 s" in message
    assert clock.now >= 10
    with pytest.raises(TorchDistributedEnvironmentError, match="MF_MASTER_ADDR is not set"):
        kubernetes.resolve_master("train", 1, {}, 10, resolve, clock, clock.sleep)


def test_a_worker_pod_finds_its_place():
    order = AgentOrder(records.blueprint(rendezvous_timeout_s=30.0), "kubernetes")
    env = {"MF_WORKER_REPLICA_INDEX": "0", "MF_MASTER_ADDR": "control.svc.cluster.local"}
    resolved = []
    backend = kubernetes.KubernetesBackend(lambda name: resolved.append(name) or "10.0.0.9")
    place = backend.agent_place(order, env)
    assert (place.node, place.master_addr) == (1, "10.0.0.9")
    assert resolved == ["control.svc.cluster.local"]


class FakeEnvironment:
    """The two commands of Metaflow's environment `Kubernetes._command` asks for."""

    def get_package_commands(self, url, datastore_type, metadata):
        return ["echo download %s" % url]

    def bootstrap_commands(self, step_name, datastore_type):
        return ["echo bootstrap"]


def create_kwargs():
    """What `kubernetes step` passes to `Kubernetes.launch_job` for a plain step (trimmed of
    the options left at their defaults)."""
    return dict(
        flow_name="F", run_id="5", step_name="train", task_id="7", attempt="0", user="tester",
        code_package_metadata="{}", code_package_sha="abc", code_package_url="s3://b/pkg",
        code_package_ds="s3", docker_image="python:3.11", docker_image_pull_policy=None,
        step_cli="python -u flow.py --quiet step train --run-id 5 --task-id 7 "
                 "--input-paths ${METAFLOW_INPUT_PATHS_0}",
        namespace="default", cpu="1", gpu=None, gpu_vendor="nvidia", disk="1024",
        memory="4096", use_tmpfs=False, tmpfs_tempdir=True, tmpfs_size=None, tmpfs_path=None,
        run_time_limit=3600, env={"METAFLOW_INPUT_PATHS_0": "5/start/1"},
        persistent_volume_claims=None, tolerations=None, labels={"team": "ml"},
        annotations=None, shared_memory=None, port=None, qos="Burstable",
        extended_resources=None, security_context=None)


@pytest.fixture
def kubeconfig(tmp_path, monkeypatch):
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(path))
    # the client reads KUBECONFIG when it is first imported, which may have happened already
    from kubernetes.config import kube_config
    monkeypatch.setattr(kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(path))


def gang_jobset_dict(nodes=2):
    kube = Kubernetes(SimpleNamespace(TYPE="s3"), None, FakeEnvironment())
    kw = create_kwargs()
    jobset = kube.create_jobset(num_parallel=nodes, **kw)
    cli = SimpleNamespace(
        executable="python", script="flow.py", top_args=["--quiet"],
        orig_datastore="s3@s3://bucket/metaflow",
        params={"run_id": "5", "task_id": "7", "retry_count": 0, "max_user_code_retries": 1,
                "namespace": "user:tester"})
    kubernetes.gang_jobset(kube, jobset, kw, records.gang_step(nodes=nodes), cli)
    return pruned(jobset.dump())


def container(obj, name):
    [rjob] = [r for r in obj["spec"]["replicatedJobs"] if r["name"] == name]
    return rjob, rjob["template"]["spec"]["template"]["spec"]["containers"][0]


def test_the_gang_jobset_is_valid_and_runs_the_task_on_control_and_agents_on_workers(
        kubeconfig):
    obj = gang_jobset_dict(nodes=3)
    validate_jobset(obj)  # the JobSet CRD's published schema
    control_job, control = container(obj, "control")
    worker_job, worker = container(obj, "worker")
    assert (control_job["replicas"], worker_job["replicas"]) == (1, 2)
    # the task's own command, unchanged; the agent's, built from data
    assert control["command"][:2] == ["bash", "-c"]
    assert "python -u flow.py --quiet step train --run-id 5 --task-id 7 " \
           "--input-paths ${METAFLOW_INPUT_PATHS_0}" in control["command"][-1]
    agent = worker["command"][-1]
    assert "spin-step" not in control["command"][-1] and " step train " not in agent
    words = shlex.split(agent[agent.index("python -u flow.py --quiet spin-step"):].split(";")[0])
    assert words[:6] == ["python", "-u", "flow.py", "--quiet", "spin-step", "train"]
    assert words[words.index("--task-id") + 1] == "7-node-$((MF_WORKER_REPLICA_INDEX+1))"
    assert words[words.index("--input-paths") + 1] == "${METAFLOW_INPUT_PATHS_0}"
    assert "--namespace user:tester" in agent
    env = {e["name"]: e.get("value") for e in control["env"]}
    assert json.loads(env[kubernetes.MAIN_NODE_ENV]) == {"step": "train", "nodes": 3}
    assert env["MF_WORLD_SIZE"] == "3"
    worker_env = {e["name"]: e for e in worker["env"]}
    assert kubernetes.MAIN_NODE_ENV not in worker_env
    order = AgentOrder.from_env({ORDER_ENV: worker_env[ORDER_ENV]["value"]})
    assert order == AgentOrder(records.blueprint(nodes=3), "kubernetes")
    # the attempt's secret is read from the run's datastore on the pod, never in its spec
    assert "secret" not in worker_env[ORDER_ENV]["value"]
    assert worker_env["MF_WORKER_REPLICA_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['jobset.sigs.k8s.io/job-index']"
    # @kubernetes(labels=...) reaches the JobSet (a queue label such as Kueue's passes through)
    assert obj["metadata"]["labels"]["team"] == "ml"


def test_the_agent_command_quotes_every_word_but_the_node_index(kubeconfig):
    obj = gang_jobset_dict()
    agent = container(obj, "worker")[1]["command"][-1]
    assert "--orig-flow-datastore s3@s3://bucket/metaflow" in agent
    assert "'user:tester'" not in agent  # shlex.quote leaves safe words as they are
    assert "$((MF_WORKER_REPLICA_INDEX+1))" in agent


def test_remote_ports_of_retries_differ():
    assert naming.remote_port("5", "train", "7", 0) != naming.remote_port("5", "train", "7", 1)


def test_a_gpu_gang_without_enough_shared_memory_is_warned():
    warning = kubernetes.shared_memory_warning("train", None)
    assert warning.startswith("@torch_distributed on step train: its GPU gang runs in pods "
                              "with the default 64 MiB of shared memory")
    assert "@kubernetes(shared_memory=1024)" in warning
    assert "256 MiB" in kubernetes.shared_memory_warning("train", 256)
    assert kubernetes.shared_memory_warning("train", 1024) is None
    assert kubernetes.shared_memory_warning("train", "16000") is None


def test_kubernetes_gpus_set_the_processes_per_node():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.devices import \
        requested_gpus
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import \
        plan_topology

    gpus, source = requested_gpus([SimpleNamespace(name="kubernetes", attributes={"gpu": 8})])
    assert (gpus, source) == (8, "@kubernetes(gpu=8)")
    topology = plan_topology(None, 2, None, gpus, source)
    assert (topology.nodes, topology.nproc_per_node, topology.world_size) == (2, 8, 16)


def test_a_worker_that_cannot_take_its_place_says_why_and_leaves_the_verdict_to_node_0():
    import subprocess
    import sys

    code = ("from metaflow_extensions.torch_distributed.plugins.torch_distributed.backends import "
            "kubernetes\n"
            "from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import "
            "TorchDistributedEnvironmentError\n"
            "kubernetes.leave_to_node_0(TorchDistributedEnvironmentError('train', 'no GPU here'))"
            "\nraise SystemExit(5)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    # exit 0: a failed worker Job would fail the JobSet before node 0 says why
    assert res.returncode == 0, res.stderr
    assert "@torch_distributed cannot run here" in res.stderr
    assert "no GPU here" in res.stderr
