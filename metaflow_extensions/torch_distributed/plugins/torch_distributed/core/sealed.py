"""Values of the gang's store, sealed under the attempt's secret (pure: no torch, no store).

Anyone who reaches node 0's port can list, read and write every key of the store (torch's
TCPStore has no access control), so the key names hide nothing. What the package's own
machinery reads is trusted for its seal instead: an HMAC-SHA256 under the attempt's secret over
the gang attempt's id, the key and the payload. A value forged without the secret, moved to
another key, copied from another attempt, truncated or corrupted does not open.
"""

import hashlib
import hmac
import threading
from typing import Dict, Optional, Set, Tuple

# The first bytes of every sealed value: its format, so that a later one can be told apart.
VERSION = b"mftd1"
TAG_SIZE = hashlib.sha256().digest_size


def _tag(secret: str, gang_id: str, key: str, payload: bytes) -> bytes:
    mac = hmac.new(secret.encode(), digestmod=hashlib.sha256)
    # Each field is length-prefixed, so that no two (gang id, key, payload) read the same.
    for part in (VERSION, gang_id.encode(), key.encode(), payload):
        mac.update(len(part).to_bytes(8, "big"))
        mac.update(part)
    return mac.digest()


def seal(secret: str, gang_id: str, key: str, payload: bytes) -> bytes:
    """The value to store under `key` for the attempt `gang_id`: VERSION, tag, payload. (A
    value sealed without a secret never opens: unseal refuses an empty secret.)"""
    return VERSION + _tag(secret, gang_id, key, payload) + payload


def unseal(secret: str, gang_id: str, key: str, value: bytes) -> Optional[bytes]:
    """The payload of `value` read under `key`, or None when it was not sealed under this
    secret for this attempt and key (or was changed since)."""
    head = len(VERSION) + TAG_SIZE
    if not secret or len(value) < head or not value.startswith(VERSION):
        return None
    payload = value[head:]
    if not hmac.compare_digest(value[len(VERSION):head], _tag(secret, gang_id, key, payload)):
        return None
    return payload


class Ignored:
    """The values that failed to open, by kind of message, each distinct (key, value) counted
    once however often a poller reads it. One per process (IGNORED): every ControlPlane of the
    process counts there, so the gang can say once how many forged or corrupt messages its
    processes ignored."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: Set[Tuple[str, bytes]] = set()
        self._counts: Dict[str, int] = {}

    def note(self, kind: str, key: str, value: bytes) -> None:
        seen = (key, hashlib.sha256(value).digest())
        with self._lock:
            if seen in self._seen:
                return
            self._seen.add(seen)
            self._counts[kind] = self._counts.get(kind, 0) + 1

    def counts(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


IGNORED = Ignored()


def merge_counts(*counts: Optional[Dict[str, int]]) -> Dict[str, int]:
    """The sum of several processes' counts (None for a process that sent none)."""
    total: Dict[str, int] = {}
    for one in counts:
        for kind, n in (one or {}).items():
            total[kind] = total.get(kind, 0) + int(n)
    return total


def describe(counts: Dict[str, int]) -> str:
    """`3 (abort 1, gather 2)`: how many were ignored, by kind."""
    return "%d (%s)" % (sum(counts.values()),
                        ", ".join("%s %d" % (k, n) for k, n in sorted(counts.items())))
