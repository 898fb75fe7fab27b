"""The cores a process may use: its CPU affinity capped by its cgroups' CPU quotas (pure
decisions over the files' text), and the reading of those files, here from made-up ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterbook.nodes.tasks.cpus import (
    BOOT_ID,
    cgroup_dirs,
    cpu_list,
    cpu_quotas,
    parse_cfs,
    parse_cpu_max,
    parse_place,
    place_here,
    usable_cores,
    usable_cores_here,
)

V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "33 31 0:30 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
)


@pytest.mark.parametrize(
    ("affinity", "quotas", "cores"),
    [
        (8, [], 8),  # no cgroup limit: the affinity
        (8, [(None, 100000)], 8),  # cgroup v2 "max"
        (8, [(-1, 100000)], 8),  # cgroup v1's "no quota"
        (8, [(200000, 100000)], 2),  # a quota below the affinity
        (2, [(800000, 100000)], 2),  # a quota above it: the affinity
        (8, [(150000, 100000)], 2),  # 1.5 CPUs: rounded up
        (8, [(10000, 100000)], 1),  # a tenth of a CPU: still one
        (8, [(400000, 100000), (300000, 100000)], 3),  # the tightest of the cgroups above
        (0, [], 1),  # never none
    ],
)
def test_usable_cores_are_the_affinity_capped_by_the_quota(affinity, quotas, cores) -> None:
    assert usable_cores(affinity, quotas) == cores


def test_the_quota_files_are_parsed_as_each_cgroup_version_writes_them() -> None:
    assert parse_cpu_max("max 100000\n") == (None, 100000)
    assert parse_cpu_max("150000 100000\n") == (150000, 100000)
    assert parse_cpu_max("") is None
    assert parse_cpu_max("lots 100000") is None
    assert parse_cfs("-1\n", "100000\n") == (-1, 100000)
    assert parse_cfs("50000\n", "100000\n") == (50000, 100000)
    assert parse_cfs("?", "100000") is None


def test_a_v2_cgroup_and_those_above_it_hold_its_limits() -> None:
    dirs = cgroup_dirs("0::/user.slice/job.scope\n", V2_MOUNT)
    assert dirs == [
        (2, "/sys/fs/cgroup/user.slice/job.scope"),
        (2, "/sys/fs/cgroup/user.slice"),
        (2, "/sys/fs/cgroup"),
    ]


def test_a_v1_cgroup_is_found_through_the_mount_of_its_cpu_controller() -> None:
    cgroup = "5:memory:/elsewhere\n3:cpu,cpuacct:/batch/job1\n0::/\n"
    dirs = cgroup_dirs(cgroup, V1_MOUNTS)
    assert dirs == [
        (1, "/sys/fs/cgroup/cpu,cpuacct/batch/job1"),
        (1, "/sys/fs/cgroup/cpu,cpuacct/batch"),
        (1, "/sys/fs/cgroup/cpu,cpuacct"),
    ]


def test_a_container_that_sees_only_its_own_cgroup_reads_it_at_the_mount_point() -> None:
    # Docker without a cgroup namespace: /proc/self/cgroup names a path of the host, the
    # mount's root is the container's cgroup, mounted at /sys/fs/cgroup.
    mount = "30 23 0:26 /docker/abc /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n"
    assert cgroup_dirs("0::/docker/abc\n", mount) == [(2, "/sys/fs/cgroup")]
    assert cgroup_dirs("0::/kubepods/other\n", mount) == [(2, "/sys/fs/cgroup")]


def test_quotas_come_from_the_files_there_are() -> None:
    files = {
        "/a/b/cpu.max": "max 100000",
        "/a/cpu.max": "250000 100000",
        "/v1/cpu.cfs_quota_us": "-1",
        "/v1/cpu.cfs_period_us": "100000",
    }
    dirs = [(2, "/a/b"), (2, "/a"), (2, "/"), (1, "/v1"), (1, "/none")]
    assert cpu_quotas(dirs, files.get) == [(None, 100000), (250000, 100000), (-1, 100000)]


def test_this_process_cores_are_read_from_its_cgroup_files(tmp_path: Path) -> None:
    # A made-up /proc/self and cgroup v2 tree: the job's cgroup has half a CPU, its parent one.
    proc, tree = tmp_path / "proc", tmp_path / "cgroup"
    (tree / "job").mkdir(parents=True)
    (tree / "cpu.max").write_text("100000 100000\n")
    (tree / "job" / "cpu.max").write_text("50000 100000\n")
    proc.mkdir()
    (proc / "cgroup").write_text("0::/job\n")
    (proc / "mountinfo").write_text(f"30 23 0:26 / {tree} rw - cgroup2 cgroup2 rw\n")
    assert usable_cores_here(str(proc)) == 1
    (tree / "job" / "cpu.max").write_text("max 100000\n")
    assert usable_cores_here(str(proc)) == 1  # the parent's quota holds
    (tree / "cpu.max").write_text("max 100000\n")
    assert usable_cores_here(str(proc)) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("cpus", "listed"),
    [([0], "0"), ([3, 0, 1, 2], "0-3"), ([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11"), ([5, 7], "5,7")],
)
def test_a_cpu_list_is_written_as_the_kernel_lists_cpus_and_read_back(
    cpus: list[int], listed: str
) -> None:
    assert cpu_list(cpus) == listed
    assert parse_place(f"b00t-1d/{listed}") == ("b00t-1d", frozenset(cpus))


@pytest.mark.parametrize(
    "text",
    [
        None,
        3,
        "",
        "b00t",
        "/0-1",
        "b00t/",
        "b00t/3-1",
        "b00t/0-",
        "b00t/x",
        "a/b/0",
        "b 0t/0",
        "b00t/\u00b2",
        "b\u00e9/0",
    ],
)
def test_what_is_no_place_reads_as_none(text: object) -> None:
    assert parse_place(text) is None


def test_the_place_here_is_this_kernels_boot_and_this_process_cpus() -> None:
    boot = Path(BOOT_ID).read_text().strip()
    assert place_here() == f"{boot}/{cpu_list(os.sched_getaffinity(0))}"
    assert place_here(lambda path: None) is None  # no /proc to read the boot id from
