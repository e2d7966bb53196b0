"""Metaflow's own `--with batch` path, end to end, against moto and the Batch emulator."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.support import isolated_env, metaflow

FLOW = Path(__file__).parent / "flows" / "batch_smoke_flow.py"


def test_flow_runs_on_emulated_batch_and_logs_are_readable(aws, batch, tmp_path):
    workdir = tmp_path / "flow"
    workdir.mkdir()
    shutil.copy(FLOW, workdir)
    (tmp_path / "metaflow-home").mkdir()
    env = isolated_env(aws.env, batch.env, home=tmp_path / "metaflow-home")

    run = metaflow(FLOW.name, ["run", "--with", "batch", "--run-id-file", "run-id"], workdir, env)

    assert run.returncode == 0, run.stdout + run.stderr
    # Job names are "<user>-<flow>-<run id>-<step>-<task id>-<attempt>".
    assert [s["jobName"].split("-")[-3] for s in batch.submissions] == ["start", "end"]
    # The only traffic meant for outside 127.0.0.1 was @batch asking for instance metadata.
    assert all("//169.254.169.254/" in request for request in batch.sunk_requests)

    # Metaflow tails the job's logs from S3 while it runs: end read start's artifact.
    assert "start ran as AWS Batch job " in run.stdout + run.stderr

    run_id = (workdir / "run-id").read_text().strip()
    logs = metaflow(FLOW.name, ["logs", "%s/start" % run_id], workdir, env)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "hello from AWS Batch job " in logs.stdout
