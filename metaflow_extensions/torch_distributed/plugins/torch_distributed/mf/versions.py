"""The Metaflow versions whose internals this package relies on (spin-step, cli_args, the
task_decorate order). Outside the tested range we stop with a clear message instead of
failing in some obscure way halfway through a gang.

The package does not depend on a Metaflow distribution (setup.py): Metaflow comes as
`metaflow` or as Outerbounds' `ob-metaflow` (2.19.39.1 is Metaflow 2.19.39 with Outerbounds'
changes), and this check, not pip, keeps the version in range (core/supported.py holds it)."""

from ..core.errors import TorchDistributedEnvironmentError
from ..core.supported import metaflow_version_supported, tested_range
from ..mf import internals


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
