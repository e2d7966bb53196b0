"""Every backend, in the order the decorator asks them (backends.base.Backend)."""

from typing import Dict, Mapping, Optional, Tuple

from ..core.errors import TorchDistributedEnvironmentError
from ..core.gangspec import NodeZero, TaskIdentity
from . import argo, batch, kubernetes, local, slurm, stepfunctions
from .base import Backend, GangStep

# The local backend last: it places node 0 of any gang no other backend placed.
BACKENDS: Tuple[Backend, ...] = (batch.BACKEND, kubernetes.BACKEND, stepfunctions.BACKEND,
                                 argo.BACKEND, slurm.BACKEND, local.BACKEND)
_BY_NAME: Dict[str, Backend] = {b.name: b for b in BACKENDS}


def by_name(step_name: str, name: str) -> Backend:
    """The backend called `name` (an Attempt's or AgentOrder's)."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TorchDistributedEnvironmentError(
            step_name, "this node was started for backend %r, which this release of "
            "@torch_distributed does not know (it knows %s): node 0 and this node run different "
            "releases. Install the same release everywhere." % (name, ", ".join(sorted(_BY_NAME))))


def launch_env(step: GangStep) -> Dict[str, str]:
    """What every backend sets on the step's command for an attempt it runs."""
    env: Dict[str, str] = {}
    for backend in BACKENDS:
        env.update(backend.launch_env(step))
    return env


def install(step: GangStep, environ: Mapping[str, str], deploy_target: Optional[str]) -> None:
    """Let every backend install what it builds for `step` in this process."""
    for backend in BACKENDS:
        backend.install(step, environ, deploy_target)


def node_zero(step: GangStep, environ: Mapping[str, str], identity: TaskIdentity) -> NodeZero:
    """Where node 0 of `step`'s gang (this task) hosts its store: the first backend that
    placed it; the local backend, last, places every node 0 the others did not."""
    placed = (backend.node_zero(step, environ, identity) for backend in BACKENDS)
    return next(place for place in placed if place is not None)
