"""Values of the gang's store, sealed under the attempt's secret (pure: no torch, no store).

Anyone who reaches node 0's port can list, read and write every key of the store (torch's
TCPStore has no access control), so the key names hide nothing. What the package's own
machinery reads is trusted for its seal instead: an HMAC-SHA256 under the attempt's secret over
the gang attempt's id, the key and the payload. A value forged without the secret, moved to
another key, copied from another attempt, truncated or corrupted does not open.

What torch, gloo and NCCL exchange through the store to bootstrap (peers' addresses and pair
ids, NCCL's unique id) is sealed and also kept private (seal_private): whoever reads the store
learns neither where to connect nor the ids that would let it pose as a peer.
"""

import hashlib
import hmac
import secrets
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


# The first bytes of a private value (seal_private): its format.
PRIVATE_VERSION = b"mftdp1"
NONCE_SIZE = 16
_BLOCK = hashlib.sha256().digest_size


def _subkey(secret: str, purpose: bytes) -> bytes:
    """A key of its own for each use of the secret (encryption, authentication)."""
    return hmac.new(secret.encode(), b"mftd-private/" + purpose, hashlib.sha256).digest()


def _xor(data: bytes, stream: bytes) -> bytes:
    return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(len(data), "big")


class PrivateSeal:
    """seal_private and open_private under one secret, its two keys derived once: a rank's
    rendezvous store seals and opens every value of its round with one (gloo reads each
    peer's record through it, 63 reads a rank in a gang of 64)."""

    def __init__(self, secret: str) -> None:
        self._usable = bool(secret)
        # HMAC's keyed states, computed once; each block and tag starts from a copy of one
        self._enc = hmac.new(_subkey(secret, b"enc"), digestmod=hashlib.sha256)
        self._mac = hmac.new(_subkey(secret, b"mac"), digestmod=hashlib.sha256)

    def _keystream(self, nonce: bytes, size: int) -> bytes:
        """HMAC-SHA256 as a pseudorandom function in counter mode (as NIST SP 800-108's KDF
        in counter mode): block i is HMAC(key, nonce || i)."""
        stream = []
        for i in range((size + _BLOCK - 1) // _BLOCK):
            block = self._enc.copy()
            block.update(nonce + i.to_bytes(8, "big"))
            stream.append(block.digest())
        return b"".join(stream)[:size]

    def _tag(self, context: str, key: str, body: bytes) -> bytes:
        mac = self._mac.copy()
        # Each field is length-prefixed, so that no two (context, key, body) read the same.
        mac.update(b"".join(len(part).to_bytes(8, "big") + part
                            for part in (PRIVATE_VERSION, context.encode(), key.encode(), body)))
        return mac.digest()

    def seal(self, context: str, key: str, payload: bytes) -> bytes:
        """`payload` encrypted, then authenticated (encrypt-then-MAC, each with a key of its
        own derived from the secret) for `key` in `context` (the attempt and its round):
        PRIVATE_VERSION, tag, nonce, ciphertext. A fresh random nonce each time: sealing one
        payload twice gives two values."""
        nonce = secrets.token_bytes(NONCE_SIZE)
        body = nonce + _xor(payload, self._keystream(nonce, len(payload)))
        return PRIVATE_VERSION + self._tag(context, key, body) + body

    def open(self, context: str, key: str, value: bytes) -> Optional[bytes]:
        """The payload `seal` sealed into `value` for `key` in `context`, or None when it was
        not sealed so under this secret (forged, moved from another key, of another attempt
        or round, truncated, changed)."""
        head = len(PRIVATE_VERSION) + TAG_SIZE
        if (not self._usable or len(value) < head + NONCE_SIZE
                or not value.startswith(PRIVATE_VERSION)):
            return None
        body = value[head:]
        if not hmac.compare_digest(value[len(PRIVATE_VERSION):head],
                                   self._tag(context, key, body)):
            return None
        nonce, ciphertext = body[:NONCE_SIZE], body[NONCE_SIZE:]
        return _xor(ciphertext, self._keystream(nonce, len(ciphertext)))


def seal_private(secret: str, context: str, key: str, payload: bytes) -> bytes:
    """PrivateSeal(secret).seal: `payload` encrypted and authenticated for `key` in `context`."""
    return PrivateSeal(secret).seal(context, key, payload)


def open_private(secret: str, context: str, key: str, value: bytes) -> Optional[bytes]:
    """PrivateSeal(secret).open: the payload of `value`, or None when it does not open."""
    return PrivateSeal(secret).open(context, key, value)


def shown(text: str, limit: int = 120) -> str:
    """`text`, read from the store without a seal, as it may be printed: quoted and escaped
    (no newline, no terminal escape), at most `limit` characters of it. Whoever reaches the
    store could otherwise write lines into the task's log."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


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
