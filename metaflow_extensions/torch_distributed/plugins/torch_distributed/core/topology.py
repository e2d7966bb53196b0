"""The shape of a gang: how many nodes, how many processes per node, which rank is where.

Pure: no metaflow, torch or os.environ. `plan_topology` turns the decorator's attributes and
what the step asks for into a Topology, or raises ValueError with the arithmetic spelled out
(the decorator wraps it with the step's name).
"""

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class Topology:
    nodes: int
    nproc_per_node: int

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def rank(self, node: int, local_rank: int) -> int:
        return node * self.nproc_per_node + local_rank

    def ranks_of(self, node: int) -> range:
        return range(node * self.nproc_per_node, (node + 1) * self.nproc_per_node)

    def locate(self, rank: int) -> Tuple[int, int]:
        """(node, local_rank) of a global rank."""
        return divmod(rank, self.nproc_per_node)

    def describe(self) -> str:
        return "%d node%s x %d process%s per node = world size %d" % (
            self.nodes,
            "" if self.nodes == 1 else "s",
            self.nproc_per_node,
            "" if self.nproc_per_node == 1 else "es",
            self.world_size,
        )


ATTRIBUTES = ("world_size", "nodes", "nproc_per_node")
# torchrun's words for --nproc-per-node that the decorator accepts (torch.distributed.run's
# determine_local_world_size): "gpu" one process per GPU, "auto" per GPU, else per CPU.
NPROC_WORDS = ("gpu", "auto")
# The torch.distributed backend for the gang's device, as the plan names it.
BACKENDS = {"cpu": "gloo", "cuda": "nccl"}


def plan_line(step_name: str, topology: Topology, accelerator: str,
              emulated: bool = False) -> str:
    """What a gang prints when it starts, e.g. `train: 1 node x 4 processes = world size 4
    (CPU, gloo)`; `emulated` says that its several nodes all run on this machine."""
    where = "%s, %s" % (accelerator.upper(), BACKENDS[accelerator])
    if emulated and topology.nodes > 1:
        where += "; the %d nodes emulated on this machine" % topology.nodes
    return "%s: %d node%s x %d process%s = world size %d (%s)" % (
        step_name,
        topology.nodes,
        "" if topology.nodes == 1 else "s",
        topology.nproc_per_node,
        "" if topology.nproc_per_node == 1 else "es",
        topology.world_size,
        where,
    )


def _check_count(name: str, value: object) -> Optional[int]:
    if value is None:
        return None
    # bool is an int in Python; True processes is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int):
        words = ' (or "gpu" or "auto", as torchrun takes them)' if name == "nproc_per_node" \
            else ""
        raise ValueError(
            "%s=%r is not a whole number. Give a positive integer%s, e.g. %s=2."
            % (name, value, words, name)
        )
    if value < 1:
        raise ValueError(
            "%s=%d must be at least 1. Give a positive integer, e.g. %s=2."
            % (name, value, name)
        )
    return value


def _nproc_word(word: str, gpus: Optional[int], gpu_source: Optional[str],
                cpus: Optional[int], cpu_source: Optional[str]) -> Tuple[int, str]:
    """(processes per node, where they came from) for torchrun's nproc_per_node="gpu" or
    "auto": the node's GPUs as the default counts them; "auto" without GPUs, its CPUs."""
    if gpus:
        return gpus, 'nproc_per_node="%s": %s' % (word, gpu_source or "%d GPUs" % gpus)
    if word == "gpu":
        raise ValueError(
            'nproc_per_node="gpu" means one process per GPU (as torchrun\'s --nproc-per-node=gpu)'
            ", but the step asks for no GPUs (no gpu= on @resources, @batch or @kubernetes) and "
            "this machine shows none. Ask for them with @resources(gpu=N), give a number "
            '(nproc_per_node=2), or write nproc_per_node="auto" for one process per CPU when '
            "there are no GPUs.")
    if not cpus:
        raise ValueError('nproc_per_node="auto" found neither GPUs nor a CPU count. Give a '
                         "number of processes per node, e.g. nproc_per_node=2.")
    return cpus, 'nproc_per_node="auto": no GPUs, %s' % (cpu_source or "%d CPUs" % cpus)


