"""Our Slurm backend with Outerbounds' metaflow-slurm 0.0.4 installed beside it (issue 43,
point 1): `--with torch_slurm` still runs a gang as one multi-node job, and metaflow-slurm's
`@slurm` (one srun of one task) is refused for a gang at validation, before anything reaches
the queue: never two submissions, never a gang squeezed onto one node."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import run_bounded

from .test_slurm_flows import NODES, job_ids

PEER = Path(__file__).with_name("requirements-peer.txt")
LOADED = "slurm(0.0.4)"  # Metaflow's banner names every extension it loaded


@pytest.fixture(scope="module")
def peer_path(tmp_path_factory):
    """A folder with metaflow-slurm and its dependencies, for PYTHONPATH."""
    target = tmp_path_factory.mktemp("metaflow-slurm")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
         "--target", str(target), "-r", str(PEER)],
        capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    assert (target / "metaflow_extensions" / "slurm_ext").is_dir(), sorted(target.iterdir())
    return str(target)


def _run_with(runner, peer_path, flow, *withs):
    argv = runner.argv(flow, "run", *[a for w in withs for a in ("--with", w)])
    proc, elapsed = run_bounded(argv, runner.root, runner.env({"PYTHONPATH": peer_path}), 240)
    return proc.returncode, proc.stdout + proc.stderr, elapsed


def test_a_gang_is_still_one_multi_node_job_with_metaflow_slurm_installed(
        slurm_runner, slurm_cluster, peer_path):
    code, out, _ = _run_with(slurm_runner, peer_path, "slurm_gang_flow.py", "torch_slurm")
    assert code == 0, out
    assert LOADED in out, out  # metaflow-slurm's extension was loaded in this run
    data = slurm_runner.client(
        "t = Flow('SlurmGangFlow').latest_run['train'].task\n"
        "result = dict(places=t.data.places, total=t.data.total)")
    hosts = [p["host"] for p in sorted(data["places"], key=lambda p: p["rank"])]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= NODES, hosts
    assert data["total"] == 10.0
    jobs = job_ids(out)
    assert len(jobs) == 3, out  # start, the gang, end: one job each, never two for the gang
    assert "NumNodes=2 " in slurm_cluster.job(jobs[1])


@pytest.mark.parametrize("withs", [("slurm",), ("torch_slurm", "slurm")],
                         ids=["metaflow-slurm alone", "both"])
def test_metaflow_slurms_decorator_on_a_gang_is_refused_before_anything_is_queued(
        slurm_runner, slurm_cluster, peer_path, withs):
    code, out, elapsed = _run_with(slurm_runner, peer_path, "slurm_gang_flow.py", *withs)
    assert code != 0, out
    assert LOADED in out, out
    if withs == ("slurm",):
        assert ("@torch_distributed on step train: a gang of 2 nodes (2 nodes x 2 processes "
                "per node = world size 4) cannot run under metaflow-slurm's @slurm") in out, out
    else:
        assert re.search(r"@torch_slurm on step \w+: the step also has @slurm, which sends it "
                         r"to metaflow-slurm's Slurm submission", out), out
    assert "Workflow starting" not in out, out  # refused at validation
    assert job_ids(out) == [] and slurm_cluster.queue() == []
    print("refused in %.1f s" % elapsed)
