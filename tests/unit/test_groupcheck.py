"""groupcheck.py: the diagnosis of a rank that did not join the gang, and the body guard with
real torch rendezvous and real Lightning classes."""

import socket
import sys
from datetime import timedelta

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf import groupcheck
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedConfigError,
    TorchDistributedFrameworkError,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.groupcheck import (
    GroupWatch,
    accelerate_processes,
    check_mode,
    diagnose,
    explain_error,
    lightning_trainer_subclasses,
    loaded_frameworks,
    run_body,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology

GANG = Topology(2, 2)
# Lightning 2.x's own words (TorchElasticEnvironment.validate_settings)
LIGHTNING_DEVICES_1 = ("You set `devices=1` and `num_nodes=2` in Lightning, but the product "
                       "(1 * 2) does not match the world size (4).")


# --- diagnose: pure --------------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[4], [1, 4], [4, 4]])
def test_a_rank_that_joined_a_group_of_the_gangs_size_is_fine(sizes):
    assert diagnose(3, GANG, sizes) is None


def test_a_gang_of_one_is_never_diagnosed():
    assert diagnose(0, Topology(1, 1), []) is None


def test_a_rank_that_never_joined_is_told_it_ran_alone_with_the_plain_torch_fix():
    message = diagnose(2, GANG, [])
    assert message.startswith("rank 2 finished the step without joining the gang's process "
                              "group (2 nodes x 2 processes per node = world size 4)")
    assert "on all of the data" in message
    assert "init_process_group() (no arguments)" in message


def test_a_group_of_another_size_names_both_sizes():
    message = diagnose(1, GANG, [1])
    assert "rank 1 joined a process group of 1 process, not the gang's" in message
    assert "world size 4" in message and "no world_size, rank or init_method" in message
    assert "2 and 3 processes" in diagnose(1, GANG, [3, 2, 2])


def test_a_trainer_subclass_is_named_with_the_variables_it_reads_and_the_fix():
    message = diagnose(0, Topology(2, 3), [], ["lightning"], ["FineTuner"])
    assert "FineTuner subclasses Trainer, so it reads PL_FINETUNER_NUM_NODES and " \
        "PL_FINETUNER_DEVICES, not the gang's" in message
    assert "PL_TRAINER_NUM_NODES=2 and PL_TRAINER_DEVICES=3" in message
    assert "FineTuner(..., num_nodes=current.torch_distributed.num_nodes, " \
           "devices=current.torch_distributed.local_world_size)" in message
    assert "SingleDeviceStrategy" not in message


def test_lightning_without_a_subclass_points_at_single_device_and_the_cli():
    message = diagnose(0, GANG, [], ["lightning"], [])
    assert "SingleDeviceStrategy" in message and "JSONARGPARSE_DEFAULT_ENV" in message
    assert "Plain torch" not in message


def test_accelerate_alone_in_a_group_of_the_gangs_size_ran_alone():
    message = diagnose(1, GANG, [4], ["accelerate"], accelerate_processes=1)
    assert message.startswith("rank 1 finished the step without joining")
    assert "ACCELERATE_USE_CPU=true" in message
    assert diagnose(1, GANG, [4], ["accelerate"], accelerate_processes=4) is None


def test_accelerate_and_fastai_hints():
    message = diagnose(0, GANG, [], ["accelerate", "fastai"])
    assert "ACCELERATE_USE_CPU=true" in message
    assert "learn.distrib_ctx()" in message


# --- explain_error: pure -------------------------------------------------------------------

def test_lightnings_devices_mismatch_becomes_the_fix():
    hint = explain_error(LIGHTNING_DEVICES_1, GANG)
    assert hint.startswith("Lightning's Trainer was given devices=1, which contradicts the "
                           "gang's 2 nodes x 2 processes per node = world size 4")
    assert "Remove devices=1 from Trainer(...)" in hint
    assert "PL_TRAINER_NUM_NODES=2 and PL_TRAINER_DEVICES=2" in hint
    assert "*" not in hint  # Metaflow's console would read it as emphasis


def test_lightnings_num_nodes_mismatch_names_num_nodes():
    hint = explain_error("You set `devices=2` and `num_nodes=1` in Lightning, but the product "
                         "(2 * 1) does not match the world size (4).", GANG)
    assert "given num_nodes=1," in hint and "Remove num_nodes=1 from" in hint


def test_other_errors_are_left_alone():
    assert explain_error("bad learning rate", GANG) is None


# --- check_mode ----------------------------------------------------------------------------

@pytest.mark.parametrize("environ,mode", [({}, "error"), ({groupcheck.CHECK_ENV: "warn"}, "warn"),
                                          ({groupcheck.CHECK_ENV: " OFF "}, "off"),
                                          ({groupcheck.CHECK_ENV: ""}, "error")])
def test_check_mode(environ, mode):
    assert check_mode("train", environ) == mode


@pytest.mark.parametrize("environ,mode", [({}, "warn"), ({groupcheck.CHECK_ENV: ""}, "warn"),
                                          ({groupcheck.CHECK_ENV: "error"}, "error"),
                                          ({groupcheck.CHECK_ENV: "off"}, "off")])
def test_a_step_that_got_the_decorator_from_with_warns_unless_told_otherwise(environ, mode):
    assert check_mode("train", environ, default_mode="warn") == mode


def test_an_unknown_check_mode_is_a_config_error_naming_the_value():
    with pytest.raises(TorchDistributedConfigError) as info:
        check_mode("train", {groupcheck.CHECK_ENV: "loud"})
    assert "METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK='loud'" in str(info.value)
    assert "step *train*" in str(info.value)


# --- the impure helpers, with real modules -------------------------------------------------

def test_lightning_trainer_subclasses_are_found_in_both_namespaces():
    import lightning.pytorch as lp
    import pytorch_lightning as pl

    class ProbeTrainerA(lp.Trainer):
        pass

    class ProbeTrainerB(ProbeTrainerA):
        pass

    class ProbeTrainerC(pl.Trainer):
        pass

    names = lightning_trainer_subclasses(sys.modules)
    assert {"ProbeTrainerA", "ProbeTrainerB", "ProbeTrainerC"} <= set(names)
    assert lightning_trainer_subclasses({}) == []


def test_loaded_frameworks_from_module_tables():
    class State:
        class PartialState:
            _shared_state = {"backend": "gloo"}

    class Fresh:
        class PartialState:
            _shared_state = {}

    assert loaded_frameworks({}) == []
    assert loaded_frameworks({"pytorch_lightning": 1, "fastai.learner": 1}) == \
        ["lightning", "fastai"]
    assert loaded_frameworks({"accelerate.state": Fresh}) == []
    assert loaded_frameworks({"accelerate.state": State}) == ["accelerate"]


def test_accelerate_processes_from_its_state():
    class State:
        class PartialState:
            _shared_state = {"num_processes": 1}

    class Fresh:
        class PartialState:
            _shared_state = {}

    assert accelerate_processes({}) is None
    assert accelerate_processes({"accelerate.state": Fresh}) is None
    assert accelerate_processes({"accelerate.state": State}) == 1


# --- GroupWatch and run_body with a real (one-process) torch rendezvous -----------------------

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _init_alone(init_process_group):
    init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % _free_port(), rank=0,
                       world_size=1, timeout=timedelta(seconds=30))


