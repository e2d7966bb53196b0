"""What each node of a gang reports of itself at the rendezvous (versions, the code package,
its GPUs), and the verdict on a node that differs from node 0: pure data and pure functions,
tested by tables. Gathering the facts is mf/nodefacts.py's; the exchange is the control
plane's (runtime/control.py); the check runs in each node agent before it starts a rank
(gang/agent.py), so a node that differs never runs the step's code."""

import dataclasses
from typing import Any, Dict, List, Mapping, Optional, Tuple

# The facts, in the order a refusal names them, each with how the message names it.
FIELDS = (
    ("python", "Python"),
    ("torch", "torch"),
    ("cuda", "CUDA (torch.version.cuda)"),
    ("nccl", "NCCL"),
    ("package", "metaflow-torch-distributed"),
    ("metaflow", "Metaflow"),
    ("code", "the code package (METAFLOW_CODE_SHA)"),
    ("gpus", "visible GPUs"),
)
LABELS = dict(FIELDS)


@dataclasses.dataclass(frozen=True)
class NodeFacts:
    """What one node runs with: versions as their modules say them (None: not there, e.g. no
    CUDA in a CPU build of torch), the code package's sha (None where the step runs from the
    local tree) and how many GPUs the node's processes may use."""

    python: str
    torch: str
    cuda: Optional[str]
    nccl: Optional[str]
    package: str
    metaflow: str
    code: Optional[str]
    gpus: int

    def to_dict(self) -> Mapping[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeFacts":
        """Facts read back from their JSON form; fields a release did not send are None."""
        found: Dict[str, Any] = {f.name: data.get(f.name) for f in dataclasses.fields(cls)}
        return cls(**found)

    def changed(self, overrides: Mapping[str, Any]) -> "NodeFacts":
        """These facts with `overrides` ({field: value}) in place of their own."""
        unknown = sorted(set(overrides) - set(LABELS))
        if unknown:
            raise ValueError("no such fact of a node: %s (the facts: %s)"
                             % (", ".join(unknown), ", ".join(LABELS)))
        return dataclasses.replace(self, **overrides)


Difference = Tuple[str, Any, Any]  # (field, node 0's value, the node's value)


def differences(reference: NodeFacts, node: NodeFacts) -> List[Difference]:
    """Where `node` differs from `reference` (node 0's facts), in FIELDS' order."""
    return [(name, getattr(reference, name), getattr(node, name)) for name, _ in FIELDS
            if getattr(reference, name) != getattr(node, name)]


def gpu_shortfall(node: NodeFacts, accelerator: str, nproc_per_node: int) -> Optional[Difference]:
    """("gpus", what the topology needs, what the node shows) when a node of a GPU gang shows
    fewer GPUs than the processes the topology gives each node; None otherwise."""
    if accelerator == "cuda" and node.gpus < nproc_per_node:
        return ("gpus", nproc_per_node, node.gpus)
    return None


def _shown(value: Any) -> str:
    return "none" if value is None else str(value)


def refusal(node: int, found: List[Difference], shortfall: Optional[Difference],
            topology: str) -> str:
    """Why node `node` refuses to start its ranks, after its name (a Failure's message: "node
    N " comes before it): each field that differs, with its value and node 0's, and a GPU
    count short of `topology` (Topology.describe()); and what to do."""
    said = ["%s %s on node %d, %s on node 0" % (LABELS[name], _shown(theirs), node,
                                                _shown(ours))
            for name, ours, theirs in found]
    if shortfall is not None:
        said.append("%d visible GPUs on node %d, where the gang (%s) runs %d processes per "
                    "node, one GPU each" % (shortfall[2], node, topology, shortfall[1]))
    return ("differs from node 0: %s. It started none of its ranks. Every node of a gang must "
            "run the same image (the same Python, torch, CUDA, NCCL, Metaflow and "
            "metaflow-torch-distributed), the same code package and as many GPUs as the "
            "others: run the step again, and if it comes back, fix the image or the machine "
            "type of the node's job" % "; ".join(said))
