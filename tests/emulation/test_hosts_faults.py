"""Faults a cluster has, with every node its own host (TD_EMULATION_HOSTS=1, netns.py): a 2 x 2
gang on the AWS Batch and the Kubernetes emulation whose node 1 loses its link (during
training, or as soon as its container runs: during the rendezvous), whose node 1's PID 1 gets
the SIGTERM of a TerminateJob or a pod deletion, or whose node 0 has an image that maps its
hostname to 127.0.1.1. Each test prints its fault's time to failure (shown with -s).

The module runs where TD_EMULATION_HOSTS=1 is set (and sets it again for its own moto and
emulators), and is skipped, with the reason, where nodes cannot be hosts (not root, no
iproute2)."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from . import netns
from .probes import wait_for
from .test_batch_gang import BatchRun, _task_seconds, _train_job_id
from .test_k8s_gang import KubernetesRun

pytestmark = [
    pytest.mark.skipif(netns.unavailable() is not None,
                       reason="nodes as hosts: %s" % netns.unavailable()),
    # Opt-in while they are not yet stable on a loaded 2-core machine (a rank of node 1 once
    # could not reach node 0's store for 60 s while its agent had joined): CI's default run
    # does not take them until then.
    pytest.mark.skipif(not netns.enabled(), reason="the faults of nodes as hosts run with "
                       "%s=1 only, for now" % netns.ENV),
]

# The package's default heartbeat timeout is 30 s; the issue measured 31 s from the cut on a
# quiet machine, 37 to 57 s were measured at a load average of 7 on 2 cores, 109 s at 18.
LOST_BOUND_S = 180
# A node's container up to its ranks' first lines, on a loaded 2-core machine.
START_S = 240


@pytest.fixture(scope="module", autouse=True)
def nodes_as_hosts():
    """Before the module's moto starts (autouse: first of its scope), so that it listens on
    the bridge too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(netns.ENV, "1")
        yield


def _in_background(run, **td):
    outcome = {}
    runner = threading.Thread(target=lambda: outcome.update(res=run.run(**td)))
    runner.start()

    def finish():
        runner.join(500)
        assert "res" in outcome, "the run did not end within 500 s"
        return outcome["res"]
    return finish


def _batch_node(batch, index):
    """The NodeProcess of node `index` of the train job, once node 1's ranks train."""
    job_id = wait_for(lambda: _train_job_id(batch), START_S, "the train job")
    wait_for(lambda: batch.api.find(job_id).nodes[index].process is not None, START_S,
             "node %d to start" % index)
    wait_for(lambda: "[rank 3] rank 3 all-reduced once" in batch.node_log(job_id, 1), START_S,
             "node 1's ranks to train")
    return batch.api.find(job_id).nodes[index].process


def _worker_pod(kubernetes):
    """The train JobSet's worker pod (node 1) once its ranks train."""
    worker = wait_for(lambda: next((p for js in list(kubernetes.controller.jobsets.values())
                                    for p in js.pods if p.replicated_job == "worker"
                                    and p.process is not None), None), START_S, "the worker pod")
    wait_for(lambda: "[rank 3] rank 3 all-reduced once" in kubernetes.pod_log(worker.name),
             START_S, "node 1's ranks to train")
    return worker


def _cut_and_time(process, finish, what):
    process.host.cut()
    cut_at = time.monotonic()
    res = finish()
    took = time.monotonic() - cut_at
    print("%s: link of node 1 cut during training, the run failed %.1f s later" % (what, took))
    assert res.returncode != 0, res.output
    assert "node 1 stopped sending heartbeats 30.0s ago" in res.output, res.output
    assert took < LOST_BOUND_S, took


def _sigterm_and_time(process, finish, what):
    os.kill(process.pid, signal.SIGTERM)  # PID 1 of node 1, as TerminateJob or the kubelet
    sent = time.monotonic()
    res = finish()
    took = time.monotonic() - sent
    print("%s: SIGTERM to PID 1 of node 1, the run ended %.1f s later" % (what, took))
    return res, took


def _assert_preempted_by_node_1(res):
    assert res.returncode != 0, res.output
    assert "preempted (SIGTERM to node 1): every rank gets SIGTERM" in res.output, res.output
    assert "killed by SIGKILL" not in res.output, res.output


