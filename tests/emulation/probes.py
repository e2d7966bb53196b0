"""Bounded waiting and process checks shared by the emulation tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests import intruder
from tests.support import assert_collective_history, live_processes, with_env


def wait_for(probe: Callable[[], object], timeout_s: float = 10.0, what: str = "condition"):
    """Polls `probe` until it returns something truthy; fails the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() >= deadline:
            pytest.fail("timed out after %.1f s waiting for %s" % (timeout_s, what))
        time.sleep(0.05)


@contextlib.contextmanager
def frozen_node(node_dir: Path, timeout_s: float):
    """Once node 1 of a 2 x 2 gang (running in `node_dir`) has joined node 0 and its rank 3 has
    started, suspend every process of that node: a node that hangs as a whole, with no exit,
    no report and no heartbeat. Yields when it froze (time.monotonic()); kills them after."""
    log = node_dir / "container.log"

    def read():
        return log.read_text(errors="replace") if log.exists() else ""

    wait_for(lambda: "[node 1 agent] joined the gang of node 0" in read() and
             "[rank 3] rank 3 says hello" in read(), timeout_s, "node 1 to join and start")
    frozen = [p for p in psutil.process_iter(["cwd"])
              if (p.info["cwd"] or "").startswith(str(node_dir))]
    assert frozen
    stopped_at = time.monotonic()
    for p in frozen:
        p.suspend()
    try:
        yield stopped_at
    finally:
        kill_frozen(frozen)


def kill_frozen(frozen: list) -> None:
    """Kills the suspended processes of a frozen node that are still there and waits for them.
    Any may end on its own meanwhile: as a host (TD_EMULATION_HOSTS=1) the kernel kills every
    process of a node whose PID 1 exits."""
    for p in frozen:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    # a suspended process takes its SIGKILL when the kernel next schedules it, which on two
    # loaded cores can be after the emulator's check that nothing is left
    psutil.wait_procs(frozen, timeout=10)


def assert_hang_report(out: str, flow_file: str, hang_timeout: int) -> None:
    """The gang's hang report for rank 2 (node 1) stuck outside any collective while ranks 0,
    1 and 3 wait in all_reduce, as the task's log of `flow_file` shows it (stacks.py)."""
    import re

    assert "rank 2 (node 1, local rank 0) made no progress: for " in out, out[-6000:]
    assert "while ranks 0, 1, 3 wait (hang_timeout=%ds)" % hang_timeout in out, out[-6000:]
    assert out.index("rank 2 (node 1): at %s:" % flow_file) < out.index(
        "ranks 0, 1, 3 (nodes 0, 1): all_reduce, called from %s:" % flow_file)
    stack = out[out.index("Rank 2's stack (most recent call last):"):]
    assert re.search(r'File ".*%s", line \d+, in train' % re.escape(flow_file), stack), \
        stack[:2000]
    assert_collective_history(out, "ranks 0, 1, 3 (nodes 0, 1)", "ranks 0, 1, 2, 3 (nodes 0, 1)")


def processes_of(emulator_url: str) -> list[psutil.Process]:
    """Live processes started by the emulator at `emulator_url` (marked by their env)."""
    return processes_with("AWS_ENDPOINT_URL_BATCH", emulator_url)


def processes_with(name: str, value: str) -> list[psutil.Process]:
    """Live processes whose environment has `name` set to `value`."""
    return live_processes(with_env(name, value))


def published_secret(env: dict, flow: str, run_id: str, step: str, task_id: str,
                     attempt: int) -> str:
    """The secret node 0 of a remote gang published for one attempt (attempt_secret.py), read
    from the run's datastore on moto's S3 as an agent reads it."""
    import json

    from .aws import client

    bucket, _, root = env["METAFLOW_DATASTORE_SYSROOT_S3"][len("s3://"):].partition("/")
    key = "%s/%s/%s/%s/%s/%d.torch_distributed_gang" % (root, flow, run_id, step, task_id,
                                                        attempt)
    body = client(env["AWS_ENDPOINT_URL"], "s3").get_object(Bucket=bucket, Key=key)["Body"]
    return json.loads(body.read())["secret"]


def batch_views(batch) -> str:
    """Everything the AWS Batch API shows whoever may list jobs: every job's description and
    every job definition, as one JSON text."""
    import json

    jobs = [batch.api.describe_jobs({"jobs": batch.api.job_ids(s["jobName"])})
            for s in batch.submissions]
    definitions = batch.api.describe_job_definitions({})
    return json.dumps([batch.submissions, jobs, definitions], default=str)


INTRUDER = Path(__file__).parent.parent / "intruder.py"
# In the log mode, the line the intruder's forged pickle writes to the stdout of a process that
# unpickles it (in a run's output: the pickle ran); and how its report's line starts.
INTRUDER_PWNED, INTRUDER_REPORT = intruder.PWNED, intruder.REPORT


def intruder_env(out_dir: Path | None = None) -> dict:
    """The TD_* variables that make a test flow's rank 0 start tests/intruder.py, which writes
    to `out_dir`; with none, it reports through the node's log (TD_INTRUDER_DIR "-", for a
    node that sees no folder of the test): intruder_report reads it back."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
    return {"TD_INTRUDER": str(INTRUDER),
            "TD_INTRUDER_DIR": intruder.LOG if out_dir is None else str(out_dir)}


def intruder_report(output: str) -> dict:
    """The report the intruder printed in a run's output (its one line, "intruder report: "
    and the JSON of what it saw and did)."""
    import json

    lines = [line for line in output.splitlines() if INTRUDER_REPORT in line]
    assert len(lines) >= 1, "no intruder report in the output:\n" + output[-6000:]
    reports = [json.loads(line.split(INTRUDER_REPORT, 1)[1]) for line in lines]
    assert all(r == reports[0] for r in reports), lines  # a log shown twice: the same line
    return reports[0]
