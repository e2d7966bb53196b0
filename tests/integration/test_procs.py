"""Members as real processes: forked and exec'd, their exit statuses, error files, output pump,
stopping, and dying with their parent."""

import errno
import gc
import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    read_error_file,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
    ExitWaiter,
    OutputPump,
    SignalSetup,
    fork_member,
    spawn_member,
    stop_members,
)

REPO = Path(__file__).parents[2]


def real_stdio():
    """In a forked member: print through fds 1 and 2, as in a Metaflow task (pytest replaced
    sys.stdout and sys.stderr with its capture files, which the fork inherits)."""
    sys.stdout = open(1, "w", closefd=False)
    sys.stderr = open(2, "w", closefd=False)


def read_to_eof(fd, timeout=10.0):
    chunks = []
    deadline = time.monotonic() + timeout
    while True:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("no end of file on fd %d within %ss" % (fd, timeout))
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks).decode()
        chunks.append(chunk)


def read_line(fd, timeout=10.0):
    data = b""
    deadline = time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            raise TimeoutError("no line on fd %d within %ss (got %r)" % (fd, timeout, data))
        byte = os.read(fd, 1)
        if not byte:
            raise EOFError(data)
        data += byte
    return data.decode().rstrip("\n")


def wait_exit(member, timeout=10.0):
    deadline = time.monotonic() + timeout
    while member.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("%s still running after %ss" % (member.label, timeout))
        time.sleep(0.01)
    return member.returncode


def gone(pid, timeout=5.0):
    """True once `pid` has exited (a zombie waiting for its reaper counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


def kill_quietly(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Members:
    """The members a test forked: stopped and their pipes closed at the end of the test."""

    def __init__(self):
        self.started = []
        self.owned_fds = []

    def fork(self, label, body, env=None, own_fds=True, **kw):
        member = fork_member(label, body, env or {}, **kw)
        self.started.append(member)
        if own_fds:
            self.owned_fds += [member.stdout_fd, member.stderr_fd]
        return member

    def close(self):
        stop_members(self.started, 0.1)
        for fd in self.owned_fds:
            os.close(fd)


@pytest.fixture
def members():
    started = Members()
    yield started
    started.close()


def run_forked(members, body, **kw):
    """Fork a member running `body`; (exit status, stdout, stderr) once it ends."""
    member = members.fork("[rank 1]", body, **kw)
    out = read_to_eof(member.stdout_fd)
    err = read_to_eof(member.stderr_fd)
    return wait_exit(member), out, err


# ExitWaiter: a watch's sleep, woken by a member's exit

def test_the_exit_waiter_wakes_as_a_member_exits_and_sleeps_out_one_that_ended(members):
    member = members.fork("[rank 1]", lambda: time.sleep(0.3))
    waiter = ExitWaiter()
    try:
        began = time.monotonic()
        waiter.wait([member], 30.0)
        assert time.monotonic() - began < 20, "slept through the member's exit"
        assert member.poll() == 0
        began = time.monotonic()  # ended and reaped: its pidfd would wake it at once, forever
        waiter.wait([member], 0.3)
        assert time.monotonic() - began >= 0.29
    finally:
        waiter.close()


def test_the_exit_waiter_sleeps_the_interval_where_the_kernel_has_no_pidfds(members,
                                                                              monkeypatch):
    def refuse(pid, flags=0):
        raise OSError(errno.ENOSYS, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", refuse)
    member = members.fork("[rank 1]", lambda: time.sleep(30))
    waiter = ExitWaiter()
    began = time.monotonic()
    waiter.wait([member], 0.3)
    assert 0.29 <= time.monotonic() - began < 20
    assert member.poll() is None
    waiter.close()


# fork_member: exit statuses, error files, environment

def test_body_that_returns_exits_0_and_its_output_is_on_its_own_pipes(members):
    def body():
        real_stdio()
        print("to stdout")
        print("to stderr", file=sys.stderr)
        sys.stdout.write("unflushed tail")  # flushed by the member on its way out

    code, out, err = run_forked(members, body)
    assert (code, out, err) == (0, "to stdout\nunflushed tail", "to stderr\n")


def test_body_that_raises_exits_1_with_an_error_file_in_torchs_format(members, tmp_path):
    error_file = str(tmp_path / "error-rank-1.json")

    def train_step():
        raise ValueError("boom 42")

    def body():
        real_stdio()
        train_step()

    code, out, err = run_forked(members, body, error_file=error_file)
    assert code == 1
    assert "Traceback (most recent call last)" in err and "ValueError: boom 42" in err
    with open(error_file) as f:
        data = json.load(f)
    assert data["message"]["message"] == "ValueError: boom 42"
    callstack = data["message"]["extraInfo"]["py_callstack"]
    assert "in train_step" in callstack and callstack.rstrip().endswith("ValueError: boom 42")
    assert data["message"]["extraInfo"]["timestamp"].isdigit()
    assert read_error_file(error_file) == ("ValueError: boom 42", callstack)


def test_an_error_file_the_user_wrote_first_is_kept(members, tmp_path):
    error_file = tmp_path / "error-rank-1.json"
    original = json.dumps({"message": {"message": "RuntimeError: from @record",
                                       "extraInfo": {"py_callstack": "original tb"}}})
    error_file.write_text(original)

    def body():
        real_stdio()
        raise RuntimeError("re-raised after @record")

    code, _, _ = run_forked(members, body, error_file=str(error_file))
    assert code == 1
    assert error_file.read_text() == original


class _SlowToPrint(ValueError):
    """An exception whose message takes a while to format: the window between a rank's raise
    and the record of its failure, made wide enough to send the gang's SIGTERM into it."""

    def __init__(self, mark):
        super().__init__("slow to print")
        self.mark = mark

    def __str__(self):
        if not Path(self.mark).exists():  # the first time only: the window is open once
            Path(self.mark).touch()
            time.sleep(0.5)
        return "slow to print"


