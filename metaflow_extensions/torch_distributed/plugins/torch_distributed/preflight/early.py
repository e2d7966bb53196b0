"""What `torch-distributed preflight` must set up before Metaflow's CLI starts: Metaflow refuses
@batch without an S3 datastore (and an S3 datastore without a root) in its CLI's top-level
group, before any command of ours is even imported, and the preflight is run exactly where
that configuration may be missing, to say so. decorator.py, which the flow imports before
Metaflow reads its command line, calls `install`."""

from typing import List, Sequence

from ..mf import internals

# What Metaflow would have refused, as internals.preflight_without_s3 notes it: the preflight
# says it first, with the fix, and goes on with its other checks.
NOTED: List[str] = []


def preflight_invoked(argv: Sequence[str]) -> bool:
    """Whether this process runs `torch-distributed preflight`."""
    words = list(argv)
    return "torch-distributed" in words and "preflight" in words[words.index(
        "torch-distributed"):]


def install(argv: Sequence[str]) -> None:
    """In a process that runs the preflight, let Metaflow's CLI start without an S3 datastore."""
    if preflight_invoked(argv):
        internals.preflight_without_s3(NOTED.append)
