"""Faults of SSH clusters on fake hosts (real sshd, real Open MPI): a corrupt rendezvous
state, a node cut off (link down, or every packet silently dropped), the owner SIGKILLed or
exiting without stop(), a host key swapped, a job timing out on a partitioned node.

Each ends in a clear state: the cluster says what happened, nothing hangs, and no process,
key or file of the cluster stays on a node."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.nodes.tasks.program import ENTRY
from clusterbook.rendezvous.agent import HEAD_LEASE, parse_join_url
from clusterbook.rendezvous.backends.tcp import TcpBackend, read_secret
from tests.conftest import mpi_debris
from tests.testbed import AGENT_NAME, FakeHost, Testbed, is_agent
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

SLEEPER = """\
import socket, time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("started", socket.gethostname(), flush=True)
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def nothing_left(testbed: Testbed) -> Iterator[None]:
    """Every test leaves the hosts as it found them: no key, directory or process."""
    yield
    for host in testbed.hosts:
        with contextlib.suppress(Exception):
            host.link_up()
        with contextlib.suppress(Exception):
            host.pass_traffic()
    left = {h.name: h.authorized_keys.read_text().count("clusterbook:") for h in testbed.hosts}
    assert set(left.values()) == {0}, f"cluster keys left behind: {left}"
    assert wait_for(lambda: not strays(testbed), 10), f"processes left: {strays(testbed)}"


def strays(bed: Testbed, keep: Callable[[str], bool] = lambda _: False) -> dict[str, list[str]]:
    """Command lines of the processes in the hosts other than sshd (and ``keep``)."""
    out: dict[str, list[str]] = {}
    for host in bed.hosts:
        for pid in host.processes():
            if pid == host.sshd.pid:
                continue
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                line = " ".join(proc.cmdline())
                if proc.name() == AGENT_NAME:  # a fork of a session: its command line
                    line = f"{AGENT_NAME}: {line}"
                if not keep(line):
                    out.setdefault(host.name, []).append(line[:120])
    return out


def cluster_files(host: FakeHost) -> list[str]:
    return [p.name for p in (host.home / ".clusterbook" / "clusters").iterdir()]


def wait_for(condition: Callable[[], object], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def started(job: cb.Job, ranks: int) -> None:
    seen = 0
    for record in job.stream():
        seen += record.line.startswith("started")
        if seen == ranks:
            return
    raise AssertionError(f"the job ended before {ranks} ranks started: {job.wait().summary()}")


def job_processes(line: str) -> bool:
    """A process of the cluster's jobs or agents (not an ssh session of the head, nor the
    Python each session runs the bootstrap's tasks in: ``python -c SOURCE``)."""
    if line.startswith(f"{AGENT_NAME}: "):
        return True
    if line.split()[1:2] == ["-c"]:
        return False
    return any(word in line for word in ("prted", "sleeper.py", "worker join"))


# -- a corrupt rendezvous state -------------------------------------------------------------


def test_a_corrupt_rendezvous_state_shows_and_stop_still_cleans_every_node(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2).start()
    try:
        # The store's join URL (what each agent was given), its secret from the head's token
        # file: what someone holding the token could do.
        url = cluster._provider.head.join_url
        assert url is not None
        assert cluster.id in url
        store, _ = parse_join_url(url)
        token_file = Path.home() / ".clusterbook" / "clusters" / cluster.id / "token"
        with TcpBackend(store, read_secret(token_file)) as backend:
            current = backend.get_state()
            assert current is not None
            assert backend.set_state(b"\x00 not a rendezvous state", current[1])[2]
        assert wait_for(lambda: cluster.snapshot().problem is not None, 10)
        assert "cannot be read" in (cluster.snapshot().problem or "")
        assert "PROBLEM" in repr(cluster)
    finally:
        cluster.stop()  # must neither raise nor skip a node
    for host in testbed.hosts[:2]:
        assert cluster.id not in cluster_files(host)
    assert wait_for(lambda: not strays(testbed), 5), strays(testbed)  # sessions closing


# -- a node cut off -------------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["link down", "silent drop"])
def test_a_node_cut_off_is_lost_fails_its_job_and_its_agent_stops_its_processes(
    testbed: Testbed, openmpi_python: str, tmp_path: Path, cut: str
) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    node1, node2 = testbed.hosts[:2]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2).start()
    try:
        job = cluster.mpirun(["python", str(sleeper)], np=2, timeout=300)
        started(job, 2)
        assert strays(testbed, keep=lambda line: not job_processes(line)).get(node2.name)
        if cut == "link down":
            node2.link_down()
        else:
            node2.drop_traffic()
        result = job.wait(timeout=60)  # the head fails it: no waiting for the 300 s timeout
        assert isinstance(job.error, cb.NodeLostError)
        assert job.error.node == node2.addr
        assert f"Node {node2.addr} (node2) was lost" in (result.error or "")
        assert result.summary().count("was lost") == 1
        status = cluster.status().set_index("node")
        assert status.loc[node2.addr, "state"] == "lost"
        # Cut off from the head past its lease, node2's agent stops every process of the
        # cluster's jobs there (the MPI daemon too), removes what the bootstrap put there and
        # exits; the head's ssh sessions are all that is left until the link is back.
        on_node2 = lambda: strays(testbed, keep=lambda line: not job_processes(line)).get(  # noqa: E731
            node2.name
        )
        assert wait_for(lambda: not on_node2(), 20), on_node2()
        # node1's part of the job was stopped by the head.
        assert not any("sleeper" in line for line in strays(testbed).get(node1.name, []))
        assert wait_for(lambda: cluster.id not in cluster_files(node2), 5)
        assert "clusterbook:" not in node2.authorized_keys.read_text()
        # node1 is fine, but a job cannot run on a cluster with a lost node: said at once.
        with pytest.raises(cb.ClusterStateError, match=f"{node2.addr}.*was lost"):
            cluster.mpirun(["python", str(sleeper)], np=2)
    finally:
        node2.link_up()
        node2.pass_traffic() if cut == "silent drop" else None
        cluster.stop()
    assert cluster.id not in cluster_files(node1)


