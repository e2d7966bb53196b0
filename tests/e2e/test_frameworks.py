"""Every framework with zero configuration, on a real gang of 2 nodes x 2 processes (CPU, gloo):
Lightning (both packages), its traps, Fabric and Accelerate; and plain torch that forgets
init_process_group (the right way is covered by the sampler test of test_local_gang.py and the
flow of docs/frameworks/torch.md, run by test_docs.py).

A rank's record (gathered onto rank 0 with current.torch_distributed.gather) holds the row
indices it trained on and the sum of its weights after training: one gang means 4 disjoint
quarters of the 64 rows and the same weights on every rank (the gradients were all-reduced).
"""

import pytest

ROWS = list(range(64))
GROUP_CHECK = "METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK"


def ranks_of(flow_runner, flow):
    return flow_runner.client(
        "t = Flow(%r).latest_run['train'].task\nresult = t['ranks'].data" % flow)


def assert_one_gang(ranks):
    shards = [r["seen"] for r in ranks]
    assert [len(s) for s in shards] == [16, 16, 16, 16], shards
    assert sorted(sum(shards, [])) == ROWS, shards
    weights = [r["weight_sum"] for r in ranks]
    assert max(weights) - min(weights) < 1e-6, weights


def test_ranks_that_never_form_a_group_fail_the_step_with_the_fix(flow_runner):
    res = flow_runner.run("fw_torch_flow.py")
    assert res.returncode != 0
    # said once, in the step's error (issue 42): Metaflow prints its *train* as bold
    assert "@torch_distributed on step train: rank " in res.output, res
    assert "finished the step without joining the gang's process group (2 nodes x 2 processes " \
           "per node = world size 4)" in res.output, res
    assert "init_process_group() (no arguments)" in res.output
    assert "%s=warn" % GROUP_CHECK in res.output
    ok = flow_runner.client("result = Flow('TorchFlow').latest_run['train'].task.successful")
    assert ok is False


def test_the_group_check_can_be_a_warning(flow_runner):
    res = flow_runner.run("fw_torch_flow.py", env={GROUP_CHECK: "warn"})
    assert res.returncode == 0, res
    for rank in range(4):
        assert "@torch_distributed on step *train*: WARNING: rank %d finished the step without " \
               "joining" % rank in res.output, res
    # what the warning is about: every rank trained on all the data
    assert [sorted(r["seen"]) for r in ranks_of(flow_runner, "TorchFlow")] == [ROWS] * 4


@pytest.mark.parametrize("package, start_method", [
    ("lightning.pytorch", "auto"), ("pytorch_lightning", "auto"),
    # every rank, rank 0 included, a spin-step of the task (what auto picks off Linux, or when
    # the task initialised CUDA): the Trainer sees the same processes created externally
    ("lightning.pytorch", "exec")])
def test_bare_lightning_trainer_is_ddp_over_the_gang(flow_runner, package, start_method):
    res = flow_runner.run("fw_lightning_flow.py", env={
        "TD_LT": package, "METAFLOW_TORCH_DISTRIBUTED_START_METHOD": start_method})
    assert res.returncode == 0, res
    ranks = ranks_of(flow_runner, "LightningFlow")
    assert [(r["strategy"], r["world_size"], r["global_rank"]) for r in ranks] == \
        [("DDPStrategy", 4, rank) for rank in range(4)]
    assert_one_gang(ranks)
    # the gang ran under the start method asked for (auto: fork here)
    used = flow_runner.client(
        "from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.events "
        "import gang_record\nt = Flow('LightningFlow').latest_run['train'].task\n"
        "result = gang_record(t).to_dict()['start_method']")
    assert used == ("fork" if start_method == "auto" else start_method), used
    # Lightning launched nothing: it saw processes created externally (TorchElastic), and the
    # 4 bodies are the gang's 4 processes, each run once
    assert {(r["environment"], r["external"]) for r in ranks} == {("TorchElasticEnvironment", True)}
    bodies = [line.split() for line in (flow_runner.marks / "bodies").read_text().splitlines()]
    assert sorted(rank for rank, _ in bodies) == ["0", "1", "2", "3"]
    assert len({pid for _, pid in bodies}) == 4
    # rank 0's trained weights are the step's artifact and reach the next step
    shapes = flow_runner.client(
        "result = Flow('LightningFlow').latest_run['end'].task['state_shapes'].data")
    assert shapes == {"layer.weight": [2, 32], "layer.bias": [2, 0]}


def test_lightning_cli_reads_the_gang_shape_from_the_environment(flow_runner):
    res = flow_runner.run("fw_lightning_flow.py", env={"TD_TRAP": "cli"})
    assert res.returncode == 0, res
    ranks = ranks_of(flow_runner, "LightningFlow")
    assert {(r["strategy"], r["world_size"]) for r in ranks} == {("DDPStrategy", 4)}
    assert_one_gang(ranks)


