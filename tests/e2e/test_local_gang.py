"""Real flows through `python flow.py run` on the local backend (CPU, gloo)."""

TRAIN = "t = Flow('GangFlow').latest_run['train'].task\n"


def test_two_nodes_two_processes_all_reduce(flow_runner):
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 2})
    assert res.returncode == 0, res
    got = flow_runner.client(TRAIN + (
        "run = t.parent.parent\n"
        "result = dict(total=t['total'].data, rank=t['rank_seen'].data, envs=t['envs'].data,\n"
        "              info=t['info'].data,\n"
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
    # members are invisible: one task per step
    assert got["tasks"] == [1, 1, 1]
    # the plan, printed when the gang starts
    assert "train: 2 nodes x 2 processes = world size 4 (CPU, gloo; the 2 nodes emulated on " \
        "this machine)" in res.output, res
    # every rank's output reached the console, prefixed with its rank
    for rank in range(4):
        assert "[rank %d] hello from rank %d" % (rank, rank) in res.output
        assert "[rank %d] stderr of rank %d" % (rank, rank) in res.output


def test_a_client_without_the_gang_secret_cannot_stop_or_confuse_it(flow_runner):
    """Rank 0 writes an abort, node 1's join, done and failure, under the control plane's key
    names but without the gang's secret, and another gang's id, while node 1's agent is still
    loading the flow: the gang runs on as if nothing happened."""
    res = flow_runner.run("gang_flow.py", env={"TD_NODES": 2, "TD_NPROC": 1, "TD_INTRUDE": 1})
    assert res.returncode == 0, res
    assert "[rank 0] intruder wrote its keys" in res.output, res
    assert flow_runner.client(TRAIN + "result = t['total'].data") == 1 + 2
    for word in ("abort", "bogus", "cannot reach node 0", "another job"):
        assert word not in res.output, res


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
