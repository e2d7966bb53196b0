"""Hang detection without a timeout from the user (stacks.py): a rank stuck outside any
collective while the others wait in all_reduce fails the gang within hang_timeout + a few
seconds, naming the straggler with its stack in the log and on the card; a rank that is slow but
still reaches its collectives is not a hang. No `timeout=` is given to init_process_group: torch
would wait 30 minutes."""

import os
import re
import signal
import time
from pathlib import Path

from tests.support import assert_collective_history, card_json, flight_recorder_for_gloo

DELETER = str(Path(__file__).parent.parent / "progress_deleter.py")

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
    # each rank's last collectives, from torch's Flight Recorder where torch keeps one for gloo
    history = assert_collective_history(out, "ranks 0, 1, 3 (nodes 0, 1)",
                                        "ranks 0, 1, 2, 3 (nodes 0, 1)")
    if flight_recorder_for_gloo():  # rank 2 ran no collective before it hung
        assert "all_reduce #1 on default_pg (Float[1]) NOT COMPLETED" in history, history[:2000]
        assert "rank 2 (node 1): none yet\n" in history, history[:2000]
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
    assert "Each rank's last collectives" in data
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
    # 18 s: a sample taken while rank 2 hangs must be there when its peers time out: a probe
    # samples every 5 s at the default hang_timeout, and node 1's agent passes it on to node 0
    # every 2.5 s. Whichever watch sees a peer's timeout first names rank 2: node 0's, or node
    # 1's agent, from its own ranks' probes (it gave no stack before: 1 run in 10 failed here)
    env = dict(GANG, TD_FAIL_RANK=2, TD_FAIL_WHEN="in_collective", TD_FAIL_HOW="hang",
               TD_PG_TIMEOUT=18)
    res = flow_runner.run("gang_flow.py", env=env, timeout=120)
    out = res.output
    assert res.returncode != 0, out[-6000:]
    assert "rank 2 (node 1, local rank 0) hung: it neither failed nor finished" in out, \
        out[-6000:]
    stack = out[out.index("Its stack as its probe last saw it (most recent call last):"):]
    assert re.search(r'File ".*gang_flow\.py", line \d+, in maybe_fail', stack), stack[:2000]
    assert "made no progress" not in out  # hang_timeout (600 s) did not come first


def _task_pid(root):
    """The pid of the gang step's task (Metaflow's `step train` process, node 0)."""
    from tests.support import live_processes, started_in

    steps = {p.pid: p for p in live_processes(started_in(root))
             if "step" in p.info["cmdline"] and "train" in p.info["cmdline"]}
    # node 0's forked ranks have the task's command line: the task is the one whose parent
    # is not among them
    tasks = [pid for pid, p in steps.items() if p.ppid() not in steps]
    return tasks[0] if len(tasks) == 1 else None


def test_every_ranks_stacks_on_demand_with_sigusr1_to_the_task(flow_runner):
    """A SIGUSR1 to the task while rank 2 is stuck outside any collective and the others wait
    in all_reduce: every rank of both nodes prints all its threads' stacks into the log (rank
    2's own loop among them), nothing is stopped, and the gang goes on to its hang verdict."""
    import os
    import signal

    from tests.emulation.probes import wait_for

    env = dict(GANG, TD_FAIL_RANK=2, TD_FAIL_WHEN="in_collective", TD_FAIL_HOW="hang",
               METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT=15)
    proc = flow_runner.popen("gang_flow.py", "run", env=env)
    try:
        wait_for(flow_runner.failed_at, 120, "rank 2 to stop in its loop")
        time.sleep(1.5)  # the others are in their all_reduce
        pid = wait_for(lambda: _task_pid(flow_runner.root), 10, "the task's pid")
        os.kill(pid, signal.SIGUSR1)
        asked = time.time()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = out + err
    assert proc.returncode != 0, output[-6000:]
    asked_line = output.index("every rank prints its threads' stacks (asked with SIGUSR1); "
                              "the gang goes on")
    assert "node 0 asked for every rank's stacks: this node's ranks print theirs" in output
    # once: the handler in rank 0's main thread, run when its all_reduce was interrupted,
    # does not ask again (the wakeup fd's reader already did)
    assert output.count("(asked with SIGUSR1)") == 1, output[-8000:]
    for rank in range(4):  # faulthandler's dump of every thread, in the rank's own lines
        assert re.search(r"\[rank %d\] (Current thread|Thread) 0x[0-9a-f]+ \(most recent call "
                         r"first\):" % rank, output), (rank, output[-8000:])
    assert re.search(r'\[rank 2\]   File ".*gang_flow\.py", line \d+ in maybe_fail', output)
    assert re.search(r'\[rank 0\]   File ".*distributed_c10d\.py", line \d+ in all_reduce',
                     output), output[-8000:]
    # nothing was stopped by the request: the gang still failed as hung, after it
    verdict = output.index("rank 2 (node 1, local rank 0) made no progress: for ")
    assert asked_line < verdict
    assert "killed by" not in output, output[-6000:]
    assert time.time() - asked > 5  # the verdict came seconds later, not at the request
    flow_runner.assert_no_leftovers()


def test_a_hang_while_node_1s_progress_is_deleted_in_a_loop_fails_as_tampering(flow_runner):
    """Issue 37: an outside process deletes node 1's progress in a loop while rank 2 (node 1)
    hangs outside any collective. Before, node 0 held node 1's last progress that got through
    and gave no verdict until the deletions stopped (90 s here); now the gang fails within
    hang_timeout of the deletions, naming the key and the tampering."""
    env = dict(GANG, TD_FAIL_RANK=2, TD_FAIL_WHEN="in_collective", TD_FAIL_HOW="hang",
               METAFLOW_TORCH_DISTRIBUTED_HANG_TIMEOUT=HANG_TIMEOUT, TD_INTRUDER=DELETER)
    try:
        res = flow_runner.run("gang_flow.py", env=env, timeout=75)
        ended = time.time()
    finally:
        pid = flow_runner.marks / "deleter-pid"
        if pid.exists():
            try:
                os.killpg(int(pid.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    out = res.output
    assert res.returncode != 0, out[-6000:]
    assert "node 1 keeps sending its progress, but it stopped reaching node 0" in out, \
        out[-6000:]
    assert "store is being tampered with" in out and "mftd/node/1/progress" in out
    since = float((flow_runner.marks / "deleting-since").read_text())
    print("deleting node 1's progress: the gang failed %.1fs after the deletions began"
          % (ended - since))
    assert ended - since < HANG_TIMEOUT + SLACK, out[-6000:]
    assert re.search(r"The gang ignored \d+ \(.*progress deleted \d+", out), out[-3000:]
