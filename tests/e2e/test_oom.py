"""A real OOM kill, named as such: the flow runs in a memory cgroup with a limit (as a container
does), rank 1 allocates until the kernel's OOM killer ends it, and the step's error says that
the OOM killer did it, from the cgroup's own count (oom.py). Machines that do not let a test
create a memory cgroup skip this test (the fixture-based tests in tests/unit/test_oom.py run
everywhere)."""

import os
import pytest

from tests.emulation import netns

LIMIT = 1400 << 20  # the Metaflow runtime, the task (rank 0) and rank 1 fit; rank 1's hog not


def test_a_rank_ended_by_the_oom_killer_is_named_as_such(flow_runner):
    group, why_not = netns.memory_cgroup("mftd-test-%d" % os.getpid(), LIMIT)
    if group is None:
        pytest.skip("this machine does not let a test create a memory cgroup: %s" % why_not)
    out, code = flow_runner.run_in_cgroup(group, "gang_flow.py", {
        "TD_NODES": 1, "TD_NPROC": 2, "TD_FAIL_RANK": 1, "TD_FAIL_WHEN": "after_init",
        "TD_FAIL_HOW": "oom"})
    assert code != 0, out[-6000:]
    assert "rank 1 (node 0, local rank 1) was killed by SIGKILL: the kernel's OOM killer: the " \
        "memory cgroup's oom_kill count went from 0 to 1" in out, out[-6000:]
    flow_runner.assert_no_leftovers()
