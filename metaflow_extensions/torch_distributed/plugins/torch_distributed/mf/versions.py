"""The Metaflow versions whose internals this package relies on (spin-step, cli_args, the
task_decorate order). Outside the tested range we stop with a clear message instead of
failing in some obscure way halfway through a gang.

The package does not depend on a Metaflow distribution (setup.py): Metaflow comes as
`metaflow` or as Outerbounds' `ob-metaflow` (2.19.39.1 is Metaflow 2.19.39 with Outerbounds'
changes), and this check, not pip, keeps the version in range."""

from typing import List, Tuple

from ..mf import internals
from ..core.errors import TorchDistributedCompileError, TorchDistributedEnvironmentError

# Keep in step with the `metaflow` extra in setup.py. Metaflow 2.18 has no spin-step.
TESTED_METAFLOW: Tuple[Tuple[int, ...], Tuple[int, ...]] = ((2, 19, 0), (2, 20, 0))


def _parse(version: str) -> Tuple[int, ...]:
    # get_version() appends the extensions after a "+": 2.19.39+obcheckpoint(0.2.14)
    parts: List[int] = []
    for piece in version.split("+")[0].split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (3 - len(parts)))


def metaflow_version_supported(version: str) -> bool:
    low, high = TESTED_METAFLOW
    return low <= _parse(version) < high


def tested_range() -> str:
    low, high = TESTED_METAFLOW
    return ">=%s,<%s" % (".".join(map(str, low)), ".".join(map(str, high[:2])))


def check_metaflow_version(step_name: str) -> None:
    installed = internals.metaflow_distributions()
    if len(installed) > 1:
        raise TorchDistributedEnvironmentError(
            step_name,
            "%s both installed the metaflow package in this environment, each over the other's "
            "files, so which Metaflow runs is a mix of them. Keep one: pip uninstall -y %s, "
            "then pip install the one you use (e.g. 'ob-metaflow%s' or 'metaflow%s')." % (
                " and ".join("%s %s" % found for found in installed),
                " ".join(name for name, _ in installed), tested_range(), tested_range()))
    name, found = installed[0] if installed else ("metaflow", internals.metaflow_version())
    if not metaflow_version_supported(found):
        raise TorchDistributedEnvironmentError(
            step_name,
            "%s %s is installed, but this release of metaflow-torch-distributed is tested "
            "with Metaflow %s, as metaflow or ob-metaflow (it relies on Metaflow internals "
            "that change between releases). Install a tested version: pip install '%s%s'." % (
                name, found, tested_range(), name, tested_range()))


def compile_error(step_name: str, found: str) -> TorchDistributedCompileError:
    """The error for a step whose Metaflow-built command, job or workflow is not the shape this
    release knows (`found` says what was not): Metaflow's internals moved."""
    return TorchDistributedCompileError(
        step_name, "%s. Metaflow built the step in a way this release of "
        "metaflow-torch-distributed does not know how to make a gang of: its internals differ "
        "from the tested Metaflow %s. Install a tested version (pip install 'metaflow%s'); if "
        "yours is in that range, report this message." % (found, tested_range(), tested_range()))
