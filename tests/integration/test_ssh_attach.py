"""Attaching from another machine: a detached cluster runs on a fake host (its own network
namespace, hostname, sshd, and run root: its clusters are not on this machine's file system),
and this machine reaches it with ``cb.Cluster.attach("ssh://root@HOST/NAME")`` and the
``clusterbook`` commands, over real ssh, through a relay to its control socket and a reader of
its directory that run there as long as the handle is open, and no longer."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.testbed import FakeHost, Testbed, make_testbed, require_testbed

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]

PYTHON = sys.executable
CLI = [PYTHON, "-m", "clusterbook"]
# The default run root's parent on the fake host: a directory of its own there.
STATE = Path.home() / ".local" / "state" / "clusterbook"

STARTER = """\
import sys
import clusterbook as cb
python, name = sys.argv[1:3]
cluster = cb.Cluster.local(1, 2, python=python, name=name, detached=True).start()
print(cluster.id, flush=True)
"""

RANKS = """\
import sys
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for i in range(3):
    print(f"line {i} of rank {rank} on", MPI.Get_processor_name(), flush=True)
"""


def served(host: FakeHost) -> list[psutil.Process]:
    """The processes on ``host`` that serve attached handles (clusterbook serve-dir)."""
    found = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            if "serve-dir" in proc.cmdline():
                found.append(proc)
    return found


def none_served(host: FakeHost, within: float = 10.0) -> list[psutil.Process]:
    """What still serves handles on ``host`` after ``within`` s (a zombie has gone)."""
    give_up = time.monotonic() + within
    while (left := [p for p in served(host) if _running(p)]) and time.monotonic() < give_up:
        time.sleep(0.05)
    return left


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """One fake host, node1, whose ssh sessions see a directory of their own at the default
    run root's place: what runs there is not on this machine's file system."""
    require_testbed()
    made = make_testbed(1, tmp_path_factory.mktemp("bed"))
    try:
        own = made.directory / "node1-state"
        own.mkdir(mode=0o700)
        made.hosts[0].rebind([(own, STATE)])
        yield made
    finally:
        made.close()


@pytest.fixture
def remote(bed: Testbed) -> Iterator[tuple[FakeHost, str]]:
    """A detached cluster started on node1 over ssh, stopped there at the end whatever the
    test did; yields the host and the cluster's name."""
    host = bed.hosts[0]
    name = f"far-{os.getpid()}-{time.monotonic_ns()}"
    started = bed.ssh(host, [PYTHON, "-c", STARTER, PYTHON, name], timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        yield host, name
    finally:
        bed.ssh(host, [*CLI, "stop", name], timeout=60)


def reach(bed: Testbed, **how: str) -> dict[str, str]:
    """How this machine logs in to the fake hosts: the testbed's key and known_hosts."""
    return {"identity": str(bed.identity), "known_hosts": str(bed.known_hosts), **how}


def flags(bed: Testbed) -> list[str]:
    return ["--identity", str(bed.identity), "--known-hosts", str(bed.known_hosts),
            "--python", PYTHON]  # fmt: skip


def supervisors(host: FakeHost) -> list[int]:
    """The detached clusters' supervisors running on ``host``."""
    out = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            if "clusterbook.cluster.detached" in psutil.Process(pid).cmdline():
                out.append(pid)
    return out


def on_head(bed: Testbed, path: str | Path) -> Path:
    """Where this machine sees a path of node1's run root."""
    return bed.directory / "node1-state" / Path(path).relative_to(STATE)


def test_a_cluster_on_another_machine_is_attached_over_ssh(bed, remote) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        assert cluster.name == name
        assert cluster.state == "running"
        assert cluster.record.head_host == "node1"
        assert not Path(cluster.run_dir).exists()  # not on this machine's file system
        assert f"attached over ssh to root@{host.addr}" in repr(cluster)
        cluster.wait_ready(60)
        assert cluster.status()["state"].tolist() == ["joined"]
        job = cluster.mpirun([PYTHON, "-c", RANKS], np=2)
        assert job.wait(60).ok
        logs = job.logs()
        lines = sorted(f"line {i} of rank {r} on node1" for i in range(3) for r in range(2))
        assert sorted(logs["line"]) == lines
        assert sorted(r.line for r in cluster.job().stream()) == lines
        assert cluster.jobs[0].outcome is not None
        runs = cluster.run_on_nodes(["hostname"])
        assert runs["stdout"].str.strip().tolist() == ["node1"]
        only = cluster.nodes[0].name
        assert cluster.run_on_nodes(["hostname"], nodes=[only]).node.tolist() == [only]
        with pytest.raises(cb.ConfigError, match=f"'nope' is not a node.*its nodes are {only}"):
            cluster.run_on_nodes(["hostname"], nodes=["nope"])
        written = bed.directory / f"written-{name}.txt"  # node1 shares this directory
        cluster.write(written, "over ssh\n", nodes=only, mode=0o600)
        assert (written.read_text(), written.stat().st_mode & 0o777) == ("over ssh\n", 0o600)
        with pytest.raises(cb.ConfigError, match="give an absolute path on that machine"):
            cluster.put("train.py")  # a path of this machine's directory means nothing there
        assert served(host)  # the reader and the relay, while the handle is open
        head = supervisors(host)
        assert len(head) == 1
        cluster.stop()
        assert cluster.state == "stopped"
        assert "attached handle" in (cluster.record.stop_reason or "")
        with contextlib.suppress(psutil.NoSuchProcess):  # gone, and reaped, already
            assert psutil.wait_procs([psutil.Process(head[0])], timeout=10)[1] == []
    assert none_served(host) == []


def test_functions_run_on_a_cluster_on_another_machine(bed, remote) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    scale = 10  # a closure's value travels with the function
    big = b"x" * (9 << 20)  # more than one message of the connection holds

    def where(x: int, data: bytes) -> tuple[str, int, int, int]:
        import os
        import socket

        return socket.gethostname(), int(os.environ["OMPI_COMM_WORLD_RANK"]), x * scale, len(data)

    def fail() -> None:
        raise ValueError("no luck on the far side")

    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        cluster.wait_ready(60)
        job = cluster.submit(where, 4, big, np=2)
        assert job.result(timeout=120) == [("node1", r, 40, len(big)) for r in range(2)]
        kept = on_head(bed, job.directory) / "values"
        assert sorted(p.name for p in kept.iterdir()) == ["rank-0.value", "rank-1.value"]
        assert list((on_head(bed, cluster.run_dir) / "functions").iterdir()) == []
        with pytest.raises(cb.JobFailedError, match="raised ValueError: no luck") as raised:
            cluster.submit(fail, np=1).result(timeout=60)
        assert "no luck on the far side" in raised.value.__cause__.text
        with cluster.executor() as pool:
            futures = [pool.submit(lambda i: i * i, i) for i in range(3)]
            assert [f.result(timeout=60) for f in futures] == [0, 1, 4]
        assert not Path(cluster.run_dir).exists()  # all of it on the head's machine
    assert none_served(host) == []


def test_the_commands_reach_a_cluster_on_another_machine(bed, remote) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        assert cluster.mpirun([PYTHON, "-c", RANKS], np=2).wait(60).ok

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120)

    listed = run("ls", "--host", f"root@{host.addr}", *flags(bed))
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if name in line)
    assert "running" in row.split()
    status = run("status", address, *flags(bed))
    assert status.returncode == 0, status.stderr
    assert f"{name} (" in status.stdout
    assert "job-0001" in status.stdout
    logs = run("logs", address, "job-0001", "--rank", "1", *flags(bed))
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [f"[1] line {i} of rank 1 on node1" for i in range(3)]
    there = run("exec", address, *flags(bed), "--", "hostname")
    assert (there.returncode, there.stdout.split()[1:]) == (0, ["node1"]), there.stderr
    alone = run("ls", "--identity", str(bed.identity))
    assert alone.returncode == 2
    assert "--identity say how to reach another machine; give it with --host" in alone.stderr
    here = run("status", name, "--python", PYTHON)  # a name of this machine's clusters
    assert here.returncode == 2
    assert f"--python {PYTHON} say how to reach a cluster on another machine" in here.stderr
    stopped = run("stop", address, *flags(bed))
    assert stopped.returncode == 0, stopped.stderr
    assert "stopped" in stopped.stdout
    assert supervisors(host) == []
    assert none_served(host) == []


