"""One real Slurm cluster (.ci/slurm: slurmctld and 4 slurmd, each node its own host) for the
whole session; flows run on its controller host, the login node, with the local datastore in
the test's folder (every host shares this machine's filesystem)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm.bundle import oci_bundle
from tests.support import FlowRunner, Result, _like_a_terminal, run_bounded

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "slurm"
# Slurm's own flows, then the flows the other layers run (the same flow on every backend).
FLOWS = (Path(__file__).parent / "flows", ROOT / "tests" / "e2e" / "flows",
         ROOT / "tests" / "emulation" / "flows")


# This machine's own address on the cluster's bridge (`.ci/slurm up N host-link`): a server
# the tests start there (an S3 of moto's) is reachable from every host of the cluster.
HOST_LINK_ADDRESS = "10.78.0.1"


class Cluster:
    def __init__(self, state: str, up_s: float) -> None:
        self.state = state
        self.up_s = up_s
        self.host_address = HOST_LINK_ADDRESS

    def on_controller(self, *argv: str) -> list[str]:
        """argv run on the controller host, SLURM_CONF set."""
        return [str(SCRIPT), "exec", self.state, *argv]

    def query(self, *argv: str) -> str:
        return subprocess.run(self.on_controller(*argv), check=True, capture_output=True,
                              text=True, timeout=30).stdout

    def queue(self) -> list[str]:
        """Every job still in the queue (pending, running or completing)."""
        return self.query("squeue", "-h", "-o", "%i %T %j").split("\n")[:-1]

    def job(self, job_id: str) -> str:
        return self.query("scontrol", "show", "job", "-o", job_id)

    def slurmd(self, host: str, action: str) -> None:
        subprocess.run([str(SCRIPT), "slurmd", self.state, host, action], check=True,
                       timeout=30)

    def link(self, host: str, action: str) -> None:
        """Cut (down) or mend (up) `host`'s link to the other hosts. A mended host is resumed
        at once (Slurm holds a node it stopped hearing DOWN until its next ping cycle, about
        a minute; `scontrol update ... State=RESUME` makes it idle within a second)."""
        subprocess.run([str(SCRIPT), "link", self.state, host, action], check=True, timeout=30)
        if action == "up":  # (refused, and nothing to do, when Slurm had not marked it down)
            subprocess.run(self.on_controller("scontrol", "update", "NodeName=%s" % host,
                                              "State=RESUME"), capture_output=True, timeout=30)

    def daemon_pid(self, host: str) -> int:
        """The pid of the daemon .ci/slurm started on `host` (ctl: slurmctld)."""
        pids = [line.split()[0] for line in Path(self.state, "pids").read_text().splitlines()
                if line.split()[1:] == [host]]
        return int(pids[-1])

    def idle_nodes(self) -> set[str]:
        return set(self.query("sinfo", "-h", "-N", "-t", "idle", "-o", "%N").split())

    def wait_queue_empty(self, timeout: float = 30.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while (left := self.queue()) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root: Slurm's daemons and the hosts' network namespaces"
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        return "slurm-wlm is not installed and apt-get is not there to install it"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Cluster]:
    reason = _why_not()
    if reason and os.environ.get("TD_SLURM_REQUIRED") == "1":  # CI: a skip would hide the layer
        pytest.fail("TD_SLURM_REQUIRED=1, but the Slurm layer cannot run here: " + reason)
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    up = subprocess.run([str(SCRIPT), "up", "4", "host-link"], capture_output=True, text=True,
                        timeout=600)
    assert up.returncode == 0, up.stderr
    cluster = Cluster(up.stdout.strip().splitlines()[-1], time.monotonic() - started)
    print("slurm cluster up in %.2f s: %s" % (cluster.up_s, cluster.state), file=sys.stderr)
    try:
        yield cluster
    finally:
        down = subprocess.run([str(SCRIPT), "down", cluster.state], capture_output=True,
                              text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not os.path.exists(cluster.state)


class SlurmFlowRunner(FlowRunner):
    """FlowRunner whose flows run on the cluster's controller host, `--with torch_slurm`."""

    def __init__(self, root: Path, cluster: Cluster) -> None:
        super().__init__(root)
        self.cluster = cluster

    def flow_path(self, name):
        target = self.root / name
        if not target.exists():
            shutil.copy(next(f / name for f in FLOWS if (f / name).exists()), target)
        return target

    def argv(self, name: str, *args: str) -> list[str]:
        return self.cluster.on_controller(sys.executable, str(self.flow_path(name)),
                                          "--no-pylint", *args)

    def run(self, name, *args, env=None, timeout=240):
        proc, elapsed = run_bounded(self.argv(name, "run", "--with", "torch_slurm", *args),
                                    self.root, self.env(env), timeout)
        return Result(proc, elapsed, proc.stdout, proc.stderr)

    def popen(self, name, *args, env=None):
        return subprocess.Popen(self.argv(name, "run", "--with", "torch_slurm", *args),
                                cwd=self.root, env=self.env(env), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True,
                                preexec_fn=_like_a_terminal)


@pytest.fixture
def slurm_runner(slurm_cluster, tmp_path) -> Iterator[SlurmFlowRunner]:
    runner = SlurmFlowRunner(tmp_path, slurm_cluster)
    yield runner
    runner.assert_no_leftovers()
    assert slurm_cluster.wait_queue_empty(timeout=10) == [], "jobs left in the queue"


@pytest.fixture(scope="session")
def slurm_bundle(tmp_path_factory) -> Iterator[Path]:
    """The test bundle, sharing every test's folder and the repository (the venv) with the
    cluster's nodes. It lies outside them, in /var/tmp, as a site's bundles lie outside what
    they mount: the task validates the flow again in the container, where the bundle is not."""
    base = tmp_path_factory.getbasetemp()
    folder = Path(tempfile.mkdtemp(prefix="td-oci-bundle-", dir="/var/tmp"))
    try:
        yield oci_bundle(folder / "bundle", [str(base), str(ROOT)], "ci-bundle")
    finally:
        shutil.rmtree(folder)