def test_group_watch_sees_a_group_even_after_it_was_destroyed_and_restores_torch():
    import torch.distributed as dist
    from torch.distributed import init_process_group  # bound before the watch starts
    from torch.distributed.rendezvous import _rendezvous_handlers

    before = dict(_rendezvous_handlers)
    with GroupWatch() as watch:
        _init_alone(init_process_group)
        assert watch.group_sizes() == [1, 1]  # joined, and still initialised
        dist.destroy_process_group()
        assert watch.group_sizes() == [1]
    assert _rendezvous_handlers == before


def test_run_body_error_mode_fails_a_rank_that_never_joined():
    ran = []
    with pytest.raises(TorchDistributedFrameworkError) as info:
        run_body(ran.append, ("body",), "train", GANG, environ={"RANK": "3"})
    assert ran == ["body"]
    message = str(info.value)
    assert "step *train*: rank 3 finished the step without joining" in message
    assert "METAFLOW_TORCH_DISTRIBUTED_GROUP_CHECK=warn" in message


def test_run_body_error_mode_fails_a_rank_whose_group_has_the_wrong_size():
    import torch.distributed as dist

    def body():
        _init_alone(dist.init_process_group)
        dist.destroy_process_group()

    with pytest.raises(TorchDistributedFrameworkError) as info:
        run_body(body, (), "train", GANG, environ={"RANK": "0"})
    assert "joined a process group of 1 process" in str(info.value)


