"""The straggler named while the gang trains (issue 41, point 1; core/stragglers.py): a 2 x 2
gang whose rank 3 sleeps before each step gets one line in the run's output naming rank 3
within 2 minutes, at the default settings (hang_timeout 600 s: a probe sample every 5 s;
a window of 120 s, named once half of it has passed); a control gang, the same steps with the
sleep taken by each rank in turn, names none. Both gangs run at once, each in its own folder."""

import re
import time
from datetime import datetime

import pytest

from tests.support import FlowRunner, card_json

GANG = {"TD_NODES": 2, "TD_NPROC": 2, "TD_SLOW_S": 0.5, "TD_SLOW_STEPS": 170}  # 85 s of steps
NAMED_WITHIN = 120.0
LINE = re.compile(r"^(\S+ \S+) .*@torch_distributed on step \*train\*: (rank (\d+) \(node (\d+)\) "
                  r"is the straggler: the other ranks wait (\d+)% of their time for it, over "
                  r"the last [^\n]*)$", re.M)


@pytest.fixture(scope="module")
def gangs(tmp_path_factory):
    """{"slow": (output, runner), "turns": (output, runner)}: both flows run at once."""
    runners = {name: FlowRunner(tmp_path_factory.mktemp(name)) for name in ("slow", "turns")}
    envs = {"slow": dict(GANG, TD_SLOW_RANK=3), "turns": dict(GANG, TD_SLOW_BY_TURNS=1)}
    procs = {name: runners[name].popen("gang_flow.py", "run", env=envs[name])
             for name in runners}
    out = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=400)
            out[name] = (proc.returncode, stdout + stderr, runners[name])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
    yield out
    for runner in runners.values():
        runner.assert_no_leftovers()


def test_the_rank_that_sleeps_before_each_step_is_named_within_two_minutes(gangs):
    code, output, runner = gangs["slow"]
    assert code == 0, output[-6000:]
    lines = LINE.findall(output)
    assert lines, output[-6000:]
    assert len(lines) == 1, lines  # repeated only when it changes: it did not
    stamp, text, rank, node, share = lines[0]
    assert (rank, node) == ("3", "1"), text
    assert int(share) >= 50, text  # the others spend most of their time in all_reduce
    assert "no rank is the straggler any more" not in output
    # from the gang's ranks starting their bodies to the line, by Metaflow's stamp on it
    started = min(p.stat().st_mtime for p in runner.marks.glob("body-*"))
    named_at = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S.%f").timestamp()
    took = named_at - started
    print("straggler named %.1f s after the ranks started: %s" % (took, text))
    assert 0 < took < NAMED_WITHIN, (took, text)
    # the card: each rank's waiting share and the straggler, per rank and per node
    data = _card(runner, output)
    assert "### Waiting in collectives" in data, data[:3000]
    assert "**Rank 3 (node 1) was the straggler**" in data
    assert '"straggler"' in data


def _card(runner, output):
    """The JSON data of the gang's card of the run whose `output` is given."""
    run_id = re.search(r"run-id (\d+)", output).group(1)
    task = re.search(r"%s/train/(\d+)" % run_id, output).group(1)
    pathspec = "%s/train/%s" % (run_id, task)
    listed = runner.cli("gang_flow.py", "card", "list", pathspec, "--id", "torch_distributed")
    card_hash = re.findall(r"Card Hash: (\w+)", listed.output)[0]
    target = runner.root / "card.html"
    got = runner.cli("gang_flow.py", "card", "get", pathspec, "--hash", card_hash, str(target))
    assert got.returncode == 0, got.output
    return card_json(target.read_text())


def test_a_gang_slow_by_turns_names_no_straggler(gangs):
    code, output, runner = gangs["turns"]
    assert code == 0, output[-6000:]
    assert "is the straggler" not in output, output[-6000:]
    assert "straggler any more" not in output
    data = _card(runner, output)
    assert "### Waiting in collectives" in data and "No rank was the straggler." in data
