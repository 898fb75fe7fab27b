"""How many cores this process may use, counted as its scheduler counts them: the CPUs its
affinity allows (``taskset``, a cpuset, Slurm's binding), capped by the CPU quota of its
cgroup and of the cgroups above it (a container's ``--cpus``, systemd's ``CPUQuota=``, a
Kubernetes CPU limit), in cgroup v2 (``cpu.max``) or v1 (``cpu.cfs_quota_us`` over
``cpu.cfs_period_us``). Never ``os.cpu_count()``, which counts the machine's CPUs whatever
this process may use of them.

A quota of 1.5 CPUs counts as 2 cores (rounded up, as the JVM and Go's runtime count a
quota): ranks that share the half core are slowed, not stopped. The decisions are pure
functions of the files' text; :func:`usable_cores_here` reads them.
"""

import math
import os

from .common import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

#: The files that say this process's cgroups, and where the cgroup file systems are.
PROC_SELF = "/proc/self"


def usable_cores(affinity: int, quotas: "Iterable[tuple[int | None, int]]" = ()) -> int:
    """The cores a process may use: ``affinity`` (the CPUs it may run on), capped by each
    of ``quotas`` (microseconds of CPU time per period; a quota of None, or one of -1 as
    cgroup v1 writes it, is no limit), rounded up; at least one."""
    cores = max(1, affinity)
    for quota, period in quotas:
        if quota is None or quota <= 0 or period <= 0:
            continue
        cores = min(cores, max(1, math.ceil(quota / period)))
    return cores


def parse_cpu_max(text: str) -> "tuple[int | None, int] | None":
    """cgroup v2's ``cpu.max`` (``"max 100000"``, ``"150000 100000"``) as (quota, period);
    None when it is not that."""
    words = text.split()
    if len(words) != 2 or not words[1].isdigit():
        return None
    if words[0] == "max":
        return None, int(words[1])
    return (int(words[0]), int(words[1])) if words[0].isdigit() else None


def parse_cfs(quota: str, period: str) -> "tuple[int | None, int] | None":
    """cgroup v1's ``cpu.cfs_quota_us`` (``-1``: none) and ``cpu.cfs_period_us`` as (quota,
    period); None when they are not numbers."""
    try:
        return int(quota), int(period)
    except ValueError:
        return None


def _mount_fields(line: str) -> "tuple[str, str, str, list[str]] | None":
    """A line of ``/proc/self/mountinfo`` as (root, mount point, file system, its options)."""
    fields = line.split()
    if "-" not in fields[6:]:
        return None
    sep = fields.index("-", 6)
    if len(fields) < sep + 4:
        return None
    root, point = (f.replace("\\040", " ") for f in fields[3:5])
    return root, point, fields[sep + 1], fields[sep + 3].split(",")


def cgroup_dirs(cgroup_text: str, mountinfo_text: str) -> "list[tuple[int, str]]":
    """The directories whose CPU quota limits this process, each with its cgroup version (1
    or 2): its cgroup's and those above it, up to the root of the mount they are seen
    through, innermost first. ``cgroup_text`` is ``/proc/self/cgroup``, ``mountinfo_text``
    ``/proc/self/mountinfo``.

    A cgroup path outside the mount's root (a container that sees only its own cgroup, at
    the mount point) is looked for at the mount point."""
    paths: dict[int, str] = {}  # by version: where this process is
    for line in cgroup_text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            paths.setdefault(2, path)
        elif "cpu" in controllers.split(","):
            paths.setdefault(1, path)
    found: list[tuple[int, str]] = []
    for line in mountinfo_text.splitlines():
        fields = _mount_fields(line)
        if fields is None:
            continue
        root, point, fstype, options = fields
        version = 2 if fstype == "cgroup2" else 1 if fstype == "cgroup" else 0
        if version not in paths or (version == 1 and "cpu" not in options):
            continue
        path = paths[version]
        inside = root == "/" or path == root or path.startswith(root.rstrip("/") + "/")
        below = (path if root == "/" else path[len(root) :]) if inside else ""
        here = point.rstrip("/") + "/" + below.strip("/")
        while True:
            found.append((version, here.rstrip("/") or "/"))
            if len(here.rstrip("/")) <= len(point.rstrip("/")):
                break
            here = os.path.dirname(here.rstrip("/"))
    return found


