"""`run --with torch_slurm` from a machine that is not the login node (issue 43, point 2): every
Slurm command goes to the controller host over ssh (METAFLOW_TORCH_SLURM_SSH, an sshd of
.ci/slurm's, key-only), the flow runs outside the cluster's hosts, and this machine's own
`sbatch`, `scontrol`, `squeue` and `scancel` are shims that leave a mark and fail, so a
command run here instead of over ssh shows."""

import stat
import subprocess
import sys
import time

import psutil
import pytest

from tests.support import run_bounded

from .conftest import SCRIPT, SlurmFlowRunner
from .test_slurm_flows import NODES, ctrl_c_while_training, job_ids

SHIMMED = ("sbatch", "scontrol", "squeue", "scancel", "sinfo")


@pytest.fixture(scope="module")
def ssh_config(slurm_cluster):
    made = subprocess.run([str(SCRIPT), "sshd", slurm_cluster.state], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip().splitlines()[-1]


class OffClusterRunner(SlurmFlowRunner):
    """Flows run on this machine, outside the cluster's hosts, their Slurm commands over ssh."""

    def __init__(self, root, cluster, ssh):
        super().__init__(root, cluster)
        self.shims = root / "shims"
        self.shims.mkdir()
        for name in SHIMMED:
            shim = self.shims / name
            shim.write_text("#!/bin/sh\ntouch %s/ran-$(basename \"$0\")\nexit 1\n" % root)
            shim.chmod(0o755)
        self.ssh = ssh

    def argv(self, name, *args):
        return [sys.executable, str(self.flow_path(name)), "--no-pylint", *args]

    def env(self, extra=None):
        env = super().env(extra)
        env.pop("SLURM_CONF", None)
        env["PATH"] = "%s:%s" % (self.shims, env["PATH"])
        env.setdefault("METAFLOW_TORCH_SLURM_SSH", self.ssh)
        return env

    def ran_here(self):
        return sorted(p.name for p in self.root.glob("ran-*"))


@pytest.fixture
def off_cluster(slurm_cluster, ssh_config, tmp_path):
    runner = OffClusterRunner(tmp_path, slurm_cluster, "-F %s ctl" % ssh_config)
    yield runner
    runner.assert_no_leftovers()
    assert _ssh_masters() == [], "ssh connections left open"
    assert slurm_cluster.wait_queue_empty(timeout=10) == [], "jobs left in the queue"


def _ssh_masters():
    found = []
    for p in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if p.info["name"] == "ssh" and "torch-slurm-ssh-" in cmdline:
            found.append(cmdline)
    return found


def test_a_gang_submitted_over_ssh_runs_on_two_nodes(off_cluster, slurm_cluster):
    result = off_cluster.run("slurm_gang_flow.py")
    assert result.returncode == 0, result
    assert off_cluster.ran_here() == [], result  # no Slurm command ran on this machine
    assert "over ssh -F %s ctl" % off_cluster.ssh.split()[1] in result.output, result
    data = off_cluster.client(
        "t = Flow('SlurmGangFlow').latest_run['train'].task\n"
        "result = dict(places=t.data.places, total=t.data.total)")
    hosts = [p["host"] for p in sorted(data["places"], key=lambda p: p["rank"])]
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3] and hosts[0] != hosts[2], hosts
    assert set(hosts) <= NODES and data["total"] == 10.0, data
    jobs = job_ids(result.output)
    assert len(jobs) == 3 and "NumNodes=2 " in slurm_cluster.job(jobs[1]), result
    # the job's environment came from a file only its user can read: Metaflow's settings and
    # the step's @environment, not this machine's PATH
    env_files = sorted(off_cluster.root.glob(".torch_slurm/**/env.sh"))
    assert len(env_files) == 3, env_files
    for env_file in env_files:
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        text = env_file.read_text()
        assert "export METAFLOW_DEFAULT_METADATA=local" in text and "export USERNAME=" in text
        assert "\nexport PATH=" not in "\n" + text
    train = next(f for f in env_files if "/train/" in str(f)).read_text()
    assert "export TD_MARK_DIR=%s" % off_cluster.marks in train, train  # the step's @environment


def test_ctrl_c_over_ssh_leaves_the_queue_empty(off_cluster, slurm_cluster):
    out = ctrl_c_while_training(off_cluster, slurm_cluster)
    assert off_cluster.ran_here() == [], out


def test_a_login_node_ssh_cannot_reach_fails_at_once_with_nothing_queued(off_cluster,
                                                                          slurm_cluster):
    started = time.monotonic()
    result = off_cluster.run("slurm_plain_flow.py", env={
        "METAFLOW_TORCH_SLURM_SSH": "-F %s -o ConnectTimeout=3 -o HostName=10.78.0.250 ctl"
        % off_cluster.ssh.split()[1]})
    assert result.returncode != 0, result
    assert "@torch_slurm on step *start*: the login node could not be reached over ssh" \
        in result.output, result
    assert "`ssh -F %s -o ConnectTimeout=3 -o HostName=10.78.0.250 ctl true` must work" % (
        off_cluster.ssh.split()[1]) in result.output, result
    assert time.monotonic() - started < 60, result
    assert job_ids(result.output) == [] and slurm_cluster.queue() == []


def test_the_preflight_asks_the_login_node_over_ssh(off_cluster, slurm_cluster):
    argv = off_cluster.argv("slurm_gang_flow.py", "--with", "torch_slurm", "torch-distributed",
                            "preflight")
    proc, _ = run_bounded(argv, off_cluster.root, off_cluster.env(), 120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "[ok] Slurm: slurm-wlm 22.05.8; Slurmctld(primary) at ctl is UP" in out, out
    assert "[ok] nodes: 4 nodes of partition debug have 2 CPUs and take jobs now" in out, out
    assert off_cluster.ran_here() == [], out
    # and without the login node, it says which command and how to fix it
    proc, _ = run_bounded(argv, off_cluster.root, off_cluster.env({
        "METAFLOW_TORCH_SLURM_SSH": "-F %s -o ConnectTimeout=3 -o HostName=10.78.0.250 ctl"
        % off_cluster.ssh.split()[1]}), 120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "[FAILED] Slurm: sbatch could not be run on the login node over `ssh -F" in out, out
