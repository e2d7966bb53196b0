"""Metaflow semantics around a gang: foreach, retry, catch, resume, Ctrl-C, start methods."""

import json
import os
import signal
import time

import pytest

TRAIN = "t = Flow('GangFlow').latest_run['train'].task\n"


def test_foreach_of_gangs_runs_concurrently_and_joins_one_input_per_branch(flow_runner):
    res = flow_runner.run("foreach_flow.py")
    assert res.returncode == 0, res
    got = flow_runner.client(
        "run = Flow('ForeachGangs').latest_run\n"
        "j = run['join'].task\n"
        "result = dict(results=j['results'].data, n=j['n_inputs'].data, ports=j['ports'].data,\n"
        "              train_tasks=len(list(run['train'])), merged=j['merged_lrs'].data,\n"
        "              names=sorted({a.id for t in run['train'] for a in t}))")
    assert got["n"] == 2 and got["train_tasks"] == 2
    assert got["merged"] == [1.0, 10.0]
    # nothing of the package's own is an artifact a join, task.data or resume would see
    assert not [n for n in got["names"] if "torch_distributed" in n], got["names"]
    assert got["results"] == [[1.0, 3.0], [10.0, 30.0]]
    assert len(set(got["ports"])) == 2


def test_retry_reruns_the_whole_gang(flow_runner):
    res = flow_runner.run("gang_flow.py", "--with", "retry:times=1,minutes_between_retries=0",
                          env={"TD_NODES": 2, "TD_NPROC": 1, "TD_FAIL_RANK": 1,
                               "TD_FAIL_WHEN": "after_init", "TD_FAIL_HOW": "raise",
                               "TD_FAIL_ATTEMPT": 0})
    assert res.returncode == 0, res
    assert "injected failure on rank 1" in res.output
    got = flow_runner.client(TRAIN + "result = dict(attempt=t['attempt'].data, "
                             "total=t['total'].data, ok=t.successful)")
    assert got["attempt"] == 1 and got["total"] == 3 and got["ok"]


def test_catch_records_the_gang_failure(flow_runner):
    res = flow_runner.run("gang_flow.py", "--with", "catch:var=failure",
                          env={"TD_NODES": 1, "TD_NPROC": 2, "TD_FAIL_RANK": 1,
                               "TD_FAIL_WHEN": "after_init", "TD_FAIL_HOW": "exit"})
    assert res.returncode == 0, res
    got = flow_runner.client(TRAIN + "result = repr(t['failure'].data)")
    assert "rank 1 (node 0, local rank 1) exited with code 3" in got


def test_resume_after_a_failed_gang(flow_runner):
    failed = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 1,
                                                  "TD_FAIL_RANK": 1, "TD_FAIL_WHEN": "after_init"})
    assert failed.returncode != 0, failed
    resumed = flow_runner.cli("gang_flow.py", "resume", env={"TD_NODES": 2, "TD_NPROC": 1})
    assert resumed.returncode == 0, resumed
    got = flow_runner.client(
        "run = Flow('GangFlow').latest_run\n"
        "result = dict(ok=run.successful, train=len(list(run['train'])),"
        " total=run['train'].task['total'].data)")
    assert got == {"ok": True, "train": 1, "total": 3}


def test_ctrl_c_leaves_no_process(flow_runner):
    proc = flow_runner.popen("gang_flow.py", "run",
                             env={"TD_NODES": 2, "TD_NPROC": 2, "TD_ALL_SLEEP": 1})
    deadline = time.monotonic() + 60
    while len(list(flow_runner.marks.glob("sleeping-*"))) < 4:
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    # to the run's process only: Metaflow's runtime kills its tasks 5 s later, and the gang's
    # note says that it was Metaflow's shutdown, not the OOM killer
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    output = out + err
    assert "the Metaflow task process of node 0 (pid " in output, output
    assert "was ended by Metaflow: the run was interrupted (a SIGINT to its process), and " \
           "Metaflow kills the tasks still running 5 s later." in output, output
    assert "died without a word" not in output and "OOM killer" not in output, output
    # the fixture asserts that nothing from this test's folder is left running


def test_another_users_files_where_the_interrupt_mark_lies_do_not_fail_the_run(flow_runner):
    """Another user of the machine takes, in the run's shared TMPDIR, the names where the run's
    interrupt mark lay (a folder: even root cannot unlink it) and lies now (this user's own
    folder): the run, which ends by forgetting its mark, still succeeds (it ended "Internal
    error", exit status 1)."""
    from tests.other_user import as_other_user, shared_tmp

    with shared_tmp() as shared:
        proc = flow_runner.popen("gang_flow.py", "run",
                                 env={"TD_NODES": 1, "TD_NPROC": 2, "TMPDIR": shared})

        victim = os.getuid()

        def plant():  # named by the run's pid, before its tasks end
            os.mkdir(os.path.join(shared, "torch-distributed-interrupted-%d" % proc.pid))
            os.mkdir(os.path.join(shared, "metaflow-torch-distributed-%d" % victim))

        as_other_user(plant)
        out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, out + err
    assert "Internal error" not in out + err


@pytest.mark.parametrize("how", ["raise", "sigkill"])
def test_exec_start_method(flow_runner, how):
    env = {"TD_NODES": 2, "TD_NPROC": 2, "METAFLOW_TORCH_DISTRIBUTED_START_METHOD": "exec"}
    ok = flow_runner.run("gang_flow.py", "--with", "retry", env=env)
    assert ok.returncode == 0, ok
    assert flow_runner.client(TRAIN + "result = t['total'].data") == 10
    # every rank and node 1's agent is a spin-step of the task, which runs @retry: Metaflow's
    # warning that a spin-step ignores it (twice per step, per process) is not shown
    assert "[rank 3]" in ok.output and "Task finished successfully." in ok.output, ok
    assert "not supported in spin steps" not in ok.output, ok
    bad = flow_runner.run("gang_flow.py", env=dict(env, TD_FAIL_RANK=3, TD_FAIL_WHEN="in_collective",
                                                   TD_FAIL_HOW=how))
    assert bad.returncode != 0
    assert "rank 3 (node 1, local rank 1)" in bad.output, bad


