"""current.torch_distributed.gather's store protocol, on a real control plane (TCPStore)."""

from datetime import timedelta

import pytest
import torch.distributed as dist

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import ControlPlane
from tests.integration.conftest import hosted_store

SECRET = "s3cr3t"
GANG = "1700-train-5-0"


@pytest.fixture
def stores():
    """Node 0's store, and a rank's client of it."""
    host, port = hosted_store(GANG, SECRET)
    yield host, ControlPlane.client("127.0.0.1", port, GANG, SECRET, timedelta(seconds=5)), port


def test_rank_0_gets_every_value_in_rank_order_and_the_keys_are_gone(stores):
    host, rank, _ = stores
    for r, value in ((2, {"loss": 0.5}), (0, "zero"), (1, [1, 2])):
        rank.put_gathered(0, r, value)
    assert host.take_gathered(0, range(3), timedelta(seconds=2), 0.01) == [
        "zero", [1, 2], {"loss": 0.5}]
    # taken once: the next gather with the same number waits for new values
    with pytest.raises(dist.DistStoreError):
        host.take_gathered(0, range(3), timedelta(seconds=0.2), 0.01)


def test_a_rank_that_never_sends_is_named_when_the_wait_runs_out(stores):
    host, rank, _ = stores
    rank.put_gathered(4, 0, "a")
    rank.put_gathered(4, 2, "c")
    with pytest.raises(dist.DistStoreError,
                       match=r"gather: ranks \[1\] did not send their value within 0:00:00.3"):
        host.take_gathered(4, range(3), timedelta(seconds=0.3), 0.01)


def test_another_secret_sees_none_of_the_values(stores):
    host, _, port = stores
    intruder = ControlPlane.client("127.0.0.1", port, GANG, "not-the-secret",
                                   timedelta(seconds=5))
    intruder.put_gathered(0, 0, "forged")
    with pytest.raises(dist.DistStoreError):
        host.take_gathered(0, range(1), timedelta(seconds=0.2), 0.01)