def test_nodes_whose_agents_gave_up_are_lost_for_good_and_every_call_says_so(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    """Every node cut off past its agent's lease (as when the head is paused): the agents
    clean up and exit, so the nodes cannot come back; status, wait_ready() and mpirun() all
    say so with one reason, instead of a cluster that looks as if its nodes were coming."""
    nodes = testbed.hosts[:2]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2).start()
    try:
        for host in nodes:
            host.link_down()
        try:
            # The agents give up once they lost the head for their lease, and clean up.
            assert wait_for(lambda: all(cluster.id not in cluster_files(h) for h in nodes), 20)
        finally:
            for host in nodes:
                host.link_up()
        assert wait_for(lambda: "were lost" in (cluster.snapshot().problem or ""), 20)
        problem = cluster.snapshot().problem or ""
        named = ", ".join(f"{h.addr} ({h.name})" for h in nodes)
        assert problem.startswith(f"Nodes {named} were lost for good: not heard from"), problem
        assert problem.endswith("Stop the cluster and start a new one.")
        assert set(cluster.status()["state"]) == {"lost"}
        assert cluster.state == "running"
        with pytest.raises(cb.ClusterStateError) as waited:
            cluster.wait_ready(30)
        with pytest.raises(cb.ClusterStateError) as ran:
            cluster.mpirun(["python", "-c", "print(1)"], np=2)
        assert str(waited.value) == str(ran.value) == problem
    finally:
        cluster.stop()
    assert cluster.jobs == []


def test_a_timeout_on_a_partitioned_node_names_it(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    sleeper = tmp_path / "sleeper.py"
    sleeper.write_text(SLEEPER)
    node2 = testbed.hosts[1]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2).start()
    try:
        node2.link_down()
        job = cluster.mpirun(["python", str(sleeper)], np=2, timeout=2.0)
        result = job.wait(timeout=60)
        assert not result.ok
        summary = result.summary()
        # Whichever comes first, the timeout or the loss, the summary names the node.
        assert f"Node {node2.addr} (node2)" in summary, summary
        if result.timed_out:
            assert "has not been heard from" in summary or "was lost" in summary
    finally:
        node2.link_up()
        cluster.stop()


# -- the owner dies -------------------------------------------------------------------------

OWNER = """\
import sys
import clusterbook as cb
hosts, identity, known_hosts, python, run_dir, sleeper, ending = sys.argv[1:]
cluster = cb.Cluster.ssh(
    hosts.split(","), identity=identity, known_hosts=known_hosts, python=python,
    run_dir=run_dir, connect_timeout=10,
)
cluster.start()
job = cluster.mpirun(["python", sleeper], np=2)
seen = 0
for record in job.stream():
    seen += record.line.startswith("started")
    if seen == 2:
        break
print("READY", cluster.id, flush=True)
if ending == "hang":
    sys.stdin.read()
"""


