"""Hang detection's parts (stacks.py): where a stack stands, a node's reading of its ranks'
probes (injected clock), the verdict (pure), and a real probe on a real gloo group."""

import json
import os
import threading
import time

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import stacks
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.support import REPO, flight_recorder_for_gloo
from tests.unit.fakes import Clock

SITE = "/venv/lib/python3.11/site-packages"
C10D = SITE + "/torch/distributed/distributed_c10d.py"
LOGGER = SITE + "/torch/distributed/c10d_logger.py"
AUTOGRAD = SITE + "/torch/autograd/__init__.py"
TENSOR = SITE + "/torch/_tensor.py"
FLOW = "/home/me/flow.py"


def frames(*outermost_first):
    return [list(f) for f in reversed(outermost_first)]


def test_a_stack_inside_a_collective_names_the_call_the_user_made():
    stack = frames((FLOW, 54, "train"), (LOGGER, 81, "wrapper"), (C10D, 2800, "all_reduce"))
    assert stacks.waiting_call(stack) == "all_reduce"
    assert stacks.user_frame(stack) == "flow.py:54 in train"
    # DDP's collectives run inside autograd's backward
    backward = frames((FLOW, 60, "train"), (TENSOR, 640, "backward"),
                      (AUTOGRAD, 350, "backward"), (SITE + "/torch/autograd/graph.py", 820,
                                                    "_engine_run_backward"))
    assert stacks.waiting_call(backward) == "backward"
    # a Python loop of the step's own: no call
    assert stacks.waiting_call(frames((FLOW, 57, "train"), (FLOW, 12, "spin"))) is None
    assert stacks.user_frame(frames((FLOW, 57, "train"), (FLOW, 12, "spin"))) == \
        "flow.py:12 in spin"


def test_the_stack_shown_starts_at_the_steps_code():
    import metaflow

    mf = os.path.join(os.path.dirname(metaflow.__file__), "task.py")
    stack = frames((FLOW, 300, "<module>"), (mf, 938, "run_step"), (FLOW, 54, "train"),
                   (C10D, 2800, "all_reduce"))
    shown = stacks.format_stack(stack)
    assert shown.splitlines() == ['  File "%s", line 54, in train' % FLOW,
                                  '  File "%s", line 2800, in all_reduce' % C10D]


def test_a_frame_with_no_line_number_is_shown_not_a_crash_of_the_watch():
    """Python 3.11+ gives a frame between two lines f_lineno None; a probe sampled one and the
    watch's thread, formatting it, raised "%d format: a real number is required, not NoneType"
    (CI: a Lightning gang failed as 'lost the gang's control plane')."""
    stack = frames((FLOW, None, "train"), (C10D, 2800, "all_reduce"))
    assert stacks.user_frame(stack) == "flow.py:? in train"
    assert stacks.format_stack(stack).splitlines()[0] == '  File "%s", line ?, in train' % FLOW
    sample = {"seq": 3, "at": time.time(), "stack": stack}
    assert stacks.report_of(sample, 1.0)["where"] == "flow.py:? in train"


def report(quiet, waiting=None, seq=10, where="flow.py:54 in train", done=False, age=0.1,
           history=None):
    return {"quiet_s": quiet, "seq": seq, "waiting": waiting, "where": where,
            "stack": '  File "%s", line 1, in x' % FLOW, "age_s": age, "done": done,
            "history": history}


TOPO = Topology(2, 2)


def test_ranks_waiting_in_a_collective_while_one_is_elsewhere_is_a_hang_naming_it():
    reports = {0: report(30, "all_reduce"), 1: report(31, "all_reduce"),
               2: report(30, None, where="flow.py:65 in maybe_fail"), 3: report(30, "all_reduce")}
    rank, text = stacks.verdict(reports, 4, 20, TOPO.locate)
    assert rank == 2
    assert "for 30s no collective completed on any rank while ranks 0, 1, 3 wait" in text
    assert text.index("rank 2 (node 1): at flow.py:65 in maybe_fail, not in a collective") < \
        text.index("ranks 0, 1, 3 (nodes 0, 1): all_reduce, called from flow.py:54 in train")
    assert "Rank 2's stack (most recent call last)" in text
    # one stack for each place, the straggler's first
    assert text.index("Rank 2's stack") < \
        text.index("Ranks 0, 1, 3's stack (rank 0's, most recent call last)")
    assert "raise hang_timeout, or set it to 0" in text