def test_batch_node_1_whose_link_is_cut_during_training_is_named_by_its_heartbeat(
        aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = _in_background(gang, TD_BUSY=400, timeout_s=500)
    _cut_and_time(_batch_node(batch, 1), finish, "AWS Batch")


def test_kubernetes_node_1_whose_link_is_cut_during_training_is_named_by_its_heartbeat(
        aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = _in_background(gang, TD_BUSY=400, timeout_s=500)
    _cut_and_time(_worker_pod(kubernetes).process, finish, "Kubernetes")


def test_batch_sigterm_to_pid_1_of_node_1_preempts_every_rank(aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = _in_background(gang, TD_BUSY=400, timeout_s=500)
    res, took = _sigterm_and_time(_batch_node(batch, 1), finish, "AWS Batch")
    _assert_preempted_by_node_1(res)
    assert "[node 1 agent] preempted (SIGTERM to node 1)" in res.output, res.output
    assert took < LOST_BOUND_S, took


def test_kubernetes_sigterm_to_pid_1_of_node_1_preempts_every_rank(aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = _in_background(gang, TD_BUSY=400, timeout_s=500)
    res, took = _sigterm_and_time(_worker_pod(kubernetes).process, finish, "Kubernetes")
    _assert_preempted_by_node_1(res)
    assert took < LOST_BOUND_S, took


def _assert_loopback_refused(res, what):
    assert res.returncode != 0, res.output
    assert "node 0 of this 2-node gang found only the loopback address 127.0.1.1 for itself" \
        in res.output, res.output
    assert "did not join" not in res.output, res.output
    took = _task_seconds(res.output, "train")
    print("%s: node 0's hostname at 127.0.1.1 refused %.1f s after the train task started"
          % (what, took))
    assert took < 60, took


def test_batch_node_0_whose_etc_hosts_maps_its_hostname_to_loopback_fails_at_once(
        aws, start_emulator, tmp_path):
    batch = start_emulator(loopback_hostname_nodes=[0])
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    res = gang.run(TD_RENDEZVOUS_TIMEOUT=240, timeout_s=400)
    _assert_loopback_refused(res, "AWS Batch")
    assert "its hostname" in res.output, res.output


def test_kubernetes_node_0_whose_etc_hosts_maps_its_name_to_loopback_fails_at_once(
        aws, start_kubernetes, tmp_path):
    kubernetes = start_kubernetes(loopback_hostname_pods=[("control", 0)])
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    res = gang.run(TD_RENDEZVOUS_TIMEOUT=240, timeout_s=400)
    _assert_loopback_refused(res, "Kubernetes")


def _cut_at_start_and_time(process, finish, what):
    """Node 1's link cut as soon as its container runs: it never reaches node 0 (nor S3)."""
    process.host.cut()
    cut_at = time.monotonic()
    res = finish()
    took = time.monotonic() - cut_at
    print("%s: link of node 1 cut during the rendezvous, the run failed %.1f s later"
          % (what, took))
    assert res.returncode != 0, res.output
    assert "did not join the gang within the rendezvous timeout of 30.0s" in res.output, \
        res.output
    assert "Missing: node 1 (ranks 2-3)" in res.output, res.output
    assert took < 30 + LOST_BOUND_S, took


def test_batch_node_1_cut_off_during_the_rendezvous_is_named_at_its_timeout(
        aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = _in_background(gang, TD_RENDEZVOUS_TIMEOUT=30, timeout_s=500)
    job_id = wait_for(lambda: _train_job_id(batch), START_S, "the train job")
    process = wait_for(lambda: batch.api.find(job_id).nodes[1].process, START_S,
                       "node 1 to start")
    _cut_at_start_and_time(process, finish, "AWS Batch")


def test_kubernetes_node_1_cut_off_during_the_rendezvous_is_named_at_its_timeout(
        aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = _in_background(gang, TD_RENDEZVOUS_TIMEOUT=30, timeout_s=500)
    worker = wait_for(lambda: next((p for js in list(kubernetes.controller.jobsets.values())
                                    for p in js.pods if p.replicated_job == "worker"
                                    and p.process is not None), None), START_S, "the worker pod")
    _cut_at_start_and_time(worker.process, finish, "Kubernetes")
