"""Rank 0's body never begins once the gang has failed: the watch's thread may fail the gang in
the moment before the body begins, when there is no body yet to interrupt (Leader._on_failure
then only stops the members). Driven at the seam, with the watch failing from on_body_start."""

import types

import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.errors import (
    TorchDistributedAborted,
)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from metaflow_extensions.torch_distributed.plugins.torch_distributed.gang import leader as gang
from tests import records


class Watch:
    def __init__(self):
        self.reports = []
        self.failed_before_body = False

    def failed(self):
        return self.failed_before_body

    def report(self, failure):
        self.reports.append(failure)


def attempt_of(watch):
    return types.SimpleNamespace(
        watch=watch, runner=types.SimpleNamespace(env_of=lambda rank: {}),
        spec=None, body_finished=False, rank0_exception=None)


@pytest.fixture
def leader(monkeypatch):
    monkeypatch.setattr(gang, "rank_info", lambda spec, topology, local_rank: None)
    monkeypatch.setattr(gang.current_mod, "install", lambda info: None)
    return records.leader(Topology(1, 2))


def test_a_gang_that_failed_before_rank_0s_body_began_never_runs_it(leader, monkeypatch):
    ran = []
    monkeypatch.setattr(gang, "run_rank_body", lambda *a, **k: ran.append(a))
    watch = Watch()

    def the_watch_fails_meanwhile():
        watch.failed_before_body = True

    attempt = attempt_of(watch)
    leader._run_rank0(attempt, None, (), the_watch_fails_meanwhile)
    assert ran == [] and not attempt.body_finished
    assert isinstance(attempt.rank0_exception, TorchDistributedAborted)
    [failure] = watch.reports
    assert failure.rank == 0 and "another rank of the gang failed" in failure.message
    assert not leader._body_running.is_set()


def test_rank_0s_body_runs_when_the_gang_stands(leader, monkeypatch):
    ran = []
    monkeypatch.setattr(gang, "run_rank_body", lambda *a, **k: ran.append(a))
    attempt = attempt_of(Watch())
    leader._run_rank0(attempt, "body", (), None)
    assert len(ran) == 1 and attempt.body_finished and attempt.rank0_exception is None
