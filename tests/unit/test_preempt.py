"""Preemption's parts (preempt.py, the watch's hold): a rank's SIGTERM handler, in a real
process, tells a preemption (the node's mark) from the gang's own stop; the watch, with an
injected clock, holds every failure for the grace and ends with the preemption as the cause."""

import os
import signal
import subprocess
import sys
import textwrap
import time

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure, root_cause
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    LeaderWatch, Phase, Slot)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.unit.fakes import Clock, FakeMember

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rank(work_dir, marked, own_handler=False):
    """A process that installs the rank handler (after its own, if asked), is sent SIGTERM,
    and says what happened: (returncode, output)."""
    script = textwrap.dedent('''
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
        if %r:
            signal.signal(signal.SIGTERM, lambda s, f: print("own handler", flush=True))
        installed = preempt.install_rank_handler(%r)
        print("installed" if installed else "left alone", flush=True)
        if %r:
            preempt.leave_mark(%r)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)
        print("preempted" if preempt.PREEMPTED.is_set() else "not preempted", flush=True)
    ''' % (REPO, own_handler, work_dir, marked, work_dir))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    return proc.returncode, proc.stdout


def test_a_marked_sigterm_keeps_the_rank_running_with_preempted_set(tmp_path):
    code, out = _rank(str(tmp_path), marked=True)
    assert code == 0 and out.split() == ["installed", "preempted"], out


def test_an_unmarked_sigterm_ends_the_rank_as_the_default_would(tmp_path):
    code, out = _rank(str(tmp_path), marked=False)
    assert code == -signal.SIGTERM and out.split() == ["installed"], (code, out)


def test_a_handler_of_the_users_is_left_in_place(tmp_path):
    code, out = _rank(str(tmp_path), marked=True, own_handler=True)
    assert code == 0 and "left alone" in out and "own handler" in out, out


def _scheduled_rank(work_dir, stop_marked):
    """As Slurm's nodes run them: a supervisor process (it notes the SIGTERMs it gets) and its
    child, a rank with the handler of a scheduler that signals every process; the rank gets
    one SIGTERM (after the gang's stop mark, if `stop_marked`). (the rank's returncode, the
    rank's word, the supervisor's)."""
    script = textwrap.dedent('''
        import os, signal, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
        heard = []
        signal.signal(signal.SIGTERM, lambda s, f: heard.append(s))
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            preempt.install_rank_handler(%r, scheduler_signals_all=True)
            if %r:
                preempt.leave_stop_mark(%r)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            os.write(write, b"preempted" if preempt.PREEMPTED.is_set() else b"not preempted")
            os._exit(0)
        os.close(write)
        _, status = os.waitpid(pid, 0)
        word = os.read(read, 100).decode() or "-"
        time.sleep(0.1)
        print(os.waitstatus_to_exitcode(status), word,
              "told" if heard else "not-told", flush=True)
    ''' % (REPO, work_dir, stop_marked, work_dir))
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    code, word, told = proc.stdout.split()
    return int(code), word, told


def test_a_schedulers_sigterm_to_a_rank_preempts_and_tells_its_supervisor(tmp_path):
    """Slurm signals a rank before its supervisor could leave the mark: the rank is preempted,
    not ended, and its supervisor hears it (a SIGTERM only the rank got preempts the gang)."""
    assert _scheduled_rank(str(tmp_path), stop_marked=False) == (0, "preempted", "told")


def test_the_gangs_own_stop_still_ends_a_rank_where_the_scheduler_signals_all(tmp_path):
    assert _scheduled_rank(str(tmp_path), stop_marked=True) == (-signal.SIGTERM, "-",
                                                                "not-told")


def test_a_new_round_clears_the_stop_mark(tmp_path):
    preempt.leave_stop_mark(str(tmp_path))
    assert os.path.exists(preempt.stop_mark_file(str(tmp_path)))
    preempt.clear_stop_mark(str(tmp_path))
    preempt.clear_stop_mark(str(tmp_path))  # twice: nothing to clear is fine
    assert not os.path.exists(preempt.stop_mark_file(str(tmp_path)))