def test_a_rank_stopped_while_it_records_its_exception_still_counts_as_failed_on_its_own(
        members, tmp_path):
    # The gang stops the others the moment the first rank fails; a rank that raised its own
    # error just before must not be reported as "stopped" because the SIGTERM came while it
    # was still writing its traceback and error file.
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
        from_exit,
    )

    error_file = str(tmp_path / "error-rank-1.json")
    mark = tmp_path / "raised"

    def body():
        real_stdio()
        raise _SlowToPrint(str(mark))

    member = members.fork("[rank 1]", body, error_file=error_file)
    deadline = time.monotonic() + 10
    while not mark.exists():
        assert time.monotonic() < deadline, "the member never raised"
        time.sleep(0.005)
    stopped_at = time.time()
    stop_members([member], grace=5.0)
    failure = from_exit(1, 0, 1, member.returncode, time.time(), error_file)
    assert failure.kind == "exception", failure
    assert failure.message == "_SlowToPrint: slow to print"
    assert failure.detected_at < stopped_at


@pytest.mark.parametrize("exit_arg,code,stderr", [(3, 3, ""), (0, 0, ""), (None, 0, ""),
                                                  ("bad config", 1, "bad config\n")])
def test_sys_exit(members, tmp_path, exit_arg, code, stderr):
    error_file = tmp_path / "error.json"

    def body():
        real_stdio()
        sys.exit(exit_arg)

    assert run_forked(members, body, error_file=str(error_file)) == (code, "", stderr)
    assert not error_file.exists()


def test_a_member_killed_by_a_signal_reports_minus_the_signal(members):
    def body():
        os.kill(os.getpid(), signal.SIGKILL)

    code, _, _ = run_forked(members, body)
    assert code == -signal.SIGKILL


def test_env_is_applied_in_the_child_only(members, monkeypatch):
    monkeypatch.setenv("TD_TEST_LEAKED", "from a launcher")
    monkeypatch.delenv("TD_TEST_PROBE", raising=False)

    def body():
        os.write(1, json.dumps({
            "probe": os.environ.get("TD_TEST_PROBE"),
            "leaked": os.environ.get("TD_TEST_LEAKED"),
            "own_group": os.getpgid(0) == os.getpid(),
        }).encode())

    code, out, _ = run_forked(members, body, env={"TD_TEST_PROBE": "probe-7"},
                              remove_env=["TD_TEST_LEAKED"])
    assert code == 0
    assert json.loads(out) == {"probe": "probe-7", "leaked": None, "own_group": True}
    assert "TD_TEST_PROBE" not in os.environ
    assert os.environ["TD_TEST_LEAKED"] == "from a launcher"


