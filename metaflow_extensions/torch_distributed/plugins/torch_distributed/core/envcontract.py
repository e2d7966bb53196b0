"""The environment of one rank: what torch, torchrun-aware code, Lightning, Fabric, Accelerate
and fastai read to find their place in the gang.

Pure: a function of plain data. The facts behind each variable are in
shared/reference/torch_env.md ("Recommendation"); docs/environment.md documents them for users.
"""

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence

from .topology import Topology

# Variables a launcher of another kind may have leaked into our environment; left in place they
# make Lightning or Accelerate detect SLURM, MPI or LSF instead of us.
FOREIGN_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "LSB_", "JSM_NAMESPACE_")
# LightningCLI without subcommands (run=False), then each of its subcommands.
LIGHTNING_CLI_PREFIXES = ("", "FIT__", "VALIDATE__", "TEST__", "PREDICT__")
# torch's Flight Recorder's size (its name since torch 2.7, and NCCL's older one): a user's
# value of either is kept; else the ranks keep torch's default of later releases.
FLIGHT_RECORDER_VARS = {"TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"}
FLIGHT_RECORDER_ENTRIES = "2000"


@dataclass(frozen=True)
class Rendezvous:
    """Where and under which identity a gang meets."""

    master_addr: str
    master_port: int
    gang_id: str
    restart_count: int = 0
    max_restarts: int = 0


def rank_env(topology: Topology, node: int, local_rank: int, rendezvous: Rendezvous,
             accelerator: str = "cpu", error_file: Optional[str] = None,
             cuda_visible_devices: Optional[str] = None,
             base_env: Optional[Mapping[str, str]] = None, cpu_count: int = 1,
             loopback_interface: Optional[str] = None,
             node_interface: Optional[str] = None) -> Dict[str, str]:
    """The variables to set for (node, local_rank); `base_env` is the environment they go into,
    read only to honour what the user set there already. `loopback_interface` (the name of
    this host's loopback interface) is given when every node runs on this host: gloo then
    listens there, not on the address the host name resolves to. `node_interface` (the
    interface that reaches node 0, on a node of a backend that names it) is gloo's and NCCL's
    where the user set neither."""
    base_env = base_env or {}
    nodes, nproc = topology.nodes, topology.nproc_per_node
    rank = topology.rank(node, local_rank)
    world = topology.world_size
    env = {
        "MASTER_ADDR": rendezvous.master_addr,
        "MASTER_PORT": str(rendezvous.master_port),
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(nproc),
        "NODE_RANK": str(node),
        "GROUP_RANK": str(node),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(rank),
        "ROLE_WORLD_SIZE": str(world),
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": rendezvous.gang_id,
        "TORCHELASTIC_RESTART_COUNT": str(rendezvous.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(rendezvous.max_restarts),
        # Lightning: a bare Trainer() / Fabric() gets the gang's shape.
        "PL_TRAINER_NUM_NODES": str(nodes),
        "PL_TRAINER_DEVICES": str(nproc),
        "LT_NUM_NODES": str(nodes),
        "LT_DEVICES": str(nproc),
    }
    trainer = {"NUM_NODES": str(nodes), "DEVICES": str(nproc)}
    # node 0's supervisor hosts the TCPStore: every rank, rank 0 included, is a client of it
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True"
    if error_file:
        env["TORCHELASTIC_ERROR_FILE"] = error_file
    if accelerator == "cpu":
        # Without it Accelerate runs every CPU process alone (DistributedType.NO).
        env["ACCELERATE_USE_CPU"] = "true"
        env["PL_TRAINER_ACCELERATOR"] = "cpu"
        env["LT_ACCELERATOR"] = "cpu"
        trainer["ACCELERATOR"] = "cpu"
    else:
        env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = base_env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    env.update(lightning_cli_env(trainer))
    if "JSONARGPARSE_DEFAULT_ENV" not in base_env:
        # LightningCLI passes every Trainer argument explicitly, so PL_TRAINER_* never reach
        # it; with jsonargparse's environment parsing on, it reads the variables above.
        env["JSONARGPARSE_DEFAULT_ENV"] = "true"
    if cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = cuda_visible_devices
    if loopback_interface and "GLOO_SOCKET_IFNAME" not in base_env:
        env["GLOO_SOCKET_IFNAME"] = loopback_interface
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        if node_interface and name not in base_env and name not in env:
            env[name] = node_interface
    if not FLIGHT_RECORDER_VARS & set(base_env):
        # torch's Flight Recorder (each rank's last collectives, in the hang report):
        # torch 2.10 and later keep it by default for gloo; 2.9 only when asked
        env["TORCH_FR_BUFFER_SIZE"] = FLIGHT_RECORDER_ENTRIES
    if "OMP_NUM_THREADS" not in base_env:
        env["OMP_NUM_THREADS"] = str(max(1, cpu_count // nproc))
    return env


def lightning_cli_env(trainer_args: Mapping[str, str]) -> Dict[str, str]:
    """LightningCLI's names for Trainer arguments: PL_TRAINER__<ARG> for LightningCLI(run=False)
    and PL_<SUBCOMMAND>__TRAINER__<ARG> for each subcommand. They are defaults: a config file
    or a --trainer.* argument still wins."""
    return {"PL_%sTRAINER__%s" % (prefix, arg): value
            for prefix in LIGHTNING_CLI_PREFIXES for arg, value in trainer_args.items()}


def foreign_launcher_vars(base_env: Mapping[str, str]) -> List[str]:
    """Names of leaked launcher variables to remove from a rank's environment."""
    return sorted(k for k in base_env if k.startswith(FOREIGN_LAUNCHER_PREFIXES))


def node_gpu_block(node: int, nproc_per_node: int, visible_ids: Sequence[str],
                   nodes_on_host: int) -> Optional[str]:
    """CUDA_VISIBLE_DEVICES for an emulated node sharing a host with other nodes.

    Every rank of a node sees all of its node's GPUs (Lightning and torch.cuda.set_device index
    them by LOCAL_RANK); nodes on one host get disjoint blocks so NCCL never sees a GPU twice.
    Returns None when the host has a single node and nothing needs masking.
    """
    if nodes_on_host <= 1:
        return None
    block = visible_ids[node * nproc_per_node:(node + 1) * nproc_per_node]
    if len(block) < nproc_per_node:
        raise ValueError(
            "node %d needs GPUs %d..%d but the host shows %d GPUs"
            % (node, node * nproc_per_node, (node + 1) * nproc_per_node - 1, len(visible_ids))
        )
    return ",".join(block)


def parse_visible_devices(value: Optional[str], device_count: int) -> List[str]:
    """The list of GPU ids visible to a process, from CUDA_VISIBLE_DEVICES and the device count."""
    if value is None:
        return [str(i) for i in range(device_count)]
    visible = []
    for item in (v.strip() for v in value.split(",")):
        if not item or item.startswith("-"):
            break  # CUDA stops at the first invalid entry: "0,-1,1" shows device 0 only
        visible.append(item)
    return visible