@pytest.fixture
def owner(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> Iterator[Callable[[str], tuple[subprocess.Popen[str], str]]]:
    """Start a Python process that owns an SSH cluster of two hosts running a job, and
    ``ending`` (``"hang"``: waits for its stdin; ``"exit"``: exits without stop()); return it
    and its cluster's id. Killed at teardown if still there."""
    started: list[subprocess.Popen[str]] = []

    def start(ending: str) -> tuple[subprocess.Popen[str], str]:
        sleeper = tmp_path / "sleeper.py"
        sleeper.write_text(SLEEPER)
        script = tmp_path / "owner.py"
        script.write_text(OWNER)
        hosts = ",".join(f"{h.addr}:1" for h in testbed.hosts[:2])
        args = [hosts, str(testbed.identity), str(testbed.write_known_hosts()), openmpi_python]
        args += [str(tmp_path / "run"), str(sleeper), ending]
        proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), line
        return proc, line.split()[1]

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("ending", ["sigkill", "exit without stop"])
def test_nodes_clean_themselves_when_their_owner_dies(
    testbed: Testbed, owner: Callable[[str], tuple[subprocess.Popen[str], str]], ending: str
) -> None:
    proc, cluster_id = owner("hang" if ending == "sigkill" else "exit")
    for host in testbed.hosts[:2]:
        assert cluster_id in cluster_files(host)
        assert f"clusterbook:{cluster_id}" in host.authorized_keys.read_text()
    if ending == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)

    # Within its lease, each node's agent stops the cluster's processes there and removes
    # the key line and the files the bootstrap installed (or stop() did it at exit).
    def cleaned() -> bool:
        return not strays(testbed) and all(
            cluster_id not in cluster_files(h)
            and "clusterbook:" not in h.authorized_keys.read_text()
            for h in testbed.hosts[:2]
        )

    assert wait_for(cleaned, HEAD_LEASE + 8), strays(testbed)


# -- a host key swapped ---------------------------------------------------------------------


def test_a_swapped_host_key_says_the_key_changed(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    node2 = testbed.hosts[1]
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2).start()
    try:
        node2.swap_host_key()  # a reinstalled node, or another machine at its address
        # Its sessions ended, the warm launches' connection among them: said, then refused.
        with pytest.warns(cb.ColdLaunchWarning, match=node2.addr):
            job = cluster.mpirun(["python", "-c", "print('hi')"], np=2, timeout=60)
        result = job.wait(timeout=90)
        assert not result.ok
        summary = result.summary()
        assert f"The host key of {node2.addr} changed" in summary, summary
    finally:
        with pytest.warns(cb.CleanupWarning, match=node2.addr):
            cluster.stop()  # node2 is refused (its key changed): named, not cleaned
        # Clean node2 by hand, as its admin would after checking the new key.
        testbed.write_known_hosts()
        args = json.dumps({"cluster_id": cluster.id, "tag": f"clusterbook:{cluster.id}"})
        done = testbed.ssh(node2, [openmpi_python, ENTRY, "cleanup", args])
        assert done.returncode == 0, done.stderr
    assert os.path.exists(testbed.known_hosts)


def test_the_cleanup_command_removes_what_nobody_could(
    testbed: Testbed,
    owner: Callable[[str], tuple[subprocess.Popen[str], str]],
    openmpi_python: str,
) -> None:
    nodes = testbed.hosts[:2]
    proc, cluster_id = owner("hang")
    # The agents die with their owner, before they can clean anything.
    for host in nodes:
        for pid in host.processes():
            with contextlib.suppress(psutil.Error):
                if is_agent(psutil.Process(pid)):
                    os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    time.sleep(HEAD_LEASE + 1)
    assert all(f"clusterbook:{cluster_id}" in h.authorized_keys.read_text() for h in nodes)
    assert all(cluster_id in cluster_files(h) for h in nodes)
    command = [sys.executable, "-m", "clusterbook", "cleanup", cluster_id]
    command += ["--hosts", ",".join(h.addr for h in nodes), "--identity", str(testbed.identity)]
    command += ["--known-hosts", str(testbed.known_hosts), "--python", openmpi_python]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    for host in nodes:
        assert f"{host.addr}: stopped" in done.stdout
        assert "clusterbook:" not in host.authorized_keys.read_text()
        assert cluster_id not in cluster_files(host)
    assert wait_for(lambda: not strays(testbed), 10), strays(testbed)
    # Again: nothing left to do, no error.
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert again.returncode == 0, again.stderr
    assert "removed 0 key line(s)" in again.stdout


def test_the_cleanup_command_refuses_a_bad_id() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "clusterbook", "cleanup", "../etc"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "'../etc' is not a cluster id" in done.stderr


STUBBORN = """\
import signal, time
from mpi4py import MPI
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only SIGKILL ends it: MPI cannot clean up
MPI.COMM_WORLD.Barrier()
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.alone  # what it checks is every MPI job's files in /dev/shm and /tmp
def test_a_killed_job_leaves_no_mpi_debris_on_the_nodes(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    program = tmp_path / "stubborn.py"
    program.write_text(STUBBORN)
    before = mpi_debris()
    with testbed.cluster(openmpi_python, tmp_path / "run", hosts=2, slots=2) as cluster:
        job = cluster.mpirun(["python", str(program)], np=4, timeout=120)
        started(job, 4)
        assert {p for p in mpi_debris() - before if "prted." in p}, "no daemon session to check"
        assert job.cancel()
        assert job.cancelled()
        assert wait_for(lambda: not mpi_debris() - before, 5), mpi_debris() - before