@pytest.mark.parametrize("args, expected", [
    ({"nodes": 0}, "nodes=0 must be at least 1"),
    ({"world_size": -2}, "world_size=-2 must be at least 1"),
    ({"world_size": 2.5}, "world_size=2.5 is not a whole number"),
    ({"nproc_per_node": "2"}, "nproc_per_node='2' is not a whole number"),
    ({"world_size": 6, "nproc_per_node": 4}, "6 / 4 = 1.50 nodes"),
    ({"world_size": 4, "nodes": 3, "nproc_per_node": 2}, "nodes=3 x 2 processes per node"),
    ({"world_size": 5, "nodes": 2}, "world_size=5 is not divisible by nodes=2"),
    ({"bogus": 1}, "bogus"),
    ({"rendezvous_timeout": 0}, "rendezvous_timeout=0 is not a positive number"),
    ({"start_method": "spawn"}, "start_method='spawn' is not one of"),
])
def test_invalid_configuration_fails_before_any_task(flow_runner, args, expected):
    res = flow_runner.run("config_flow.py", env={"TD_ARGS": json.dumps(args)})
    assert res.returncode != 0
    assert expected in res.output, res
    assert "start step ran" not in res.output
    if "bogus" not in args:
        assert "@torch_distributed on step train:" in res.output, res


def test_nproc_per_node_gpu_without_gpus_fails_before_any_task(flow_runner):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.devices import (
        visible_gpu_ids,
    )
    if visible_gpu_ids():
        pytest.skip("this machine has GPUs: nproc_per_node='gpu' plans a gang here")
    res = flow_runner.run("config_flow.py", env={"TD_ARGS": json.dumps({"nproc_per_node": "gpu"})})
    assert res.returncode != 0
    assert "@torch_distributed on step train: nproc_per_node=\"gpu\" means one process per " \
        "GPU" in " ".join(res.output.split()), res
    assert "start step ran" not in res.output and "Internal error" not in res.output, res


def test_nproc_per_node_auto_runs_one_rank_per_cpu_as_torchrun(flow_runner):
    # torchrun's --nproc-per-node=auto without GPUs: torch._utils.cpu_count(), the affinity
    before = os.sched_getaffinity(0)
    cpus = set(sorted(before)[:2])
    os.sched_setaffinity(0, cpus)  # the flow's processes inherit it
    try:
        res = flow_runner.run("config_flow.py", env={
            "TD_ARGS": json.dumps({"nproc_per_node": "auto"}),
            "METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK": "off"})
    finally:
        os.sched_setaffinity(0, before)
    assert res.returncode == 0, res
    assert "train: 1 node x %d process%s = world size %d (CPU, gloo)" % (
        len(cpus), "es" if len(cpus) > 1 else "", len(cpus)) in res.output, res


NUM_PARALLEL_FIX = (
    "@torch_distributed on step train: step start reaches it with self.next(..., "
    "num_parallel=2), Metaflow's own way to start a gang (with @parallel). @torch_distributed "
    "starts the gang itself and infers its size: write self.next(self.train) without "
    "num_parallel, remove @parallel (or @pytorch_parallel) from step train if it has one, and "
    "size the gang on @torch_distributed instead: num_parallel=2 becomes nodes=2.")


@pytest.mark.parametrize("with_parallel", [False, True], ids=["num_parallel", "and_parallel"])
def test_num_parallel_is_rejected_by_one_message_that_drops_it_and_parallel(flow_runner,
                                                                            with_parallel):
    # Metaflow's own graph check would first ask for @parallel; with @parallel added, a
    # message that only said to remove @parallel would lead the user in a loop
    res = flow_runner.run("parallel_flow.py",
                          env={"TD_PARALLEL_DECORATOR": 1} if with_parallel else {})
    assert res.returncode != 0
    assert NUM_PARALLEL_FIX in " ".join(res.output.split()), res
    assert "does not have a @parallel decorator" not in res.output, res
    assert "cannot be combined with @parallel" not in res.output, res
    assert "start step ran" not in res.output


@pytest.mark.parametrize("how", ["succeeds", "raises", "exits"])
def test_rank_0_ignoring_sigchld_changes_nothing_the_gang_sees(flow_runner, how):
    """User code in rank 0 that ignores SIGCHLD (the kernel then reaps the forked ranks before
    the gang can): a rank that finished is finished, one that raised or exited failed with its
    own cause, never 'killed by SIGKILL'."""
    env = {"TD_NODES": 1, "TD_NPROC": 2, "TD_RANK0_IGNORE_SIGCHLD": 1}
    if how != "succeeds":
        env.update(TD_FAIL_RANK=1, TD_FAIL_WHEN="after_body",
                   TD_FAIL_HOW="raise" if how == "raises" else "exit")
    res = flow_runner.run("gang_flow.py", env=env)
    assert "SIGKILL" not in res.output, res.output[-4000:]
    if how == "succeeds":
        assert res.returncode == 0, res.output[-4000:]
    else:
        assert res.returncode != 0, res.output[-4000:]
        assert ("rank 1 (node 0, local rank 1) raised this error"
                if how == "raises" else "rank 1 (node 0, local rank 1) exited with code 3") \
            in res.output, res.output[-4000:]
        if how == "raises":
            assert "ValueError: injected failure on rank 1" in res.output
