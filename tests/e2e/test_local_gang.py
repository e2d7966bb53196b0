"""Real flows through `python flow.py run` on the local backend (CPU, gloo)."""

import json
import os
import re
from pathlib import Path

import pytest

TRAIN = "t = Flow('GangFlow').latest_run['train'].task\n"
INTRUDER = str(Path(__file__).parent.parent / "intruder.py")


def test_two_nodes_two_processes_all_reduce(flow_runner):
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 2})
    assert res.returncode == 0, res
    got = flow_runner.client(TRAIN + (
        "run = t.parent.parent\n"
        "result = dict(total=t['total'].data, rank=t['rank_seen'].data, envs=t['envs'].data,\n"
        "              info=t['info'].data, frozen=t['frozen'].data,\n"
        "              tasks=[len(list(run[s])) for s in ('start', 'train', 'end')])"))
    assert got["total"] == 1 + 2 + 3 + 4
    assert got["rank"] == 0
    envs = got["envs"]
    assert [e["RANK"] for e in envs] == ["0", "1", "2", "3"]
    assert [e["NODE_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["GROUP_RANK"] for e in envs] == ["0", "0", "1", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1", "0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["LOCAL_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["GROUP_WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["MASTER_ADDR"] for e in envs} == {"127.0.0.1"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    assert len({e["TORCHELASTIC_RUN_ID"] for e in envs}) == 1
    assert got["info"] == dict(rank=0, local_rank=0, world_size=4, local_world_size=2,
                               node_rank=0, num_nodes=2, is_main=True, device="cpu",
                               master_port=int(envs[0]["MASTER_PORT"]))
    # every rank, of node 0 and of the node its agent forked, runs with the objects its task
    # loaded (torch, Metaflow) frozen out of the collector: the task froze them before forking
    assert len(got["frozen"]) == 4 and min(got["frozen"]) > 10000, got["frozen"]
    # members are invisible: one task per step
    assert got["tasks"] == [1, 1, 1]
    # the plan, printed when the gang starts
    assert "train: 2 nodes x 2 processes = world size 4 (CPU, gloo; the 2 nodes emulated on " \
        "this machine)" in res.output, res
    # every rank's output reached the console, prefixed with its rank
    for rank in range(4):
        assert "[rank %d] hello from rank %d" % (rank, rank) in res.output
        assert "[rank %d] stderr of rank %d" % (rank, rank) in res.output


@pytest.mark.parametrize("nodes, nproc", [(1, 4), (2, 2)])
def test_an_outside_process_with_the_gang_address_can_neither_steer_it_nor_run_code_in_it(
        flow_runner, nodes, nproc):
    """An outside process given only MASTER_ADDR and MASTER_PORT lists the store's keys and
    forges an abort, check-ins, done, a failure and every other rank's gather value (a pickle
    with a side effect) while the gang runs (tests/intruder.py): the gang finishes with the
    right values, the pickle is never loaded, and the log says how many it ignored."""
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": nodes, "TD_NPROC": nproc,
                                               "TD_INTRUDER": INTRUDER})
    assert res.returncode == 0, res
    seen = json.loads((flow_runner.marks / "intruder.json").read_text())
    assert "mftd/abort" in seen["wrote"] and "mftd/gang" in seen["keys"], seen
    # no key name carries the secret (a run of hex digits as long as a secret or its half)
    assert not [k for k in seen["keys"] if re.search("[0-9a-f]{32}", k)], seen["keys"]
    assert not (flow_runner.marks / "pwned").exists()  # the forged pickle was never loaded
    # torch's own records (the other ranks' gloo addresses) were there, each under the gang's
    # prefix of its round and none in the clear; rank 0's, planted as a copy of another's
    # before rank 0 wrote it, was waited past (issue 37)
    assert seen["torch_keys"] and seen["torch_clear"] == [], seen
    assert all(k.startswith("torch/r0/") for k in seen["torch_keys"]), seen["torch_keys"]
    envs = flow_runner.client(TRAIN + "result = t['envs'].data")
    assert [e["RANK"] for e in envs] == [str(r) for r in range(nodes * nproc)]
    assert flow_runner.client(TRAIN + "result = t['total'].data") == sum(
        range(1, nodes * nproc + 1))
    [said] = re.findall(r"The gang ignored (\d+) \((.*?)\) messages in its rendezvous store",
                        res.output)
    kinds = dict(part.rsplit(" ", 1) for part in said[1].split(", "))
    assert kinds["gather"] == str(nodes * nproc - 1), said  # rank 0 read every forged one
    if nodes > 1:  # node 0 watches node 1 through the store, node 1's agent watches the abort
        # (a forged check-in is read only while node 0 still waits for one: node 1's agent,
        # forked, has checked in before rank 0's body starts the intruder)
        assert {"abort", "failure"} <= set(kinds), said
    for word in ("ValueError: forged", "cannot reach node 0", "another job", "Traceback"):
        assert word not in res.output, res
    # every socket the gang listens on (its store, gloo's) is on the loopback address
    listening = flow_runner.client(TRAIN + "result = t['listening'].data")
    port = int(envs[0]["MASTER_PORT"])
    assert [port] == [p for _, p in listening if p == port], listening
    assert len(listening) > nodes * nproc and {a for a, _ in listening} == {"127.0.0.1"}, \
        listening

def test_logs_command_shows_every_rank(flow_runner):
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 1})
    assert res.returncode == 0, res
    task = flow_runner.client(TRAIN + "result = t.pathspec")
    run_step_task = "/".join(task.split("/")[1:])
    out = flow_runner.cli("gang_flow.py", "logs", run_step_task, "--stdout")
    err = flow_runner.cli("gang_flow.py", "logs", run_step_task, "--stderr")
    assert out.returncode == 0 and err.returncode == 0, (out, err)
    for rank in range(2):
        assert "[rank %d] hello from rank %d" % (rank, rank) in out.stdout
        assert "[rank %d] stderr of rank %d" % (rank, rank) not in out.stdout
        assert "[rank %d] stderr of rank %d" % (rank, rank) in err.stdout


