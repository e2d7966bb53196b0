"""Metaflow's own `--with batch` path, end to end, against moto and the Batch emulator."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

FLOW = Path(__file__).parent / "flows" / "batch_smoke_flow.py"
RUN_TIMEOUT_S = 180


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
    return subprocess.run(
        [sys.executable, FLOW.name, "--no-pylint", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def test_flow_runs_on_emulated_batch_and_logs_are_readable(aws, batch, tmp_path):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOW, workdir)
    (tmp_path / "metaflow-home").mkdir()
    env = isolated_env(aws.env, batch.env, home=tmp_path / "metaflow-home")

    run = metaflow(["run", "--with", "batch", "--run-id-file", "run-id"], workdir, env)

    assert run.returncode == 0, run.stdout + run.stderr
    run_id = (workdir / "run-id").read_text().strip()
    steps = [s["jobName"].split("-")[-3] for s in batch.submissions]
    assert steps == ["start", "end"]
    logs = metaflow(["logs", "%s/start" % run_id], workdir, env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "hello from AWS Batch job " in logs.stdout
    end_logs = metaflow(["logs", "%s/end" % run_id], workdir, env)
    assert "start ran as AWS Batch job " in end_logs.stdout
