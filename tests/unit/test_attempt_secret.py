"""How a remote gang's agents get the attempt's secret: from node 0, through the run's
datastore (Metaflow's own local datastore here), never from what the scheduler shows."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import (
    attempt_secret,
    internals,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import \
    TorchDistributedEnvironmentError
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.gangspec import TaskIdentity


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = 0

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.now += s
        self.sleeps += 1


def identity(root, attempt=0):
    return TaskIdentity(run_id="5", task_id="7", input_paths="", split_index=None,
                        retry_count=attempt, max_user_code_retries=1, namespace=None,
                        orig_datastore="local@" + root)


def test_an_agent_reads_what_node_0_published_for_its_attempt(tmp_path):
    root = str(tmp_path / ".metaflow")
    node0 = internals.flow_datastore_at("GangFlow", "local@" + root)
    attempt_secret.publish(node0, identity(root), "train", "5-train-7-0", "s" * 64)
    assert attempt_secret.fetch("GangFlow", identity(root), "train", "5-train-7-0", 5) == "s" * 64


def test_an_agent_waits_for_node_0_then_names_what_is_missing(tmp_path):
    root = str(tmp_path / ".metaflow")
    node0 = internals.flow_datastore_at("GangFlow", "local@" + root)
    # the previous attempt's secret is not this attempt's
    attempt_secret.publish(node0, identity(root, 0), "train", "5-train-7-0", "old")
    clock = Clock()
    with pytest.raises(TorchDistributedEnvironmentError,
                       match=r"node 0 of the gang \(task 5/train/7, attempt 1\) did not publish "
                             r"the attempt's secret .* within the rendezvous timeout of 3s"):
        attempt_secret.fetch("GangFlow", identity(root, 1), "train", "5-train-7-1", 3,
                             clock=clock, sleep=clock.sleep)
    assert clock.sleeps == 3 / attempt_secret.POLL_S
