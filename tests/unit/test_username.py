"""The user name given to Metaflow only where it would find none (config/username.py)."""

import os
import pwd

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.config.username import user_name

ROOT = 0
# a uid with a passwd entry other than root, and one without any
SOMEONE = next(p for p in pwd.getpwall() if p.pw_uid != 0)
NOBODY_UID = max(p.pw_uid for p in pwd.getpwall()) + 1


@pytest.mark.parametrize("configured,environ,uid,expected", [
    # Metaflow finds a name: this package gives none (Metaflow's own choice stands)
    ("alice", {}, ROOT, "alice"),
    ("alice", {"USER": "bob"}, ROOT, "alice"),
    (None, {"USER": "bob"}, ROOT, None),
    (None, {"USERNAME": "bob"}, ROOT, None),
    (None, {"SUDO_USER": "bob", "USER": "root"}, ROOT, None),
    (None, {"USER": "bob"}, SOMEONE.pw_uid, None),
    # Metaflow finds none (no variable, or only root): a name it accepts
    (None, {}, ROOT, "root@box"),
    (None, {"USER": "root"}, ROOT, "root@box"),
    (None, {"USER": "", "USERNAME": "root"}, ROOT, "root@box"),
    (None, {}, SOMEONE.pw_uid, SOMEONE.pw_name),
    (None, {"USER": "root"}, NOBODY_UID, "uid%d" % NOBODY_UID),
    ("", {}, ROOT, "root@box"),
], ids=["configured", "configured beats USER", "USER", "USERNAME", "SUDO_USER",
        "USER of a non-root uid", "root, nothing set", "USER=root", "empty USER, USERNAME=root",
        "a user without USER", "a uid without passwd entry", "empty METAFLOW_USER"])
def test_a_name_only_where_metaflow_finds_none(configured, environ, uid, expected):
    assert user_name(configured, environ, uid=uid, hostname="box") == expected


def test_the_name_is_one_metaflow_accepts_in_this_process():
    from metaflow.util import get_username

    name = user_name(None, {}, uid=os.getuid())
    assert name and name != "root"
    # this suite sets USERNAME (tests/support.py) or runs with a user: Metaflow's own choice
    assert get_username() not in (None, "root")
