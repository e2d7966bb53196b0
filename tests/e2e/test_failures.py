"""The fault matrix: every way a rank can fail stops the whole gang fast, names the cause and
leaves nothing.

2 nodes x 2 processes: rank 0 and rank 1 are members forked by the Metaflow task, rank 2
a member on node 1 (started by node 1's agent). Where x when x how is 3 x 4 x 4 = 48 cases;
CI runs 17 of them: 16 that cover every pair of (where, when), (where, how) and (when, how),
and a member hung after its body. TD_FULL_FAULT_MATRIX=1 runs all 48.
TD_FAULT_START_METHOD=exec runs them under that start method (every rank, rank 0 included, a
spin-step of the task; the default is the package's, fork here). TD_FAULT_REPORT=<file>
appends each case's measured detection time to that file as a JSON line (docs/reliability.md
is written from it by bench/fault_table.py).
"""

import datetime
import json
import os
import re
import time

import psutil
import pytest

GANG = {"TD_NODES": 2, "TD_NPROC": 2}
if os.environ.get("TD_FAULT_START_METHOD"):
    GANG["METAFLOW_TORCH_DISTRIBUTED_START_METHOD"] = os.environ["TD_FAULT_START_METHOD"]
# The peers of a hung rank give up after this process-group timeout (seconds), passed to
# init_process_group in the hang cases only. It also bounds how long the first rank waits in
# init for the last, so it must cover node 1's agent starting on a loaded 2-core machine.
PG_TIMEOUT = 10
# A rank hung after its body is failed after the finish timeout (RDZV_TIMEOUT, the rendezvous
# timeout's default for it); node 1's agent must also check in within the rendezvous timeout,
# so it cannot be tiny on a loaded 2-core machine.
RDZV_TIMEOUT = 10
# Under start_method="exec" node 1's agent and every rank are interpreters of their own that
# import metaflow and torch before they check in: on a loaded 2-core machine (load 10) that
# took more than 10 s. Their rendezvous timeout is this; the finish timeout stays RDZV_TIMEOUT.
EXEC_RDZV_TIMEOUT = 90
# The target is 5 s (docs/reliability.md reports the measured times); CI asserts a
# looser bound so that a loaded 2-core runner does not turn noise into failures.
DETECTION_BOUND = 10.0
# A run that has not ended by then is hung: it is killed and the case fails.
RUN_BOUND = 120.0
# The same for a rank hung after its body (the gang must end it after RDZV_TIMEOUT).
HANG_AFTER_BODY_BOUND = 45.0

WHERE = {0: "rank 0 (node 0, local rank 0)", 1: "rank 1 (node 0, local rank 1)",
         2: "rank 2 (node 1, local rank 0)"}
RANKS = (0, 1, 2)
WHENS = ("before_init", "in_rendezvous", "in_collective", "after_body")
HOWS = ("raise", "exit", "sigkill", "hang")
# Artifacts the step body sets; a failed attempt must not show them.
BODY_ARTIFACTS = {"started_attempt", "total", "rank_seen", "env_seen", "envs", "info", "attempt"}

TRAIN = "t = Flow('GangFlow').latest_run['train'].task\n"


def _pairwise():
    """16 cases covering every pair of dimensions: where = (when + how) mod 3."""
    return {(RANKS[(i + j) % 3], when, how)
            for i, when in enumerate(WHENS) for j, how in enumerate(HOWS)}


# plus a member hung after its body: the supervisor's finish timeout
CI_CASES = _pairwise() | {(1, "after_body", "hang"), (0, "after_body", "hang")}
FULL = os.environ.get("TD_FULL_FAULT_MATRIX") == "1"


def _cases():
    for rank in RANKS:
        for when in WHENS:
            for how in HOWS:
                if not FULL and (rank, when, how) not in CI_CASES:
                    continue
                yield pytest.param(rank, when, how,
                                   id="rank%d-%s-%s" % (rank, when, how))


def run_gang(flow_runner, env, *args, bound=RUN_BOUND):
    """Run gang_flow.py: (returncode, output). A run still going after `bound` seconds is
    stopped with everything it started, and the test fails (tests/support.py)."""
    res = flow_runner.cli("gang_flow.py", "run", *args, env=env, timeout=bound)
    return res.returncode, res.output


