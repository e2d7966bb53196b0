"""@checkpoint + @retry on a multi-node gang on the emulated AWS Batch: the agent of node 1 gets
the checkpoint node 0's @checkpoint loaded, through the gang's control plane."""

import pytest

from .test_batch_gang import BatchRun


class CheckpointRun(BatchRun):
    flow_name = "RemoteCheckpointFlow"


@pytest.fixture
def gang(aws, batch, tmp_path):
    return CheckpointRun(aws, batch, tmp_path, "remote_checkpoint_flow.py")


def test_the_retry_of_a_batch_gang_loads_the_checkpoint_on_every_node(gang):
    res = gang.run(TD_LAUNCH_DIR=gang.workdir)
    assert res.returncode == 0, res.output
    assert "rank 1 (node 1, local rank 0) was killed by SIGKILL" in res.output, res.output
    assert len(gang.jobs_of("train")) == 2  # the retry was a new multi-node job
    loaded = gang.client("run['train'].task['loaded'].data")
    assert [(p["rank"], p["node"]) for p in loaded] == [(0, "0"), (1, "1")]
    assert all(p["is_loaded"] and p["found"] == "saved by rank 0 in attempt 0"
               for p in loaded), loaded