def test_close_fds_are_closed_in_the_child(members):
    r, w = os.pipe()
    member = members.fork("[rank 1]", lambda: time.sleep(10), close_fds=[w])
    os.close(w)
    try:
        # The read end sees end of file only if no process holds the write end any more.
        assert read_to_eof(r, timeout=3) == ""
        assert member.poll() is None
    finally:
        os.close(r)


def test_a_stop_that_reaches_a_member_recording_its_own_error_ends_it_with_no_second_error():
    """The stop's SIGTERM reaches the rank that failed first while it records its error: it is
    held back until the error is written, then ends the process, whatever handler the body had
    (rank 0's raises TorchDistributedAborted, which must not follow the rank's own traceback
    as a second error of another rank's). Seen under start_method="exec", where the member's
    process is Metaflow's spin-step, which prints an exception that escapes."""
    script = textwrap.dedent("""
        import os, signal, sys
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import procs

        def aborted(signum, frame):
            raise RuntimeError("rank 0 told to stop by the gang")

        signal.signal(signal.SIGTERM, aborted)
        report = procs.report_exception

        def report_as_the_stop_comes(*args):
            os.kill(os.getpid(), signal.SIGTERM)  # the gang's stop, as the error is recorded
            return report(*args)

        procs.report_exception = report_as_the_stop_comes

        def body():
            raise ValueError("the rank's own failure")

        print("returned", procs.run_member_body(body, None), flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, cwd=str(REPO))
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert done.stderr.count("ValueError: the rank's own failure") == 1, done.stderr
    assert "told to stop" not in done.stderr + done.stdout, done.stderr
    assert "returned" not in done.stdout


def test_a_member_starts_with_the_signal_setup_it_is_given_not_its_parents(members):
    """A supervisor's own handlers (and wakeup fd), installed after the setup was taken, stay
    out of the members it forks later: a restart in place forks while they are installed."""
    setup = SignalSetup.of_this_process()
    supervisors = lambda signum, frame: None  # noqa: E731
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous = signal.signal(signal.SIGTERM, supervisors)
    supervisors_fd = writer.fileno()
    theirs = signal.set_wakeup_fd(supervisors_fd)
    try:
        def body():
            handler = signal.getsignal(signal.SIGTERM)
            wakeup = signal.set_wakeup_fd(-1)
            os.write(1, json.dumps([handler is supervisors, handler == setup.handlers[
                signal.SIGTERM], wakeup]).encode())

        code, out, _ = run_forked(members, body, signals=setup)
        inherited_code, inherited, _ = run_forked(members, body)
    finally:
        signal.set_wakeup_fd(theirs)
        signal.signal(signal.SIGTERM, previous)
        reader.close()
        writer.close()
    assert (code, json.loads(out)) == (0, [False, True, setup.wakeup_fd]), out
    # without it, the fork takes the supervisor's (what rounds after the first used to get)
    assert (inherited_code, json.loads(inherited)) == (0, [True, False, supervisors_fd])


# OutputPump

def _pump_into_files(tmp_path, members_to_pump, label_of=lambda m: m.label):
    out_path, err_path = tmp_path / "out.log", tmp_path / "err.log"
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    out_fd, err_fd = os.open(out_path, flags), os.open(err_path, flags)
    pump = OutputPump()
    for m in members_to_pump:
        pump.add(m.stdout_fd, label_of(m), out_fd)
        pump.add(m.stderr_fd, label_of(m), err_fd)
    pump.start()
    return pump, out_path, err_path, (out_fd, err_fd)


def _finish_pump(pump, targets, started):
    for m in started:
        wait_exit(m)
    drained = pump.drain(5)
    for fd in targets:
        os.close(fd)
    return drained


def _lines_of(text, prefix):
    return [line for line in text.split("\n") if line.startswith(prefix)]


def test_pump_prefixes_lines_keeps_streams_apart_and_loses_no_last_line(members, tmp_path):
    def chatty():
        real_stdio()
        print("alpha")
        print("beta")
        print("warn one", file=sys.stderr)
        sys.stdout.write("tail without newline")

    def crasher():
        os.write(1, b"last words\n")
        os.write(1, b"unfinished")
        os.write(2, b"dying\n")
        os.kill(os.getpid(), signal.SIGKILL)

    one = members.fork("[rank 1]", chatty, own_fds=False)
    two = members.fork("[rank 2]", crasher, own_fds=False)
    pump, out_path, err_path, targets = _pump_into_files(tmp_path, [one, two])
    assert _finish_pump(pump, targets, [one, two]) is True
    assert two.returncode == -signal.SIGKILL
    out, err = out_path.read_text(), err_path.read_text()
    assert _lines_of(out, "[rank 1] ") == ["[rank 1] alpha", "[rank 1] beta",
                                           "[rank 1] tail without newline"]
    assert _lines_of(out, "[rank 2] ") == ["[rank 2] last words", "[rank 2] unfinished"]
    assert err == "[rank 1] warn one\n[rank 2] dying\n" or \
        err == "[rank 2] dying\n[rank 1] warn one\n"
    assert out.endswith("\n") and len(out.splitlines()) == 5


def test_pump_reassembles_lines_longer_than_one_read(members, tmp_path):
    long_line = b"x" * 200_000

    def body():
        os.write(1, long_line[:70_000])
        time.sleep(0.05)
        os.write(1, long_line[70_000:] + b"\nshort\n")

    member = members.fork("[rank 3]", body, own_fds=False)
    pump, out_path, _, targets = _pump_into_files(tmp_path, [member])
    assert _finish_pump(pump, targets, [member]) is True
    assert out_path.read_text() == "[rank 3] " + long_line.decode() + "\n[rank 3] short\n"


def test_pump_without_a_prefix_copies_lines_as_they_are(members, tmp_path):
    def agent():
        os.write(1, b"[rank 5] prefixed by the node agent\n")

    member = members.fork("[node 1 agent]", agent, own_fds=False)
    pump, out_path, _, targets = _pump_into_files(tmp_path, [member], label_of=lambda m: "")
    assert _finish_pump(pump, targets, [member]) is True
    assert out_path.read_text() == "[rank 5] prefixed by the node agent\n"


def test_pump_outlives_a_task_that_is_killed(tmp_path):
    """The task dies (SIGKILL): its members die with it, and their last lines still arrive."""
    log = tmp_path / "task.log"
    script = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
            OutputPump, fork_member)

        def body():
            os.write(1, b"member line\\n")
            time.sleep(60)

        member = fork_member("[rank 1]", body, {})
        target = os.open(%r, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        pump = OutputPump()
        pump.add(member.stdout_fd, member.label, target)
        pump.add(member.stderr_fd, member.label, target)
        pump.start()
        print(member.pid, pump.pid, flush=True)
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    """ % (str(REPO), str(log)))
    task = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    member_pid, pump_pid = map(int, task.stdout.readline().split())
    try:
        assert task.wait(10) == -signal.SIGKILL
        assert gone(member_pid), "the member outlived its task"
        assert gone(pump_pid), "the pump did not leave after its pipes closed"
        assert log.read_text() == "[rank 1] member line\n"
    finally:
        task.stdout.close()
        kill_quietly(member_pid)
        kill_quietly(pump_pid)


