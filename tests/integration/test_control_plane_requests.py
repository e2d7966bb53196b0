"""What the gang's control plane asks of node 0's store (issue 25: every node's polling goes
through it). Real TCPStore, each request counted by a proxy."""

from datetime import timedelta

import pytest
import torch.distributed  # noqa: F401 - imported before any store, as in a task
from torch.distributed import TCPStore

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import Failure
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import control as C
from tests.integration.conftest import hosted_store

GANG = "1700-train-5-0"
SECRET = "0123456789abcdef0123456789abcdef"


class Counting:
    """A store client that counts the requests made through it."""

    def __init__(self, store):
        self._store = store
        self.calls = []

    def __getattr__(self, name):
        attr = getattr(self._store, name)

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call if callable(attr) else attr


def counted(port):
    """(a ControlPlane whose requests are counted, its counter)."""
    store = Counting(TCPStore("127.0.0.1", port, None, False, timedelta(seconds=5)))
    return C.ControlPlane(store, GANG, SECRET), store


@pytest.fixture
def gang():
    host, port = hosted_store(GANG, SECRET)
    node = C.ControlPlane.connect("127.0.0.1", port, GANG, SECRET, timeout=5)
    yield host, node, port


def test_reading_a_message_that_is_there_is_one_request(gang):
    _, node, port = gang
    node.report_failure(3, Failure(25, 3, "exit", 1.0, 1, local_rank=1))
    control, store = counted(port)
    assert control.failure(3).rank == 25
    assert control.failure(4) is None
    assert len(store.calls) == 2  # one each (check, then get: three)