def test_run_body_warn_mode_prints_and_returns(capsys):
    run_body(lambda: None, (), "train", GANG,
             environ={"RANK": "1", groupcheck.CHECK_ENV: "warn"})
    err = capsys.readouterr().err
    assert err.startswith("@torch_distributed on step *train*: WARNING: rank 1 finished")


def test_run_body_off_mode_and_single_process_gangs_check_nothing(capsys):
    run_body(lambda: None, (), "train", GANG, environ={groupcheck.CHECK_ENV: "off"})
    run_body(lambda: None, (), "train", Topology(1, 1), environ={})
    assert capsys.readouterr().err == ""


def test_run_body_turns_lightnings_mismatch_into_the_fix_and_keeps_the_cause():
    def body():
        raise ValueError(LIGHTNING_DEVICES_1)

    with pytest.raises(TorchDistributedFrameworkError) as info:
        run_body(body, (), "train", GANG, environ={})
    assert "Remove devices=1 from Trainer(...)" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)


def test_run_body_passes_other_errors_through_unchanged():
    def body():
        raise ValueError("bad learning rate")

    with pytest.raises(ValueError, match="bad learning rate"):
        run_body(body, (), "train", GANG, environ={})


# --- spawn_message: pure -------------------------------------------------------------------

@pytest.mark.parametrize("start_method, named", [
    ("spawn", 'strategy="ddp_spawn"'), ("fork", 'strategy="ddp_fork" or "ddp_notebook"'),
    ("forkserver", 'a strategy with start_method="forkserver"')])
def test_a_strategy_that_starts_processes_is_named_with_the_fix(start_method, named):
    message = groupcheck.spawn_message(start_method, 2, GANG)
    assert message.startswith("Lightning was given %s, which starts 2 processes of its own in "
                              "every rank (with torch.multiprocessing, start method %s): each "
                              "rank of the gang's 2 nodes x 2 processes per node"
                              % (named, start_method)), message
    assert message.endswith('remove strategy= from Trainer(...) (or Fabric(...)), or pass '
                            'strategy="ddp". Stopped before any of them started.')


def test_a_scripts_command_line_from_a_list_or_entrypoint_args():
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.mf.scripts import (
        script_argv)

    assert script_argv("train.py", ["--lr", 0.1], python="py") == ["py", "train.py", "--lr",
                                                                   "0.1"]
    assert script_argv("train.py", {"epochs": 2, "fast": True, "slow": False, "x": None},
                       python="py") == ["py", "train.py", "--epochs", "2", "--fast"]
    assert script_argv("train.py")[1:] == ["train.py"]


def test_a_group_a_child_joined_counts_as_the_ranks():
    joined = []
    with groupcheck.GroupWatch(enabled=False, on_join=joined.append) as watch:
        groupcheck.joined_in_child(4)
    groupcheck.joined_in_child(8)  # no rank body running: nothing to count
    assert watch.group_sizes() == [4] and joined == [4]