def _watch():
    clock, members = Clock(), [FakeMember(), FakeMember()]
    watch = LeaderWatch([Slot(m, 0, r, r) for r, m in enumerate(members, 1)], None,
                        Topology(1, 3), clock=clock).begin()
    return watch, clock, members


def test_a_preempted_gang_holds_its_failures_for_the_grace_and_fails_as_preempted():
    watch, clock, members = _watch()
    watch.preempt(0, grace=20, at=100.0)
    members[0].code = 1  # a rank that raised while it saved
    watch.report(Failure(0, 0, "exception", 101.0, local_rank=0, message="ValueError: x"))
    for _ in range(10):
        assert not watch.poll_once()  # held: the others still save
        clock.now += 1
    clock.now = 20.0
    assert watch.poll_once()
    assert watch.phase is Phase.FAILED
    cause = watch.failures[0]
    assert cause.kind == "preempted" and cause.node == 0 and cause.detected_at == 100.0
    assert "was preempted (SIGTERM to node 0)" in cause.describe()
    assert "20s (preempt_grace)" in cause.describe()
    assert [f.kind for f in watch.failures[1:]] == ["exception", "exit"]  # kept, not the cause


def test_a_preempted_gang_whose_ranks_all_left_fails_at_once_never_finishes():
    watch, clock, members = _watch()
    watch.preempt(0, grace=20)
    for m in members:
        m.code = 0  # saved and left the body
    assert watch.poll_once()
    assert watch.phase is Phase.FAILED and watch.failures[0].kind == "preempted"


def _watch_that_preempts(grace=20):
    """A watch whose on_preempt is the leader's: the gang is preempted from the SIGTERM's time."""
    watch, clock, members = _watch()
    watch.on_preempt = lambda origin, at=None: watch.preempt(origin, grace, at)
    return watch, clock, members


def _settle(watch, clock):
    for _ in range(100):
        if watch.poll_once():
            return
        clock.now += 1
    raise AssertionError("the watch never ended")


def test_rank_0s_error_raised_by_its_own_sigterm_handler_before_the_watch_polled_is_no_cause():
    """The task got SIGTERM; before the watch's next poll acted on it, a framework's handler in
    rank 0 (Lightning's SIGTERMException) raised and rank 0 reported it: the gang is still
    preempted, with the SIGTERM as the cause (CI: the error was the cause, and Lightning's
    SystemExit ended the task as a success)."""
    watch, clock, members = _watch_that_preempts()
    watch.sigterm()
    raised = Failure(0, 0, "exception", time.time() + 0.01, local_rank=0,
                     message="SIGTERMException: ")
    watch.report(raised)
    assert not watch.failed()  # held for the grace, not the outcome
    for m in members:
        m.code = 0
    _settle(watch, clock)
    assert [f.kind for f in watch.failures] == ["preempted", "exception"]
    assert root_cause(watch.failures).kind == "preempted"


def test_a_ranks_exit_seen_in_the_poll_that_hears_the_sigterm_is_held_with_the_rest():
    watch, clock, members = _watch_that_preempts()
    watch.sigterm()
    members[0].code = 1  # ended while the task's SIGTERM waited for this poll
    _settle(watch, clock)
    assert watch.failures[0].kind == "preempted", watch.failures


def test_only_the_first_preemption_counts():
    watch, _, _ = _watch()
    watch.preempt(0, 5, at=1.0)
    watch.preempt(1, 5, at=2.0)
    assert watch.preempted == (0, 1.0)


