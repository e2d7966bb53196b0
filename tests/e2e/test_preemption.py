"""Preemption reaches every rank (preempt.py): a SIGTERM to the task (node 0) or to node 1's
agent becomes a SIGTERM to every rank of every node within a second; each rank saves (through
current.torch_distributed.preempted, or its own SIGTERM handler), the attempt fails as
preempted, and @retry's next attempt resumes from what they saved."""

import json
import os
import signal
import time

import pytest

from tests.emulation.probes import wait_for

RANKS = range(4)
# seconds from the SIGTERM to a rank's save: the 1 s, plus one training step and the
# agreement's all_reduce, on a loaded 2-core machine
REACH_BOUND = 3.0


def _running(marks, attempt):
    paths = [marks / ("running-%d-%d" % (r, attempt)) for r in RANKS]
    if all(p.exists() and p.read_text() for p in paths):
        return [json.loads(p.read_text()) for p in paths]
    return None


@pytest.mark.parametrize("target, node", [("task", 0), ("agent", 1)])
def test_a_sigterm_reaches_every_rank_which_saves_and_the_retry_resumes(flow_runner, target,
                                                                       node):
    proc = flow_runner.popen("preempt_flow.py", "run")
    try:
        running = wait_for(lambda: _running(flow_runner.marks, 0), 120, "every rank training")
        time.sleep(1.0)  # some steps of training
        pid = running[0]["pid"] if target == "task" else running[2]["ppid"]  # node 1's agent
        sent = time.time()
        os.kill(pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = out + err
    assert proc.returncode == 0, output[-6000:]  # the retry succeeded
    saved = [json.loads((flow_runner.marks / ("checkpoint-%d.json" % r)).read_text())
             for r in RANKS]
    for rank, state in enumerate(saved):
        assert state["at"] - sent < REACH_BOUND, (rank, state["at"] - sent, output[-4000:])
    assert len({s["step"] for s in saved}) == 1 and saved[0]["step"] > 0  # agreed, trained
    # rank 2's own SIGTERM handler ran (the ranks' agreement may have saved it first)
    own = flow_runner.marks / "own-handler-2"
    assert own.exists() and float(own.read_text()) - sent < REACH_BOUND, output[-4000:]
    # attempt 0 failed as preempted, naming the node that got the SIGTERM; never as an OOM
    assert "was preempted (SIGTERM to node %d)" % node in output, output[-6000:]
    assert "OOM" not in output and "died without a word" not in output
    got = flow_runner.client("t = Flow('PreemptFlow').latest_run['train'].task\n"
                             "result = dict(resumed=t['resumed_from'].data, "
                             "steps=t['steps'].data, attempt=t.current_attempt)")
    assert got == dict(resumed=saved[0]["step"], steps=saved[0]["step"] + 5, attempt=1), got
    flow_runner.assert_no_leftovers()


def test_a_preemption_after_rank_0_left_its_body_still_reaches_the_others(flow_runner):
    """Rank 0 finished its body while the other ranks still work: the task waits for them, and
    a SIGTERM to it then is a preemption too (every other rank saves), never the task's end."""
    proc = flow_runner.popen("preempt_flow.py", "run", env={"TD_RANK0_LEAVES_FIRST": 1})
    try:
        running = wait_for(lambda: _running(flow_runner.marks, 0), 120, "every rank started")
        wait_for(lambda: (flow_runner.marks / "rank0-left").exists(), 60, "rank 0 to leave")
        time.sleep(0.5)
        sent = time.time()
        os.kill(running[0]["pid"], signal.SIGTERM)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = out + err
    assert proc.returncode == 0, output[-6000:]  # preempted, then the retry succeeded
    for rank in (1, 2, 3):
        state = json.loads((flow_runner.marks / ("checkpoint-%d.json" % rank)).read_text())
        assert state["at"] - sent < REACH_BOUND, (rank, output[-4000:])
    assert "was preempted (SIGTERM to node 0)" in output, output[-6000:]
    flow_runner.assert_no_leftovers()
