"""Another local user of the machine, for the attacks that only someone else can make: files
planted in a shared folder under a name the package would use. Acting as a second user needs
root, as CI runs the tests: `as_other_user(fn)` runs `fn()` in a forked child under an
unprivileged user's uid and gid (created with useradd the first time; `nobody` where that
cannot be), and anyone else skips with the reason."""

import os
import pwd
import shutil
import subprocess
import tempfile
import traceback
from contextlib import contextmanager

import pytest

NAME = "td-other-user"


def other_user():
    """(uid, gid) of an unprivileged user who is not this one; skips unless this is root."""
    if os.geteuid() != 0:
        pytest.skip("acting as a second local user needs root (CI runs the tests as root)")
    for attempt in range(2):
        try:
            entry = pwd.getpwnam(NAME)
            return entry.pw_uid, entry.pw_gid
        except KeyError:
            if attempt == 0 and shutil.which("useradd"):  # another worker may add it meanwhile
                subprocess.run(["useradd", "--system", "--no-create-home",
                                "--shell", "/usr/sbin/nologin", NAME], capture_output=True)
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def as_other_user(fn):
    """Run `fn()` as the other user (other_user), in a forked child; fails the test if it
    raised."""
    uid, gid = other_user()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            fn()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the other user's part failed (stderr)"


@contextmanager
def shared_tmp():
    """A folder every user may create names in, like /tmp (mode 1777), to be the victim's
    TMPDIR: the other user plants there without touching the machine's own /tmp."""
    path = tempfile.mkdtemp(prefix="td-shared-", dir="/tmp")
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