def test_a_handle_that_does_not_hold_the_clusters_secret_is_refused(bed, remote) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        token = on_head(bed, cluster.run_dir) / "token"
        right = token.read_text()
        token.write_text("ab" * 32 + "\n")  # still 0600: read, but not the head's secret
        try:
            with pytest.raises(cb.ClusterStateError, match="do not share the cluster's secret"):
                cluster.mpirun([PYTHON, "-c", "print(1)"], np=1)
        finally:
            token.write_text(right)
        assert cluster.state == "running"
        assert cluster.jobs == []  # nothing ran
    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        assert cluster.mpirun([PYTHON, "-c", "print(1)"], np=1).wait(60).ok
    assert none_served(host) == []


def test_a_host_whose_key_is_not_the_known_one_is_refused(bed, remote, tmp_path) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    swapped = tmp_path / "known_hosts"
    key = other.with_suffix(".pub").read_text().split()[:2]
    swapped.write_text(f"{host.addr} {' '.join(key)}\n")
    with pytest.raises(cb.HostKeyChangedError, match="CHANGED"):
        cb.Cluster.attach(address, **reach(bed, known_hosts=str(swapped), python=PYTHON))
    unknown = tmp_path / "none"
    unknown.write_text("")
    with pytest.raises(cb.HostKeyUnknownError, match=f"{host.addr} is not known"):
        cb.Cluster.attach(address, **reach(bed, known_hosts=str(unknown), python=PYTHON))
    assert served(host) == []  # nothing ran there


