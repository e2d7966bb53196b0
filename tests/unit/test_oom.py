"""OOM evidence (oom.py): the memory cgroup of a process, its OOM-kill count (cgroup v1 and v2
files), and a SIGKILLed rank's failure that says the OOM killer did it only when the count rose.
Fixture cgroup trees here; a real OOM in tests/e2e/test_oom.py where the machine allows it."""

import signal

from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime import oom
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.failures import from_exit
from metaflow_extensions.torch_distributed.plugins.torch_distributed.runtime.supervisor import (
    LeaderWatch, Slot)
from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.topology import Topology
from tests.unit.fakes import FakeMember


def _tree(tmp_path, v1):
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = tmp_path / "cgroup"
    if v1:
        proc.write_text("4:memory:/job/abc\n1:cpu:/\n0::/\n")
        group = tmp_path / "fs" / "memory" / "job" / "abc"
        group.mkdir(parents=True)
        (group / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    else:
        proc.write_text("0::/kubepods/pod1\n")
        group = tmp_path / "fs" / "kubepods" / "pod1"
        group.mkdir(parents=True)
        (group / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\n")
    return proc, group


def test_the_memory_cgroup_and_its_oom_kills_are_read_on_v1_and_v2(tmp_path):
    for v1 in (True, False):
        proc, group = _tree(tmp_path / str(v1), v1)
        found = oom.memory_cgroup(str(proc), str(tmp_path / str(v1) / "fs"))
        assert found == str(group)
        assert oom.oom_kills(found) == 2
    assert oom.memory_cgroup(str(tmp_path / "missing")) is None
    assert oom.oom_kills(None) is None


def test_the_oom_killer_is_named_only_when_the_count_rose(tmp_path):
    proc, group = _tree(tmp_path, v1=False)
    watch = oom.OomWatch(str(group))
    assert watch.evidence() is None  # 2 before the gang: not this gang's
    (group / "memory.events").write_text("oom 2\noom_kill 3\n")
    assert "the kernel's OOM killer: the memory cgroup's oom_kill count went from 2 to 3" \
        in watch.evidence()
    assert oom.OomWatch(str(tmp_path / "nothing")).evidence() is None  # unreadable: no claim


def test_a_sigkilled_rank_says_oom_when_its_cgroup_counted_one(tmp_path):
    proc, group = _tree(tmp_path, v1=True)
    watch = LeaderWatch([Slot(FakeMember(), 0, 1, 1)], None, Topology(1, 2))
    watch._oom = oom.OomWatch(str(group))
    (group / "memory.oom_control").write_text("oom_kill 3\n")
    watch.slots[0].member.code = -signal.SIGKILL
    failure = watch._check()
    assert failure.sentence().startswith(
        "rank 1 (node 0, local rank 1) was killed by SIGKILL: the kernel's OOM killer")
    # no rise, no claim
    plain = from_exit(1, 0, 1, -signal.SIGKILL, 0.0)
    assert plain.sentence() == "rank 1 (node 0, local rank 1) was killed by SIGKILL."
