"""The Kubernetes emulation on its own, through the official `kubernetes` client: admission
against the JobSet CRD's schema, pod environment, InOrder start, cluster DNS, failure and
success as the JobSet controller reports them."""

from __future__ import annotations

import json
import sys

import pytest
from kubernetes import client, config

from . import netns
from .hosts import is_node_address
from .probes import wait_for

GROUP, VERSION = "jobset.x-k8s.io", "v1alpha2"
PROBE = ("import json, os, socket, sys, time\n"
         "name = os.environ['CONTROL']\n"
         "try:\n    address = socket.gethostbyname(name)\n"
         "except OSError:\n    address = None\n"
         "print(json.dumps({'index': os.environ['INDEX'], 'pod': os.environ['POD'],"
         " 'address': address}))\n"
         "sys.stdout.flush()\n"
         "time.sleep(float(os.environ.get('HOLD', '0')))\n"
         "sys.exit(int(os.environ.get('EXIT_' + os.environ['INDEX'], '0')))\n")


def jobset(name, workers=2, code=PROBE, **extra):
    def rjob(job, replicas):
        env = [{"name": "CONTROL", "value": "%s-control-0-0.%s.default.svc.cluster.local"
                % (name, name)},
               {"name": "INDEX", "valueFrom": {"fieldRef": {
                   "fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-index']"}}},
               {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
        env += [{"name": k, "value": v} for k, v in extra.get(job, {}).items()]
        return {"name": job, "replicas": replicas, "template": {"spec": {
            "backoffLimit": 0, "completions": 1, "parallelism": 1, "template": {"spec": {
                "subdomain": name, "restartPolicy": "Never",
                "containers": [{"name": job, "image": "python:3.11", "env": env,
                                "command": [sys.executable, "-c", code]}]}}}}}

    return {"apiVersion": "%s/%s" % (GROUP, VERSION), "kind": "JobSet",
            "metadata": {"name": name},
            "spec": {"suspend": False, "startupPolicy": {"startupPolicyOrder": "InOrder"},
                     "successPolicy": None,  # a null the API server prunes
                     "replicatedJobs": [rjob("control", 1), rjob("worker", workers)]}}


@pytest.fixture
def api(kubernetes):
    return client.CustomObjectsApi(config.new_client_from_config(str(kubernetes.kubeconfig)))


def finished(api, name):
    status = api.get_namespaced_custom_object(GROUP, VERSION, "default", "jobsets",
                                              name)["status"]
    return status if status.get("terminalState") else None


def outputs(kubernetes, name):
    return sorted((json.loads(kubernetes.pod_log(p.name).strip().splitlines()[-1])
                   for p in kubernetes.pods(name)), key=lambda o: (o["pod"]))


def test_a_jobset_runs_its_pods_in_order_and_completes(kubernetes, api):
    # the control pod stays up a while: a pod's name resolves only while it runs
    api.create_namespaced_custom_object(GROUP, VERSION, "default", "jobsets",
                                        jobset("js-a", control={"HOLD": "3"}))
    status = wait_for(lambda: finished(api, "js-a"), 30, "the JobSet to finish")
    assert status["terminalState"] == "Completed"
    assert [c["type"] for c in status["conditions"]] == ["Completed"]
    assert [(s["name"], s["succeeded"], s["failed"]) for s in status["replicatedJobsStatus"]] \
        == [("control", 1, 0), ("worker", 2, 0)]
    found = outputs(kubernetes, "js-a")
    # the downward API gave each pod its job index and name; the control pod's DNS name
    # resolved on every pod (InOrder: workers start once the control pod runs)
    assert [(o["index"], o["pod"].rsplit("-", 3)[0]) for o in found] == [
        ("0", "js-a-control"), ("0", "js-a-worker"), ("1", "js-a-worker")]
    control_ip = next(p.ip for p in kubernetes.pods("js-a") if p.replicated_job == "control")
    assert is_node_address(control_ip)
    assert {o["address"] for o in found} == {control_ip}
    pods = client.CoreV1Api(api.api_client).list_namespaced_pod(
        "default", label_selector="jobset.sigs.k8s.io/jobset-name=js-a,"
        "jobset.sigs.k8s.io/replicatedjob-name=worker").items
    assert sorted(p.metadata.annotations["jobset.sigs.k8s.io/job-index"] for p in pods) == [
        "0", "1"]
    assert {p.status.container_statuses[0].state.terminated.exit_code for p in pods} == {0}


# What a pod sees of its siblings' folders (pods/<name>) and of the emulator's own.
LOOK = ("import json, os, sys, time\n"
        "open('here', 'w').write(os.environ['POD'])\n"
        "time.sleep(float(os.environ.get('HOLD', '0')))\n"
        "print(json.dumps({'pod': os.environ['POD'], 'at': time.time(),"
        " 'pods': sorted(os.listdir('../..')), 'emulator': sorted(os.listdir('../../..'))}))\n")


@pytest.mark.skipif(not netns.enabled(), reason="pods as hosts only (TD_EMULATION_HOSTS=1):"
                    " as processes of one host every pod sees every folder")
def test_a_pod_as_a_host_sees_no_other_pods_folder(kubernetes, api):
    """Pods on separate nodes share no disk: each sees its own folder and the cluster's DNS
    records, not its siblings' folders (the control pod wrote in its folder before the
    workers started: InOrder)."""
    api.create_namespaced_custom_object(GROUP, VERSION, "default", "jobsets",
                                        jobset("js-apart", code=LOOK, control={"HOLD": "3"},
                                               worker={"HOLD": "1"}))
    status = wait_for(lambda: finished(api, "js-apart"), 60, "the JobSet to finish")
    pods = kubernetes.pods("js-apart")
    assert status["terminalState"] == "Completed", [kubernetes.pod_log(p.name) for p in pods]
    assert len(pods) == 3
    for pod in pods:
        seen = json.loads(kubernetes.pod_log(pod.name).strip().splitlines()[-1])
        assert seen["pods"] == [pod.name], seen
        assert seen["emulator"] == ["dns", "pods"], seen
        if pod.replicated_job == "worker":
            control = next(p for p in pods if p.replicated_job == "control")
            written = kubernetes.pod_dir(control.name) / "work" / "here"
            assert written.read_text() == control.name  # there, on this machine
            assert written.stat().st_mtime < seen["at"], seen


def test_a_failed_job_fails_the_jobset(kubernetes, api):
    api.create_namespaced_custom_object(GROUP, VERSION, "default", "jobsets",
                                        jobset("js-b", worker={"EXIT_1": "3"}))
    status = wait_for(lambda: finished(api, "js-b"), 30, "the JobSet to finish")
    assert status["terminalState"] == "Failed"
    assert status["conditions"][0]["reason"] == "FailedJobs"
    worker = {s["name"]: s for s in status["replicatedJobsStatus"]}["worker"]
    assert worker["failed"] == 1


def test_an_invalid_jobset_is_refused_like_the_api_server_would(kubernetes, api):
    bad = jobset("js-c")
    bad["spec"]["replicatedJobs"][1]["replicas"] = "two"
    with pytest.raises(client.rest.ApiException) as caught:
        api.create_namespaced_custom_object(GROUP, VERSION, "default", "jobsets", bad)
    assert caught.value.status == 422
    assert "replicatedJobs/1/replicas: 'two' is not of type 'integer'" in caught.value.body
    assert kubernetes.created == []


def test_a_name_under_the_cluster_domain_resolves_only_once_its_pod_runs(kubernetes, api):
    # the worker probes a name no pod has: the shim answers like an unknown name
    body = jobset("js-d", workers=1)
    body["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0][
        "env"][0]["value"] = "js-d-worker-9-0.js-d.default.svc.cluster.local"
    api.create_namespaced_custom_object(GROUP, VERSION, "default", "jobsets", body)
    wait_for(lambda: finished(api, "js-d"), 30, "the JobSet to finish")
    by_job = {o["pod"].rsplit("-", 3)[0]: o for o in outputs(kubernetes, "js-d")}
    control_ip = next(p.ip for p in kubernetes.pods("js-d") if p.replicated_job == "control")
    assert is_node_address(control_ip)
    assert by_job["js-d-control"]["address"] == control_ip
    assert by_job["js-d-worker"]["address"] is None
