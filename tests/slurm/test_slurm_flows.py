"""Flows through `python flow.py run --with torch_slurm` on a real Slurm cluster (.ci/slurm):
real slurmctld and slurmd, real sbatch and srun, real gloo process groups."""

import os
import re
import signal
import subprocess
import sys
import time

import pytest

NODES = {"n1", "n2", "n3", "n4"}


def job_ids(output):
    return re.findall(r"\[slurm\] submitted job (\d+)", output)


def wait_running(cluster, name_part, timeout=60.0):
    """The id of the job whose name has `name_part` once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in cluster.queue():
            job_id, state, name = line.split()
            if name_part in name and state == "RUNNING":
                return job_id
        time.sleep(0.2)
    pytest.fail("no running job named *%s* after %s s: %s" % (name_part, timeout,
                                                              cluster.queue()))


def test_plain_steps_are_one_node_jobs_with_their_options(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_plain_flow.py")
    assert result.returncode == 0, result
    places = slurm_runner.client(
        "result = Flow('SlurmPlainFlow').latest_run['end'].task.data.places")
    assert [p["nodes"] for p in places] == ["1", "1", "1"], places
    assert {p["host"] for p in places} <= NODES, places  # on compute nodes, not the login node
    assert len({p["job"] for p in places}) == 3, places  # one job per step
    assert job_ids(result.output) == [p["job"] for p in places]
    middle = slurm_cluster.job(places[1]["job"])
    assert "TimeLimit=00:10:00" in middle and "Partition=debug" in middle, middle
    assert "Requeue=0" in middle, middle  # --no-requeue
    assert "JobState=COMPLETED" in middle, middle


def test_gang_2x2_runs_on_two_nodes(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_gang_flow.py")
    assert result.returncode == 0, result
    data = slurm_runner.client(
        "t = Flow('SlurmGangFlow').latest_run['train'].task\n"
        "result = dict(places=t.data.places, total=t.data.total, stdout=t.stdout)")
    places = sorted(data["places"], key=lambda p: p["rank"])
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    assert data["total"] == 10.0  # 1 + 2 + 3 + 4, all-reduced over the gang
    assert {p["world_size"] for p in places} == {4}
    hosts = [p["host"] for p in places]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= NODES, hosts
    # SLURM_* stays out of the ranks' environment (Lightning would take a node for the world)
    assert all(p["slurm"] == [] for p in places), places
    # gloo and NCCL use the interface that reaches node 0 (each host's eth0 on the bridge)
    assert all(p["interfaces"] == ["eth0", "eth0"] for p in places), places
    # every node's ranks reach the task's log, node 1's shipped to node 0
    for rank, host in enumerate(hosts):
        assert "rank %d says hello from %s" % (rank, host) in data["stdout"], data["stdout"]
    train_job = job_ids(result.output)[1]
    shown = slurm_cluster.job(train_job)
    assert "NumNodes=2 " in shown and "JobState=COMPLETED" in shown, shown
    assert "CPUs/Task=2 " in shown, shown  # a CPU per process of a node (no cpu= given)
    # task/affinity bound each node's task to its 2 CPUs: a thread per rank
    assert all(len(p["cpus"]) == 2 and p["threads"] == ["1", 1] for p in places), places
    print("2x2 gang flow: %.1f s from run to done (3 jobs); the gang's job ran %s"
          % (result.elapsed, re.search(r"RunTime=(\S+)", shown).group(1)))


def test_the_ranks_of_a_node_share_the_cpus_slurm_bound_its_task_to(slurm_runner,
                                                                     slurm_cluster):
    """2 nodes x 1 process: Slurm's default of one CPU per task, and the cluster binds tasks
    to their CPUs (task/affinity): each rank's threads are that CPU's, not the node's 2."""
    result = slurm_runner.run("slurm_gang_flow.py", env={"TD_NPROC": 1})
    assert result.returncode == 0, result
    places = slurm_runner.client("result = Flow('SlurmGangFlow').latest_run['train']"
                                 ".task.data.places")
    assert [len(p["cpus"]) for p in places] == [1, 1], places
    assert [p["threads"] for p in places] == [["1", 1], ["1", 1]], places


