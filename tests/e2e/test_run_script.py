"""An existing torchrun-style script run in every rank with current.torch_distributed.run_script
(docs/migration.md, from metaflow-torchrun and from torchrun): the ranks' scripts form the
gang's group and train together, their lines carry the rank's prefix, and a script's non-zero
exit fails the gang."""

import shutil

import pytest

from tests.support import FLOWS


def run(flow_runner, **env):
    shutil.copy(FLOWS / "torchrun_script.py", flow_runner.root)
    return flow_runner.run("script_flow.py", env=env)


@pytest.mark.parametrize("nodes, nproc", [(1, 2), (2, 2)])
def test_a_torchrun_script_trains_as_the_gang_with_its_lines_prefixed(flow_runner, nodes, nproc):
    res = run(flow_runner, TD_NODES=nodes, TD_NPROC=nproc)
    assert res.returncode == 0, res
    world = nodes * nproc
    total = world * (world + 1) // 2
    for rank in range(world):
        assert "[rank %d] script rank %d of %d: sum %d" % (rank, rank, world, total) \
            in res.output, res
        assert (flow_runner.marks / ("sum-%d" % rank)).read_text() == str(total)
    assert "without joining the gang's process group" not in res.output, res


def test_a_scripts_failure_fails_the_gang_naming_the_rank_and_its_exit_code(flow_runner):
    res = run(flow_runner, TD_NODES=2, TD_NPROC=2, TD_SCRIPT_FAIL_RANK=2)
    assert res.returncode != 0, res
    assert "[rank 2] script of rank 2 failing" in res.output, res
    assert "rank 2 ran `" in res.output and "torchrun_script.py --out " in res.output, res
    assert "--verbose` (current.torch_distributed.run_script), which exited with code 3" \
        in res.output, res
    ok = flow_runner.client("result = Flow('ScriptFlow').latest_run['train'].task.successful")
    assert ok is False
