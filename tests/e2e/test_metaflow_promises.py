"""A ganged step is still a Metaflow step (issue 14): --with on flows written for plain
Metaflow (@parallel, unbounded foreach, steps without distributed work), @catch, @timeout,
reports of several failing ranks, and client writes from rank 0. Each scenario is one of
Metaflow's own core tests (test/core) in our words; one flow run serves several assertions."""

import os
import re
import sys
from collections import Counter

import pytest

WITH_GANG = "torch_distributed:nodes=1,nproc_per_node=2"
# Metaflow's local @parallel and the unbounded-foreach test decorator start tasks with the
# interpreter named "python": the one this suite runs with.
VENV_PATH = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}


@pytest.fixture(scope="module")
def with_everywhere(tmp_path_factory):
    from tests.support import FlowRunner

    runner = FlowRunner(tmp_path_factory.mktemp("with_everywhere"))
    res = runner.run("with_everywhere_flow.py", "--with", WITH_GANG, env=VENV_PATH)
    marks = Counter()
    for mark in runner.marks.glob("exec-*"):
        head, rank, _pid = mark.name.rsplit("-", 2)  # a mapper's task id has a "-" of its own
        _, step, task = head.split("-", 2)
        marks[(step, task, rank)] += 1
    yield runner, res, marks
    runner.assert_no_leftovers()


def test_with_leaves_parallel_steps_to_parallel(with_everywhere):
    runner, res, marks = with_everywhere
    assert res.returncode == 0, res
    # @parallel ran its own 2 tasks, each once and un-ganged (no RANK of ours)
    par = sorted(key for key in marks if key[0] == "par")
    assert [k[2] for k in par] == ["none", "none"] and all(marks[k] == 1 for k in par), marks
    got = runner.client("result = Flow('WithEverywhere').latest_run['par_join'].task['nodes'].data")
    assert got == [0, 1]


def test_unbounded_foreach_runs_each_mapper_once_as_a_gang(with_everywhere):
    runner, res, marks = with_everywhere
    assert res.returncode == 0, res
    got = runner.client(
        "run = Flow('WithEverywhere').latest_run\n"
        "control = [t.id for t in run['mapper'].control_tasks()]\n"
        "j = run['map_join'].task\n"
        "result = dict(control=control, totals=j['totals'].data, worlds=j['worlds'].data,\n"
        "    attempts={t.id: [m.value for m in t.metadata if m.name == 'attempt']\n"
        "              for t in run['mapper']})")
    mappers = sorted(set(got["attempts"]) - set(got["control"]))
    assert len(got["control"]) == 1 and len(mappers) == 2, got
    # every mapper task is a gang whose ranks 0 and 1 ran the body once each, and the control
    # task, which only launches the mappers, ran no body at all
    mapper_marks = {k: n for k, n in marks.items() if k[0] == "mapper"}
    assert mapper_marks == {("mapper", t, r): 1 for t in mappers for r in ("0", "1")}, marks
    assert all(got["attempts"][t] == ["0"] for t in mappers), got
    assert got["totals"] == [20.0, 40.0] and got["worlds"] == [2, 2], got


def test_with_warns_for_a_step_without_distributed_work(with_everywhere):
    runner, res, marks = with_everywhere
    assert res.returncode == 0, res
    assert marks[("tidy", _task_of(marks, "tidy"), "0")] == 1
    assert marks[("tidy", _task_of(marks, "tidy"), "1")] == 1
    assert ("@torch_distributed on step *tidy*: WARNING: rank 1 finished the step without "
            "joining the gang's process group") in res.output, res


def _task_of(marks, step):
    return next(k[1] for k in marks if k[0] == step)


