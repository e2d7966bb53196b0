"""Faults a cluster has, on the Kubernetes emulation with every pod its own host
(TD_EMULATION_HOSTS=1, netns.py): a 2 x 2 gang whose worker pod (node 1) loses its link
(during training or the rendezvous), hears nothing while it still sends (a one-way fault),
gets a pod deletion's SIGTERM on its PID 1, or whose control pod's image maps its name to
127.0.1.1. The AWS Batch emulation's are in test_hosts_faults_batch.py; the helpers in
hosts_faults.py. Skipped, with the reason, where pods cannot be hosts or the mode is off."""

from __future__ import annotations

import time

from . import hosts_faults as hf
from .hosts_faults import nodes_as_hosts  # noqa: F401 (autouse, before the module's moto)
from .test_k8s_gang import KubernetesRun

pytestmark = hf.MARKS


def test_kubernetes_node_1_whose_link_is_cut_during_training_is_named_by_its_heartbeat(
        aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = hf.in_background(gang, TD_BUSY=400, timeout_s=500)
    hf.cut_and_time(hf.worker_pod(kubernetes).process, finish, "Kubernetes")


def test_kubernetes_sigterm_to_pid_1_of_node_1_preempts_every_rank(aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = hf.in_background(gang, TD_BUSY=400, timeout_s=500)
    res, took = hf.sigterm_and_time(hf.worker_pod(kubernetes).process, finish, "Kubernetes")
    hf.assert_preempted_by_node_1(res)
    assert took < hf.LOST_BOUND_S, took


def test_kubernetes_node_0_whose_etc_hosts_maps_its_name_to_loopback_fails_at_once(
        aws, start_kubernetes, tmp_path):
    kubernetes = start_kubernetes(loopback_hostname_pods=[("control", 0)])
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    res = gang.run(TD_RENDEZVOUS_TIMEOUT=240, timeout_s=400)
    hf.assert_loopback_refused(res, "Kubernetes")


def test_kubernetes_node_1_cut_off_during_the_rendezvous_is_named_at_its_timeout(
        aws, kubernetes, tmp_path):
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = hf.in_background(gang, TD_RENDEZVOUS_TIMEOUT=30, timeout_s=500)
    hf.cut_at_start_and_time(hf.started_worker_pod(kubernetes).process, finish, "Kubernetes")


def test_kubernetes_node_1_that_can_send_but_hears_nothing_is_named_by_its_heartbeat(
        aws, kubernetes, tmp_path):
    """A one-way fault (netns.Host.deafen): node 1's frames still leave, nothing reaches it.
    Its heartbeats die with their connection (TCP waits for acknowledgements it never hears)
    and node 0 names it as it names a node whose link is cut."""
    gang = KubernetesRun(aws, kubernetes, tmp_path, "k8s_gang_flow.py")
    finish = hf.in_background(gang, TD_BUSY=400, timeout_s=500)
    hf.worker_pod(kubernetes).process.host.deafen()
    cut_at = time.monotonic()
    res = finish()
    took = time.monotonic() - cut_at
    print("Kubernetes: node 1 deaf during training, the run failed %.1f s later" % took)
    assert res.returncode != 0, res.output
    assert "node 1 stopped sending heartbeats 30.0s ago" in res.output, res.output
    assert took < hf.LOST_BOUND_S, took
