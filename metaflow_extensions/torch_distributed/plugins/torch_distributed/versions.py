"""The Metaflow versions whose internals this package relies on (spin-step, cli_args, the
task_decorate order). Outside the tested range we stop with a clear message instead of
failing in some obscure way halfway through a gang."""

from . import internals
from .errors import TorchDistributedEnvironmentError

# Keep in step with install_requires in setup.py.
TESTED_METAFLOW = ((2, 19, 0), (2, 20, 0))


def _parse(version):
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def metaflow_version_supported(version):
    low, high = TESTED_METAFLOW
    return low <= _parse(version) < high


def check_metaflow_version(step_name):
    found = internals.metaflow_version()
    if not metaflow_version_supported(found):
        raise TorchDistributedEnvironmentError(
            step_name,
            "metaflow %s is installed, but this release of metaflow-torch-distributed is tested "
            "with metaflow >=%s,<%s (it relies on Metaflow internals that change between "
            "releases). Install a tested version: pip install 'metaflow>=%s,<%s'." % (
                found, ".".join(map(str, TESTED_METAFLOW[0])), ".".join(map(str, TESTED_METAFLOW[1])),
                ".".join(map(str, TESTED_METAFLOW[0])), ".".join(map(str, TESTED_METAFLOW[1]))))
