"""A multi-node gang deployed with `argo-workflows create`, run the way Argo runs its step: the
gang step's JobSet is taken from the compiled workflow (`--only-json`), the values Argo fills in
(workflow name, the step's input paths and attempt, our compiler's expressions) are filled in
(tests/emulation/argo.py), and the JobSet is created on the loopback Kubernetes API, whose
controller runs its pods (k8s_api.py), after the gang's NetworkPolicy (the DAG task before the
gang's; the emulation enforces no policy on traffic: the tests check which pods it selects).
The steps around it run with Metaflow's `step` command, with the task ids Argo hands on: `start`
before, `end` after, reading the gang's task id from the JobSet's label as the template's
output does."""

from __future__ import annotations

import ast
import json
import re
import shutil
import time
import urllib.request
from pathlib import Path

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import naming

from . import argo
from .jobset_controller import validate_jobset
from tests.support import isolated_env, metaflow
from .probes import published_secret

FLOWS = Path(__file__).parent / "flows"
FLOW = "k8s_gang_flow.py"
# Metaflow's Argo step command appends its input paths to this file and reads them back: a
# pod's /tmp is its own in a container, while the emulated pods share this host's.
INPUT_PATHS_FILE = Path("/tmp/mf-input-paths")


def compile_flow(aws, kubernetes, tmp_path, flow, top_level=(), **td):
    """(workflow, environment, directory) of `argo-workflows create --only-json` of `flow`."""
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOWS / flow, workdir)
    home = tmp_path / "metaflow-home"
    home.mkdir()
    env = isolated_env(aws.env, kubernetes.env, {"METAFLOW_KUBERNETES_NAMESPACE": "default"},
                       {k: str(v) for k, v in td.items()}, home=home)
    res = metaflow(flow, ["--datastore=s3", *top_level, "argo-workflows", "create",
                          "--only-json"], workdir, env)
    assert res.returncode == 0, res.stdout + res.stderr
    return argo.workflow(res.stdout), env, workdir


JOBSETS = "apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"
POLICIES = "apis/networking.k8s.io/v1/namespaces/default/networkpolicies"


def create(kubernetes, obj, collection=JOBSETS):
    """POST the object (a JobSet unless told) to the emulated API, as Argo's resource step does
    (`kubectl create`); the API validates it as the API server would."""
    request = urllib.request.Request(
        "%s/%s" % (kubernetes.endpoint_url, collection),
        data=json.dumps(obj).encode(), method="POST",
        headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 201


def selected(kubernetes, policy):
    """(the pods the policy selects, the pods it admits traffic from), by name."""
    spec = policy["spec"]
    [rule] = spec["ingress"]
    [source] = rule["from"]
    return tuple(sorted(p["metadata"]["name"] for p in kubernetes.controller.pods(
        "default", selector["matchLabels"])) for selector in (spec["podSelector"],
                                                               source["podSelector"]))


def wait_terminal(kubernetes, name, timeout_s=120):
    """The JobSet's status once it is Completed or Failed (Argo's success and failure
    conditions on `status.terminalState`)."""
    url = "%s/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets/%s" % (
        kubernetes.endpoint_url, name)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=10) as response:
            status = json.loads(response.read())["status"]
        if status.get("terminalState") in ("Completed", "Failed"):
            return status
        time.sleep(0.5)
    raise AssertionError("JobSet %s did not finish in %d s" % (name, timeout_s))


