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