@pytest.mark.parametrize("killed", [True, False])
def test_pump_says_who_died_only_when_its_task_is_killed(killed):
    """Nothing in a SIGKILLed task can speak: its pump writes the note it was given, last (asked
    for then: the note may depend on why). A task that ends normally tells its pump so, and no
    note is written."""
    ending = ("time.sleep(0.3)\nos.kill(os.getpid(), signal.SIGKILL)" if killed
              else "os.close(w)\npump.drain(10)")
    script = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
            OutputPump)

        r, w = os.pipe()
        pump = OutputPump()
        pump.add(r, "[rank 0]", 1)
        pump.start(close_in_child=[w], orphan_note=lambda: "[rank 0] the task died")
        os.write(w, b"last words\\n")
    """ % str(REPO)) + ending
    task = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=20)
    assert task.returncode == (-signal.SIGKILL if killed else 0), task.stderr
    assert task.stdout == "[rank 0] last words\n"
    assert task.stderr == ("[rank 0] the task died\n" if killed else "")


def test_pump_outlives_a_sigterm_of_its_parents_group(tmp_path):
    """Node 0 stops a local node's agent with a SIGTERM to the agent's process group, which
    holds the agent's pump: the pump keeps copying what the agent and its ranks still say while
    they stop (before, it died at once and the agent's next line raised BrokenPipeError)."""
    log = tmp_path / "agent.log"
    script = textwrap.dedent("""
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
            OutputPump)

        r, w = os.pipe()
        target = os.open(%r, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        pump = OutputPump()
        pump.add(r, "[node 1 agent]", target)
        pump.start(close_in_child=[w])
        signal.signal(signal.SIGTERM, lambda *_: None)  # the agent stops its ranks first
        print(pump.pid, flush=True)
        sys.stdin.readline()  # the test sent SIGTERM to this process group
        time.sleep(0.3)
        os.write(w, b"stopping this node's ranks\\n")
        os.close(w)
        print("drained" if pump.drain(10) else "killed", flush=True)
    """ % (str(REPO), str(log)))
    agent = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    pump_pid = int(agent.stdout.readline())
    try:
        os.killpg(agent.pid, signal.SIGTERM)
        agent.stdin.write("\n")
        agent.stdin.flush()
        assert agent.stdout.readline().strip() == "drained"
        assert agent.wait(10) == 0
        assert log.read_text() == "[node 1 agent] stopping this node's ranks\n"
    finally:
        agent.stdin.close()
        agent.stdout.close()
        kill_quietly(agent.pid)
        kill_quietly(pump_pid)


# stop_members

def _ready_member(members, label, body):
    member = members.fork(label, body)
    assert read_line(member.stdout_fd) == "ready"
    return member


def test_stop_members_sigkills_a_member_that_ignores_sigterm_after_the_grace(members):
    def stubborn():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"ready\n")
        time.sleep(60)

    member = _ready_member(members, "[rank 1]", stubborn)
    started = time.monotonic()
    assert stop_members([member], grace=0.5) == ["[rank 1]"]
    elapsed = time.monotonic() - started
    assert member.returncode == -signal.SIGKILL
    assert 0.45 <= elapsed < 3, elapsed


