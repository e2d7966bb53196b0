import pytest

from tests.support import assert_none_left, descendants


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    assert_none_left(descendants(), "processes left running", wait=0)


def hosted_store(gang_id, secret):
    """(node 0's control plane on a kernel-chosen loopback port, the port), as the leader
    hosts it: the store serves on a descriptor of its own, the listener is closed."""
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.control import (
        ControlPlane,
        bind_listener,
    )

    listener = bind_listener("127.0.0.1", 0)
    port = listener.getsockname()[1]
    host = ControlPlane.host(listener, gang_id, secret, timeout=5)
    listener.close()
    return host, port
