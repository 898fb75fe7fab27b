"""A local cluster's default slots are the cores this process may use, under a restricted CPU
affinity and under a cgroup CPU quota, and a job that puts more ranks on them warns unless it
says ``oversubscribe=True``; both MPI flavours run it alike. Each cluster runs in a process of
its own, whose affinity or cgroup is set before it starts (its agents and ranks inherit it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.nodes.tasks.cpus import cgroup_dirs, cpu_list
from tests.conftest import rank_lines, require, wait_gone
from tests.testbed import testbed as fake_hosts

testbed = fake_hosts

pytestmark = pytest.mark.mpi

# Starts a local cluster of two workers with the default slots, runs a job on every slot
# with and without oversubscribe=True, and prints what it saw as JSON.
SCRIPT = """\
import json, os, sys, warnings
import clusterbook as cb

python, run_dir, pin = sys.argv[1], sys.argv[2], sys.argv[3] == "pin"
if pin:  # one CPU, as `taskset -c N` gives it
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
size = "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"
out = {}
with cb.Cluster.local(workers=2, python=python, run_dir=run_dir) as cluster:
    cluster.wait_ready(timeout=60)
    out["slots"] = [n.slots for n in cluster.nodes]
    out["cores"] = [n.cores for n in cluster.nodes]
    for asked in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            job = cluster.mpirun(["python", "-c", size], oversubscribe=asked, timeout=120)
        result = job.wait()
        out[f"oversubscribe={asked}"] = {
            "warnings": [(w.category.__name__, str(w.message)) for w in caught],
            "returncode": result.returncode,
            "sizes": sorted(set(job.logs()["line"])),
        }
print(json.dumps(out))
"""


def _run(tmp_path: Path, python: str, how: str, prefix: tuple[str, ...] = ()) -> dict:
    script = tmp_path / "cores.py"
    script.write_text(SCRIPT)
    argv = [*prefix, sys.executable, str(script), python, str(tmp_path / "run"), how]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    finally:
        leftovers = wait_gone(str(tmp_path), timeout=5)
        for p in leftovers:
            p.kill()
    assert not leftovers, f"processes left: {[p.info['cmdline'] for p in leftovers]}"
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_two_workers_on_one_allowed_cpu_take_a_slot_each_and_the_job_says_so(mpi_python, tmp_path):
    out = _run(tmp_path, mpi_python, "pin")
    assert out["slots"] == [1, 1]
    assert out["cores"] == [1, 1]
    quiet, warned = out["oversubscribe=True"], out["oversubscribe=False"]
    assert [w[0] for w in warned["warnings"]] == ["OversubscriptionWarning"]
    message = warned["warnings"][0][1]
    assert "np=2 puts more ranks on a host than it has cores: 2 ranks on localhost" in message
    assert "which may use 1 cores" in message
    assert "oversubscribe=True" in message
    # Warned, not refused: both flavours run the ranks (binding off), and with
    # oversubscribe=True say nothing.
    assert warned["returncode"] == 0
    assert warned["sizes"] == ["2"]
    assert quiet["warnings"] == []
    assert quiet["returncode"] == 0
    assert quiet["sizes"] == ["2"]


def test_workers_share_the_cores_they_may_use(openmpi_python, tmp_path):
    cores = len(os.sched_getaffinity(0))
    require(cores >= 2, "needs two CPUs to share")
    out = _run(tmp_path, openmpi_python, "all", prefix=("taskset", "-c", "0,1"))
    assert out["slots"] == [1, 1]
    assert out["cores"] == [2, 2]
    assert out["oversubscribe=False"]["warnings"] == []
    assert out["oversubscribe=False"]["sizes"] == ["2"]


@contextlib.contextmanager
def _cpu_cgroup(tmp_path: Path, cpus: float) -> Iterator[tuple[Path, Path]]:
    """A new cgroup of ``cpus`` CPUs' quota (v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``, as
    this machine has), removed at the end once its processes are gone: the files to write a
    pid to, to move that process into it and back into this process's own cgroup."""
    require(os.geteuid() == 0, "needs root to make a cgroup")
    mounts = cgroup_dirs(
        Path("/proc/self/cgroup").read_text(), Path("/proc/self/mountinfo").read_text()
    )
    period = 100000
    for version, directory in mounts:
        base = Path(directory)
        if version == 2 and "cpu" not in (base / "cgroup.subtree_control").read_text().split():
            continue
        group = base / f"clusterbook-test-{os.getpid()}-{tmp_path.name}"
        try:
            group.mkdir()
        except OSError:
            continue
        try:
            if version == 2:
                (group / "cpu.max").write_text(f"{int(cpus * period)} {period}\n")
            else:
                (group / "cpu.cfs_period_us").write_text(f"{period}\n")
                (group / "cpu.cfs_quota_us").write_text(f"{int(cpus * period)}\n")
            yield group / "cgroup.procs", base / "cgroup.procs"
        finally:
            deadline = time.monotonic() + 10
            while True:
                try:
                    group.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        return
    require(False, "no cgroup CPU controller to make a cgroup in")