@pytest.fixture(scope="module")
def promises(tmp_path_factory):
    from tests.support import FlowRunner

    runner = FlowRunner(tmp_path_factory.mktemp("promises"))
    res = runner.run("promises_flow.py")
    got = runner.client(
        "run = Flow('PromisesFlow').latest_run\n"
        "def var(step, name):\n"
        "    w = run[step].task[name].data\n"
        "    return dict(type=w.type, message=w.exception)\n"
        "slow, slow_exec = run['slow'].task, run['slow_exec'].task\n"
        "result = dict(\n"
        "    ok=run.successful, tags=sorted(run.user_tags),\n"
        "    timed_ok=run['timed'].task['timed_ok'].data,\n"
        "    timed_nodes_ok=run['timed_nodes'].task['timed_nodes_ok'].data,\n"
        "    timed_exec_ok=run['timed_exec'].task['timed_exec_ok'].data,\n"
        "    timeout_error=var('slow', 'timeout_error'),\n"
        "    slow_ran=slow['slow_interrupted'].data - slow['slow_started'].data,\n"
        "    slow_after_group=slow['slow_interrupted'].data - slow['slow_joined'].data,\n"
        "    exec_timeout_error=var('slow_exec', 'timeout_error'),\n"
        "    exec_slow_ran=slow_exec['slow_interrupted'].data - slow_exec['slow_started'].data,\n"
        "    failure=var('caught', 'failure'),\n"
        "    retry_with_catch=run['caught'].task['retry_with_catch'].data,\n"
        "    caught_attempts=len([m for m in run['caught'].task.metadata if m.name == 'attempt']),\n"
        "    both=var('both', 'both'),\n"
        "    seen_by_client=run['tagged'].task['seen_by_client'].data)")
    yield runner, res, got
    runner.assert_no_leftovers()


def test_timeout_counts_the_body_not_the_gang_start_up(promises):
    _, res, got = promises
    assert res.returncode == 0, res
    # @timeout(seconds=2) on a 0.3 s body: importing torch and starting the gang (longer than
    # 2 s on a loaded machine) is not charged to it, nor is the wait for a node agent and the
    # rank it execs, or node 0's exec'd rank, to import Metaflow and torch and check in (4 to 6
    # s more here): the clock starts once the gang is assembled. timed_nodes and timed_exec
    # time out on a clock that starts with rank 0's body.
    assert got["timed_ok"] is True
    assert got["timed_nodes_ok"] is True
    assert got["timed_exec_ok"] is True


def test_a_body_past_its_timeout_after_assembly_is_stopped_with_the_gang(promises):
    _, res, got = promises
    assert res.returncode == 0, res
    # a body that outlives its @timeout is stopped, with the gang (2 nodes), after its full 2
    # seconds, by rank 0's own TimeoutException (which @catch records), not by node 1's agent,
    # whose own clock started before rank 0's
    assert got["timeout_error"]["type"].endswith("TimeoutException"), got
    assert 1.9 <= got["slow_ran"] < 30, got
    assert got["slow_after_group"] < 2.5, got  # the group formed on the clock: once assembled
    # Metaflow's log line of the timeout, once, from rank 0 (an agent's lines have no prefix)
    said = [line for line in res.output.splitlines() if "/slow/" in line and re.search(
        r"\] (\[rank \d+\] )?[-\d]+ [:.\d]+ Step slow timed out after 0 hours, 0 minutes, "
        r"2 seconds", line)]
    assert len(said) == 1 and "[rank 0]" in said[0], said
    assert "node agent exited" not in res.output, res.output
    # with rank 0 exec'd (a spin-step of the task), the same: the alarm reaches its process,
    # and what its body set before it reaches the task for @catch
    assert got["exec_timeout_error"]["type"].endswith("TimeoutException"), got
    assert 1.9 <= got["exec_slow_ran"] < 30, got


def test_catch_keeps_the_caught_attempts_artifacts_and_the_users_exception(promises):
    _, res, got = promises
    assert res.returncode == 0, res
    # Metaflow's CatchRetryTest in our words: the last attempt's artifact set before the
    # failure is kept when @catch ends the task, and @catch holds the user's own exception,
    # raised by rank 1 (a member), not a gang error
    assert got["retry_with_catch"] == 1 and got["caught_attempts"] == 2, got
    assert got["failure"] == {"type": "__main__.DataError",
                              "message": "rank 1: bad shard on attempt 1"}, got


def test_two_failing_ranks_are_both_named(promises):
    _, res, got = promises
    assert res.returncode == 0, res
    # under the exception that @catch prints (its log keeps the step's *both* as written)
    assert ("@torch_distributed on step *both*: rank 1 (node 0, local rank 1) raised this "
            "error; its traceback is in its [rank 1] lines above. Also failed on their own, "
            "after it: rank 0 (node 0, local rank 0) raised ValueError: rank 0 broke.") \
        in res.output, res
    assert got["both"] == {"type": "builtins.ValueError", "message": "rank 1 broke"}, got


def test_client_writes_from_rank_0_only(promises):
    _, res, got = promises
    assert res.returncode == 0, res
    assert got["ok"] and got["seen_by_client"] is True
    assert "trained" in got["tags"], got