class ArgoRun:
    """One run of the compiled workflow: start and end with Metaflow's `step` command, the gang
    step's JobSet (one per attempt) created on the emulated Kubernetes as Argo would."""

    def __init__(self, aws, kubernetes, tmp_path, workflow, flow=FLOW, top_level=(), **td):
        self.kubernetes = kubernetes
        self.flow = flow
        # the name Argo gives this run of the WorkflowTemplate (each test its own: the tests
        # of this file share moto's S3), and Metaflow's run id on Argo
        self.workflow = workflow
        self.run_id = "argo-" + workflow
        self.wf, self.env, self.workdir = compile_flow(aws, kubernetes, tmp_path, flow,
                                                       top_level, **td)
        self.policies = {}  # the gang's task (its inputs) -> its NetworkPolicy

    def step(self, *args):
        res = metaflow(self.flow, ["--datastore=s3", *args], self.workdir, self.env)
        assert res.returncode == 0, res.stdout + res.stderr
        return res.stdout + res.stderr

    def start(self):
        """start, under the task ids its container would use; the gang's input paths."""
        self.step("init", "--run-id", self.run_id, "--task-id", "t-0a1b2c3d-params")
        self.step("step", "start", "--run-id", self.run_id, "--task-id", "t-0a1b2c3d",
                  "--input-paths", "%s/_parameters/t-0a1b2c3d-params" % self.run_id)
        return "%s/start/t-0a1b2c3d" % self.run_id

    def train(self, input_paths, attempt, **more):
        """(JobSet, its final status, {replicated job: pod}) of one attempt of the gang."""
        inputs = dict(more, **{"input-paths": input_paths})
        jobset = argo.jobset(self.wf, "train", self.workflow,
                             dict(inputs, retryCount=str(attempt)))
        validate_jobset(jobset)
        task = json.dumps(inputs, sort_keys=True)
        if task not in self.policies:  # the DAG task before the gang's, once for its attempts
            self.policies[task] = argo.network_policy(self.wf, "train", self.workflow, inputs)
            create(self.kubernetes, self.policies[task], POLICIES)
        INPUT_PATHS_FILE.unlink(missing_ok=True)
        try:
            create(self.kubernetes, jobset)
            status = wait_terminal(self.kubernetes, jobset["metadata"]["name"])
        finally:
            INPUT_PATHS_FILE.unlink(missing_ok=True)
        pods = {p.replicated_job: p for p in self.kubernetes.pods(jobset["metadata"]["name"])}
        return jobset, status, pods

    def log(self, pod):
        return self.kubernetes.pod_log(pod.name)


def test_the_compiled_jobset_of_a_two_node_gang_runs_and_hands_its_task_to_the_next_step(
        aws, kubernetes, tmp_path):
    run = ArgoRun(aws, kubernetes, tmp_path, "kubernetesgangflow-x7k2p", TD_NODES=2, TD_NPROC=2)
    argo.validate_workflow(run.wf)
    input_paths = run.start()

    # train: the JobSet Argo would create for the DAG task's arguments (first attempt)
    arguments = {p["name"]: p["value"]
                 for p in argo.dag_task(run.wf, "train")["arguments"]["parameters"]}
    assert arguments == {
        "input-paths": "argo-{{workflow.name}}/start/{{tasks.start.outputs.parameters.task-id}}",
        "retryCount": "0"}  # the step has no @retry: Argo's {{retries}} is not set
    jobset, status, pods = run.train(input_paths, 0)
    control_log, worker_log = run.log(pods["control"]), run.log(pods["worker"])
    assert status["terminalState"] == "Completed", control_log[-4000:] + worker_log[-4000:]

    # the gang formed across both pods: node 0 is the task (every rank's output in its log),
    # node 1 the agent of the worker pod
    for rank in range(4):
        assert "rank %d says hello from pod" % rank in control_log, control_log[-4000:]
    assert "[node 1 agent] joined the gang of node 0" in worker_log, worker_log[-4000:]

    # the gang's NetworkPolicy (created before its JobSet, accepted by the API as valid)
    # selects exactly the gang's two pods and admits traffic from them alone
    [policy] = kubernetes.network_policies.created
    gang = sorted(p.name for p in kubernetes.pods(jobset["metadata"]["name"]))
    assert len(gang) == 2 and selected(kubernetes, policy) == (gang, gang)
    assert list(kubernetes.network_policies.policies) == [("default", policy["metadata"]["name"])]

    # the template's output: the task id on the JobSet's label, which the next step reads
    task_id = jobset["metadata"]["labels"]["torch_distributed_task_id"]
    assert task_id.startswith("t-") and len(task_id) == 10
    assert jobset["metadata"]["name"] == "td-%s-0" % task_id[2:]
    shown = run.step("step", "end", "--run-id", run.run_id, "--task-id", "t-9f8e7d6c",
                     "--input-paths", "%s/train/%s" % (run.run_id, task_id))
    assert "total 10.0 over 4 ranks" in shown, shown
    dump = run.step("dump", "%s/train/%s" % (run.run_id, task_id))
    assert "'world_size': 4" in dump and "'node_rank': 1" in dump, dump
    # the only task of train is the gang's: the agent's spin-step persists nothing of its own
    keys = [k["Key"] for k in aws.client("s3").list_objects_v2(
        Bucket=aws.bucket, Prefix="metaflow/KubernetesGangFlow/%s/train/" % run.run_id)["Contents"]]
    assert {k.split("/")[4] for k in keys} <= {task_id, task_id + "-node-1"}, keys
    assert any(k.split("/")[4] == task_id + "-node-1" and k.endswith("0.task_stdout.log")
               for k in keys), keys
    # node 0 drew the attempt's secret and put it beside its files, where the worker pod read
    # it; the compiled WorkflowTemplate, the JobSet and its pods hold neither it nor anything
    # to derive it
    secret = published_secret(run.env, "KubernetesGangFlow", run.run_id, "train", task_id, 0)
    assert len(secret) == 64
    assert secret not in json.dumps([run.wf, jobset, kubernetes.controller.pods("default", {})])