def test_a_cgroup_cpu_quota_caps_the_slots(openmpi_python, tmp_path):
    require(len(os.sched_getaffinity(0)) >= 2, "needs two CPUs, of which the quota gives one")
    with _cpu_cgroup(tmp_path, 0.5) as (procs, _):
        enter = f'echo $$ > "{procs}" && exec "$0" "$@"'
        out = _run(tmp_path, openmpi_python, "all", prefix=("sh", "-c", enter))
    # Half a CPU: one core, shared by the two workers, which take a slot each all the same.
    assert out["slots"] == [1, 1]
    assert out["cores"] == [1, 1]
    warned = out["oversubscribe=False"]["warnings"]
    assert [w[0] for w in warned] == ["OversubscriptionWarning"]
    assert out["oversubscribe=True"]["warnings"] == []


@pytest.mark.root
@pytest.mark.sshd
def test_an_ssh_nodes_cores_are_what_its_sessions_may_use(testbed, openmpi_python, tmp_path):
    # The fake host's sshd, and so every session it starts, may run on one CPU. (Its quota
    # cannot be shown this way: a fake host's /sys is its own, without the cgroup mounts.)
    allowed = os.sched_getaffinity(0)
    require(len(allowed) >= 2, "needs two CPUs, of which the node gets one")
    host = testbed.hosts[0]
    sshd = host.processes()
    for pid in sshd:
        os.sched_setaffinity(pid, {min(allowed)})
    try:
        refused = testbed.cluster(openmpi_python, tmp_path / "run", hosts=1, slots=2)
        with pytest.raises(cb.BootstrapError) as info:
            refused.start()
        refused.stop()
        (problem,) = info.value.problems[host.addr]
        assert "2 slots asked, but the node has 1 cores" in problem
        with testbed.cluster(openmpi_python, tmp_path / "run1", hosts=1) as cluster:
            assert [(n.slots, n.cores) for n in cluster.nodes] == [(1, 1)]
            job = cluster.mpirun(["python", "-c", "pass"], np=2, oversubscribe=True)
            assert job.wait(timeout=120).ok
    finally:
        for pid in sshd:
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(pid, allowed)


SHARING = (
    "import os; from mpi4py import MPI; "
    "print(len(os.sched_getaffinity(0)), os.environ.get('OMPI_MCA_mpi_yield_when_idle', '-'))"
)


@pytest.mark.root
@pytest.mark.sshd
def test_hosts_of_one_machine_share_its_cpus(testbed, mpi_python, tmp_path):
    # The test bed's hosts are network namespaces of this machine: each host alone has room
    # for its 2 ranks, but its MPI daemon would bind them to the CPUs the other's binds to.
    cpus = os.sched_getaffinity(testbed.hosts[0].processes()[0])
    require(len(cpus) >= 2, "needs two CPUs, to give each host 2 slots")
    with testbed.cluster(mpi_python, tmp_path / "run", hosts=2, slots=2) as cluster:
        places = {n.place for n in cluster.nodes}
        assert len(places) == 1
        assert next(iter(places)).endswith("/" + cpu_list(cpus))
        job = cluster.mpirun(["python", "-c", SHARING], np=4, oversubscribe=True)
        result = job.wait(timeout=120)
        assert result.ok, result.summary()
    # Every rank unbound; Open MPI's ranks yield while they wait where 4 ranks are more than
    # the machine's CPUs (MPICH's yield on their own).
    openmpi = job.plan.launcher.flavour is MPIFlavour.OPENMPI
    yields = "1" if openmpi and len(cpus) < 4 else "-"
    assert rank_lines(job) == [f"{len(cpus)} {yields}"] * 4