def test_a_trainer_subclass_fails_the_step_and_names_the_fix(flow_runner):
    res = flow_runner.run("fw_lightning_flow.py", env={"TD_TRAP": "subclass"})
    assert res.returncode != 0
    assert "FineTuner subclasses Trainer, so it reads PL_FINETUNER_NUM_NODES and " \
           "PL_FINETUNER_DEVICES, not the gang's " \
           "PL_TRAINER_NUM_NODES=2 and PL_TRAINER_DEVICES=2" in res.output, res
    assert "FineTuner(..., num_nodes=current.torch_distributed.num_nodes" in res.output


def test_explicit_devices_fail_fast_with_the_fix(flow_runner):
    # Trainer(num_nodes=1) takes the same path (Lightning's own check of num_nodes x devices
    # against the world size); tests/unit/test_groupcheck.py covers its message.
    res = flow_runner.run("fw_lightning_flow.py", env={"TD_TRAP": "devices1"})
    assert res.returncode != 0
    assert "Lightning's Trainer was given devices=1, which contradicts the gang's 2 nodes x 2 " \
           "processes per node" in res.output, res
    assert "Remove devices=1 from Trainer(...)" in res.output
    # said once (issue 42), however many ranks raised it: in the step's error; each rank's
    # traceback ends with its first words, after Lightning's own ValueError
    assert res.output.count("Remove devices=1 from Trainer(...)") == 1, res
    assert "(the step's error, below, says it in full, with its fix)" in res.output, res
    # it failed in trainer.fit as Lightning launched, before any training step
    assert "`Trainer.fit` stopped" not in res.output
    assert_ranks_that_raised_are_not_called_stopped(res.output)


def assert_ranks_that_raised_are_not_called_stopped(output):
    """Every rank whose log shows its own error is not among those the summary says were
    stopped, and the summary names the step once per error and ends its sentences once."""
    raised = {int(line.split("[rank ", 1)[1].split("]", 1)[0]) for line in output.splitlines()
              if "[rank " in line and "TorchDistributedFrameworkError" in line}
    for line in output.splitlines():
        if "The other ranks still running (" in line:
            stopped = line.split("The other ranks still running (", 1)[1].split(")", 1)[0]
            assert not raised & {int(r) for r in stopped.split(", ")}, (raised, line)
        assert "..\n" not in line + "\n" or line.rstrip().endswith("..."), line
        assert line.count("@torch_distributed on step") <= 1, line


def test_a_strategy_that_starts_processes_of_its_own_is_named_before_anything_trains(
        flow_runner):
    # ddp_fork and ddp_notebook take the same path (tests/integration/test_lightning_launch.py)
    res = flow_runner.run("fw_lightning_flow.py", env={"TD_TRAP": "ddp_spawn"})
    assert res.returncode != 0
    assert 'Lightning was given strategy="ddp_spawn", which starts 2 processes of its own in ' \
           'every rank' in res.output, res
    assert 'remove strategy= from Trainer(...) (or Fabric(...)), or pass strategy="ddp"' \
        in res.output, res
    # stopped before Lightning pickled the step's own LightningModule for its children
    assert "Can't pickle" not in res.output and "SingleDeviceStrategy" not in res.output, res
    # each rank that got that far ran its body once (the gang stops the others once one fails)
    ranks = [line.split()[0] for line in (flow_runner.marks / "bodies").read_text().splitlines()]
    assert ranks and len(set(ranks)) == len(ranks) and set(ranks) <= {"0", "1", "2", "3"}, ranks


def test_fabric_with_no_arguments_forms_the_group(flow_runner):
    res = flow_runner.run("fw_fabric_flow.py")
    assert res.returncode == 0, res
    ranks = ranks_of(flow_runner, "FabricFlow")
    assert [(r["strategy"], r["world_size"], r["global_rank"]) for r in ranks] == \
        [("DDPStrategy", 4, rank) for rank in range(4)]
    assert_one_gang(ranks)


def test_accelerator_on_cpu_forms_one_group_of_four(flow_runner):
    res = flow_runner.run("fw_accelerate_flow.py")
    assert res.returncode == 0, res
    ranks = ranks_of(flow_runner, "AccelerateFlow")
    assert [(r["num_processes"], r["process_index"], r["group_size"]) for r in ranks] == \
        [(4, rank, 4) for rank in range(4)]
    assert {r["distributed_type"] for r in ranks} == {"DistributedType.MULTI_CPU"}
    assert_one_gang(ranks)
