"""The DNS server of the emulation's bridge (nodes as hosts, netns.py), as a VPC's resolver or a
cluster's DNS answers a node: at once. A node's /etc/resolv.conf names the bridge's address;
this answers, over UDP, the A query of a host's name with its address, the PTR query of a
host's address with its name, and every other query with NXDOMAIN.

Without it a node's queries went to an address where nothing listened, and each was refused by
an ICMP port unreachable, which the kernel rate-limits (about one a second per destination
after a burst of 6): torch's TCPStore looks up the name of every connection it accepts, so
with a few dozen connections node 0's store spent tens of seconds in the resolver's 1 s
timeouts, which no real cluster's DNS costs.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
from typing import Callable, Optional

A, PTR, IN = 1, 12, 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3


def _name(packet: bytes, offset: int) -> tuple[str, int]:
    """The query name at `offset` (no compression: a question's name is written out) and the
    offset after it."""
    labels = []
    while True:
        length = packet[offset]
        offset += 1
        if length == 0:
            return ".".join(labels), offset
        if length & 0xC0:
            raise ValueError("a compressed name in a question")
        labels.append(packet[offset:offset + length].decode("ascii", "replace"))
        offset += length


def _encode(name: str) -> bytes:
    return b"".join(bytes([len(label)]) + label.encode("ascii")
                    for label in name.rstrip(".").split(".") if label) + b"\0"


def answer(query: bytes, lookup: Callable[[str], Optional[str]],
           reverse: Callable[[str], Optional[str]]) -> Optional[bytes]:
    """The response to one DNS query: `lookup(name)` gives a name's IPv4 address and
    `reverse(address)` an address's name (None: unknown, NXDOMAIN). None for what is not a
    query (a response, a packet too short)."""
    if len(query) < 12:
        return None
    ident, flags, questions = struct.unpack("!HHH", query[:6])
    if flags & 0x8000:
        return None
    rd = flags & 0x0100
    try:
        if questions != 1:
            raise ValueError("%d questions" % questions)
        name, end = _name(query, 12)
        qtype, qclass = struct.unpack("!HH", query[end:end + 4])
    except (ValueError, IndexError, struct.error):
        return struct.pack("!HHHHHH", ident, 0x8000 | rd | 0x0080 | FORMERR, 0, 0, 0, 0)
    question = query[12:end + 4]
    record, known = None, False
    if qclass == IN and qtype != PTR:  # a name: its address for A, no record of other types
        address = lookup(name.lower().rstrip("."))
        known = address is not None
        if known and qtype == A:
            record = socket.inet_aton(address)
    elif qclass == IN and qtype == PTR and name.lower().endswith(".in-addr.arpa"):
        octets = name.lower()[:-len(".in-addr.arpa")].split(".")
        try:
            address = str(ipaddress.IPv4Address(".".join(reversed(octets))))
        except ValueError:
            address = None
        host = reverse(address) if address else None
        if host is not None:
            record = _encode(host)
    rcode = NOERROR if known or record is not None else NXDOMAIN
    header = struct.pack("!HHHHHH", ident, 0x8000 | 0x0400 | rd | 0x0080 | rcode, 1,
                         1 if record is not None else 0, 0, 0)
    if record is None:
        return header + question
    # the answer's name points back at the question's (offset 12)
    return header + question + struct.pack("!HHHIH", 0xC00C, qtype, IN, 60,
                                           len(record)) + record


class Server:
    """Answers DNS queries on UDP `port` of `address` in a daemon thread until `close()`."""

    def __init__(self, address: str, lookup: Callable[[str], Optional[str]],
                 reverse: Callable[[str], Optional[str]], port: int = 53):
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._socket.bind((address, port))
        self.port = self._socket.getsockname()[1]
        self._lookup, self._reverse = lookup, reverse
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="emulation-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                query, peer = self._socket.recvfrom(4096)
            except OSError:
                return
            try:
                response = answer(query, self._lookup, self._reverse)
                if response is not None:
                    self._socket.sendto(response, peer)
            except Exception:  # one bad packet never stops the resolver
                continue

    def close(self) -> None:
        self._closed = True
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._socket.close()