def test_stop_members_gives_each_member_its_own_grace(members):
    """A local node's agent gets longer than a rank (it stops its own ranks first): a rank that
    ignores SIGTERM is killed after its grace without waiting for the agent's, and an agent
    that leaves within its longer grace is not killed."""
    def stubborn():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.write(1, b"ready\n")
        time.sleep(60)

    def slow_to_leave():
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(1.0), os._exit(7)))
        os.write(1, b"ready\n")
        time.sleep(60)

    rank = _ready_member(members, "[rank 1]", stubborn)
    agent = _ready_member(members, "[node 1 agent]", slow_to_leave)
    started = time.monotonic()
    assert sorted(stop_members([rank, agent], lambda m: 5.0 if m is agent else 0.3)) == sorted(
        ["[rank 1]", "[node 1 agent]"])
    assert time.monotonic() - started < 4  # did not sit out the agent's grace
    assert rank.returncode == -signal.SIGKILL
    assert agent.returncode == 7  # left on its own, within its grace


def test_stop_members_sigterms_first_and_skips_members_that_already_exited(members):
    def polite():
        os.write(1, b"ready\n")
        time.sleep(60)

    done = members.fork("[rank 1]", lambda: None)
    wait_exit(done)
    running = _ready_member(members, "[rank 2]", polite)
    started = time.monotonic()
    assert stop_members([done, running], grace=5) == ["[rank 2]"]
    assert time.monotonic() - started < 2.5  # did not sit out the grace period
    assert (done.returncode, running.returncode) == (0, -signal.SIGTERM)


def test_stop_members_kills_a_members_children_even_after_the_member_left(members):
    def parent_of_a_worker():
        # A data-loader-like child that ignores SIGTERM, in the member's process group.
        worker = subprocess.Popen(["sh", "-c", "trap '' TERM; echo up; exec sleep 60"],
                                  stdout=subprocess.PIPE)
        worker.stdout.readline()
        os.write(1, b"%d\n" % worker.pid)
        time.sleep(60)

    member = members.fork("[rank 1]", parent_of_a_worker)
    worker_pid = int(read_line(member.stdout_fd))
    try:
        assert psutil.Process(worker_pid).status() != psutil.STATUS_ZOMBIE
        assert os.getpgid(worker_pid) == member.pid
        assert stop_members([member], grace=2) == ["[rank 1]"]
        assert member.returncode == -signal.SIGTERM
        assert gone(worker_pid), "the member's child survived"
    finally:
        kill_quietly(worker_pid)


