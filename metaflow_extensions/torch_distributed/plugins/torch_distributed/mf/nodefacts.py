"""This node's facts for the rendezvous (core/nodefacts.py): gathered in a process that has
imported torch already (the task and every node agent import it before they start ranks), so
it costs no import; CUDA is never initialised (forking stays safe)."""

import importlib.metadata
import json
import platform
from typing import Any, Dict, Mapping, Optional

from ..core import devices
from ..core.errors import TorchDistributedConfigError
from ..core.nodefacts import LABELS, NodeFacts
from ..mf import internals

# For tests only: JSON {"<node>": {"<fact>": value}}, what node <node> reports of itself
# changed as given (a node with another torch or a GPU fewer, rehearsed on one machine:
# every node of a local gang runs this machine's Python and torch). docs/environment.md.
TEST_ENV = "METAFLOW_TORCH_DISTRIBUTED_TEST_NODE_FACTS"
# The code package's sha, which Metaflow's @batch and @kubernetes put in the environment of
# every container of a step's job (plugins/aws/batch/batch.py, plugins/kubernetes/
# kubernetes.py: environment_variable("METAFLOW_CODE_SHA", ...)); absent for a local run.
CODE_SHA_ENV = "METAFLOW_CODE_SHA"


def gather(step_name: str, node: int, environ: Mapping[str, str],
           cuda_visible_devices: Optional[str] = None) -> NodeFacts:
    """The facts of node `node` as this process sees them; `cuda_visible_devices` is what the
    gang gives the node's ranks where it chooses (a node emulated on a shared host)."""
    import torch

    if cuda_visible_devices is not None:
        environ = dict(environ, CUDA_VISIBLE_DEVICES=cuda_visible_devices)
    facts = NodeFacts(
        python=platform.python_version(),
        torch=str(torch.__version__),
        cuda=torch.version.cuda,
        nccl=_nccl(torch),
        package=_version("metaflow-torch-distributed"),
        metaflow=internals.metaflow_version(),
        code=environ.get(CODE_SHA_ENV) or None,
        gpus=len(devices.visible_gpu_ids(environ)),
    )
    return facts.changed(_test_overrides(step_name, environ).get(str(node), {}))


def _nccl(torch: Any) -> Optional[str]:
    """NCCL's version in this torch, or None without NCCL (a CPU build): the library's, known
    without a GPU or CUDA's initialisation."""
    import torch.distributed as dist

    if not dist.is_nccl_available():
        return None
    found = torch.cuda.nccl.version()
    return ".".join(map(str, found)) if isinstance(found, tuple) else str(found)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _test_overrides(step_name: str, environ: Mapping[str, str]) -> Dict[str, Dict[str, Any]]:
    raw = environ.get(TEST_ENV)
    if not raw:
        return {}
    problem: Optional[str] = None
    try:
        found: Any = json.loads(raw)
    except ValueError as ex:
        found, problem = None, str(ex)
    else:
        if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
            problem = "not an object of objects"
        else:
            unknown = sorted({k for v in found.values() for k in v} - set(LABELS))
            problem = "no such fact: %s" % ", ".join(unknown) if unknown else None
    if problem is not None:
        raise TorchDistributedConfigError(
            step_name, "%s=%r is not what it takes (%s): a JSON object such as "
            "'{\"1\": {\"torch\": \"2.5.1\"}}', the facts node 1 reports changed, for tests "
            "only; the facts are %s. Unset it." % (TEST_ENV, raw, problem, ", ".join(LABELS)))
    return dict(found)