def _supervisor(body):
    """Run `body` (code) in a real process inside preempt.SupervisorHandler, whose on_preempt
    appends the time to `calls`; returns what the process printed."""
    script = textwrap.dedent('''
        import os, signal, socket, sys, time
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
        calls = []
        handler = preempt.SupervisorHandler(lambda: calls.append(time.time()))
    ''' % REPO) + textwrap.dedent(body)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_sigterm_reaches_the_supervisor_while_a_handler_of_rank_0s_blocks():
    """Rank 0's body replaced the handler with one that waits before it chains ours (Lightning
    2.6 broadcasts first): the gang still hears of the SIGTERM at once, through the wakeup fd,
    and the wakeup fd is given back as found when the block ends."""
    out = _supervisor('''
        with handler:
            ours = signal.getsignal(signal.SIGTERM)

            def lightning_like(signum, frame):
                time.sleep(3)  # a collective that waits for the peers
                ours(signum, frame)

            signal.signal(signal.SIGTERM, lightning_like)
            sent = time.time()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.1)
            print("heard-after-%.1f" % (calls[0] - sent))
            print("preempted" if preempt.PREEMPTED.is_set() else "not-preempted")
        print("wakeup-fd", signal.set_wakeup_fd(-1))
    ''')
    heard = float(out[0].rsplit("-", 1)[1])
    assert heard < 1.0 and out[1:] == ["preempted", "wakeup-fd", "-1"], out


def test_a_wakeup_fd_of_someone_elses_is_left_alone():
    out = _supervisor('''
        theirs, _ = socket.socketpair()
        theirs.setblocking(False)
        signal.set_wakeup_fd(theirs.fileno())
        with handler:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            print("called", len(calls))
        print("same" if signal.set_wakeup_fd(-1) == theirs.fileno() else "replaced")
    ''')
    assert out == ["called", "1", "same"], out  # the handler alone told the gang


# -- a container's main process: preempt.FORWARDING ------------------------------------------

_SUPERVISOR = textwrap.dedent('''
    import os, signal, sys, time
    sys.path.insert(0, %r)
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import preempt
    def on_sigterm(signum, frame):
        print("supervisor got SIGTERM", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_sigterm)
    time.sleep(float(sys.argv[1]))  # before it announces itself
    print("told before" if preempt.announce() else "announced", flush=True)
    if sys.argv[2] == "withdraw":
        preempt.withdraw()
        print("withdrawn", flush=True)
    time.sleep(float(sys.argv[3]))
    print("finished", flush=True)
''' % REPO)


class _Announced:
    """The file a container's announced pid goes to, in the folder its FORWARDING made in
    `tmp_dir` (a name of mktemp's: found by looking)."""

    def __init__(self, tmp_dir):
        self.tmp_dir = tmp_dir

    def path(self):
        folders = list(self.tmp_dir.glob("metaflow-torch-distributed-forward.*"))
        return folders[0] / preempt.PID_FILE if folders else None

    def exists(self):
        return self.path() is not None and self.path().exists()

    def read_text(self):
        return self.path().read_text()


def _container(tmp_path, *args):
    """A container's main process (FORWARDING) running a supervisor, in a new session, as a
    node's command runs: (Popen, the file its announced pid goes to)."""
    env = dict(os.environ, TMPDIR=str(tmp_path))
    proc = subprocess.Popen(
        preempt.forwarding([sys.executable, "-c", _SUPERVISOR, *map(str, args)]),
        env=env, stdout=subprocess.PIPE, text=True, start_new_session=True)
    return proc, _Announced(tmp_path)


def _wait_until(predicate, timeout=30):
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_sigterm_to_the_containers_main_process_reaches_the_announced_supervisor(tmp_path):
    proc, announced = _container(tmp_path, 0, "stay", 30)
    _wait_until(lambda: announced.exists())
    assert announced.read_text() != str(proc.pid)  # the supervisor's own pid, not PID 1's
    os.kill(proc.pid, signal.SIGTERM)  # to the main process only, as docker and the kubelet
    out, _ = proc.communicate(timeout=30)
    assert out.splitlines() == ["announced", "supervisor got SIGTERM"]
    assert proc.returncode == 7  # the container exits with its command's status
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_a_sigterm_before_the_supervisor_announced_itself_is_told_when_it_does(tmp_path):
    proc, _ = _container(tmp_path, 1.5, "stay", 0)
    _wait_until(lambda: _children(proc.pid))  # the supervisor runs, and sleeps 1.5 s
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.splitlines() == ["told before", "finished"]
    assert proc.returncode == 0


