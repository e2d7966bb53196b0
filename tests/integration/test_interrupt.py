"""The run's own interruption (interrupt.py): Metaflow's runtime, told to stop by a SIGINT of
its own, leaves a mark the tasks' log pumps read when it kills them."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.other_user import as_other_user, shared_tmp

REPO = str(Path(__file__).parents[2])


def test_the_runtimes_sigint_leaves_a_mark_and_still_interrupts(tmp_path):
    """In Metaflow's runtime process: a SIGINT leaves the mark the tasks' log pumps read, then
    raises KeyboardInterrupt as before; forget_interrupt removes the mark."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import os, signal, sys
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import interrupt

        # Python's own handler, as in `python flow.py run` from a terminal (a job started in
        # the background by a non-interactive shell inherits SIGINT ignored)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert interrupt.mark_interrupts() == interrupt.mark_interrupts()  # installed once
        assert not interrupt.was_interrupted(os.getpid())
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            print("interrupted", interrupt.was_interrupted(os.getpid()))
        interrupt.forget_interrupt(os.getpid())
        print("forgotten", not interrupt.was_interrupted(os.getpid()))
    """ % str(Path(__file__).parents[2]))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout == "interrupted True\nforgotten True\n", done.stderr


# -- another user's files where the mark would be ----------------------------------------------
# Where the mark lay before, as a name in the shared folder (TMPDIR), and where it lies now: a
# file in this user's own folder, whose name the other user may take first. The planting below
# uses the paths, not the module's functions, so that it reads the same against any version.

def _old_mark(shared, pid):
    return os.path.join(shared, "torch-distributed-interrupted-%d" % pid)


# this user's, not the other user's (the planting runs as the other user)
VICTIM_UID = os.getuid()


def _user_dir(shared):
    return os.path.join(shared, "metaflow-torch-distributed-%d" % VICTIM_UID)


def _victim(shared, script):
    """A process with `shared` as its TMPDIR that runs `script` once it reads a line (so the
    other user can plant files named by its pid first): (Popen, its pid)."""
    preamble = textwrap.dedent("""
        import os, signal, sys
        sys.path.insert(0, %r)
        from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import interrupt
        sys.stdin.readline()
    """ % REPO)
    proc = subprocess.Popen([sys.executable, "-c", preamble + textwrap.dedent(script)],
                            env=dict(os.environ, TMPDIR=shared), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, proc.pid


def _go(proc):
    out, err = proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0, err
    return out, err


def _take_user_dir(shared, how, target):
    """(As the other user.) Take this user's folder's name first: a folder of the other
    user's, or a symlink to `target`."""
    if how == "a folder of theirs":
        os.mkdir(_user_dir(shared), 0o777)
        os.chmod(_user_dir(shared), 0o777)
    else:
        os.symlink(target, _user_dir(shared))


@pytest.mark.parametrize("how", ["a folder of theirs", "a symlink to a folder of the victim's"])
def test_a_symlink_planted_at_the_mark_is_not_followed(tmp_path, how):
    """Another user plants a symlink where the runtime's SIGINT leaves its mark, pointing at a
    file of the victim's: the SIGINT still interrupts the runtime, and the file is untouched.
    The other user may take the name of the victim's own folder first: the mark is then not
    left (the note then says less), and nothing is written through it."""
    precious = tmp_path / "precious"
    precious.write_text("the victim's")
    victims_folder = tmp_path / "folder"
    victims_folder.mkdir(mode=0o700)
    with shared_tmp() as shared:
        proc, pid = _victim(shared, """
            signal.signal(signal.SIGINT, signal.default_int_handler)
            interrupt.mark_interrupts()
            try:
                os.kill(os.getpid(), signal.SIGINT)
            except KeyboardInterrupt:
                print("interrupted")
            interrupt.forget_interrupt(os.getpid())
        """)

        def plant():
            os.symlink(str(precious), _old_mark(shared, pid))
            _take_user_dir(shared, how, str(victims_folder))
            if how == "a folder of theirs":
                os.symlink(str(precious), os.path.join(_user_dir(shared), "interrupted-%d" % pid))

        as_other_user(plant)
        out, _ = _go(proc)
        assert os.lstat(_user_dir(shared)).st_uid != VICTIM_UID  # the name stayed theirs
    assert out == "interrupted\n"
    assert precious.read_text() == "the victim's"
    assert list(victims_folder.iterdir()) == []


def test_a_file_of_another_users_at_the_mark_is_no_interruption_and_no_error(tmp_path):
    """Another user plants files (plain, or a folder) where the mark of the runtime (here: this test's
    process, the victim's parent, as Metaflow's runtime is its task's) would lie: the run's end
    (runtime_finished) does not fail on them, and a task that died without a word is not said
    to have been interrupted."""
    with shared_tmp() as shared:
        runtime = os.getpid()
        proc, pid = _victim(shared, """
            from types import SimpleNamespace
            from metaflow_extensions.torch_distributed.plugins.torch_distributed import decorator
            from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import runner

            print("interrupted", interrupt.was_interrupted(os.getppid()))
            spec = SimpleNamespace(node=0, attempt=SimpleNamespace(local=True),
                                   blueprint=SimpleNamespace(step_name="train"))
            print(runner._orphan_note("[node 0]", spec, 1234)())
            try:
                interrupt.forget_interrupt(os.getppid())
                # as in Metaflow's runtime, which forgets its own mark at the run's end
                decorator.TorchDistributedDecorator.runtime_finished(SimpleNamespace(active=True),
                                                                     None)
                print("finished")
            except Exception as e:
                print("failed:", repr(e))
        """)

        def plant():
            with open(_old_mark(shared, runtime), "w") as f:
                f.write("theirs")
            # a folder at the name the run's end removes: root may unlink another user's file
            # from a sticky folder, but a folder not even so (another user cannot unlink either)
            os.mkdir(_old_mark(shared, pid))
            os.mkdir(_user_dir(shared), 0o755)
            for mark_pid in (runtime, pid):
                with open(os.path.join(_user_dir(shared), "interrupted-%d" % mark_pid), "w"):
                    pass

        as_other_user(plant)
        out, _ = _go(proc)
        assert os.lstat(_user_dir(shared)).st_uid != VICTIM_UID  # the name stayed theirs
    interrupted, note, finished = out.splitlines()
    assert (interrupted, finished) == ("interrupted False", "finished")
    assert "died without a word" in note and "interrupted" not in note, note
