"""rank_env against the table of reference/torch_env.md ("Recommendation"), and its helpers."""

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.envcontract import (
    Rendezvous,
    foreign_launcher_vars,
    node_gpu_block,
    parse_visible_devices,
    rank_env,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

RDZV = Rendezvous("10.0.0.5", 29511, "1700-train-3-1", restart_count=1)


def test_two_nodes_by_four_node_1_local_rank_2_matches_the_reference_table():
    env = rank_env(Topology(2, 4), 1, 2, RDZV, accelerator="cpu",
                   error_file="/tmp/gang/error-rank-6.json", base_env={}, cpu_count=16)
    assert env == {
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29511",
        "WORLD_SIZE": "8",
        "RANK": "6",
        "LOCAL_RANK": "2",
        "LOCAL_WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_RANK": "6",
        "ROLE_WORLD_SIZE": "8",
        "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": "1700-train-3-1",
        "TORCHELASTIC_RESTART_COUNT": "1",
        "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_ERROR_FILE": "/tmp/gang/error-rank-6.json",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "PL_TRAINER_NUM_NODES": "2",
        "PL_TRAINER_DEVICES": "4",
        "PL_TRAINER_ACCELERATOR": "cpu",
        "LT_NUM_NODES": "2",
        "LT_DEVICES": "4",
        "LT_ACCELERATOR": "cpu",
        "ACCELERATE_USE_CPU": "true",
        "OMP_NUM_THREADS": "4",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "JSONARGPARSE_DEFAULT_ENV": "true",
        **{"PL_%sTRAINER__%s" % (prefix, arg): value
           for prefix in ("", "FIT__", "VALIDATE__", "TEST__", "PREDICT__")
           for arg, value in (("NUM_NODES", "2"), ("DEVICES", "4"), ("ACCELERATOR", "cpu"))},
    }


@pytest.mark.parametrize("nodes,nproc", [(1, 1), (2, 2), (3, 4)])
def test_every_rank_of_a_gang_is_distinct_and_consistent(nodes, nproc):
    topo = Topology(nodes, nproc)
    envs = [rank_env(topo, n, l, RDZV) for n in range(nodes) for l in range(nproc)]
    assert [e["RANK"] for e in envs] == [str(r) for r in range(nodes * nproc)]
    assert [e["NODE_RANK"] for e in envs] == [e["GROUP_RANK"] for e in envs]
    assert [int(e["LOCAL_RANK"]) for e in envs] == list(range(nproc)) * nodes
    for key in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
                "GROUP_WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        assert len({e[key] for e in envs}) == 1, key
    assert envs[0]["WORLD_SIZE"] == str(nodes * nproc)


def test_every_value_is_a_string():
    env = rank_env(Topology(2, 2), 1, 1, RDZV, accelerator="cuda", error_file="/e",
                   cuda_visible_devices="2,3")
    assert all(isinstance(v, str) for v in env.values()), env


@pytest.mark.parametrize("cpu_count,nproc,expected", [(16, 4, "4"), (2, 4, "1"), (7, 2, "3"),
                                                      (1, 1, "1")])
def test_omp_num_threads_shares_the_cores_when_unset(cpu_count, nproc, expected):
    env = rank_env(Topology(1, nproc), 0, 0, RDZV, base_env={"PATH": "/bin"},
                   cpu_count=cpu_count)
    assert env["OMP_NUM_THREADS"] == expected


def test_omp_num_threads_is_left_alone_when_the_user_set_it():
    env = rank_env(Topology(1, 4), 0, 0, RDZV, base_env={"OMP_NUM_THREADS": "8"}, cpu_count=16)
    assert "OMP_NUM_THREADS" not in env


@pytest.mark.parametrize("name", ["TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE"])
def test_a_flight_recorder_size_the_user_set_is_kept(name):
    env = rank_env(Topology(1, 2), 0, 0, RDZV, base_env={name: "0"})
    assert "TORCH_FR_BUFFER_SIZE" not in env


def test_cpu_only_variables_on_cpu():
    env = rank_env(Topology(1, 2), 0, 1, RDZV, accelerator="cpu")
    assert env["ACCELERATE_USE_CPU"] == "true"
    assert env["PL_TRAINER_ACCELERATOR"] == "cpu"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in env


def test_cuda_gets_nccl_error_handling_and_no_cpu_flags():
    env = rank_env(Topology(1, 2), 0, 1, RDZV, accelerator="cuda", cuda_visible_devices="4,5")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "4,5"
    for key in ("ACCELERATE_USE_CPU", "PL_TRAINER_ACCELERATOR", "LT_ACCELERATOR"):
        assert key not in env


def test_cuda_keeps_the_users_nccl_error_handling():
    env = rank_env(Topology(1, 2), 0, 1, RDZV, accelerator="cuda",
                   base_env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"})
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "0"


def test_lightning_cli_reads_the_gang_shape_from_its_own_variables():
    env = rank_env(Topology(2, 3), 1, 0, RDZV, accelerator="cuda")
    assert env["JSONARGPARSE_DEFAULT_ENV"] == "true"
    assert env["PL_TRAINER__NUM_NODES"] == "2" and env["PL_TRAINER__DEVICES"] == "3"
    for sub in ("FIT", "VALIDATE", "TEST", "PREDICT"):
        assert env["PL_%s__TRAINER__NUM_NODES" % sub] == "2"
        assert env["PL_%s__TRAINER__DEVICES" % sub] == "3"
    assert not [k for k in env if k.endswith("TRAINER__ACCELERATOR")]


def test_lightning_cli_env_parsing_left_alone_when_the_user_set_it():
    env = rank_env(Topology(2, 2), 0, 0, RDZV, base_env={"JSONARGPARSE_DEFAULT_ENV": "false"})
    assert "JSONARGPARSE_DEFAULT_ENV" not in env


def test_cuda_visible_devices_untouched_unless_given():
    assert "CUDA_VISIBLE_DEVICES" not in rank_env(Topology(1, 2), 0, 0, RDZV, accelerator="cuda")


def test_every_rank_is_a_client_of_the_store_node_0_hosts():
    for local_rank in (0, 1):
        env = rank_env(Topology(1, 2), 0, local_rank, Rendezvous("h", 1, "g"))
        assert env["TORCHELASTIC_USE_AGENT_STORE"] == "True"


def test_error_file_only_when_given():
    assert "TORCHELASTIC_ERROR_FILE" not in rank_env(Topology(1, 1), 0, 0, RDZV)


def test_rank_env_does_not_modify_base_env():
    base = {"OMP_NUM_THREADS": "3", "PATH": "/bin"}
    rank_env(Topology(1, 2), 0, 0, RDZV, accelerator="cuda", base_env=base)
    assert base == {"OMP_NUM_THREADS": "3", "PATH": "/bin"}


def test_foreign_launcher_vars():
    base = {
        "SLURM_JOB_ID": "1", "SLURM_NTASKS": "4", "OMPI_COMM_WORLD_RANK": "0", "PMI_RANK": "0",
        "PMIX_RANK": "0", "MV2_COMM_WORLD_RANK": "0", "LSB_JOBID": "9",
        "JSM_NAMESPACE_RANK": "0", "PATH": "/bin", "MY_SLURM_NOTE": "x", "RANK": "3",
        "HOME": "/root",
    }
    assert foreign_launcher_vars(base) == [
        "JSM_NAMESPACE_RANK", "LSB_JOBID", "MV2_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK",
        "PMIX_RANK", "PMI_RANK", "SLURM_JOB_ID", "SLURM_NTASKS",
    ]
    assert foreign_launcher_vars({"PATH": "/bin"}) == []


def test_node_gpu_blocks_are_disjoint_for_two_nodes_of_two():
    ids = ["0", "1", "2", "3"]
    blocks = [node_gpu_block(n, 2, ids, 2) for n in range(2)]
    assert blocks == ["0,1", "2,3"]


def test_node_gpu_block_follows_the_visible_ids_not_their_positions():
    assert node_gpu_block(1, 2, ["4", "5", "6", "7"], 2) == "6,7"


def test_node_gpu_block_is_none_for_a_single_node():
    assert node_gpu_block(0, 4, ["0", "1", "2", "3"], 1) is None


def test_node_gpu_block_too_few_gpus_is_a_clear_error():
    with pytest.raises(ValueError) as info:
        node_gpu_block(1, 2, ["0", "1", "2"], 2)
    message = str(info.value)
    assert "node 1" in message and "2..3" in message and "3 GPUs" in message


@pytest.mark.parametrize("value,count,expected", [
    (None, 4, ["0", "1", "2", "3"]),
    (None, 0, []),
    ("2,3", 8, ["2", "3"]),
    (" 1 , 2 ", 4, ["1", "2"]),
    ("", 4, []),
    ("-1", 4, []),
    ("0,-1,1", 4, ["0"]),
    ("1,,2", 4, ["1"]),
    ("GPU-8f1c,GPU-77a0", 2, ["GPU-8f1c", "GPU-77a0"]),
])
def test_parse_visible_devices(value, count, expected):
    assert parse_visible_devices(value, count) == expected
