"""The emulation's DNS server (dns.py), which nodes as hosts use as their resolver: a host's
name and address answered both ways, anything else NXDOMAIN, at once, and a malformed query
answered FORMERR without stopping the server. Runs without root (a port of its own on
127.0.0.1)."""

import socket
import struct

import pytest

from . import dns

HOSTS = {"ip-10-77-0-2.ec2.internal": "10.77.0.2"}


def _lookup(name):
    return next((a for n, a in HOSTS.items() if name in (n, n.split(".")[0])), None)


def _reverse(address):
    return next((n for n, a in HOSTS.items() if a == address), None)


def _query(name, qtype, ident=0x1234):
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + dns._encode(name) + \
        struct.pack("!HH", qtype, dns.IN)


def _parse(response):
    ident, flags, _, answers, _, _ = struct.unpack("!HHHHHH", response[:12])
    return ident, flags & 0x8000, flags & 0x000F, answers


@pytest.fixture
def server():
    running = dns.Server("127.0.0.1", _lookup, _reverse, port=0)
    yield running
    running.close()


def _ask(server, packet):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(packet, ("127.0.0.1", server.port))
        return s.recvfrom(4096)[0]


def test_a_hosts_address_is_answered_with_its_name_and_its_name_with_its_address(server):
    ptr = _ask(server, _query("2.0.77.10.in-addr.arpa", dns.PTR))
    assert _parse(ptr) == (0x1234, 0x8000, dns.NOERROR, 1)
    assert ptr.endswith(dns._encode("ip-10-77-0-2.ec2.internal")), ptr
    for name in ("ip-10-77-0-2.ec2.internal", "ip-10-77-0-2"):
        a = _ask(server, _query(name, dns.A))
        assert _parse(a) == (0x1234, 0x8000, dns.NOERROR, 1), name
        assert a.endswith(socket.inet_aton("10.77.0.2")), a


def test_everything_else_is_nxdomain(server):
    for name, qtype in (("3.0.77.10.in-addr.arpa", dns.PTR), ("example.com", dns.A),
                        ("pypi.org", 28)):
        assert _parse(_ask(server, _query(name, qtype)))[2] == dns.NXDOMAIN, name
    # a known name asked for another type: it exists, with no record of that type
    assert _parse(_ask(server, _query("ip-10-77-0-2", 28))) == (0x1234, 0x8000, dns.NOERROR, 0)


def test_a_malformed_query_is_formerr_and_the_server_goes_on(server):
    broken = struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + b"\x05ab"
    assert _parse(_ask(server, broken))[2] == dns.FORMERR
    assert _parse(_ask(server, _query("ip-10-77-0-2", dns.A)))[2] == dns.NOERROR