@pytest.mark.parametrize("reports", [
    # one rank's collectives still move: not a hang
    {0: report(30, "all_reduce"), 1: report(2, "all_reduce"), 2: report(30), 3: report(30)},
    # nobody waits in a collective (everyone computes): not a hang
    {r: report(100) for r in range(4)},
    # a rank has not reported yet
    {r: report(100, "all_reduce") for r in range(3)},
    # a rank finished its body: the finish timeout's business
    {0: report(100, "barrier"), 1: report(100, done=True), 2: report(100), 3: report(100)},
    # a rank's collective count is unknown (before init_process_group, or a backend without
    # sequence numbers): its stillness proves nothing
    {0: report(100, "all_reduce"), 1: report(100, seq=None), 2: report(100), 3: report(100)},
], ids=["one-moves", "none-waits", "one-unknown", "one-done", "one-count-unknown"])
def test_no_verdict_while_the_gang_moves_or_cannot_be_judged(reports):
    assert stacks.verdict(reports, 4, 20, TOPO.locate) is None


def test_when_every_rank_waits_the_one_behind_on_collectives_is_named():
    reports = {0: report(30, "all_reduce", seq=12), 1: report(30, "all_reduce", seq=12),
               2: report(30, "barrier", seq=11), 3: report(30, "all_reduce", seq=12)}
    assert stacks.verdict(reports, 4, 20, TOPO.locate)[0] == 2
    # same counts: the one in another call than the others
    reports[2]["seq"] = 12
    assert stacks.verdict(reports, 4, 20, TOPO.locate)[0] == 2
    # all in the same call at the same count: no odd one out (a peer vanished, a deadlock)
    reports[2]["waiting"] = "all_reduce"
    rank, text = stacks.verdict(reports, 4, 20, TOPO.locate)
    assert rank == 0 and "every rank in the same call" in text


def fr_entry(seq, name="gloo:all_reduce", group=("0", "default_pg"), retired=True,
             sizes=((4, 3),), dtypes=("Float",), state="scheduled", p2p=None):
    """One entry as torch's Flight Recorder dump gives it (the fields the report reads)."""
    return {"collective_seq_id": 0 if p2p else seq, "p2p_seq_id": p2p or 0,
            "is_p2p": bool(p2p), "profiling_name": name, "process_group": list(group),
            "retired": retired, "state": state, "input_sizes": [list(s) for s in sizes],
            "input_dtypes": list(dtypes)}


def test_a_flight_recorder_entry_reads_as_op_group_number_sizes_and_whether_it_completed():
    assert stacks.collective_of(fr_entry(4, retired=False)) == {
        "op": "all_reduce", "group": "default_pg", "seq": 4, "sizes": "Float[4, 3]",
        "done": False}
    # a subgroup torch gave no description: its name; NCCL's own states
    sub = stacks.collective_of(fr_entry(2, "nccl:broadcast", ("3", "undefined"),
                                        retired=False, state="completed"))
    assert (sub["op"], sub["group"], sub["done"]) == ("broadcast", "group 3", True)
    # many tensors: the first two and a count; a point-to-point op: its own number
    many = stacks.collective_of(fr_entry(7, sizes=[(1,)] * 5, dtypes=["Float"] * 5))
    assert many["sizes"] == "Float[1], Float[1] and 3 more"
    assert stacks.collective_of(fr_entry(0, "gloo:send", p2p=9))["seq"] == 9