def test_a_failed_attempt_is_retried_as_a_new_jobset_on_a_new_port(aws, kubernetes, tmp_path):
    # rank 3 (on the worker pod) fails in the first attempt only; @retry(times=1)
    run = ArgoRun(aws, kubernetes, tmp_path, "kubernetesgangflow-r3tr1", TD_NODES=2, TD_NPROC=2,
                  TD_RETRIES=1,
                  TD_FAIL_RANK=3, TD_FAIL_ATTEMPT=0)
    assert argo.dag_task(run.wf, "train")["arguments"]["parameters"][-1] == {
        "name": "retryCount", "value": "{{retries}}"}
    assert argo.template(run.wf, "train")["retryStrategy"]["limit"] == 1
    input_paths = run.start()

    first, status, pods = run.train(input_paths, 0)
    control_log = run.log(pods["control"])
    assert status["terminalState"] == "Failed", control_log[-4000:]
    # node 0 failed the task naming the rank on the worker pod, with its traceback
    assert "injected failure on rank 3" in control_log, control_log[-4000:]
    assert "node 1" in control_log, control_log[-4000:]

    # Argo's retry: the same template with the next attempt, a new JobSet
    second, status, pods = run.train(input_paths, 1)
    assert status["terminalState"] == "Completed", run.log(pods["control"])[-4000:]
    # one NetworkPolicy for the task, created once: it covers both attempts' pods
    [policy] = kubernetes.network_policies.created
    both = sorted(p.name for js in (first, second)
                  for p in kubernetes.pods(js["metadata"]["name"]))
    assert len(both) == 4 and selected(kubernetes, policy) == (both, both)
    task_id = first["metadata"]["labels"]["torch_distributed_task_id"]
    assert second["metadata"]["labels"]["torch_distributed_task_id"] == task_id  # same task
    assert (first["metadata"]["name"], second["metadata"]["name"]) == (
        "td-%s-0" % task_id[2:], "td-%s-1" % task_id[2:])
    dump = run.step("dump", "%s/train/%s" % (run.run_id, task_id))
    port = naming.remote_port(run.run_id, "train", task_id, 1)
    assert port != naming.remote_port(run.run_id, "train", task_id, 0)
    assert re.search(r"\battempt \[[^\]]*\] = 1\b", dump), dump  # rank 0's artifact
    assert dump.count("'%d')" % port) == 4, dump  # every rank met node 0 on the attempt's port


def test_a_failing_rank_on_the_worker_pod_restarts_the_gang_in_place_within_the_jobset(
        aws, kubernetes, tmp_path):
    """max_restarts=1 on a deployed gang: rank 3 (the worker pod) raises in round 0; both pods
    start their ranks again inside the same JobSet (Argo's retry, a new JobSet, is not used)."""
    run = ArgoRun(aws, kubernetes, tmp_path, "kubernetesgangflow-r5tr1", TD_NODES=2, TD_NPROC=2,
                  TD_FAIL_RANK=3, TD_FAIL_ROUND=0, TD_MAX_RESTARTS=1)
    input_paths = run.start()
    jobset, status, pods = run.train(input_paths, 0)
    control_log = run.log(pods["control"])
    assert status["terminalState"] == "Completed", control_log[-4000:]
    assert "restart 1 of 1 after rank 3 (node 1) raised ValueError: injected failure on rank " \
           "3" in control_log, control_log[-4000:]
    # one JobSet, whose pods were never replaced (a restart in place keeps the machines)
    assert [p.replicated_job for p in kubernetes.pods(jobset["metadata"]["name"])] in (
        ["control", "worker"], ["worker", "control"])
    task_id = jobset["metadata"]["labels"]["torch_distributed_task_id"]
    dump = run.step("dump", "%s/train/%s" % (run.run_id, task_id))
    assert re.search(r"\brestarts \[[^\]]*\] = 1\b", dump), dump  # rank 0's, round 1
    assert re.search(r"\battempt \[[^\]]*\] = 0\b", dump), dump
    shown = run.step("step", "end", "--run-id", run.run_id, "--task-id", "t-9f8e7d6c",
                     "--input-paths", "%s/train/%s" % (run.run_id, task_id))
    assert "total 10.0 over 4 ranks" in shown, shown


