""".ci/slurm itself: a run killed before its `down` (a machine's restart, a CI job cancelled)
leaves the cluster's namespaces and host link behind; the next `up` must remove them, and
must still refuse the host link of a cluster that runs.

Found by CI: a killed run's host link held 10.78.0.1, and every test of the next run on that
machine failed at setup with "10.78.0.1 is already an address of this machine"."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.slurm.conftest import SCRIPT, _why_not

# A /24 of the tests' own, away from the session cluster's 10.78.0 (which holds its host link).
SUBNET = "10.79.0"
ENV = {**os.environ, "SLURM_CI_SUBNET": SUBNET}
# interfaces with an address each, made after the cluster's host link
PADDING, PADDING_NET = 30, "10.79.200"

pytestmark = pytest.mark.skipif(_why_not() is not None and os.environ.get("TD_SLURM_REQUIRED")
                                != "1", reason=str(_why_not()))


def _script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *argv], capture_output=True, text=True, env=ENV,
                          timeout=180)


def _namespaces(state: str) -> list[str]:
    prefix = "sl" + "".join(c for c in Path(state).name if c.isalnum())[-8:] + "-"
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(prefix)]


def _clusters_namespaces() -> list[str]:
    """Every Slurm cluster's namespaces on this machine (not other tests')."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return sorted(line.split()[0] for line in listed.splitlines() if line.startswith("sl"))


def _host_addresses() -> str:
    return subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                          text=True).stdout


def _kill_like_a_restart(state: str) -> None:
    """SIGKILL to every daemon of the cluster and to whatever runs on its hosts, with no
    `down`: what a machine's restart or a cancelled CI job does to a cluster."""
    pids = {int(line.split()[0]) for line in Path(state, "pids").read_text().splitlines()}
    for ns in _namespaces(state):
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        pids.update(int(pid) for pid in out.split())
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:  # reaped by init; wait until each is gone
        for _ in range(100):
            if not Path("/proc/%d" % pid).exists():
                break
            subprocess.run(["sleep", "0.05"])


def test_an_up_after_a_killed_run_removes_what_it_left_and_takes_its_host_link() -> None:
    first = _script("up", "1", "host-link")
    assert first.returncode == 0, first.stderr
    killed = first.stdout.strip().splitlines()[-1]
    _kill_like_a_restart(killed)
    # what the killed run left: its hosts' namespaces and this machine's address on its bridge
    assert _namespaces(killed) and " %s.1/" % SUBNET in _host_addresses()

    second = _script("up", "1", "host-link")
    try:
        assert second.returncode == 0, second.stderr
        state = second.stdout.strip().splitlines()[-1]
        assert "removing a cluster a killed run left" in second.stderr, second.stderr
        assert _namespaces(killed) == [] and not os.path.exists(killed)
        idle = _script("exec", state, "sinfo", "-h", "-N", "-t", "idle", "-o", "%N")
        assert idle.stdout.split() == ["n1"], idle

        # a cluster that runs keeps its host link: a third up is refused, makes nothing and
        # leaves the running one as it was
        before = _clusters_namespaces()
        third = _script("up", "1", "host-link")
        assert third.returncode == 1
        assert ("%s.1 is already an address of this machine, on %s-h: a cluster that runs"
                % (SUBNET, _namespaces(state)[0].rsplit("-", 1)[0])) in third.stderr, third.stderr
        assert "removing" not in third.stderr
        assert _clusters_namespaces() == before
        # and its host link survives every sweep (the sweep told a dead cluster's link with a
        # `| grep -q`, which under pipefail fails on a match now and then: grep leaves at the
        # match and `ip`, still writing the interfaces after it, dies of SIGPIPE; interfaces
        # added after the link, as a test's bridges are, make that likely)
        for i in range(PADDING):
            subprocess.run(["ip", "link", "add", "tdpad%d" % i, "type", "bridge"], check=True)
            subprocess.run(["ip", "addr", "add", "%s.%d/32" % (PADDING_NET, i + 1), "dev",
                            "tdpad%d" % i], check=True)
        for _ in range(10):
            assert _script("up", "1", "host-link").returncode == 1
            assert " %s.1/" % SUBNET in _host_addresses()
        # sshd checks for the host link each time (it failed the same way: CI's ssh tests)
        for _ in range(10):
            sshd = _script("sshd", state)
            assert sshd.returncode == 0, sshd.stderr
        again = _script("exec", state, "sinfo", "-h", "-N", "-t", "idle", "-o", "%N")
        assert again.stdout.split() == ["n1"], again
    finally:
        for i in range(PADDING):
            subprocess.run(["ip", "link", "delete", "tdpad%d" % i], capture_output=True)
        for state in [line for line in (second.stdout.strip().splitlines()[-1:]) if line]:
            assert _script("down", state).returncode == 0
    assert " %s.1/" % SUBNET not in _host_addresses()