def plan_topology(world_size: object = None, nodes: object = None, nproc_per_node: object = None,
                  gpus: Optional[int] = None, gpu_source: Optional[str] = None,
                  cpus: Optional[int] = None, cpu_source: Optional[str] = None) -> Topology:
    """The Topology of a gang.

    `gpus` is the GPU count per node that the step asks for (from @resources, @batch or
    @kubernetes) or, failing that, that the machine shows; `gpu_source` names where it came from.
    One rule, local or remote: processes per node default to `gpus`, and nodes to
    world_size / nproc_per_node. Without GPUs, all of world_size runs on one node unless `nodes`
    is given (then world_size / nodes per node, or 1 without world_size). `cpus` (and
    `cpu_source`) is a node's CPU count, which only nproc_per_node="auto" reads.
    """
    world_size = _check_count("world_size", world_size)
    nodes = _check_count("nodes", nodes)
    word = nproc_per_node if nproc_per_node in NPROC_WORDS else None
    nproc_per_node = None if word else _check_count("nproc_per_node", nproc_per_node)

    # where nproc_per_node came from, for the messages below
    if word:
        nproc_per_node, source = _nproc_word(str(word), gpus, gpu_source, cpus, cpu_source)
    elif nproc_per_node is not None:
        source = "nproc_per_node=%d" % nproc_per_node
        if gpus and nproc_per_node > gpus and gpu_source and gpu_source.startswith("@"):
            raise ValueError(
                "nproc_per_node=%d asks for more processes per node than the %d GPUs of %s: "
                "ranks would share GPUs. Set nproc_per_node=%d or ask for more GPUs."
                % (nproc_per_node, gpus, gpu_source, gpus)
            )
    elif nodes is not None and world_size is not None:
        if world_size % nodes:
            raise ValueError(
                "world_size=%d is not divisible by nodes=%d (%d / %d = %.2f processes per "
                "node). Make world_size a multiple of nodes."
                % (world_size, nodes, world_size, nodes, world_size / nodes)
            )
        nproc_per_node = world_size // nodes
        source = "world_size=%d / nodes=%d" % (world_size, nodes)
        if gpus and gpu_source and gpu_source.startswith("@") and nproc_per_node != gpus:
            raise ValueError(
                "world_size=%d / nodes=%d = %d processes per node, but %s gives each node %d "
                "GPUs. Drop nodes (it is inferred), or make world_size = nodes x %d = %d."
                % (world_size, nodes, nproc_per_node, gpu_source, gpus, gpus, nodes * gpus)
            )
    elif gpus:
        nproc_per_node = gpus
        source = gpu_source or "%d GPUs" % gpus
    elif world_size is not None and nodes is None:
        # No GPUs to spread over machines: a user who asks for N processes means N processes
        # on this node, not N emulated nodes. Several nodes only when `nodes` says so.
        nproc_per_node = world_size
        source = "world_size=%d on one node (no GPUs requested or visible)" % world_size
    else:
        nproc_per_node = 1
        source = "default of 1 process per node (no GPUs requested or visible)"

    if nodes is None:
        if world_size is None:
            nodes = 1
        elif world_size % nproc_per_node:
            raise ValueError(
                "world_size=%d is not divisible by %d processes per node (from %s): "
                "%d / %d = %.2f nodes. Make world_size a multiple of %d, or set "
                "nproc_per_node." % (
                    world_size, nproc_per_node, source, world_size, nproc_per_node,
                    world_size / nproc_per_node, nproc_per_node,
                )
            )
        else:
            nodes = world_size // nproc_per_node

    if world_size is not None and nodes * nproc_per_node != world_size:
        raise ValueError(
            "nodes=%d x %d processes per node (from %s) = %d, not world_size=%d. "
            "Give any two of world_size, nodes and nproc_per_node that agree, or just one."
            % (nodes, nproc_per_node, source, nodes * nproc_per_node, world_size)
        )
    return Topology(nodes, nproc_per_node)