def test_a_dropped_connection_is_said_and_the_next_call_connects_again(bed, remote) -> None:
    host, name = remote
    address = f"ssh://root@{host.addr}/{name}"
    with cb.Cluster.attach(address, **reach(bed, python=PYTHON)) as cluster:
        cluster.wait_ready(60)
        failed: list[BaseException] = []

        def slow() -> None:
            try:
                cluster.run_on_nodes(["sleep", "30"], timeout=60)
            except BaseException as exc:
                failed.append(exc)

        asking = threading.Thread(target=slow)
        asking.start()
        _until(lambda: _sleeping(host))
        for pid in _sessions(host):  # the connection's sshd: as a network that drops it
            os.kill(pid, signal.SIGKILL)
        asking.join(60)
        assert not asking.is_alive()
        assert len(failed) == 1
        assert isinstance(failed[0], cb.ClusterStateError), failed
        assert "Lost the ssh connection" in str(failed[0])
        assert cluster.state == "running"  # connected again
        assert cluster.run_on_nodes(["hostname"])["stdout"].str.strip().tolist() == ["node1"]
    assert none_served(host) == []


def test_what_cannot_be_reached_is_named(bed, remote) -> None:
    host, name = remote
    with pytest.raises(cb.UnknownClusterError, match=f"On root@{host.addr}: No cluster 'nope'"):
        cb.Cluster.attach(f"ssh://root@{host.addr}/nope", **reach(bed, python=PYTHON))
    # Neither `clusterbook` on the PATH of its sessions nor python3 has clusterbook there.
    unfound = r"Cannot run clusterbook \(or python3 -m clusterbook\) on root@"
    with pytest.raises(cb.ConfigError, match=unfound):
        cb.Cluster.attach(f"ssh://root@{host.addr}/{name}", **reach(bed))
    with pytest.raises(cb.ConfigError, match="No module named clusterbook"):
        cb.Cluster.attach(f"ssh://root@{host.addr}/{name}", **reach(bed, python="/usr/bin/python3"))
    assert none_served(host) == []


def _until(condition, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _sleeping(host: FakeHost) -> bool:
    with contextlib.suppress(psutil.Error):
        return any(psutil.Process(p).cmdline()[:2] == ["sleep", "30"] for p in host.processes())
    return False


def _sessions(host: FakeHost) -> list[int]:
    """The sshd processes of the connections to ``host`` (its listening sshd is spared)."""
    out = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            if pid != host.sshd.pid and psutil.Process(pid).name() == "sshd":
                out.append(pid)
    return out