# spawn_member

def test_spawn_member_runs_argv_in_its_own_group_with_its_env():
    script = ("import os, sys\n"
              "print('out', os.environ['TD_TEST_X'], os.getpgid(0) == os.getpid())\n"
              "print('err', file=sys.stderr)\n"
              "sys.exit(4)\n")
    env = dict(os.environ, TD_TEST_X="seven")
    member = spawn_member("[rank 1]", [sys.executable, "-c", script], env)
    out = read_to_eof(member.stdout_fd)
    err = read_to_eof(member.stderr_fd)
    assert wait_exit(member) == 4
    assert (out, err) == ("out seven True\n", "err\n")
    assert "TD_TEST_X" not in os.environ


def test_spawn_member_can_be_stopped():
    member = spawn_member("[rank 2]", [sys.executable, "-c", "import time; time.sleep(60)"],
                          dict(os.environ))
    assert os.getpgid(member.pid) == member.pid
    assert stop_members([member], grace=5) == ["[rank 2]"]
    assert member.returncode == -signal.SIGTERM


def test_pumping_a_spawned_member_never_closes_someone_elses_fd(tmp_path):
    """The pump closes the pipes it takes over; nothing may close those fd numbers again (the
    Popen's own file objects used to, closing whatever file the task had opened since)."""
    member = spawn_member("[node 1 agent]", [sys.executable, "-c", "print('hi')"],
                          dict(os.environ))
    pump, out_path, _, targets = _pump_into_files(tmp_path, [member])
    assert _finish_pump(pump, targets, [member]) is True
    assert out_path.read_text() == "[node 1 agent] hi\n"
    number = member.stdout_fd
    # The task opens a file of its own, which gets the freed fd number.
    other = os.open(tmp_path / "artifact.bin", os.O_WRONLY | os.O_CREAT)
    if other != number:
        os.dup2(other, number)
        os.close(other)
    del member
    gc.collect()
    try:
        os.fstat(number)
    finally:
        try:
            os.close(number)
        except OSError:
            pass


# die_with_parent

@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_members_die_with_their_parent(start):
    script = textwrap.dedent("""
        import os, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
            fork_member, spawn_member)

        if sys.argv[1] == "fork":
            member = fork_member("[rank 1]", lambda: time.sleep(60), {})
        else:
            member = spawn_member("[rank 1]", [sys.executable, "-c",
                                               "import time; time.sleep(60)"], dict(os.environ))
        print(member.pid, flush=True)
        time.sleep(60)
    """ % str(REPO))
    parent = subprocess.Popen([sys.executable, "-c", script, start], stdout=subprocess.PIPE,
                              text=True)
    member_pid = int(parent.stdout.readline())
    try:
        assert psutil.Process(member_pid).ppid() == parent.pid
        parent.kill()
        assert parent.wait(10) == -signal.SIGKILL
        assert gone(member_pid), "the member outlived its parent"
    finally:
        parent.stdout.close()
        kill_quietly(member_pid)


def test_members_started_in_turn_on_kept_pipes_write_to_the_same_reader(members):
    """Restarts in place: each round's process of a rank writes to the pipes its node keeps
    for that rank, so the one pump reading them sees every round's lines, and end of file
    only once the node lets the write ends go."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    for round_ in range(2):
        def body(round_=round_):
            real_stdio()
            print("round %d" % round_)
        member = members.fork("[rank 1]", body, own_fds=False, pipes=(out_w, err_w),
                              close_fds=[out_r, err_r, out_w, err_w])
        assert wait_exit(member) == 0
        assert member.stdout_fd is None  # the caller's read end serves every round
    os.close(out_w)
    os.close(err_w)
    assert read_to_eof(out_r) == "round 0\nround 1\n"
    assert read_to_eof(err_r) == ""
    os.close(out_r)
    os.close(err_r)