def failing_env(rank, when, how, gang=GANG, **extra):
    env = dict(gang, TD_FAIL_RANK=rank, TD_FAIL_WHEN=when, TD_FAIL_HOW=how,
               TD_RDZV_TIMEOUT=RDZV_TIMEOUT)
    if gang.get("METAFLOW_TORCH_DISTRIBUTED_START_METHOD") == "exec":
        # no deadline on the interpreters' start; the same one on a rank hung after its body
        env.update(TD_RDZV_TIMEOUT=EXEC_RDZV_TIMEOUT, TD_FINISH_TIMEOUT=RDZV_TIMEOUT)
    env.update(extra)
    if how == "hang":
        env["TD_PG_TIMEOUT"] = PG_TIMEOUT
    return env


def report(case, **fields):
    path = os.environ.get("TD_FAULT_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(dict(case, **fields)) + "\n")


@pytest.mark.parametrize("rank, when, how", list(_cases()))
def test_failing_rank_fails_the_gang(flow_runner, rank, when, how):
    check_failing_rank(flow_runner, rank, when, how, GANG)


# Under start_method="exec" rank 0 is a spin-step of the task, not forked by it. CI runs its
# failure in each phase, one way each (TD_FAULT_START_METHOD=exec runs the whole matrix so).
EXEC_CI_CASES = [(0, "before_init", "raise"), (0, "in_rendezvous", "sigkill"),
                 (0, "in_collective", "exit"), (0, "in_collective", "hang"),
                 (0, "after_body", "raise")]


@pytest.mark.parametrize("rank, when, how", EXEC_CI_CASES)
def test_failing_rank_0_fails_an_exec_gang(flow_runner, rank, when, how):
    check_failing_rank(flow_runner, rank, when, how,
                       dict(GANG, METAFLOW_TORCH_DISTRIBUTED_START_METHOD="exec"))


def check_failing_rank(flow_runner, rank, when, how, gang):
    bound = HANG_AFTER_BODY_BOUND if (when, how) == ("after_body", "hang") else RUN_BOUND
    code, output = run_gang(flow_runner, failing_env(rank, when, how, gang), bound=bound)
    ended = time.time()
    failed_at = flow_runner.failed_at()
    latency = None if failed_at is None else ended - failed_at
    report(dict(rank=rank, when=when, how=how), returncode=code, latency=latency)
    assert code != 0, output[-6000:]
    assert failed_at is not None, output[-6000:]
    limit = DETECTION_BOUND + (PG_TIMEOUT if how == "hang" and when != "after_body" else 0) \
        + (RDZV_TIMEOUT if how == "hang" and when == "after_body" else 0)
    assert latency < limit, (latency, output[-6000:])
    # the failing rank's last lines are in the log
    assert "[rank %d] last words of rank %d" % (rank, rank) in output, output[-6000:]
    if how == "raise":
        assert "ValueError: injected failure on rank %d" % rank in output, output[-6000:]
        assert "Traceback" in output
        # its traceback once, in its own lines, and no frame of the package's above its line
        assert output.count(USER_RAISE) == 1, output[-6000:]
        assert "[rank %d]     %s" % (rank, USER_RAISE) in output, output[-6000:]
        assert not [line for line in output.splitlines() if PACKAGE_FRAME in line
                    and "in gang_step" not in line], output[-6000:]
    if how == "exit" and rank != 0:
        assert "exited with code 3" in output, output[-6000:]
    if how == "sigkill":
        assert ("killed by SIGKILL" if rank else "SIGKILL") in output, output[-6000:]
    if how == "hang":
        # the hung rank is named as the cause, on one line with what happened to it
        named = [line for line in output.splitlines() if WHERE[rank] in line
                 and ("hung" in line or "did not finish" in line)]
        assert named, output[-6000:]
    else:
        assert WHERE[rank] in output, output[-6000:]
    # the failed task holds nothing its body set, on rank 0 or on any other rank
    got = flow_runner.client(TRAIN + (
        "result = dict(ok=t.successful, names=sorted(a.id for a in t))"))
    assert not got["ok"]
    assert not BODY_ARTIFACTS & set(got["names"]), got
    print("detection latency rank=%d when=%s how=%s: %.2fs" % (rank, when, how, latency))


@pytest.mark.parametrize("rank, how", [(0, "raise"), (2, "sigkill")])
def test_failed_attempt_shows_no_artifacts(flow_runner, rank, how):
    code, output = run_gang(flow_runner, failing_env(rank, "after_body", how))
    assert code != 0, output[-6000:]
    got = flow_runner.client(TRAIN + "result = dict(ok=t.successful, names=sorted(a.id for a in t))")
    assert not got["ok"]
    assert not BODY_ARTIFACTS & set(got["names"]), got


@pytest.mark.parametrize("rank, when, how", [
    (2, "in_collective", "raise"),
    (2, "in_collective", "exit"),
    (2, "in_collective", "sigkill"),
    (2, "in_collective", "hang"),
    (0, "in_collective", "sigkill"),
    (1, "before_init", "raise"),
])
def test_retry_after_each_kind_of_failure(flow_runner, rank, when, how):
    code, output = run_gang(
        flow_runner, failing_env(rank, when, how, TD_FAIL_ATTEMPT=0),
        "--with", "retry:times=1,minutes_between_retries=0")
    assert code == 0, output[-6000:]
    assert "rank %d failing now (%s, %s)" % (rank, when, how) in output
    got = flow_runner.client(TRAIN + (
        "result = dict(ok=t.successful, attempt=t['attempt'].data, total=t['total'].data,\n"
        "              started=t['started_attempt'].data, rank=t['rank_seen'].data)"))
    # the client shows the second attempt, whole: every rank took part in its all_reduce
    assert got == dict(ok=True, attempt=1, total=10.0, started=1, rank=0), got


# A rank's exception counts when it is raised, not when its process is gone: neither persistent
# DataLoader workers tearing down after the raise nor a child that ignores SIGTERM delay the
# gang's failure, and nothing of them is left. The loader case runs in CI, both with the full
# matrix.
RAISED_CASES = [("in_loader", "raise")] + ([("in_collective", "raise_with_child")] if FULL else [])
# Seconds from the raise to the task's word that its step failed (Metaflow prints it once the
# gang raised: every rank stopped); persistent DataLoader workers used to add 5 s. What follows
# (Metaflow saves the failed task, runs its decorators' task_finished, the runtime shuts down)
# is printed, not bounded: on two loaded cores (CI's two workers) it took 3 s more.
RAISED_BOUND = 4.0
_FAILED_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) \[[^\]]*/train/[^\]]*\] <flow \w+ step train> "
    r"failed:")