def cpu_quotas(
    dirs: "Iterable[tuple[int, str]]", read: "Callable[[str], str | None]"
) -> "list[tuple[int | None, int]]":
    """The CPU quota of each of ``dirs`` (:func:`cgroup_dirs`), as ``read`` (a path's text,
    None when there is no such file) finds them; a directory without one is left out."""
    quotas = []
    for version, directory in dirs:
        if version == 2:
            text = read(os.path.join(directory, "cpu.max"))
            quota = None if text is None else parse_cpu_max(text)
        else:
            q = read(os.path.join(directory, "cpu.cfs_quota_us"))
            p = read(os.path.join(directory, "cpu.cfs_period_us"))
            quota = None if q is None or p is None else parse_cfs(q, p)
        if quota is not None:
            quotas.append(quota)
    return quotas


def read_text(path: str) -> "str | None":
    """The text of ``path``, None when it cannot be read (no such cgroup file here)."""
    # utf-8: the codec every interpreter has loaded at start (an agent imports nothing more).
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def usable_cores_here(
    proc: str = PROC_SELF, read: "Callable[[str], str | None]" = read_text
) -> int:
    """The cores this process may use (:func:`usable_cores`): its affinity and the quotas
    of its cgroups, found through ``proc`` (``/proc/self``) and read with ``read``."""
    if hasattr(os, "sched_getaffinity"):
        affinity = len(os.sched_getaffinity(0))
    else:  # no affinity to ask (macOS): the machine's, and no cgroups either
        affinity = os.cpu_count() or 1
    dirs = cgroup_dirs(
        read(os.path.join(proc, "cgroup")) or "", read(os.path.join(proc, "mountinfo")) or ""
    )
    return usable_cores(affinity, cpu_quotas(dirs, read))


#: The kernel's id for this boot: the same for every process of a machine, whatever
#: namespace or container it runs in, and only on that machine.
BOOT_ID = "/proc/sys/kernel/random/boot_id"


def cpu_list(cpus: "Iterable[int]") -> str:
    """``cpus`` as the kernel lists CPUs (``0-3,8``), in order."""
    ids = sorted(set(cpus))
    runs: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        runs.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(runs)


def parse_place(text: object) -> "tuple[str, frozenset[int]] | None":
    """A place (:func:`place_here`'s ``MACHINE/CPUS``) as the machine's id and the CPU ids;
    None for what is not one."""
    if not isinstance(text, str) or text.count("/") != 1:
        return None
    machine, listed = text.split("/")
    if (
        not machine
        or not machine.isascii()
        or not listed
        or not all(c.isalnum() or c == "-" for c in machine)
    ):
        return None
    cpus: set[int] = set()
    for run in listed.split(","):
        ends = run.split("-")
        if (
            len(ends) > 2
            or not all(e.isascii() and e.isdigit() for e in ends)
            or int(ends[-1]) < int(ends[0])
        ):
            return None
        cpus.update(range(int(ends[0]), int(ends[-1]) + 1))
    return machine, frozenset(cpus)


def place_here(read: "Callable[[str], str | None]" = read_text) -> "str | None":
    """Where this process's cores are: its machine (the kernel's boot id) and the CPUs its
    affinity allows, as ``MACHINE/CPUS`` (``3f2a...-9c01/0-3``); None where either is not
    known (no Linux ``/proc``). Nodes of one machine (containers, network namespaces, several
    sshds) have the same machine, and share the CPUs their lists have in common."""
    machine = (read(BOOT_ID) or "").strip()
    if not machine or not hasattr(os, "sched_getaffinity"):
        return None
    place = f"{machine}/{cpu_list(os.sched_getaffinity(0))}"
    return place if parse_place(place) is not None else None
