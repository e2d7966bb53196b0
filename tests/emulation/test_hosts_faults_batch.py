"""Faults a cluster has, on the AWS Batch emulation with every node its own host
(TD_EMULATION_HOSTS=1, netns.py): a 2 x 2 gang whose node 1 loses its link (during training,
as soon as its container runs, or while the gang restarts in place), whose node 1's PID 1 gets
a TerminateJob's SIGTERM, whose node 0's image maps its hostname to 127.0.1.1, or whose rank 2
runs node 1 out of memory. The Kubernetes emulation's are in test_hosts_faults_k8s.py; the
helpers in hosts_faults.py. Skipped, with the reason, where nodes cannot be hosts (not root,
no iproute2) or the mode is off."""

from __future__ import annotations

import time

import pytest

from . import hosts_faults as hf
from . import netns
from .hosts_faults import nodes_as_hosts  # noqa: F401 (autouse, before the module's moto)
from .probes import wait_for
from .test_batch_gang import BatchRun, _task_seconds, _train_job_id

pytestmark = hf.MARKS


def test_batch_node_1_whose_link_is_cut_during_training_is_named_by_its_heartbeat(
        aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = hf.in_background(gang, TD_BUSY=400, timeout_s=500)
    hf.cut_and_time(hf.batch_node(batch, 1), finish, "AWS Batch")


def test_batch_sigterm_to_pid_1_of_node_1_preempts_every_rank(aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = hf.in_background(gang, TD_BUSY=400, timeout_s=500)
    res, took = hf.sigterm_and_time(hf.batch_node(batch, 1), finish, "AWS Batch")
    hf.assert_preempted_by_node_1(res)
    assert "[node 1 agent] preempted (SIGTERM to node 1)" in res.output, res.output
    assert took < hf.LOST_BOUND_S, took


def test_batch_node_0_whose_etc_hosts_maps_its_hostname_to_loopback_fails_at_once(
        aws, start_emulator, tmp_path):
    batch = start_emulator(loopback_hostname_nodes=[0])
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    res = gang.run(TD_RENDEZVOUS_TIMEOUT=240, timeout_s=400)
    hf.assert_loopback_refused(res, "AWS Batch")
    assert "its hostname" in res.output, res.output


def test_batch_node_1_cut_off_during_the_rendezvous_is_named_at_its_timeout(
        aws, batch, tmp_path):
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = hf.in_background(gang, TD_RENDEZVOUS_TIMEOUT=30, timeout_s=500)
    job_id = wait_for(lambda: _train_job_id(batch), hf.START_S, "the train job")
    process = wait_for(lambda: batch.api.find(job_id).nodes[1].process, hf.START_S,
                       "node 1 to start")
    hf.cut_at_start_and_time(process, finish, "AWS Batch")


def test_batch_node_1_cut_off_while_the_gang_restarts_in_place_is_named_by_its_heartbeat(
        aws, batch, tmp_path):
    """Rank 1 (node 0) fails round 0; the gang restarts in place (max_restarts=1), and node 1's
    link is cut while its ranks of round 1 have not joined yet (they wait, TD_LATE_ROUND):
    node 0 keeps watching node 1's heartbeats through the restart, names node 1 and gives
    round 0's failure, long before round 1's rendezvous timeout."""
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    finish = hf.in_background(gang, TD_FAIL_RANK=1, TD_FAIL_ROUND=0, TD_MAX_RESTARTS=1,
                            TD_LATE_ROUND=1, TD_RENDEZVOUS_TIMEOUT=400, timeout_s=500)
    job_id = wait_for(lambda: _train_job_id(batch), hf.START_S, "the train job")
    node_1 = wait_for(lambda: batch.api.find(job_id).nodes[1].process, hf.START_S,
                      "node 1 to start")
    wait_for(lambda: "[rank 3] rank 3 waits before joining round 1" in batch.node_log(job_id, 0),
             hf.START_S, "node 1's ranks of round 1 to start")
    node_1.host.cut()
    cut_at = time.monotonic()
    res = finish()
    took = time.monotonic() - cut_at
    print("AWS Batch: link of node 1 cut as the gang restarted, the run failed %.1f s later"
          % took)
    assert res.returncode != 0, res.output
    assert "restart 1 of 1 after rank 1 (node 0) raised ValueError" in res.output, res.output
    assert "node 1 stopped sending heartbeats 30.0s ago" in res.output, res.output
    assert "round 0: rank 1 (node 0) raised ValueError" in res.output, res.output
    assert took < hf.LOST_BOUND_S, took


def test_batch_rank_on_node_1_ended_by_its_containers_oom_killer_is_named_as_such(
        aws, batch, tmp_path):
    """Every node its own memory cgroup, limited to the job's memory (4 GiB, Metaflow's
    default): rank 2 (node 1) allocates until the kernel's OOM killer ends it, and node 1's
    agent reads its cgroup's count, so the step's error says it was the OOM killer, not a
    `kill -9`."""
    if netns.cgroups_unavailable():  # the hog would have this whole machine's memory
        pytest.skip(netns.cgroups_unavailable())
    gang = BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")
    res = gang.run(TD_FAIL_RANK=2, TD_FAIL_HOW="oom", timeout_s=400)
    assert res.returncode != 0, res.output
    assert "rank 2 (node 1, local rank 0) was killed by SIGKILL: the kernel's OOM killer: the " \
        "memory cgroup's oom_kill count went from 0 to 1" in res.output, res.output
    print("AWS Batch: rank 2 OOM-killed in node 1's cgroup, the train task took %.1f s"
          % _task_seconds(res.output, "train"))
