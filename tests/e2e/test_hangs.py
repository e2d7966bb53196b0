"""Hang detection without a timeout from the user (stacks.py): a rank stuck outside any
collective while the others wait in all_reduce fails the gang within hang_timeout + a few
seconds, naming the straggler with its stack in the log and on the card; a rank that is slow but
still reaches its collectives is not a hang. No `timeout=` is given to init_process_group: torch
would wait 30 minutes."""

import re
import time

from tests.support import card_json

GANG = {"TD_NODES": 2, "TD_NPROC": 2}
HANG_TIMEOUT = 6
# seconds beyond hang_timeout within which the verdict must come on a loaded 2-core machine
# (the bound is hang_timeout + 5 s; the measured times are in docs/reliability.md)
SLACK = 8


def test_a_rank_stuck_outside_any_collective_is_named_with_its_stack(flow_runner):
    env = dict(GANG, TD_FAIL_RANK=2, TD_FAIL_WHEN="in_collective", TD_FAIL_HOW="hang",
               METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT=HANG_TIMEOUT)
    res = flow_runner.run("gang_flow.py", env=env, timeout=120)
    ended = time.time()
    out = res.output
    assert res.returncode != 0, out[-6000:]
    latency = ended - flow_runner.failed_at()
    print("hang detected %.1fs after rank 2 stopped (hang_timeout %ds)" % (latency, HANG_TIMEOUT))
    assert latency < HANG_TIMEOUT + SLACK, (latency, out[-6000:])
    assert "rank 2 (node 1, local rank 0) made no progress: for " in out, out[-6000:]
    assert "no collective completed on any rank while ranks 0, 1, 3 wait (hang_timeout=6s)" \
        in out, out[-6000:]
    # the straggler first, then the others grouped by where they stand
    straggler = out.index("rank 2 (node 1): at gang_flow.py:")
    waiting = out.index("ranks 0, 1, 3 (nodes 0, 1): all_reduce, called from gang_flow.py:")
    assert straggler < waiting
    # rank 2's own stack (node 1's probe, sent through node 0's store), from the step's code on
    stack = out[out.index("Rank 2's stack (most recent call last):"):]
    assert re.search(r'File ".*gang_flow\.py", line \d+, in train', stack), stack[:2000]
    assert re.search(r'File ".*gang_flow\.py", line \d+, in maybe_fail', stack), stack[:2000]
    assert "metaflow/task.py" not in stack.split("A rank that legitimately")[0]
    assert "hung: it neither failed nor finished" not in out  # not torch's timeout: ours
    # the card's root cause is the same report
    run_id = re.search(r"run-id (\d+)", out).group(1)
    task = re.search(r"%s/train/(\d+)" % run_id, out).group(1)
    pathspec = "%s/train/%s" % (run_id, task)
    listed = flow_runner.cli("gang_flow.py", "card", "list", pathspec)
    card_hash = re.findall(r"Card Hash: (\w+)", listed.output)[0]
    target = flow_runner.root / "card.html"
    got = flow_runner.cli("gang_flow.py", "card", "get", pathspec, "--hash", card_hash,
                          str(target))
    assert got.returncode == 0, got.output
    data = card_json(target.read_text())
    assert "**Root cause:** rank 2 (node 1, local rank 0) made no progress" in data, data[:3000]
    assert "in maybe_fail" in data
    flow_runner.assert_no_leftovers()


def test_a_rank_that_is_slow_but_reaches_its_collectives_is_not_a_hang(flow_runner):
    # rank 3 sleeps 2 s before each of 6 all_reduces (12 s, twice the hang_timeout of 3 s):
    # the others wait in each all_reduce up to 2 s, but collectives keep completing
    env = dict(GANG, TD_SLOW_RANK=3, TD_SLOW_S=2, TD_SLOW_STEPS=6,
               METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT=3)
    res = flow_runner.run("gang_flow.py", env=env, timeout=120)
    assert res.returncode == 0, res.output[-6000:]
    assert "made no progress" not in res.output


def test_a_rank_named_hung_by_its_peers_timeouts_comes_with_its_stack(flow_runner):
    """A process-group timeout shorter than hang_timeout (600 s here): the peers time out
    first and the rank they waited for is named hung, now with the stack its probe saw."""
    # 12 s: longer than a probe sample (5 s at the default hang_timeout) and a half, so that a
    # sample taken while rank 2 hangs has reached node 0 when its peers time out
    env = dict(GANG, TD_FAIL_RANK=2, TD_FAIL_WHEN="in_collective", TD_FAIL_HOW="hang",
               TD_PG_TIMEOUT=12)
    res = flow_runner.run("gang_flow.py", env=env, timeout=120)
    out = res.output
    assert res.returncode != 0, out[-6000:]
    assert "rank 2 (node 1, local rank 0) hung: it neither failed nor finished" in out, \
        out[-6000:]
    stack = out[out.index("Its stack as its probe last saw it (most recent call last):"):]
    assert re.search(r'File ".*gang_flow\.py", line \d+, in maybe_fail', stack), stack[:2000]
    assert "made no progress" not in out  # hang_timeout (600 s) did not come first
