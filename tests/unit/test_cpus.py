"""usable_cpus and cgroup_cpu_quota: the CPUs a node's ranks share, read from a process's
/proc/<pid>/cgroup and mountinfo and the cgroup files they point to, laid out here as the
kernel lays them out (cgroup v1 and v2, a container's own view, nested quotas)."""

import math
import os

import metaflow  # noqa: F401 - metaflow must load the extension before its modules are imported
import pytest

from metaflow_extensions.torch_distributed.plugins.torch_distributed.core.devices import (
    cgroup_cpu_quota,
    node_cpus,
    usable_cpus,
)

V1_MOUNTS = (
    "30 25 0:26 / /sys/fs/cgroup/memory rw,relatime shared:9 - cgroup cgroup rw,memory\n"
    "31 25 0:27 {root} /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:10 - cgroup cgroup "
    "rw,cpu,cpuacct\n"
    "32 25 0:28 / /sys/fs/cgroup/cpuset rw,relatime shared:11 - cgroup cgroup rw,cpuset\n")
V2_MOUNTS = "35 25 0:30 {root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def machine(tmp_path, cgroup, mountinfo, files):
    """A process's /proc/self (cgroup, mountinfo) and the cgroup files under a root folder."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    root = tmp_path / "root"
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return str(proc), str(root)


def test_a_cgroup_v1_quota_of_a_pod_bounds_its_cpus(tmp_path):
    # Kubernetes on cgroup v1: the pod's cgroup holds the limit, the container's none
    pod = "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1"
    proc, root = machine(tmp_path, "4:cpu,cpuacct:/kubepods/pod1/c1\n3:memory:/kubepods\n",
                         V1_MOUNTS.format(root="/"), {
                             pod + "/cpu.cfs_quota_us": "400000\n",
                             pod + "/cpu.cfs_period_us": "100000\n",
                             pod + "/c1/cpu.cfs_quota_us": "-1\n",
                             pod + "/c1/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(proc, root) == 4.0
    assert usable_cpus(range(64), proc, root) == (
        4, "4 CPUs (this machine's cgroup CPU limit of 4, of the 64 CPUs it may run on)")


def test_the_tightest_quota_of_a_cgroup_and_its_parents_wins(tmp_path):
    base = "/sys/fs/cgroup/cpu,cpuacct"
    proc, root = machine(tmp_path, "4:cpu,cpuacct:/a/b\n", V1_MOUNTS.format(root="/"), {
        base + "/a/cpu.cfs_quota_us": "150000\n", base + "/a/cpu.cfs_period_us": "100000\n",
        base + "/a/b/cpu.cfs_quota_us": "800000\n", base + "/a/b/cpu.cfs_period_us": "100000\n"})
    assert cgroup_cpu_quota(proc, root) == 1.5
    assert usable_cpus(range(8), proc, root)[0] == 2  # 1.5 CPUs: 2 threads, rounded up


def test_a_container_sees_its_own_cgroup_as_the_mount_root(tmp_path):
    # docker without a cgroup namespace: the path in /proc/self/cgroup is the mount's root;
    # with one (cgroup v2, the default now), both are "/"
    proc, root = machine(tmp_path, "4:cpu,cpuacct:/docker/abc\n",
                         V1_MOUNTS.format(root="/docker/abc"), {
                             "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "200000",
                             "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000"})
    assert cgroup_cpu_quota(proc, root) == 2.0
    v2 = tmp_path / "v2"
    v2.mkdir()
    proc, root = machine(v2, "0::/\n", V2_MOUNTS.format(root="/"),
                         {"/sys/fs/cgroup/cpu.max": "250000 100000\n"})
    assert cgroup_cpu_quota(proc, root) == 2.5
    assert usable_cpus(range(96), proc, root)[0] == 3


def test_cgroup_v2_max_and_missing_files_are_no_limit(tmp_path):
    proc, root = machine(tmp_path, "0::/user.slice/session-1.scope\n",
                         V2_MOUNTS.format(root="/"), {
                             "/sys/fs/cgroup/user.slice/cpu.max": "max 100000\n"})
    assert cgroup_cpu_quota(proc, root) is None
    assert usable_cpus({0, 3, 5}, proc, root) == (3, "3 CPUs of this machine")


def test_a_quota_above_the_affinity_leaves_the_affinity(tmp_path):
    # taskset or a cpuset gave 2 CPUs; the pod may use 4
    proc, root = machine(tmp_path, "0::/pod\n", V2_MOUNTS.format(root="/"),
                         {"/sys/fs/cgroup/pod/cpu.max": "400000 100000\n"})
    assert usable_cpus({0, 1}, proc, root) == (2, "2 CPUs of this machine")


def test_a_quota_below_one_cpu_still_leaves_one(tmp_path):
    proc, root = machine(tmp_path, "0::/pod\n", V2_MOUNTS.format(root="/"),
                         {"/sys/fs/cgroup/pod/cpu.max": "50000 100000\n"})
    assert usable_cpus({0, 1, 2, 3}, proc, root)[0] == 1


@pytest.mark.parametrize("cgroup,mountinfo", [
    ("", ""),  # no /proc (another OS) or unreadable
    ("4:cpu,cpuacct:/x\n", ""),  # the hierarchy is not mounted here
    ("0::/x\n", "garbage line\n" + V2_MOUNTS.format(root="/elsewhere")),  # outside the mount
])
def test_what_cannot_be_read_is_no_limit(tmp_path, cgroup, mountinfo):
    proc, root = machine(tmp_path, cgroup, mountinfo, {})
    assert cgroup_cpu_quota(proc, root) is None


def test_this_process_uses_no_more_cpus_than_it_may_run_on():
    count, how = usable_cpus()
    affinity = len(os.sched_getaffinity(0))
    quota = cgroup_cpu_quota()
    assert count == (affinity if quota is None else min(affinity, max(1, math.ceil(quota))))
    assert node_cpus([], remote=False) == (count, how)