def test_the_hang_report_gives_each_ranks_last_collectives_ranks_alike_on_one_line():
    done = stacks.collective_of(fr_entry(3))
    pending = stacks.collective_of(fr_entry(4, retired=False))
    reports = {0: report(30, "all_reduce", history=[done, pending]),
               1: report(30, "all_reduce", history=[done, pending]),
               2: report(30, None, where="flow.py:65 in maybe_fail", history=[done]),
               3: report(30, "all_reduce", history=[done, pending])}
    _, text = stacks.verdict(reports, 4, 20, TOPO.locate)
    history = text[text.index("Each rank's last collectives (torch's Flight Recorder"):]
    assert ("  ranks 0, 1, 3 (nodes 0, 1): all_reduce #3 on default_pg (Float[4, 3]) "
            "completed; all_reduce #4 on default_pg (Float[4, 3]) NOT COMPLETED\n") in history
    assert "  rank 2 (node 1): all_reduce #3 on default_pg (Float[4, 3]) completed\n" in history
    # a torch that keeps none says so; ranks whose history was not read are left out
    for rank in reports:
        reports[rank]["history"] = "torch 2.5.1 keeps no Flight Recorder for gloo"
    reports[3]["history"] = None
    _, text = stacks.verdict(reports, 4, 20, TOPO.locate)
    assert "  ranks 0, 1, 2 (nodes 0, 1): none: torch 2.5.1 keeps no Flight Recorder for gloo" \
        in text
    assert "rank 3 (node 1): none" not in text
    # no rank's history read: no such part
    for rank in reports:
        reports[rank]["history"] = None
    assert "last collectives" not in stacks.verdict(reports, 4, 20, TOPO.locate)[1]


def test_a_rank_whose_probe_stopped_writing_is_said_to_hold_pythons_lock():
    reports = {0: report(60, "all_reduce"), 1: report(60, None, age=45.0)}
    _, text = stacks.verdict(reports, 2, 20, Topology(1, 2).locate)
    assert "rank 1: no sample for 45s" in text


def write_probe(work_dir, rank, seq, done=False, stack=None):
    sample = {"rank": rank, "at": time.time(), "seq": seq, "done": done,
              "stack": stack or frames((FLOW, 54, "train"), (C10D, 1, "all_reduce"))}
    with open(stacks.probe_file(work_dir, rank), "wb") as f:
        f.write(stacks.frame_record(json.dumps(sample).encode()))


def test_a_sample_caught_half_written_is_skipped_not_misread(tmp_path):
    record = stacks.frame_record(b'{"seq": 12}')
    assert stacks.read_record(record) == b'{"seq": 12}'
    # a shorter sample written over a longer one: the header says where it ends
    assert stacks.read_record(record + b"tail of an older, longer sample") == b'{"seq": 12}'
    assert stacks.read_record(record[:-3]) is None  # torn
    assert stacks.read_record(record.replace(b"12", b"13")) is None  # not its CRC
    assert stacks.read_record(b"") is None
    path = tmp_path / "probe-rank-0.json"
    path.write_bytes(record[:-3])
    assert stacks.NodeProgress(str(tmp_path), [0]).read() == {}


def test_a_node_times_how_long_each_ranks_collective_count_stands_still(tmp_path):
    clock = Clock(100.0)
    progress = stacks.NodeProgress(str(tmp_path), [0, 1], clock)
    assert progress.read() == {}  # no probe wrote yet
    write_probe(tmp_path, 0, 5)
    write_probe(tmp_path, 1, None)  # before init_process_group
    assert {r: rep["quiet_s"] for r, rep in progress.read().items()} == {0: 0.0, 1: 0.0}
    clock.now += 7
    write_probe(tmp_path, 0, 6)  # rank 0 ran a collective
    reports = progress.read()
    assert reports[0]["quiet_s"] == 0.0 and reports[1]["quiet_s"] == 7.0
    assert reports[0]["waiting"] == "all_reduce" and reports[0]["where"] == "flow.py:54 in train"
    clock.now += 3
    assert progress.read()[0]["quiet_s"] == 3.0


