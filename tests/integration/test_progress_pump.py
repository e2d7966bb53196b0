"""A line a progress bar rewrites with \\r goes through the output pump as its latest state,
throttled, while it runs, and as its last state when it ends; plain lines are untouched."""

import os
import time

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    OutputPump,
    _Stream,
    fork_member,
)

INTERVAL = 5.0


def bar(i, total=100):
    return b"\rtrain: %3d%%|%s| %d/%d" % (i, b"#" * (i // 10), i, total)


def test_a_rewritten_line_is_shown_when_due_then_at_most_every_interval():
    stream = _Stream(b"[rank 1] ", 1)
    assert stream.feed(b"epoch 1\n", now=0.0) == b"[rank 1] epoch 1\n"
    written = []
    for i in range(0, 101):  # one update every 0.1 s for 10 s
        now = i * 0.1
        written.append((now, stream.feed(bar(i), now)))
        written.append((now, stream.snapshot(now, INTERVAL)))
    shown = [(now, data) for now, data in written if data]
    assert shown == [(5.0, b"[rank 1] train:  50%|#####| 50/100\n"),
                     (10.0, b"[rank 1] train: 100%|##########| 100/100\n")]
    # kept: the latest state only, however many updates came
    assert stream.pending == bar(100)
    # the bar ends with a newline: its last state was shown already, and is not repeated
    assert stream.feed(b"\n", now=10.2) == b""
    assert stream.feed(b"epoch 2\n", now=10.3) == b"[rank 1] epoch 2\n"
    assert stream.due(INTERVAL) is None


def test_a_short_bar_is_one_line_of_its_last_state():
    stream = _Stream(b"", 2)
    out = stream.feed(b"".join(bar(i) for i in range(0, 101, 5)) + b"\nafter\n", now=0.0)
    assert out == b"train: 100%|##########| 100/100\nafter\n"


def test_a_stalled_bar_is_shown_once_per_new_state():
    stream = _Stream(b"", 1)
    stream.feed(bar(10), now=0.0)
    assert stream.snapshot(5.0, INTERVAL) == b"train:  10%|#| 10/100\n"
    assert stream.snapshot(10.0, INTERVAL) == b""  # nothing new: nothing written
    stream.feed(bar(11), now=11.0)
    assert stream.snapshot(15.0, INTERVAL) == b"train:  11%|#| 11/100\n"


def test_a_bar_cut_off_by_the_end_of_the_pipe_shows_its_last_state():
    stream = _Stream(b"[rank 0] ", 2)
    stream.feed(bar(30) + bar(31), now=0.0)
    assert stream.finish() == b"[rank 0] train:  31%|###| 31/100\n"


def test_carriage_returns_at_a_line_end_and_cleared_lines():
    stream = _Stream(b"", 1)
    # \r\n endings, a bar that clears its line (tqdm's leave=False), a \r split across reads
    assert stream.feed(b"windows line\r\n", now=0.0) == b"windows line\n"
    assert stream.feed(bar(50) + b"\r" + b" " * 30 + b"\r\n", now=0.0) == b""
    assert stream.feed(b"old state\r", now=0.0) == b""
    assert stream.feed(b"new state\n", now=0.1) == b"new state\n"


def test_a_real_bar_through_the_pump_arrives_while_it_runs(tmp_path):
    """A forked member redraws a bar every 0.05 s for 3 s; the pump (interval 0.5 s) writes
    its state into a pipe that this test reads, noting when each line arrives."""
    def body():
        os.write(1, b"before the bar\n")
        for i in range(61):
            os.write(2, b"\rtrain: %d/60" % i)
            time.sleep(0.05)
        os.write(2, b"\n")
        os.write(1, b"after the bar\n")

    member = fork_member("[rank 1]", body, {})
    read_end, write_end = os.pipe()
    pump = OutputPump(progress_interval=0.5)
    pump.add(member.stdout_fd, "[rank 1]", write_end)
    pump.add(member.stderr_fd, "[rank 1]", write_end)
    pump.start(close_in_child=[read_end])
    os.close(write_end)
    arrived, buffer = [], b""
    while True:
        chunk = os.read(read_end, 65536)
        if not chunk:
            break
        now = time.monotonic()
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        arrived += [(now, line.decode()) for line in lines]
    os.close(read_end)
    assert pump.drain(5)
    os.waitpid(member.pid, 0)

    lines = [line for _, line in arrived]
    assert lines[0] == "[rank 1] before the bar" and lines[-1] == "[rank 1] after the bar"
    states = [(t, line) for t, line in arrived if "train:" in line]
    assert states[-1][1] == "[rank 1] train: 60/60"
    # throttled: a few states, not 61 of them, each a line of its own
    assert 3 <= len(states) <= 9, lines
    assert all(len(line) < 40 for line in lines), lines
    # live: intermediate states arrived well before the bar ended
    first_time, first = states[0]
    assert first != "[rank 1] train: 60/60"
    assert states[-1][0] - first_time > 1.5, arrived
