"""`python flow.py --with torch_slurm torch-distributed preflight` against the real Slurm cluster
of .ci/slurm (4 nodes of 2 CPUs, KillWait=5, MinJobAge=600), from its controller host: what it
reads, a gang the partition cannot hold, a partition that does not exist, and `--smoke`, which
runs a real 2-node job."""

from tests.support import run_bounded


def preflight(runner, with_="torch_slurm", env=None, timeout=120):
    argv = runner.argv("slurm_gang_flow.py", "--with", with_, "torch-distributed", "preflight")
    proc, _ = run_bounded(argv, runner.root, runner.env(env), timeout)
    return proc.returncode, proc.stdout + proc.stderr


def test_the_preflight_reads_the_cluster(slurm_runner, slurm_cluster):
    code, out = preflight(slurm_runner)
    assert code == 0, out
    assert "checking step train: a gang of 2 nodes x (2 CPU) on Slurm" in out, out
    assert "node size" not in out, out  # it asks for a CPU per process
    assert "[ok] Slurm: slurm-wlm 22.05.8; Slurmctld(primary) at ctl is UP" in out, out
    assert "[ok] partition: partition debug (the default) is up, with 4 nodes" in out, out
    assert "[ok] nodes: 4 nodes of partition debug have 2 CPUs and take jobs now" in out, out
    # the CI cluster's KillWait of 5 s cuts the default grace of 25 s
    assert "[warning] KillWait: KillWait=5 s" in out and "is cut to 2 s" in out, out
    assert "[ok] MinJobAge: MinJobAge=600 s" in out, out
    assert "[??] datastore: whether every compute node sees %s" % (
        slurm_runner.root / ".metaflow") in out, out
    assert slurm_cluster.queue() == []  # it submitted nothing


def test_a_gang_the_partition_cannot_hold_and_a_missing_partition_fail(slurm_runner,
                                                                       slurm_cluster):
    code, out = preflight(slurm_runner, env={"TD_NODES": "8"})
    assert code != 0, out
    assert "[FAILED] partition: the gang needs 8 nodes, but partition debug has 4 nodes" in out
    assert "1 check failed: partition (train)" in out, out
    code, out = preflight(slurm_runner, "torch_slurm:partition=nosuch")
    assert code != 0, out
    assert "[FAILED] partition: partition nosuch does not exist here (the cluster has debug)" \
        in out, out
    assert slurm_cluster.queue() == []


def test_smoke_runs_a_two_node_job_and_reads_its_nodes(slurm_runner, slurm_cluster):
    argv = slurm_runner.argv("slurm_gang_flow.py", "--with", "torch_slurm", "torch-distributed",
                             "preflight", "--smoke", "--yes", "--smoke-timeout", "120")
    proc, _ = run_bounded(argv, slurm_runner.root, slurm_runner.env(None), 180)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "smoke: this RUNS one job: a gang of 2 nodes x (2 CPU) on Slurm partition " \
        "(the default)" in out, out
    assert "[ok] smoke node 0: torch" in out and "[ok] smoke node 1: torch" in out, out
    assert "[ok] smoke: a process group formed across 2 nodes and all-reduced once (2 ranks)" \
        in out, out
    assert "[ok] datastore: the smoke job's nodes read its flow and local datastore from %s" % (
        slurm_runner.root / ".torch_slurm") in out, out
    # its folder is gone once it passed, and it left no job
    assert list((slurm_runner.root / ".torch_slurm").glob("torch-distributed-smoke-*")) == []
    assert slurm_cluster.wait_queue_empty(timeout=10) == []