def test_a_rank_failure_fails_the_job_fast_with_its_traceback(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_gang_flow.py", env={"TD_FAIL_RANK": "3"})
    assert result.returncode != 0, result
    assert "ValueError: injected failure on rank 3" in result.output, result
    assert "Traceback" in result.output, result
    assert re.search(r"Slurm job \d+ failed.*JobState=FAILED", result.output), result
    assert slurm_cluster.wait_queue_empty(timeout=10) == []
    assert result.elapsed < 90, result


def test_bad_option_is_refused_before_any_job(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_bad_time_flow.py")
    assert result.returncode != 0, result
    assert "@torch_slurm on step start: time='2h' is not one of Slurm's time forms" \
        in result.output, result
    assert job_ids(result.output) == []


def _wait_training(marks, ranks=4, timeout=120.0):
    """{rank: pid} once every rank of the gang wrote its mark in its training loop."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {int(p.name.split("-")[1]): int(p.read_text() or 0)
                 for p in marks.glob("training-*")}
        if len(found) == ranks and all(found.values()):
            return found
        time.sleep(0.2)
    pytest.fail("not every rank trained after %s s: %s" % (timeout, sorted(marks.iterdir())))


def _preempted_run(slurm_runner, tmp_path, signal_it, env=None):
    """A 2 x 2 gang that trains until it sees current.torch_distributed.preempted; once every
    rank trains, signal_it({rank: pid}) is called. (returncode, output)."""
    marks = tmp_path / "training-marks"
    marks.mkdir()
    run = slurm_runner.popen("slurm_gang_flow.py", env={
        "TD_BUSY": "120", "TD_MARK_DIR": str(marks), "TD_PREEMPT_GRACE": "20", **(env or {})})
    try:
        pids = _wait_training(marks)
        signal_it(pids)
        out, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            run.kill()
    return run.returncode, out + err


def scancel_while_training(slurm_runner, slurm_cluster, tmp_path, env=None):
    """A 2 x 2 gang cancelled (scancel) once every rank trains: checks that every rank got
    current.torch_distributed.preempted and left its loop, and that the attempt failed as
    preempted, within the cluster's KillWait, then as Slurm's CANCELLED."""
    job = []

    def cancel(pids):
        job.append(wait_running(slurm_cluster, ".train."))
        slurm_cluster.query("scancel", job[0])

    code, out = _preempted_run(slurm_runner, tmp_path, cancel, env)
    assert code != 0, out
    for rank in range(4):
        assert "rank %d saw the preemption" % rank in out, out
    assert "killed by SIGTERM" not in out, out
    assert "was preempted (SIGTERM to node" in out, out
    # the grace fits in the cluster's KillWait (.ci/slurm: 5 s), or Slurm's SIGKILL would end
    # node 0's task before it recorded the attempt
    assert "preempt_grace is cut from 20s to 2s: Slurm sends SIGKILL to every process of the " \
        "job KillWait=5 s after" in out, out
    assert "given 2s (preempt_grace) to save" in out, out
    # the task's log, as Metaflow's runtime shows it
    assert "Slurm job %s was cancelled" % job[0] in out, out
    assert "JobState=CANCELLED" in out, out
    assert slurm_cluster.wait_queue_empty(timeout=10) == []


def test_scancel_mid_step_preempts_every_rank(slurm_runner, slurm_cluster, tmp_path):
    """scancel signals every process of the job at once (the ranks before their supervisors
    could tell them): every rank still gets its grace."""
    scancel_while_training(slurm_runner, slurm_cluster, tmp_path)


def test_a_sigterm_to_one_rank_preempts_the_whole_gang(slurm_runner, slurm_cluster,
                                                       tmp_path):
    """A SIGTERM that only rank 3 (node 1) got is passed on to its node's agent, and the whole
    gang is preempted: every rank sees the event, none is killed by it."""
    code, out = _preempted_run(slurm_runner, tmp_path,
                               lambda pids: os.kill(pids[3], signal.SIGTERM))
    assert code != 0, out
    for rank in range(4):
        assert "rank %d saw the preemption" % rank in out, out
    assert "killed by SIGTERM" not in out, out
    assert "node 1 was preempted (SIGTERM to node 1)" in out, out
    assert slurm_cluster.wait_queue_empty(timeout=10) == []


def ctrl_c_while_training(runner, cluster):
    """A gang run stopped by a terminal's Ctrl-C once its job runs: its output, after checking
    that it failed and left the queue empty."""
    run = subprocess.Popen(runner.argv("slurm_gang_flow.py", "run", "--with", "torch_slurm"),
                           cwd=runner.root, env=runner.env({"TD_BUSY": "120"}),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           start_new_session=True)
    try:
        wait_running(cluster, ".train.")
        os.killpg(run.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole foreground group
        out, err = run.communicate(timeout=90)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode != 0, out + err
    assert cluster.wait_queue_empty(timeout=30) == [], out + err
    return out + err


def test_ctrl_c_leaves_the_queue_empty(slurm_runner, slurm_cluster):
    ctrl_c_while_training(slurm_runner, slurm_cluster)


def test_a_gang_larger_than_the_partition_is_refused_at_submission(slurm_runner,
                                                                   slurm_cluster):
    result = slurm_runner.run("slurm_gang_flow.py", env={"TD_NODES": "5", "TD_NPROC": "1"})
    assert result.returncode != 0, result
    assert "the gang needs 5 nodes, but partition debug has 4 nodes" in result.output, result
    assert len(job_ids(result.output)) == 1  # the start step's; the gang's was never submitted
    assert slurm_cluster.wait_queue_empty(timeout=5) == []


def test_a_bare_lightning_trainer_is_ddp_over_the_gang_not_slurms_tasks(slurm_runner):
    """Inside a Slurm job Lightning would pick SLURMEnvironment from SLURM_* and take one
    task per node for the world; the ranks see none of it."""
    result = slurm_runner.run("fw_lightning_flow.py", timeout=300)
    assert result.returncode == 0, result
    ranks = slurm_runner.client(
        "result = sorted(Flow('LightningFlow').latest_run['train'].task['ranks'].data,"
        " key=lambda r: r['global_rank'])")
    assert [(r["strategy"], r["world_size"], r["global_rank"]) for r in ranks] == \
        [("DDPStrategy", 4, rank) for rank in range(4)]
    assert {(r["environment"], r["external"]) for r in ranks} == \
        {("TorchElasticEnvironment", True)}
    # the 64 rows split over the 4 ranks of both nodes, each row seen once per epoch
    assert sorted(i for r in ranks for i in r["seen"]) == list(range(64)), ranks


SLURMD_TIMEOUT_S = 10  # .ci/slurm's slurm.conf


def _fault_on_node_1(slurm_runner, slurm_cluster, marks, fault, mend, timeout=150):
    """A 2 x 2 gang that trains; once every rank trains, `fault(host)` strikes node 1's host,
    and `mend(host)` undoes it after the run, until the host is idle again. (returncode,
    output, node 1's host, seconds from the fault to the run's end)."""
    run = slurm_runner.popen("slurm_gang_flow.py", env={"TD_BUSY": "120",
                                                       "TD_MARK_DIR": str(marks)})
    host = None
    try:
        job_id = wait_running(slurm_cluster, ".train.")
        _wait_training(marks)
        fields = dict(w.split("=", 1) for w in slurm_cluster.job(job_id).split() if "=" in w)
        host = slurm_cluster.query("scontrol", "show", "hostnames",
                                   fields["NodeList"]).split()[1]
        fault(host)
        at = time.monotonic()
        out, err = run.communicate(timeout=timeout)
        took = time.monotonic() - at
    finally:
        if run.poll() is None:
            run.kill()
        if host:
            mend(host)
            deadline = time.monotonic() + 90
            while host not in slurm_cluster.idle_nodes() and time.monotonic() < deadline:
                time.sleep(0.5)
    assert host in slurm_cluster.idle_nodes(), slurm_cluster.query("sinfo")
    return run.returncode, out + err, host, took


def test_a_lost_node_fails_the_step_as_node_fail_within_slurmd_timeout(slurm_runner,
                                                                       slurm_cluster,
                                                                       tmp_path):
    """Node 1's slurmd dies (its ranks run on)."""
    code, out, lost, took = _fault_on_node_1(
        slurm_runner, slurm_cluster, tmp_path,
        lambda host: slurm_cluster.slurmd(host, "kill"),
        lambda host: slurm_cluster.slurmd(host, "start"))
    print("node lost: the step failed %.1f s after slurmd was killed" % took)
    assert code != 0, out
    assert re.search(r"Slurm job \d+ lost a node", out), out
    assert "JobState=NODE_FAIL" in out, out
    assert "The lost node: node 1 (%s, State=DOWN" % lost in out, out
    # Slurm marks the node down SlurmdTimeout after its last answer, then fails the job;
    # the bound leaves 20 s for the controller's ping cycle and the job's end
    assert took < SLURMD_TIMEOUT_S + 20, took


def test_a_cut_link_fails_the_step_naming_the_node(slurm_runner, slurm_cluster, tmp_path):
    """Node 1's link is cut while the gang trains (a partition: its slurmd, its agent and its
    ranks run on, cut off). The step fails within the heartbeat timeout or Slurm's node
    timeout, whichever comes first, naming node 1."""
    code, out, cut, took = _fault_on_node_1(
        slurm_runner, slurm_cluster, tmp_path,
        lambda host: slurm_cluster.link(host, "down"),
        lambda host: slurm_cluster.link(host, "up"))
    print("link cut: the step failed %.1f s after node 1's link went down" % took)
    assert code != 0, out
    # Slurm stops hearing the node's slurmd (SlurmdTimeout=10 on the CI cluster) before node 0
    # misses its agent's heartbeats for 30 s: the job ends as NODE_FAIL, naming the node
    assert ("node 1 stopped sending heartbeats" in out
            or "The lost node: node 1 (%s, State=DOWN" % cut in out), out
    # the heartbeat timeout (30 s) bounds it, with 20 s for the job's end to be seen
    assert took < 30 + 20, (took, out)


def test_a_setup_and_an_interpreter_of_the_nodes_own(slurm_runner, slurm_cluster, tmp_path):
    """METAFLOW_TORCH_SLURM_SETUP runs on every node before the task or the agent, in their
    shell (what it exports reaches every rank); METAFLOW_TORCH_SLURM_PYTHON=python runs them
    with the `python` the setup put on PATH (here a shim that notes each use)."""
    shims = tmp_path / "shims"
    shims.mkdir()
    used = tmp_path / "shim-used"
    shim = shims / "python"
    shim.write_text("#!/bin/sh\nhostname >> %s\nexec %s \"$@\"\n" % (used, sys.executable))
    shim.chmod(0o755)
    result = slurm_runner.run("slurm_gang_flow.py", env={
        "METAFLOW_TORCH_SLURM_SETUP": "export PATH=%s:$PATH; export TD_FROM_SETUP=yes" % shims,
        "METAFLOW_TORCH_SLURM_PYTHON": "python"})
    assert result.returncode == 0, result
    places = slurm_runner.client(
        "result = Flow('SlurmGangFlow').latest_run['train'].task.data.places")
    assert [p["from_setup"] for p in places] == ["yes"] * 4, places
    assert len({p["host"] for p in places}) == 2, places
    # every job's node ran its command through the shim: start, the gang's 2 nodes, end
    assert len(used.read_text().split()) == 4, used.read_text()
    assert len(set(used.read_text().split())) >= 2


def test_a_failed_setup_fails_the_step_naming_the_node(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_plain_flow.py", env={
        "METAFLOW_TORCH_SLURM_SETUP": "module load no-such-module 2>/dev/null"})
    assert result.returncode != 0, result
    assert re.search(r"@torch_slurm on step \*start\*: the setup command failed with exit "
                     r"status \d+ on node 0 \(n\d\): module load no-such-module", result.output), \
        result
    assert slurm_cluster.wait_queue_empty(timeout=10) == []


def test_two_gangs_of_a_foreach_run_at_once(slurm_runner, slurm_cluster):
    result = slurm_runner.run("batch_foreach_flow.py")  # the Batch layer's flow, unchanged
    assert result.returncode == 0, result
    results = slurm_runner.client(
        "result = Flow('BatchForeachFlow').latest_run['join'].task.data.results")
    assert [(lr, round(total, 5)) for lr, total, _ in results] == [(0.1, 0.2), (0.2, 0.4)]
    for lr, _, seen in results:
        assert {value for value, _, _ in seen} == {lr}  # each gang saw its own input
    assert len({port for _, _, seen in results for _, port, _ in seen}) == 2
    trains = []
    for job_id in job_ids(result.output):
        fields = dict(w.split("=", 1) for w in slurm_cluster.job(job_id).split() if "=" in w)
        if ".train." in fields["JobName"]:
            trains.append(fields)
    assert len(trains) == 2 and {t["NumNodes"] for t in trains} == {"2"}, trains
    # at once: each started before the other ended (Slurm's times are to the second)
    assert trains[0]["StartTime"] < trains[1]["EndTime"], trains
    assert trains[1]["StartTime"] < trains[0]["EndTime"], trains


def test_a_restart_in_place_stays_in_the_same_job(slurm_runner, slurm_cluster):
    result = slurm_runner.run("slurm_gang_flow.py", env={
        "TD_FAIL_RANK": "3", "TD_FAIL_ROUND": "0", "TD_MAX_RESTARTS": "1"})
    assert result.returncode == 0, result
    assert "ValueError: injected failure on rank 3" in result.output, result
    assert len(job_ids(result.output)) == 3, result  # start, train (once), end
    data = slurm_runner.client(
        "t = Flow('SlurmGangFlow').latest_run['train'].task\n"
        "result = dict(attempt=t.data.attempt, restarts=t.data.restarts, total=t.data.total,"
        " hosts=sorted({p['host'] for p in t.data.places}))")
    assert (data["attempt"], data["restarts"], data["total"]) == (0, 1, 10.0), data
    assert len(data["hosts"]) == 2, data


def test_a_killed_watcher_leaves_no_job_behind(slurm_runner, slurm_cluster):
    """Metaflow's runtime ends its workers with SIGKILL: the process that watches the job
    cannot cancel it then, and its guard does."""
    import psutil

    run = slurm_runner.popen("slurm_gang_flow.py", env={"TD_BUSY": "120"})
    try:
        job_id = wait_running(slurm_cluster, ".train.")
        watchers = [p for p in psutil.process_iter(["cmdline"])
                    if any("slurm_submit" in part for part in p.info["cmdline"] or [])
                    and "--guard" not in (p.info["cmdline"] or [])
                    and any(str(slurm_runner.root) in part for part in p.info["cmdline"])]
        assert len(watchers) == 1, [w.info["cmdline"] for w in watchers]
        watchers[0].kill()
        left = slurm_cluster.wait_queue_empty(timeout=30)
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert left == [], left
    assert "JobState=CANCELLED" in slurm_cluster.job(job_id)
    assert run.returncode != 0, out + err


def test_a_controller_that_stops_answering_for_a_while_does_not_fail_the_step(
        slurm_runner, slurm_cluster):
    """slurmctld frozen (SIGSTOP) for 12 s mid-step: scontrol fails meanwhile, the watch asks
    again, and the step ends as the job does. (Frozen before the job's srun has its step,
    Slurm fails the job itself: srun cannot confirm its allocation. The gang trains past the
    freeze: a job that ends while the controller is frozen stays COMPLETING for a minute more,
    until slurmctld resends its nodes the job's end.)"""
    run = slurm_runner.popen("slurm_gang_flow.py", env={"TD_BUSY": "16"})
    controller = slurm_cluster.daemon_pid("ctl")
    try:
        job_id = wait_running(slurm_cluster, ".train.")
        deadline = time.monotonic() + 30
        while "%s.0" % job_id not in slurm_cluster.query("squeue", "-h", "-s", "-j", job_id):
            assert time.monotonic() < deadline, "the job's srun started no step"
            time.sleep(0.2)
        time.sleep(1)
        os.kill(controller, signal.SIGSTOP)
        time.sleep(12)
        os.kill(controller, signal.SIGCONT)
        out, err = run.communicate(timeout=120)
    finally:
        os.kill(controller, signal.SIGCONT)
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert "asking again for up to 60 s" in out, out + err
    assert "total 10.0 over 4 ranks" in out, out + err


def test_a_rank_on_node_1_stuck_outside_any_collective_is_named_with_its_stack(
        slurm_runner, slurm_cluster):
    """Hang detection across Slurm nodes, as on AWS Batch (the same report)."""
    from tests.emulation.probes import assert_hang_report

    result = slurm_runner.run("slurm_gang_flow.py", env={"TD_HANG_RANK": "2",
                                                         "TD_HANG_TIMEOUT": "8"})
    assert result.returncode != 0, result
    assert "[rank 2] rank 2 hangs outside any collective" in result.output, result
    assert_hang_report(result.output, "slurm_gang_flow.py", 8)
    assert re.search(r"Slurm job \d+ failed.*JobState=FAILED", result.output), result
    assert slurm_cluster.wait_queue_empty(timeout=10) == []
