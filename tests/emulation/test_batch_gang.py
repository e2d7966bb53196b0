"""`python flow.py run --with batch`: each gang is one multi-node AWS Batch job (emulated)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from .mfrun import isolated_env, metaflow

FLOWS = Path(__file__).parent / "flows"


class BatchRun:
    """A flow copied into its own directory and run with `--with batch` on the emulation."""

    def __init__(self, aws, batch, tmp_path, flow):
        self.batch = batch
        self.flow = flow
        self.workdir = tmp_path / "flow"
        self.workdir.mkdir()
        shutil.copy(FLOWS / flow, self.workdir)
        home = tmp_path / "metaflow-home"
        home.mkdir()
        self.env = isolated_env(aws.env, batch.env, home=home)
        self.run_id = None

    def run(self, timeout_s=150, **td):
        env = dict(self.env, **{k: str(v) for k, v in td.items()})
        started = time.monotonic()
        res = metaflow(self.flow, ["run", "--with", "batch", "--run-id-file", "run-id"],
                       self.workdir, env, timeout_s=timeout_s)
        res.elapsed = time.monotonic() - started
        res.output = res.stdout + res.stderr
        id_file = self.workdir / "run-id"
        self.run_id = id_file.read_text().strip() if id_file.exists() else None
        return res

    def cli(self, *args):
        return metaflow(self.flow, list(args), self.workdir, self.env)

    def client(self, expr):
        """Evaluates `expr` with `run` bound to this run in the Metaflow client; JSON back."""
        code = ("import json; from metaflow import Flow, namespace; namespace(None); "
                "run = Flow(%r).runs(%r)[0] if False else None\n" % (self.flow_name, self.run_id))
        code = ("import json\nfrom metaflow import Run, namespace\nnamespace(None)\n"
                "run = Run('%s/%s')\nprint(json.dumps(%s))\n" % (self.flow_name, self.run_id, expr))
        (self.workdir / "client.py").write_text(code)
        res = metaflow_client(self.workdir, self.env)
        assert res.returncode == 0, res.stdout + res.stderr
        return json.loads(res.stdout.strip().splitlines()[-1])

    @property
    def flow_name(self):
        return {"batch_gang_flow.py": "BatchGangFlow",
                "batch_foreach_flow.py": "BatchForeachFlow"}[self.flow]

    def jobs_of(self, step):
        """SubmitJob bodies of `step`, in order ("<user>-<flow>-<run>-<step>-<task>-<attempt>")."""
        return [s for s in self.batch.submissions if s["jobName"].split("-")[-3] == step]


def metaflow_client(cwd, env):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "client.py"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def gang(aws, batch, tmp_path):
    return BatchRun(aws, batch, tmp_path, "batch_gang_flow.py")


def test_two_nodes_of_two_processes_form_one_gang_and_log_every_rank(gang):
    res = gang.run()
    assert res.returncode == 0, res.output
    [job] = gang.jobs_of("train")
    overrides = job["nodeOverrides"]["nodePropertyOverrides"]
    assert [o["targetNodes"] for o in overrides] == ["0:0", "1:1"]
    main, agent = (o["containerOverrides"]["command"][-1] for o in overrides)
    assert " step train " in main and "spin-step" not in main
    assert " spin-step train " in agent and "-node-$AWS_BATCH_JOB_NODE_INDEX" in agent
    places = gang.client("run['train'].task['places'].data")
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    assert [p["node_rank"] for p in places] == [0, 0, 1, 1]
    assert [p["batch_node"] for p in places] == ["0", "0", "1", "1"]
    assert len({p["job"] for p in places}) == 1
    assert {p["world_size"] for p in places} == {4}
    assert len({tuple(p["master"]) for p in places}) == 1
    assert gang.client("run['train'].task['total'].data") == 10.0
    # One task for the gang: the agents' hidden tasks never reach the metadata.
    assert gang.client("[t.id for t in run['train']]") == [job["jobName"].split("-")[-2]]

    # Metaflow tails the task's log while the job runs, node 1's ranks included ...
    for rank in range(4):
        assert "[rank %d] rank %d says hello" % (rank, rank) in res.output
    # ... and keeps it: every rank is in the task's own log, stdout and stderr apart.
    out = gang.cli("logs", "--stdout", "%s/train" % gang.run_id)
    err = gang.cli("logs", "--stderr", "%s/train" % gang.run_id)
    assert out.returncode == 0 and err.returncode == 0, out.stderr + err.stderr
    for rank in range(4):
        assert "[rank %d] rank %d says hello from batch node %d" % (
            rank, rank, rank // 2) in out.stdout
        assert "[rank %d] rank %d writes to stderr" % (rank, rank) in err.stdout
    assert "writes to stderr" not in out.stdout