def step_failed_at(output):
    """When Metaflow's runtime got the train task's `<flow ... step train> failed:` (its stamp,
    this machine's clock)."""
    stamps = [m.group(1) for m in map(_FAILED_LINE.match, output.splitlines()) if m]
    assert stamps, output[-3000:]
    return datetime.datetime.strptime(stamps[-1], "%Y-%m-%d %H:%M:%S.%f").timestamp()


@pytest.mark.parametrize("when, how", RAISED_CASES)
def test_a_raise_fails_the_gang_before_its_process_is_gone(flow_runner, when, how):
    code, output = run_gang(flow_runner, failing_env(2, when, how))
    ended = time.time()
    failed_at = flow_runner.failed_at()
    assert failed_at is not None, output[-6000:]
    latency = step_failed_at(output) - failed_at
    report(dict(rank=2, when=when, how=how), returncode=code, latency=ended - failed_at,
           task_latency=latency)
    assert code != 0, output[-6000:]
    assert "ValueError: injected failure on rank 2" in output, output[-6000:]
    assert "Traceback" in output and WHERE[2] in output, output[-6000:]
    assert latency < RAISED_BOUND, (latency, output[-6000:])
    if how == "raise_with_child":
        pid = int((flow_runner.marks / "child-pid").read_text())
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == \
            psutil.STATUS_ZOMBIE, "the child that ignores SIGTERM is still running"
    print("raise-to-failure rank=2 when=%s how=%s: %.2fs (the run's end: %.2fs)"
          % (when, how, latency, ended - failed_at))


def test_a_rank_hung_after_its_body_is_failed_after_the_finish_timeout_not_the_rendezvous_one(
        flow_runner):
    # the join deadline stays long; only the finish timeout is short
    env = failing_env(2, "after_body", "hang", TD_RDZV_TIMEOUT=300, TD_FINISH_TIMEOUT=5)
    begun = time.time()
    code, output = run_gang(flow_runner, env, bound=HANG_AFTER_BODY_BOUND)
    assert code != 0, output[-6000:]
    assert time.time() - begun < HANG_AFTER_BODY_BOUND
    assert "did not finish its step body within 5.0s after rank 0 finished its own" in output, \
        output[-6000:]
    assert "rank 2 (node 1)" in output and "raise finish_timeout" in output, output[-6000:]


