"""The Metaflow versions whose internals this release relies on, as data: the tested range,
and the error for what Metaflow built in a shape this release does not know. Pure: checking
the installed Metaflow against the range is mf/versions.py's."""

from typing import List, Tuple

from .errors import TorchDistributedCompileError

# Keep in step with the `metaflow` extra in setup.py. Metaflow 2.18 has no spin-step.
TESTED_METAFLOW: Tuple[Tuple[int, ...], Tuple[int, ...]] = ((2, 19, 0), (2, 20, 0))


# The torch releases CI runs the package's real flows on, oldest to newest (.ci/torch_range),
# and the range they span: keep in step with the `torch` extra in setup.py and docs/index.md.
# An older torch is refused when a flow starts; a newer one runs, with a warning naming it.
TESTED_TORCH: Tuple[Tuple[int, ...], Tuple[int, ...]] = ((2, 5, 0), (2, 16, 0))
TESTED_TORCH_RELEASES = ("2.5.0", "2.15.0")
# torch's libuv store (its default since 2.4) takes over a listening socket from 2.8 on; before,
# node 0 hosts the gang's store with torch's legacy store (runtime/control.py).
LIBUV_LISTEN_FD = (2, 8, 0)


def parse_version(version: str) -> Tuple[int, ...]:
    """(major, minor, patch) of a Metaflow or torch version string."""
    # get_version() appends the extensions after a "+": 2.19.39+obcheckpoint(0.2.14)
    parts: List[int] = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def metaflow_version_supported(version: str) -> bool:
    low, high = TESTED_METAFLOW
    return low <= parse_version(version) < high


def tested_range(bounds: Tuple[Tuple[int, ...], Tuple[int, ...]] = TESTED_METAFLOW) -> str:
    """The range `bounds` as pip writes it: '>=2.19.0,<2.20'."""
    low, high = bounds
    return ">=%s,<%s" % (".".join(map(str, low)), ".".join(map(str, high[:2])))


def torch_version_verdict(version: str) -> str:
    """'older', 'tested' or 'newer': where torch `version` (torch.__version__, with or without
    a local part such as '+cu124' or '+cpu') stands against TESTED_TORCH."""
    low, high = TESTED_TORCH
    found = parse_version(version)
    return "older" if found < low else "newer" if found >= high else "tested"


def compile_error(step_name: str, found: str) -> TorchDistributedCompileError:
    """The error for a step whose Metaflow-built command, job or workflow is not the shape this
    release knows (`found` says what was not): Metaflow's internals moved."""
    return TorchDistributedCompileError(
        step_name, "%s. Metaflow built the step in a way this release of "
        "metaflow-torch-distributed does not know how to make a gang of: its internals differ "
        "from the tested Metaflow %s. Install a tested version (pip install 'metaflow%s'); if "
        "yours is in that range, report this message." % (found, tested_range(), tested_range()))
