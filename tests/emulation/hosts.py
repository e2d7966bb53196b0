"""The address an emulated node or pod stands on, when every node runs on this host.

On AWS Batch and Kubernetes each node is a machine of its own: node 0 is reached at its
private address, never at a loopback address (the package refuses loopback for node 0 of a
remote gang: backends/address.py). With every node a process of this host, that private
address is this host's own non-loopback address: connections to it stay on this host.
"""

from __future__ import annotations

import functools
import ipaddress
import socket

# Any address off this host: a UDP socket "connected" to it sends nothing, but the kernel
# chooses the source address its route would use (TEST-NET-3, RFC 5737).
_PROBE = ("203.0.113.1", 9)


class NoHostAddress(RuntimeError):
    """This host has no address but loopback: an emulated node 0 has no private address."""


def _usable(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified)


@functools.lru_cache(maxsize=1)
def host_address() -> str:
    """This host's IPv4 address that is not loopback: the source of its route off the host,
    else the first such address of an interface that is up."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(_PROBE)
            routed = probe.getsockname()[0]
        except OSError:
            routed = ""
    if routed and _usable(routed):
        return routed
    import psutil

    stats = psutil.net_if_stats()
    for name, addresses in psutil.net_if_addrs().items():
        if not (stats.get(name) and stats[name].isup):
            continue
        for entry in addresses:
            if entry.family == socket.AF_INET and _usable(entry.address):
                return entry.address
    raise NoHostAddress(
        "this host has no IPv4 address but loopback, so the emulated node 0 has no private "
        "address the package accepts (it refuses loopback for a remote gang). Give the host "
        "one (e.g. `ip link add td0 type dummy && ip addr add 10.254.0.1/32 dev td0 && ip link "
        "set td0 up`, as root).")


def is_node_address(address: str) -> bool:
    """Whether an emulated node or pod stands at `address`: this host's own address, or, with
    nodes as hosts (netns.py), an address of the bridge's subnet other than the bridge's."""
    from . import netns

    if not netns.enabled():
        return address == host_address()
    network = netns.network()
    return ipaddress.ip_address(address) in network.subnet and address != network.address