def test_missing_node_fails_after_rendezvous_timeout(flow_runner):
    # node 1's agent hangs while importing the flow: it never joins. Only an exec'd agent
    # imports the flow (under fork, node 0 forks its local agents, as it forks its ranks)
    res = flow_runner.run("gang_flow.py", env=dict(
        GANG, TD_HANG_NODE=1, TD_RDZV_TIMEOUT=4,
        METAFLOW_TORCH_DISTRIBUTED_START_METHOD="exec"))
    assert res.returncode != 0, res
    assert "rendezvous timeout of 4" in res.output, res
    assert "node 1 (ranks 2-3)" in res.output, res


def test_rank_0s_collective_after_its_peers_left_fails_the_step_naming_rank_0(flow_runner):
    """Ranks 1..3 leave the body; rank 0 then calls all_reduce, and gloo raises. The step
    fails with rank 0's error (before the fix the task was recorded as a success and Metaflow
    failed the run on a missing self.next)."""
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 1, "TD_NPROC": 4,
                                               "TD_RANK0_LATE_COLLECTIVE": 1})
    assert res.returncode != 0, res
    assert "rank 0 (node 0, local rank 0) raised RuntimeError" in res.output, res
    assert not [line for line in res.output.splitlines()
                if "/train/" in line and "Task finished successfully" in line], res
    assert "self.next() was called with" not in res.output, res
    flow_runner.assert_no_leftovers()


def test_a_rank_of_another_node_that_raises_as_its_node_stops_it_is_not_called_stopped(
        flow_runner):
    """Rank 1 raises; node 1 sees the abort and stops its ranks, and rank 2 raises an error of
    its own meanwhile (as ranks meeting the same framework check a moment apart do). The
    summary names rank 2 among those that failed on their own, never among those stopped
    (before the fix node 1 told node 0 nothing once aborted, and rank 2 was called stopped)."""
    env = failing_env(1, "before_init", "raise", TD_RAISES_AS_STOPPED=2)
    code, output = run_gang(flow_runner, env)
    assert code != 0, output[-6000:]
    summary = [line for line in output.splitlines()
               if "rank 1 (node 0, local rank 1) raised this error" in line]
    assert len(summary) == 1, output[-6000:]
    assert "Also failed on their own, after it: rank 2 (node 1, local rank 0) raised " \
           "ValueError: rank 2's own error, raised as its node stops it" in summary[0], \
        output[-6000:]
    assert "The other ranks still running (0, 3) were stopped." in summary[0], summary
    flow_runner.assert_no_leftovers()


# The package's own code: no frame of it may stand above the user's line in a rank's traceback.
PACKAGE_FRAME = 'metaflow_extensions/torch_distributed/plugins/torch_distributed/'
USER_RAISE = 'raise ValueError("injected failure on rank %d" % rank)'
# Lines of a whole failed `run` of 1 node x 4 processes whose rank 2 raised (86 before the
# traceback was printed once; about 60 after, half of them Metaflow's own report of the task).
QUIET_FAILURE_LINES = 70


def test_one_ranks_exception_is_reported_once_from_the_users_code_with_the_summary_last(
        flow_runner):
    env = dict(failing_env(2, "in_collective", "raise"), TD_NODES=1, TD_NPROC=4)
    code, output = run_gang(flow_runner, env)
    assert code != 0, output[-6000:]
    lines = output.splitlines()
    assert len(lines) <= QUIET_FAILURE_LINES, (len(lines), output)
    # the user's traceback, once, in rank 2's lines, from the user's code on
    assert output.count(USER_RAISE) == 1, output
    rank2 = [line for line in lines if "[rank 2] " in line]
    assert any("Traceback (most recent call last)" in line for line in rank2), output
    assert not [line for line in lines if PACKAGE_FRAME in line
                and "in gang_step" not in line], output
    # the peers that failed because of it say so in one line each
    for rank in (0, 1, 3):
        said = [line for line in lines if "[rank %d] " % rank in line and "Error" in line]
        assert len(said) <= 1, said
    # the summary is the last word of the task, under the exception itself
    summary = [i for i, line in enumerate(lines) if "@torch_distributed on step train: rank 2 "
               "(node 0, local rank 2) raised this error; its traceback is in its [rank 2] "
               "lines above." in line]
    assert len(summary) == 1, output
    assert "ValueError: injected failure on rank 2" in lines[summary[0] - 1], output
    assert "Task failed." in lines[summary[0] + 2], output

