"""The hosts' network of nodes as hosts (netns.py): an address is not given again right after its
host was removed, whose namespace may linger with that address up while its killed processes
exit. Needs root and iproute2, as the mode does; CI runs it as root in the default mode too,
where the bridge it makes is removed again at once (the rest of the suite runs without one)."""

import atexit
import ipaddress

import pytest

from . import netns

pytestmark = pytest.mark.skipif(netns.unavailable() is not None,
                                reason="nodes as hosts: %s" % netns.unavailable())


@pytest.fixture
def network():
    net = netns.network()
    yield net
    if not netns.enabled():  # in the mode, the process's emulators go on using it
        atexit.unregister(net.close)
        net.close()
        netns.network.cache_clear()


def test_a_removed_hosts_address_is_not_given_again_to_the_next_host(network):
    first, second = network.add_host(), network.add_host()
    try:
        first.remove()
        third = network.add_host()
        try:
            assert third.address not in (first.address, second.address)
            assert ipaddress.ip_address(third.address) == ipaddress.ip_address(second.address) + 1
        finally:
            third.remove()
    finally:
        first.remove()
        second.remove()
