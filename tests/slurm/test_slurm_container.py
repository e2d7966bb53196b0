"""@torch_slurm(container=...): every node's task runs in an OCI bundle through srun's
--container (Slurm's own container support; runc, as oci.conf of .ci/slurm sets it up), on the
real Slurm cluster of .ci/slurm. The bundle (conftest.oci_bundle) has no Slurm command, as an
image would not."""

import re
from pathlib import Path

from tests.slurm.test_slurm_flows import NODES, job_ids, scancel_while_training
from tests.support import run_bounded


def test_a_gang_and_its_plain_steps_run_in_the_steps_container(slurm_runner, slurm_cluster,
                                                                slurm_bundle):
    result = slurm_runner.run("slurm_gang_flow.py", env={
        "METAFLOW_TORCH_SLURM_CONTAINER": str(slurm_bundle)})
    assert result.returncode == 0, result
    data = slurm_runner.client(
        "r = Flow('SlurmGangFlow').latest_run\n"
        "t = r['train'].task\n"
        "result = dict(places=t.data.places, total=t.data.total, stdout=t.stdout,\n"
        "              start=r['start'].task.data.start_container,\n"
        "              end=r['end'].task.data.end_container)")
    places = sorted(data["places"], key=lambda p: p["rank"])
    # every rank ran in the bundle, where Slurm's commands are not
    assert [p["container"] for p in places] == [["ci-bundle", None]] * 4, places
    assert data["start"] == data["end"] == ["ci-bundle", None], data
    assert data["total"] == 10.0  # 1 + 2 + 3 + 4, all-reduced over the gang
    hosts = [p["host"] for p in places]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= NODES, hosts
    assert all(p["slurm"] == [] for p in places), places
    for rank, host in enumerate(hosts):
        assert "rank %d says hello from %s" % (rank, host) in data["stdout"], data["stdout"]
    train_job = job_ids(result.output)[1]
    shown = slurm_cluster.job(train_job)
    assert "NumNodes=2 " in shown and "JobState=COMPLETED" in shown, shown
    print("2x2 gang flow in a container: %.1f s from run to done (3 jobs)" % result.elapsed)


def test_scancel_preempts_every_rank_in_the_container_within_the_clusters_kill_wait(
        slurm_runner, slurm_cluster, slurm_bundle, tmp_path):
    """In a container too every rank gets current.torch_distributed.preempted and its grace:
    each node's script (the container's first process) outlives Slurm's SIGTERM, or Slurm
    would remove the container (SIGKILL) at once; and node 0, where no scontrol is, knows the
    cluster's KillWait from the batch script."""
    scancel_while_training(slurm_runner, slurm_cluster, tmp_path,
                           env={"METAFLOW_TORCH_SLURM_CONTAINER": str(slurm_bundle)})


def test_a_cluster_without_an_oci_runtime_fails_the_step_instead_of_running_outside(
        slurm_runner, slurm_cluster, slurm_bundle):
    """A cluster with no oci.conf ignores srun's --container (a warning in slurmd's log only)
    and would run the task on the node's own system: node 0 notices and ends the job."""
    conf = Path(slurm_cluster.state, "oci.conf")
    aside = conf.with_name("oci.conf.aside")
    conf.rename(aside)  # each job step's slurmstepd reads it anew
    try:
        result = slurm_runner.run("slurm_plain_flow.py", env={
            "METAFLOW_TORCH_SLURM_CONTAINER": str(slurm_bundle)})
    finally:
        aside.rename(conf)
    assert result.returncode != 0, result
    assert re.search(r"@torch_slurm on step \*start\*: Slurm ran node 0 \(n\d\) outside the "
                     r"container %s: this cluster runs srun --container only where an OCI "
                     r"runtime is configured \(oci.conf beside slurm.conf\)"
                     % re.escape(str(slurm_bundle)), result.output), result
    assert len(job_ids(result.output)) == 1, result.output  # nothing ran after start's job
    assert slurm_cluster.wait_queue_empty(timeout=10) == []


def test_a_container_that_is_no_bundle_is_refused_before_any_job(slurm_runner, slurm_cluster,
                                                                 tmp_path):
    result = slurm_runner.run("slurm_plain_flow.py", env={
        "METAFLOW_TORCH_SLURM_CONTAINER": str(tmp_path)})
    assert result.returncode != 0, result
    assert "METAFLOW_TORCH_SLURM_CONTAINER=%r is not an OCI bundle seen from this machine" % (
        str(tmp_path)) in result.output, result
    assert job_ids(result.output) == [], result.output


def test_the_preflight_reads_the_clusters_oci_runtime_and_smokes_in_the_container(
        slurm_runner, slurm_cluster, slurm_bundle):
    env = slurm_runner.env({"METAFLOW_TORCH_SLURM_CONTAINER": str(slurm_bundle)})
    argv = slurm_runner.argv("slurm_gang_flow.py", "--with", "torch_slurm", "torch-distributed",
                             "preflight", "--smoke", "--yes", "--smoke-timeout", "120")
    proc, _ = run_bounded(argv, slurm_runner.root, env, 180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[ok] container: %s/oci.conf runs srun --container with runc; the step's bundle is " \
        "%s" % (slurm_cluster.state, slurm_bundle) in out, out
    # the smoke job's nodes imported torch and formed a process group in the bundle
    assert "[ok] smoke node 0: torch" in out and "[ok] smoke node 1: torch" in out, out
    assert "[ok] smoke: a process group formed across 2 nodes" in out, out
    assert slurm_cluster.wait_queue_empty(timeout=10) == []