def test_catch_keeps_its_meaning_and_its_fallback_attempt_runs_on_node_0_alone(
        aws, kubernetes, tmp_path):
    # rank 3 (on the worker pod) fails; @catch (deployed --with catch) catches the gang's
    # failure in the last attempt of the user code (the first, here), and adds attempts past
    # it for a task whose process died (its fallback)
    run = ArgoRun(aws, kubernetes, tmp_path, "kubernetesgangflow-c4tch",
                  top_level=("--with", "catch:var=failure"),
                  TD_NODES=2, TD_NPROC=2, TD_FAIL_RANK=3)
    assert argo.template(run.wf, "train")["retryStrategy"]["limit"] == 3  # @catch's
    input_paths = run.start()
    first, status, pods = run.train(input_paths, 0)
    assert status["terminalState"] == "Completed", run.log(pods["control"])[-4000:]
    task_id = first["metadata"]["labels"]["torch_distributed_task_id"]
    dump = run.step("dump", "--max-value-size=100000", "%s/train/%s" % (run.run_id, task_id))
    assert "injected failure on rank 3" in dump, dump  # @catch's variable holds the error

    # the attempt Argo makes after an attempt whose pod died: @catch's fallback
    second, status, pods = run.train(input_paths, 1)
    control_log, worker_log = run.log(pods["control"]), run.log(pods["worker"])
    assert status["terminalState"] == "Completed", control_log[-4000:] + worker_log[-4000:]
    assert "is @catch's fallback, which runs on node 0 alone" in worker_log, worker_log[-4000:]
    assert "says hello" not in control_log + worker_log  # no rank started on either pod


def test_a_foreach_of_two_gangs_is_two_jobsets_each_with_its_own_input(aws, kubernetes,
                                                                        tmp_path):
    from metaflow.plugins.argo.generate_input_paths import generate_input_paths

    run = ArgoRun(aws, kubernetes, tmp_path, "argoforeachflow-f0r3a", flow="argo_foreach_flow.py")
    argo.validate_workflow(run.wf)
    input_paths = run.start()
    gangs = []
    for split in (0, 1):  # the foreach's sub-DAG, once per item
        jobset, status, pods = run.train(input_paths, 0, **{"split-index": str(split)})
        assert status["terminalState"] == "Completed", run.log(pods["control"])[-4000:]
        gangs.append(jobset)
    task_ids = [js["metadata"]["labels"]["torch_distributed_task_id"] for js in gangs]
    assert len(set(task_ids)) == 2  # one task, and one JobSet, per item
    # one NetworkPolicy per gang, each selecting its own gang's pods and none of the other's
    policies = kubernetes.network_policies.created
    assert len(policies) == 2
    for policy, jobset in zip(policies, gangs):
        own = sorted(p.name for p in kubernetes.pods(jobset["metadata"]["name"]))
        assert len(own) == 2 and selected(kubernetes, policy) == (own, own)
    # the step after each gang reads it through the template's output; the join finds those
    # steps' tasks by Metaflow's formula (generate_input_paths, as the join's container does)
    join_inputs = generate_input_paths("collect", "2026-12-01T00:00:00Z", input_paths, 2)
    collect_ids = join_inputs.rsplit("/:", 1)[1].split(",")
    for split, (task_id, collect_id) in enumerate(zip(task_ids, collect_ids)):
        run.step("step", "collect", "--run-id", run.run_id, "--task-id", collect_id,
                 "--input-paths", "%s/train/%s" % (run.run_id, task_id))
    shown = run.step("step", "join", "--run-id", run.run_id, "--task-id", "t-5e6f7a8b",
                     "--input-paths", join_inputs)
    results = ast.literal_eval(shown.split("results ", 1)[1].splitlines()[0])
    # each gang: its own item on both nodes (summed over its 2 ranks), in its own JobSet
    assert [(lr, round(total, 4)) for lr, total, _ in results] == [(0.1, 0.2), (0.2, 0.4)]
    for (lr, _, seen), jobset in zip(results, gangs):
        assert seen == [(lr, 0, jobset["metadata"]["name"]), (lr, 1, jobset["metadata"]["name"])]