def test_distributed_sampler_shards_disjointly_with_no_arguments(flow_runner):
    res = flow_runner.run("sampler_flow.py")
    assert res.returncode == 0, res
    got = flow_runner.client("t = Flow('SamplerFlow').latest_run['train'].task\n"
                             "result = dict(shards=t['shards'].data, world=t['world'].data)")
    shards = got["shards"]
    assert [len(s) for s in shards] == [16, 16, 16, 16]
    assert sorted(sum(shards, [])) == list(range(64))
    assert got["world"] == 4


def test_world_size_one_runs_in_the_task_alone(flow_runner):
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 1, "TD_NPROC": 1})
    assert res.returncode == 0, res
    assert flow_runner.client(TRAIN + "result = t['total'].data") == 1


def test_nodes_emulated_on_this_machine_share_its_cpus_among_their_ranks_threads(flow_runner):
    """OMP_NUM_THREADS divides the CPUs the run may use among every rank on this machine: two
    emulated nodes of one process each get half each, not each the whole machine."""
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.devices import (
        usable_cpus)

    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 1})
    assert res.returncode == 0, res
    share = max(1, usable_cpus()[0] // 2)
    assert flow_runner.client(TRAIN + "result = t['threads'].data") == [[str(share), share]] * 2


def test_a_cpu_limit_on_the_run_is_the_cpus_its_gang_plans_and_shares(flow_runner):
    """A run in a cgroup limited to 1 CPU (docker run --cpus=1, a pod's CPU limit) on a
    machine of more: nproc_per_node="auto" plans 1 process, not os.cpu_count()'s."""
    from tests.emulation import netns

    if os.geteuid() != 0 or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs root (to make a cpu cgroup) and a machine of 2 CPUs or more")
    group, why_not = netns.cpu_cgroup("mftd-test-cpu-%d" % os.getpid(), 1.0, None)
    if group is None:
        pytest.skip(why_not)
    out, code = flow_runner.run_in_cgroup(group, "gang_flow.py",
                                         {"TD_NODES": 1, "TD_NPROC": "auto"})
    assert code == 0, out[-6000:]
    assert "train: 1 node x 1 process = world size 1 (CPU, gloo)" in out, out[-6000:]
    assert flow_runner.client(TRAIN + "result = t['info'].data['world_size']") == 1


def test_gpu_topology_without_gpus_fails_with_the_fix(flow_runner):
    res = flow_runner.run("gpu_flow.py")
    assert res.returncode != 0
    assert "needs 2 GPUs" in res.output and "@resources(gpu=2)" in res.output, res
    assert "METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL=1" in res.output


def test_gpu_topology_rehearsed_on_cpu(flow_runner):
    res = flow_runner.run("gpu_flow.py", env={"METAFLOW_TORCH_DISTRIBUTED_CPU_REHEARSAL": 1})
    assert res.returncode == 0, res
    got = flow_runner.client("t = Flow('GpuFlow').latest_run['train'].task\n"
                             "result = [t['world'].data, t['devices'].data]")
    assert got == [2, ["cpu", "cpu"]]


def test_node_0_fails_a_gang_whose_store_holds_more_keys_than_it_may(flow_runner):
    """Node 0 watches its store's key count (issue 37: a flood of the store): here a limit
    lowered below what the gang itself writes, so that the gang's own keys trip it."""
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 1, "TD_NPROC": 2,
                                               "METAFLOW_TORCH_DISTRIBUTED_STORE_MAX_KEYS": 2})
    assert res.returncode != 0, res
    assert "the store was flooded: it holds" in res.output, res
    assert "more than the 2 any gang of this size writes" in res.output, res


@pytest.mark.parametrize("version, refused", [("2.4.1", True), ("2.99.0", False)])
def test_the_ranks_torch_is_checked_as_the_run_starts(flow_runner, tmp_path, version, refused):
    """Where Python finds a torch older than the tested range (here a distribution record put
    first on the path, as an environment with an old torch has) the run stops before its first
    step, naming the version and the fix; a newer one runs, warned about once."""
    record = tmp_path / "fake" / ("torch-%s.dist-info" % version)
    record.mkdir(parents=True)
    (record / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: %s\n" % version)
    res = flow_runner.run("gang_flow.py", env={
        "TD_NODES": 1, "TD_NPROC": 2, "PYTHONPATH": str(tmp_path / "fake")})
    said = "torch %s is installed here" % version if refused else \
        "WARNING: torch %s (installed here) is newer than" % version
    assert res.output.count(said) == 1, res
    if refused:
        assert res.returncode != 0, res
        assert "pip install 'torch>=2.5.0,<2.16'" in res.output, res
        assert "Internal error" not in res.output and "start (task-id" not in res.output, res
    else:
        assert res.returncode == 0, res
