"""One gang run, checked twice: `world_size` alone on a machine without GPUs is one node of
that many processes (the plan is printed when the gang starts), and a rank's tqdm bar shows
while the step runs, in `run`'s output and in `logs`."""

import re
from datetime import datetime

import pytest

from tests.support import FlowRunner

WORLD = 2
# 12 s: the first state shows at 5 s, 7 s before the bar ends, so a loaded machine's few
# seconds of delay in Metaflow's reading of the task's output cannot hide that it was live
BAR_SECONDS = 12
# "2026-11-30 18:15:33.393 [1796/train/2 (pid 11012)] [rank 1] ..." (run) or without the task
# part (logs --timestamps)
STAMPED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}) (?:\[\S+ \(pid \d+\)\] )?(.*)$")
TRAIN = "t = Flow('ProgressFlow').latest_run['train'].task\n"


@pytest.fixture(scope="module")
def gang(tmp_path_factory):
    runner = FlowRunner(tmp_path_factory.mktemp("progress"))
    res = runner.run("progress_flow.py", env={"TD_WORLD": WORLD, "TD_BAR_SECONDS": BAR_SECONDS})
    yield runner, res
    runner.assert_no_leftovers()


def test_world_size_alone_without_gpus_is_one_node(gang):
    runner, res = gang
    assert res.returncode == 0, res
    assert "train: 1 node x 2 processes = world size 2 (CPU, gloo)" in res.output, res
    got = runner.client(TRAIN + "result = dict(places=t['places'].data, total=t['total'].data)")
    places = got["places"]
    assert [(p["node_rank"], p["local_rank"]) for p in places] == [(0, 0), (0, 1)]
    assert {(p["num_nodes"], p["local_world_size"]) for p in places} == {(1, WORLD)}
    # rank 1 is a process of the task itself (forked by it, as rank 0), not of a node agent
    assert places[1]["parent"] == places[0]["parent"]  # both forked by the task
    assert got["total"] == WORLD


def stamped(text):
    """(time, text) of every timestamped line."""
    found = []
    for line in text.splitlines():
        match = STAMPED.match(line)
        if match:
            found.append((datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S.%f"),
                          match.group(2)))
    return found


def assert_bars_were_live(text):
    """Each rank's tqdm bar (80 redraws over 12 s) shows as a few lines of its state, the first
    seconds before the bar ended, and the rank's plain lines are there; never one giant line."""
    lines = stamped(text)
    assert max(len(line) for line in text.split("\n")) < 300
    for rank in range(WORLD):
        prefix = "[rank %d] " % rank
        mine = [(t, line[len(prefix):]) for t, line in lines if line.startswith(prefix)]
        plain = {line for _, line in mine}
        assert {"rank %d before the bar" % rank, "rank %d after the bar" % rank} <= plain, mine
        states = [(t, line) for t, line in mine if line.startswith("rank %d: " % rank)]
        final = [(t, line) for t, line in states if "| 80/80 " in line]
        assert len(final) == 1, states
        # throttled: a 12 s bar is its latest state every 5 s (at 5 s and 10 s), plus its last
        assert 2 <= len(states) <= 3, states
        first_time, first = states[0]
        assert "| 80/80 " not in first
        # live: its first state was captured seconds before its last, on the same stream. Never
        # compared with the plain lines' times: the bar is on stderr, they are on stdout, and
        # Metaflow's local runtime reads one line per poll event through a buffered readline
        # (runtime.py, Worker.read_logline), so of two lines that reach a pipe together the
        # second is stamped when the next output on that stream arrives: seen in CI as "before
        # the bar" stamped 12 s late, with the bar's final state, and the other way round.
        assert (final[0][0] - first_time).total_seconds() > 1.5, states


def test_a_ranks_progress_bar_shows_while_the_step_runs(gang):
    runner, res = gang
    assert res.returncode == 0, res
    assert_bars_were_live(res.output)


def test_logs_show_the_progress_bars_as_they_ran(gang):
    runner, res = gang
    assert res.returncode == 0, res
    task = runner.client(TRAIN + "result = t.pathspec")
    run_step_task = "/".join(task.split("/")[1:])
    err = runner.cli("progress_flow.py", "logs", run_step_task, "--stderr", "--timestamps")
    out = runner.cli("progress_flow.py", "logs", run_step_task, "--stdout", "--timestamps")
    assert err.returncode == 0 and out.returncode == 0, (err, out)
    assert "\r" not in err.stdout
    assert_bars_were_live(err.stdout + out.stdout)