def test_a_withdrawn_supervisor_gets_no_sigterm_and_the_command_runs_to_its_end(tmp_path):
    proc, announced = _container(tmp_path, 0, "withdraw", 1.0)
    assert [proc.stdout.readline() for _ in range(2)] == ["announced\n", "withdrawn\n"]
    assert not announced.exists()
    os.kill(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.splitlines() == ["finished"]
    assert proc.returncode == 0


def _children(pid):
    import psutil

    return psutil.Process(pid).children()


def test_the_containers_exit_status_is_its_commands(tmp_path):
    for command, status in ((["bash", "-c", "exit 3"], 3), (["true"], 0),
                            (["bash", "-c", "kill -KILL $$"], 128 + 9)):
        assert subprocess.run(preempt.forwarding(command), timeout=30).returncode == status


def test_a_supervisor_handler_announces_itself_while_it_is_installed(tmp_path, monkeypatch):
    folder = tmp_path / "forward"
    folder.mkdir(mode=0o700)
    path = folder / preempt.PID_FILE
    monkeypatch.setenv(preempt.FORWARD_ENV, str(folder))
    told = []
    with preempt.SupervisorHandler(lambda: told.append("preempted")):
        assert path.read_text() == str(os.getpid())
    assert not path.exists() and told == []
    (folder / preempt.TERM_FILE).touch()  # the container was told to stop before
    with preempt.SupervisorHandler(lambda: told.append("preempted")):
        _wait_until(lambda: told)
    assert told[:1] == ["preempted"] and preempt.PREEMPTED.is_set()
    preempt.PREEMPTED.clear()


def test_the_containers_files_lie_in_a_folder_of_its_own():
    """In a shared TMPDIR (mode 1777, like /tmp) the forwarder keeps its files in a folder it
    made, mode 0700, under a name nobody can guess; it removes the folder when it ends."""
    from tests.other_user import shared_tmp

    script = textwrap.dedent("""
        import os
        path = os.environ[%r]
        folder = path if os.path.isdir(path) else os.path.dirname(path)
        print(folder, oct(os.lstat(folder).st_mode & 0o7777), os.lstat(folder).st_uid)
    """ % preempt.FORWARD_ENV)
    with shared_tmp() as shared:
        out = subprocess.run(preempt.forwarding([sys.executable, "-c", script]),
                             env=dict(os.environ, TMPDIR=shared), capture_output=True,
                             text=True, timeout=30).stdout
        folder, mode, uid = out.split()
        assert os.path.dirname(folder) == shared, out
        assert (mode, int(uid)) == (oct(0o700), os.getuid())
        assert os.listdir(shared) == []


def test_another_users_file_in_a_shared_tmpdir_forges_no_preemption(tmp_path):
    """Another user plants, in the shared TMPDIR, the file that would tell the supervisor that
    its container was stopped before it announced itself: nothing is planted where the
    forwarder looks (a folder of its own, named by mktemp), so the supervisor only announces."""
    from tests.other_user import as_other_user, shared_tmp

    with shared_tmp() as shared:
        proc = subprocess.Popen(
            preempt.forwarding([sys.executable, "-c", _SUPERVISOR, "1.5", "stay", "0"]),
            env=dict(os.environ, TMPDIR=shared), stdout=subprocess.PIPE, text=True,
            start_new_session=True)
        _wait_until(lambda: _children(proc.pid))  # past the forwarder's own start

        def plant():  # the name the forwarder used, by its pid ($$)
            open(os.path.join(shared, "metaflow-torch-distributed-forward.%d.term" % proc.pid),
                 "w").close()

        as_other_user(plant)
        out, _ = proc.communicate(timeout=30)
    assert out.splitlines() == ["announced", "finished"]
    assert proc.returncode == 0
