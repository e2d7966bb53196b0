"""The seal of every value the package reads from the gang's store (sealed.py)."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core import sealed

SECRET = "0123456789abcdef" * 4
GANG = "1700-train-5-0"
KEY = "mftd/node/1/failure"


def test_a_sealed_value_opens_under_its_secret_gang_and_key():
    value = sealed.seal(SECRET, GANG, KEY, b'{"rank": 2}')
    assert sealed.unseal(SECRET, GANG, KEY, value) == b'{"rank": 2}'
    assert sealed.unseal(SECRET, GANG, KEY, sealed.seal(SECRET, GANG, KEY, b"")) == b""


@pytest.mark.parametrize("how, opened", [
    ("another secret", lambda v: sealed.unseal("f" * 64, GANG, KEY, v)),
    ("another attempt", lambda v: sealed.unseal(SECRET, "1700-train-5-1", KEY, v)),
    ("moved to another key", lambda v: sealed.unseal(SECRET, GANG, "mftd/node/2/failure", v)),
    ("payload changed", lambda v: sealed.unseal(SECRET, GANG, KEY, v[:-1] + b"3")),
    ("tag changed", lambda v: sealed.unseal(
        SECRET, GANG, KEY, v[:8] + bytes([v[8] ^ 1]) + v[9:])),
    ("truncated", lambda v: sealed.unseal(SECRET, GANG, KEY, v[:-1])),
    ("cut inside the tag", lambda v: sealed.unseal(SECRET, GANG, KEY, v[:20])),
    ("another version", lambda v: sealed.unseal(SECRET, GANG, KEY, b"mftd2" + v[5:])),
    ("empty", lambda v: sealed.unseal(SECRET, GANG, KEY, b"")),
    ("no secret to open with", lambda v: sealed.unseal("", GANG, KEY, v)),
])
def test_a_value_that_was_not_sealed_so_does_not_open(how, opened):
    assert opened(sealed.seal(SECRET, GANG, KEY, b'{"rank": 2}')) is None, how


def test_fields_cannot_be_shifted_between_gang_key_and_payload():
    # without length prefixes ("ab", "c") and ("a", "bc") would read the same
    value = sealed.seal(SECRET, "g", "mftd/ab", b"c")
    assert sealed.unseal(SECRET, "g", "mftd/a", value) is None
    assert sealed.unseal(SECRET, "gmftd/ab", "", value[:]) is None


def test_a_value_sealed_without_a_secret_never_opens():
    assert sealed.unseal("", GANG, KEY, sealed.seal("", GANG, KEY, b"1")) is None


def test_each_distinct_forged_value_is_counted_once():
    ignored = sealed.Ignored()
    for _ in range(3):
        ignored.note("abort", "mftd/abort", b"1")
    ignored.note("abort", "mftd/abort", b"2")
    ignored.note("gather", "mftd/gather/0/1", b"x")
    assert ignored.counts() == {"abort": 2, "gather": 1}


# -- torch's own values: sealed and private (seal_private) ----------------------------------------

CONTEXT = GANG + "/round/0"
TORCH_KEY = "torch/r0/default_pg/0//cpu//0/0"
ADDRESS = b"\x02\x00\x9c\x40\x7f\x00\x00\x01 an address record of gloo: 127.0.0.1:40000, seq 7"


def test_a_private_value_opens_under_its_secret_context_and_key_only():
    value = sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, ADDRESS)
    assert sealed.open_private(SECRET, CONTEXT, TORCH_KEY, value) == ADDRESS
    assert sealed.open_private(SECRET, CONTEXT, TORCH_KEY,
                               sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, b"")) == b""


def test_a_private_value_hides_its_payload_and_is_new_each_time():
    # whoever reads the store learns neither a peer's address nor NCCL's unique id
    first = sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, ADDRESS)
    second = sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, ADDRESS)
    assert first != second
    for value in (first, second):
        assert b"127.0.0.1" not in value and b"\x7f\x00\x00\x01" not in value
        assert SECRET.encode() not in value
    assert len(first) == len(ADDRESS) + len(sealed.PRIVATE_VERSION) + sealed.TAG_SIZE + \
        sealed.NONCE_SIZE


@pytest.mark.parametrize("how, opened", [
    ("another secret", lambda v: sealed.open_private("f" * 64, CONTEXT, TORCH_KEY, v)),
    ("another round", lambda v: sealed.open_private(SECRET, GANG + "/round/1", TORCH_KEY, v)),
    ("another attempt", lambda v: sealed.open_private(SECRET, "1700-train-5-1/round/0",
                                                      TORCH_KEY, v)),
    ("moved to another rank's key", lambda v: sealed.open_private(
        SECRET, CONTEXT, TORCH_KEY[:-1] + "1", v)),
    ("one bit of the ciphertext flipped", lambda v: sealed.open_private(
        SECRET, CONTEXT, TORCH_KEY, v[:-1] + bytes([v[-1] ^ 1]))),
    ("nonce changed", lambda v: sealed.open_private(
        SECRET, CONTEXT, TORCH_KEY, v[:-len(ADDRESS) - 1] + bytes([v[-len(ADDRESS) - 1] ^ 1])
        + v[-len(ADDRESS):])),
    ("truncated", lambda v: sealed.open_private(SECRET, CONTEXT, TORCH_KEY, v[:-1])),
    ("cut inside the nonce", lambda v: sealed.open_private(SECRET, CONTEXT, TORCH_KEY, v[:50])),
    ("a value of the package's own seal", lambda v: sealed.open_private(
        SECRET, CONTEXT, TORCH_KEY, sealed.seal(SECRET, CONTEXT, TORCH_KEY, ADDRESS))),
    ("torch's plain record", lambda v: sealed.open_private(SECRET, CONTEXT, TORCH_KEY, ADDRESS)),
    ("no secret to open with", lambda v: sealed.open_private("", CONTEXT, TORCH_KEY, v)),
])
def test_a_private_value_that_was_not_sealed_so_does_not_open(how, opened):
    assert opened(sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, ADDRESS)) is None, how


def test_a_private_value_of_many_blocks_round_trips():
    payload = bytes(range(256)) * 40  # 10 kB: keystream blocks past the first
    value = sealed.seal_private(SECRET, CONTEXT, TORCH_KEY, payload)
    assert sealed.open_private(SECRET, CONTEXT, TORCH_KEY, value) == payload
    assert payload[:64] not in value


def _reference_private(secret, context, key, nonce, payload):
    """seal_private's format written out from its description, one HMAC at a time: keys
    HMAC(secret, "mftd-private/enc"|"mftd-private/mac"), keystream block i HMAC(enc, nonce||i),
    tag HMAC(mac) over the length-prefixed version, context, key and nonce||ciphertext."""
    import hashlib
    import hmac

    def subkey(purpose):
        return hmac.new(secret.encode(), b"mftd-private/" + purpose, hashlib.sha256).digest()

    stream = b"".join(hmac.new(subkey(b"enc"), nonce + i.to_bytes(8, "big"), hashlib.sha256)
                      .digest() for i in range(len(payload) // 32 + 1))
    body = nonce + bytes(p ^ s for p, s in zip(payload, stream))
    mac = hmac.new(subkey(b"mac"), digestmod=hashlib.sha256)
    for part in (b"mftdp1", context.encode(), key.encode(), body):
        mac.update(len(part).to_bytes(8, "big") + part)
    return b"mftdp1" + mac.digest() + body


@pytest.mark.parametrize("size", [0, 1, 31, 32, 33, 700, 4096])
def test_the_private_format_is_its_description_with_keys_derived_once(size):
    # PrivateSeal derives the two keys once and copies HMAC states: what it seals and opens
    # is still the format above, byte for byte, so ranks agree whatever the code's shortcuts
    payload = bytes(range(256)) * (size // 256 + 1)
    payload = payload[:size]
    nonce = bytes(range(16))
    reference = _reference_private(SECRET, CONTEXT, TORCH_KEY, nonce, payload)
    one = sealed.PrivateSeal(SECRET)
    assert one.open(CONTEXT, TORCH_KEY, reference) == payload
    assert sealed.open_private(SECRET, CONTEXT, TORCH_KEY, reference) == payload
    mine = one.seal(CONTEXT, TORCH_KEY, payload)
    nonce_of_mine = mine[len(sealed.PRIVATE_VERSION) + sealed.TAG_SIZE:][:sealed.NONCE_SIZE]
    assert mine == _reference_private(SECRET, CONTEXT, TORCH_KEY, nonce_of_mine, payload)
    # one PrivateSeal serves many keys and contexts, each bound to its own
    assert one.open(CONTEXT, TORCH_KEY + "x", mine) is None
    assert one.open(GANG + "/round/1", TORCH_KEY, mine) is None
