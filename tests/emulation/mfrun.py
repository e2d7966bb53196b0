"""Running a flow's Metaflow CLI against the AWS emulation, bounded and isolated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

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


def metaflow(flow: str, args: list[str], cwd: Path, env: dict[str, str], timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    """Runs the flow's CLI in its own session, so a hung run is stopped with all its workers."""
    argv = [sys.executable, flow, "--no-pylint", *args]
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
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        # SIGTERM first: Metaflow's atexit hook then terminates its Batch jobs.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate(timeout=KILL_GRACE_S)
        pytest.fail("%s timed out after %d s\n%s\n%s" % (argv, timeout_s, stdout, stderr))
    return subprocess.CompletedProcess(argv, process.returncode, stdout, stderr)
