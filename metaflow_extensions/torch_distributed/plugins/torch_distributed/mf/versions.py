"""The Metaflow versions whose internals this package relies on (spin-step, cli_args, the
task_decorate order). Outside the tested range we stop with a clear message instead of
failing in some obscure way halfway through a gang.

The package does not depend on a Metaflow distribution (setup.py): Metaflow comes as
`metaflow` or as Outerbounds' `ob-metaflow` (2.19.39.1 is Metaflow 2.19.39 with Outerbounds'
changes), and this check, not pip, keeps the version in range (core/supported.py holds it)."""

import importlib.metadata
import sys
from typing import Optional

from ..core.errors import TorchDistributedEnvironmentError
from ..core.supported import (
    TESTED_TORCH,
    metaflow_version_supported,
    tested_range,
    torch_version_verdict,
)
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


def installed_torch() -> Optional[str]:
    """The version of the torch installed here, read from its distribution's metadata (no
    import: the launcher of a flow need not pay for one); None if none is installed."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_torch_version(step_name: str, found: Optional[str], where: str) -> None:
    """Refuse a torch older than the tested range (it lacks what the gang relies on: the
    legacy and libuv stores' shapes, process groups' sequence numbers, ...); name a newer one
    in a warning, once, and run. `where` says whose torch it is: 'here', 'in the image'."""
    if found is None:
        return
    verdict = torch_version_verdict(found)
    torch_range = tested_range(TESTED_TORCH)
    if verdict == "older":
        raise TorchDistributedEnvironmentError(
            step_name,
            "torch %s is installed %s, but metaflow-torch-distributed needs torch %s (the "
            "releases its real flows are tested on, oldest to newest; older ones lack parts "
            "of torch.distributed the gang relies on). Install a tested torch, e.g. "
            "pip install 'torch%s', in the environment the step runs in." % (
                found, where, torch_range, torch_range))
    if verdict == "newer":
        print("@torch_distributed on step *%s*: WARNING: torch %s (installed %s) is newer "
              "than the releases this version of metaflow-torch-distributed is tested with "
              "(torch %s). It runs; if the gang misbehaves, pin a tested torch and report "
              "the difference." % (step_name, found, where, torch_range),
              file=sys.stderr, flush=True)
