"""A folder of this user's own (privdir.py): used only when it is a real folder, this user's,
with no access for anyone else; its files are created afresh, never through a symlink, and a
name that is not this user's regular file counts as absent. Another user's plantings are in
tests/integration/test_interrupt.py and tests/unit/test_preempt.py."""

import os
import stat

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import privdir


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_the_user_dir_is_named_by_uid_in_the_tempdir(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    assert privdir.user_dir() == str(tmp_path / ("metaflow-torch-distributed-%d" % os.getuid()))


def test_a_missing_folder_is_created_0700_and_used(tmp_path):
    path = tmp_path / "mine"
    with privdir.private(str(path)) as folder:
        assert folder is None and not path.exists()  # not created unless asked
    old = os.umask(0)
    try:
        with privdir.private(str(path), create=True) as folder:
            assert folder is not None
            assert privdir.create(folder, "mark", b"12")
            assert privdir.is_ours(folder, "mark") and privdir.read(folder, "mark") == b"12"
            assert not privdir.create(folder, "mark")  # O_EXCL: taken
    finally:
        os.umask(old)
    assert _mode(path) == 0o700 and _mode(path / "mark") == 0o600
    with privdir.private(str(path)) as folder:
        privdir.remove(folder, "mark")
        privdir.remove(folder, "mark")  # gone already: no error
    assert list(path.iterdir()) == []


@pytest.mark.parametrize("how", ["open to others", "a symlink to a private folder", "a file"])
def test_a_folder_that_is_not_this_users_alone_is_refused(tmp_path, how):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    path = tmp_path / "taken"
    if how == "open to others":
        path.mkdir()
        path.chmod(0o777)
    elif how == "a symlink to a private folder":
        path.symlink_to(real)
    else:
        path.write_text("")
    with privdir.private(str(path), create=True) as folder:
        assert folder is None
    assert list(real.iterdir()) == []


def test_a_symlink_in_the_folder_is_neither_followed_nor_counted(tmp_path):
    target = tmp_path / "target"
    target.write_text("kept")
    path = tmp_path / "mine"
    with privdir.private(str(path), create=True) as folder:
        os.symlink(str(target), os.path.join(str(path), "mark"))
        os.mkdir(os.path.join(str(path), "dir"))
        os.mkfifo(os.path.join(str(path), "fifo"))
        assert not privdir.create(folder, "mark", b"x")
        assert not privdir.is_ours(folder, "mark") and privdir.read(folder, "mark") is None
        assert not privdir.is_ours(folder, "dir") and privdir.read(folder, "dir") is None
        assert privdir.read(folder, "fifo") is None  # not a regular file: not read, not waited on
        privdir.remove(folder, "mark")
        privdir.remove(folder, "dir")  # a folder is not unlinked, and no error
    assert target.read_text() == "kept" and not os.path.lexists(path / "mark")
