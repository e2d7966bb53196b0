"""Node 0 tells its own kills from deaths (issue 40, point 4). A node agent on this host that
node 0 stops ends without saying goodbye to its output pump, which then says why the agent is
gone. It used to say "died without a word: it was killed by a signal it cannot catch (SIGKILL:
the OOM killer ...)" for an agent node 0 itself stopped at the rendezvous deadline. Real
processes: an agent process with the package's own output pump, stopped by a SIGTERM it does
not handle (as _kill_ranks_and_leave ends an agent) or by SIGKILL."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import (
    Failure, FailureKind)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import runner

AGENT = textwrap.dedent("""
    import os, sys, time
    from types import SimpleNamespace
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import runner
    from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.procs import (
        OutputPump)

    spec = SimpleNamespace(node=1, work_dir=sys.argv[1], attempt=SimpleNamespace(local=False),
                           blueprint=SimpleNamespace(step_name="train"))
    pump = OutputPump()
    read, write = os.pipe()
    pump.add(read, "[node 1 agent]", 2)
    pump.start(close_in_child=[write],
               orphan_note=runner._orphan_note("[node 1 agent]", spec, os.getpid()))
    os.write(write, b"waiting for my ranks to start\\n")
    time.sleep(600)  # never joins
""")


def _node_0_runner(work_dir, start_method="exec"):
    """What mark_agent_stops reads of node 0's NodeRunner: its spec and its slots."""
    spec = SimpleNamespace(work_dir=str(work_dir), start_method=start_method,
                           blueprint=SimpleNamespace(rendezvous_timeout_s=10.0))
    return SimpleNamespace(spec=spec, slots=[SimpleNamespace(rank=0, node=0),
                                             SimpleNamespace(rank=None, node=1)])


MISSING = Failure(None, 1, FailureKind.MISSING, 0.0, message=(
    "did not join the gang within the rendezvous timeout of 10.0s. Missing: node 1 (ranks "
    "2-3)."))
RAISED = Failure(3, 1, FailureKind.EXCEPTION, 0.0, local_rank=1, message="ValueError: x")


def _agent_ended_by(tmp_path, signum, before_stop=None):
    """Start the agent, let `before_stop` run (node 0's side), stop the agent with `signum`:
    what its pump wrote."""
    log = tmp_path / "agent.log"
    with open(log, "wb") as out:
        agent = subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path)], stdout=out,
                                 stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while b"waiting for my ranks" not in log.read_bytes():
            assert time.monotonic() < deadline and agent.poll() is None, log.read_text()
            time.sleep(0.05)
        if before_stop is not None:
            before_stop()
        agent.send_signal(signum)
        agent.wait(30)
        while b"@torch_distributed" not in log.read_bytes():  # the pump's last words
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        time.sleep(0.2)
        return log.read_text()
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_an_agent_node_0_stops_at_the_rendezvous_deadline_did_not_join(tmp_path):
    said = _agent_ended_by(tmp_path, signal.SIGTERM, lambda: runner.mark_agent_stops(
        _node_0_runner(tmp_path), MISSING, joined=lambda node: False))
    assert "died without a word" not in said and "SIGKILL" not in said and "OOM" not in said, \
        said
    assert ("[node 1 agent] @torch_distributed on step *train*: the node agent of node 1 "
            "(pid %s) was stopped by node 0: it did not join the gang within the rendezvous "
            "timeout of 10.0s" % said.split("(pid ")[1].split(")")[0]) in said, said
    # what it was doing: under exec, its ranks were still starting (importing)
    assert "each rank first imports Metaflow, the flow and torch" in said, said


def test_an_agent_node_0_stops_because_the_gang_failed_names_the_failure(tmp_path):
    said = _agent_ended_by(tmp_path, signal.SIGTERM, lambda: runner.mark_agent_stops(
        _node_0_runner(tmp_path, "fork"), RAISED, joined=lambda node: True))
    assert "was stopped by node 0: the gang failed (rank 3 (node 1, local rank 1) raised " \
        "ValueError: x" in said, said
    assert "died without a word" not in said and "imports" not in said, said


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_an_agent_that_dies_without_node_0_stopping_it_still_died_without_a_word(tmp_path,
                                                                                 signum):
    said = _agent_ended_by(tmp_path, signum)
    assert "died without a word: it was killed by a signal it cannot catch" in said, said
    assert "stopped by node 0" not in said, said


def test_a_mark_needs_a_directory(tmp_path):
    """The gang's directory already removed (teardown): nothing is written, nothing raised."""
    runner.mark_agent_stops(_node_0_runner(tmp_path / "gone"), MISSING, lambda node: False)
    assert not (tmp_path / "gone").exists()
    assert runner.read_stop_mark(str(tmp_path / "gone"), 1) is None
    assert not os.path.exists(runner.stop_mark(str(tmp_path), 0))