def test_a_real_probe_counts_a_real_groups_collectives_and_sees_the_main_threads_stack(
        tmp_path, monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "16")  # what the gang sets (envcontract)
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        path = stacks.probe_file(str(tmp_path), 0)
        probe = stacks.Probe(path, 0.05, 0, history_after=6).start()
        before = _read(path)["seq"]
        for _ in range(3):
            dist.all_reduce(torch.ones(1))
        time.sleep(0.3)
        sample = _read(path)
        assert sample["seq"] == before + 3
        # the main thread's stack (this test's frame), never the probe's own thread
        assert any(name == "test_a_real_probe_counts_a_real_groups_collectives_and_sees_the_"
                   "main_threads_stack" for _, _, name in sample["stack"])
        assert threading.current_thread() is threading.main_thread()
        # still: no history until the count stood still for half the hang timeout's samples
        assert "history" not in sample
        time.sleep(0.05 * (6 + 4))
        history = _read(path)["history"]
        if flight_recorder_for_gloo():
            assert [c["op"] for c in history] == ["all_reduce"] * 3, history
            assert [c["seq"] for c in history] == [before + 1, before + 2, before + 3]
            assert all(c["done"] and c["group"] == "default_pg" for c in history), history
        else:
            assert "keeps no Flight Recorder for gloo" in history, history
        # a collective: the history goes until the count stands still again
        dist.all_reduce(torch.ones(1))
        time.sleep(0.2)
        assert "history" not in _read(path)
        probe.stop()
        assert _read(path)["done"] is True
    finally:
        dist.destroy_process_group()
    assert stacks.collective_count() is None  # no group any more


def _read(path):
    with open(path, "rb") as f:
        return json.loads(stacks.read_record(f.read()))


def _free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_probe_interval_follows_the_hang_timeout_within_bounds():
    assert stacks.interval_for(600) == stacks.MAX_INTERVAL
    assert stacks.interval_for(10) == 0.5
    assert stacks.interval_for(1) == stacks.MIN_INTERVAL
    # the Flight Recorder is read after half the hang timeout without a collective
    assert stacks.history_after(600) == 60 and stacks.history_after(6) == 6
    assert stacks.history_after(0.5) == 1


def test_stacks_on_demand_dump_once_per_request_and_at_most_once_a_second(monkeypatch):
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import stacks

    sent, said, asked = [], [], []
    monkeypatch.setattr(stacks, "dump", lambda pids: sent.append(list(pids)))
    now = [100.0]
    control = type("Control", (), {"request_stacks": lambda self, n: asked.append(n)})()
    node0 = stacks.OnDemand(said.append, lambda: [10, 11], clock=lambda: now[0])
    node0.ask(control, "train")
    node0.ask(control, "train")  # the same signal heard twice, or a second kill at once
    now[0] += 1.5
    node0.ask(control, "train")
    assert sent == [[10, 11], [10, 11]] and asked == [1, 2]
    assert "every rank prints its threads' stacks (asked with SIGUSR1)" in said[0]
    agent = stacks.OnDemand(said.append, lambda: [20], clock=lambda: now[0])
    agent.follow(0)  # never asked
    agent.follow(1)
    agent.follow(1)  # the same request, read again at the next beat
    now[0] += 1.5
    agent.follow(2)
    assert sent[2:] == [[20], [20]]


def test_a_rank_registers_its_dump_and_the_gang_ignores_the_signal_until_then():
    """In a real process: ignored under ignoring_dumps (a rank not yet in its body survives
    it); registered, it dumps every thread to stderr and the process goes on."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent('''
        import os, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import stacks
        with stacks.ignoring_dumps():
            stacks.dump([os.getpid()])
            time.sleep(0.1)
            print("survived", flush=True)
            assert stacks.register_dump()
            stacks.dump([os.getpid()])
            time.sleep(0.2)
            stacks.unregister_dump()
            stacks.dump([os.getpid()])
            time.sleep(0.1)
            print("still here", flush=True)
    ''' % str(REPO))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["survived", "still here"]
    assert proc.stderr.count("Current thread 0x") == 1, proc.stderr
