"""Metaflow's own `--with batch` path, end to end, against moto and the Batch emulator."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

FLOW = Path(__file__).parent / "flows" / "batch_smoke_flow.py"
RUN_TIMEOUT_S = 120
KILL_GRACE_S = 10


def isolated_env(*layers: dict[str, str], home: Path) -> dict[str, str]:
    """The test's environment without any Metaflow or AWS settings, then `layers`."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("METAFLOW_", "AWS_"))
    }
    for layer in layers:
        env.update(layer)
    # An empty Metaflow home: no ~/.metaflowconfig profile can leak in.
    env["METAFLOW_HOME"] = str(home)
    env["METAFLOW_USER"] = "tester"
    return env


def metaflow(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """Runs the flow's CLI in its own session, so a hung run is stopped with all its workers."""
    argv = [sys.executable, FLOW.name, "--no-pylint", *args]
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        # SIGTERM first: Metaflow's atexit hook then terminates its Batch jobs.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        pytest.fail("%s timed out after %d s\n%s\n%s" % (argv, RUN_TIMEOUT_S, stdout, stderr))
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)


def test_flow_runs_on_emulated_batch_and_logs_are_readable(aws, batch, tmp_path):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOW, workdir)
    (tmp_path / "metaflow-home").mkdir()
    env = isolated_env(aws.env, batch.env, home=tmp_path / "metaflow-home")

    run = metaflow(["run", "--with", "batch", "--run-id-file", "run-id"], workdir, env)

    assert run.returncode == 0, run.stdout + run.stderr
    # Job names are "<user>-<flow>-<run id>-<step>-<task id>-<attempt>".
    assert [s["jobName"].split("-")[-3] for s in batch.submissions] == ["start", "end"]
    # The only traffic meant for outside 127.0.0.1 was @batch asking for instance metadata.
    assert all("//169.254.169.254/" in request for request in batch.sunk_requests)

    # Metaflow tails the job's logs from S3 while it runs: end read start's artifact.
    assert "start ran as AWS Batch job " in run.stdout + run.stderr

    run_id = (workdir / "run-id").read_text().strip()
    logs = metaflow(["logs", "%s/start" % run_id], workdir, env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "hello from AWS Batch job " in logs.stdout
