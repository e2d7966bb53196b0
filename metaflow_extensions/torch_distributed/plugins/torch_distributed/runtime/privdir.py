"""Folders of this user's own, for the few files the package keeps outside a gang's work dir.

A shared folder (`/tmp`, a `$TMPDIR` of a shared host) lets every user create names in it: a
file under a predictable name there can be planted first, by someone else, as a symlink (an
`open(path, "w")` truncates its target, as whoever runs it, root included) or as a file of
theirs. So the package keeps its files only in a folder nobody else can write: one it created
itself (`tempfile.mkdtemp`, bash's `mktemp -d`), or this user's `user_dir()`, which a run's
processes find without being told. A folder is used only when it passes `private`: a directory,
not a symlink to one, owned by this uid, with no access for group or others. Its files are
created with O_CREAT|O_EXCL|O_NOFOLLOW and looked up relative to the folder's descriptor (a
folder swapped for another after the check is not followed), and a name that is not this
user's regular file counts as absent. A folder or file that fails the check is ignored: what
the file was for is skipped, never an error of the user's run.
"""

import contextlib
import os
import stat
import tempfile
from typing import Iterator, Optional

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def user_dir() -> str:
    """This user's folder for files that a run's processes share: `<tempdir>/
    metaflow-torch-distributed-<uid>`. Its name is predictable, so another user may have taken
    it first; `private` then refuses it."""
    return os.path.join(tempfile.gettempdir(), "metaflow-torch-distributed-%d" % os.getuid())


@contextlib.contextmanager
def private(path: str, create: bool = False) -> Iterator[Optional[int]]:
    """A descriptor of the folder `path` while the block runs, or None when it is missing or
    not this user's alone (see the module). With `create`, a missing folder is made first,
    mode 0700."""
    if create:
        with contextlib.suppress(OSError):  # there already, or cannot be: the check says which
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, _DIR)
    except OSError:  # missing, a symlink (ELOOP), not a folder, not ours to read
        yield None
        return
    try:
        st = os.fstat(fd)
        yield fd if st.st_uid == os.getuid() and not st.st_mode & 0o077 else None
    finally:
        os.close(fd)


def create(folder: int, name: str, data: bytes = b"") -> bool:
    """Create `name` in `folder` (a descriptor from `private`) holding `data`, mode 0600. False
    when the name is taken (by anything: an old file, a symlink) or cannot be created."""
    try:
        fd = os.open(name, _NEW, 0o600, dir_fd=folder)
    except OSError:
        return False
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return True


def is_ours(folder: int, name: str) -> bool:
    """Whether `name` in `folder` is a regular file of this user's (not a symlink)."""
    try:
        st = os.stat(name, dir_fd=folder, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid()


def read(folder: int, name: str, limit: int = 4096) -> Optional[bytes]:
    """Up to `limit` bytes of `name` in `folder`, or None when it is not a regular file of this
    user's."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                     dir_fd=folder)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as f:
        return f.read(limit)


def remove(folder: int, name: str) -> None:
    """Remove `name` from `folder`, if it is there (a symlink is removed, not followed)."""
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=folder)
