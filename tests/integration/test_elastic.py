"""Elastic clusters with real agent processes: join, heartbeat, loss, pause, late arrival,
closing, and a lost head."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pandas as pd
import pytest

import clusterbook as cb
from clusterbook.rendezvous.backends.tcp import write_secret
from clusterbook.rendezvous.backends.tcp_server import StoreServer
from clusterbook.rendezvous.state import RendezvousState, encode
from tests.conftest import agent_stderr, print_agent_logs, rank_lines, ranks_started

pytestmark = pytest.mark.mpi


@pytest.fixture
def agents(tmp_path) -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start agent processes (``clusterbook worker join ...``); all are gone at teardown."""
    started: list[subprocess.Popen[str]] = []

    def start(command: str, node: str, *extra: str) -> subprocess.Popen[str]:
        argv = shlex.split(command)[1:]  # drop the program name: run it with this Python
        with agent_stderr(tmp_path, node) as said:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "clusterbook",
                    *argv,
                    "--node-id",
                    node,
                    "--slots",
                    "1",
                    *extra,
                ],
                stdout=subprocess.DEVNULL,
                stderr=said,
                text=True,
            )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        proc.wait(timeout=10)
    print_agent_logs(tmp_path)


def eventually(check: Callable[[], bool], timeout: float = 20.0) -> float:
    """Wait until ``check()`` holds; return how long it took (fail after ``timeout``)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - t0


def states(cluster: cb.Cluster) -> dict[str, str]:
    frame = cluster.status()
    return dict(zip(frame.node, frame.state, strict=True))


@pytest.fixture
def elastic(tmp_path) -> Iterator[Callable[..., cb.Cluster]]:
    made: list[cb.Cluster] = []

    def make(min_nodes: int, max_nodes: int, **kw: object) -> cb.Cluster:
        cluster = cb.Cluster.elastic(min_nodes, max_nodes, run_dir=tmp_path / f"r{len(made)}", **kw)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.stop()


def test_agents_join_and_run_a_job(elastic, agents, program):
    cluster = elastic(2, 3, last_call=0.5)
    seen: list[cb.ClusterSnapshot] = []
    cluster.subscribe(seen.append)
    for i in range(3):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    frame = cluster.status()
    assert frame.node.tolist() == ["n0", "n1", "n2"]
    assert frame.state.tolist() == ["joined"] * 3
    assert frame["round"].tolist() == [0, 0, 0]
    assert (frame.heartbeat_age < pd.Timedelta(seconds=10)).all()
    assert [n.name for n in cluster.nodes] == ["n0", "n1", "n2"]  # by rank
    job = cluster.mpirun(
        ["python", "-c", "from mpi4py import MPI; print(MPI.COMM_WORLD.size)"],
        np=3,
        oversubscribe=True,  # three nodes on this machine, which may have fewer cores
        timeout=120,
    )
    assert job.wait().ok
    assert rank_lines(job) == ["3"] * 3
    assert any(len(s.nodes) == 3 for s in seen)  # subscribers saw the nodes arrive


def test_a_killed_agent_is_dropped_at_once_and_a_new_round_forms(elastic, agents):
    cluster = elastic(2, 3, last_call=0.5)
    procs = [agents(cluster.join_command, f"n{i}") for i in range(3)]
    cluster.wait_ready(timeout=60)
    procs[1].send_signal(signal.SIGKILL)
    took = eventually(lambda: states(cluster)["n1"] == "lost")
    # Faster than a missed heartbeat could tell (interval 1 s x 3): the connection-loss path.
    assert took < cluster._provider.settings.dead_after

    def next_round_without_n1() -> bool:
        rounds = cluster.status().set_index("node")["round"].to_dict()
        return rounds["n0"] == rounds["n2"] == 1 and [n.name for n in cluster.nodes] == ["n0", "n2"]

    eventually(next_round_without_n1)


def test_a_paused_agent_is_dropped_after_missed_heartbeats_then_rejoins(elastic, agents):
    cluster = elastic(2, 3, last_call=0.5)
    procs = [agents(cluster.join_command, f"n{i}") for i in range(3)]
    cluster.wait_ready(timeout=60)
    dead_after = cluster._provider.settings.dead_after
    procs[2].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    eventually(lambda: states(cluster)["n2"] == "lost", timeout=30)
    assert time.monotonic() - t0 >= dead_after - 1.0  # not before its heartbeats expired
    eventually(lambda: sorted(n.name for n in cluster.nodes) == ["n0", "n1"])
    procs[2].send_signal(signal.SIGCONT)
    eventually(lambda: sorted(n.name for n in cluster.nodes) == ["n0", "n1", "n2"], timeout=30)
    assert set(states(cluster).values()) == {"joined"}


def test_a_late_node_waits_then_joins_the_next_round(elastic, agents):
    cluster = elastic(2, 3, last_call=0.3)
    for i in range(2):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    first_round = cluster.status()["round"].max()
    assert [n.name for n in cluster.nodes] == ["n0", "n1"]
    agents(cluster.join_command, "late")
    eventually(lambda: sorted(n.name for n in cluster.nodes) == ["late", "n0", "n1"], timeout=30)
    assert cluster.status()["round"].max() == first_round + 1


def test_wait_ready_names_who_joined(elastic, agents):
    cluster = elastic(2, 2)
    agents(cluster.join_command, "alone")
    eventually(lambda: "alone" in states(cluster))
    with pytest.raises(cb.ReadyTimeoutError, match=r"1 of at least 2 nodes joined \(alone\)"):
        cluster.wait_ready(timeout=1)
    with pytest.raises(cb.ClusterStateError, match="no nodes yet"):
        cluster.mpirun(["true"], np=1)


def test_an_elastic_cluster_that_lost_every_node_waits_for_nodes_to_join_again(elastic, agents):
    """Nodes may join an elastic cluster again: losing them all is not the end of it. mpirun
    says they were lost and how nodes join; wait_ready() waits for a round, as at the start."""
    cluster = elastic(2, 2, last_call=0.2)
    first = [agents(cluster.join_command, f"n{i}") for i in range(2)]
    cluster.wait_ready(timeout=60)
    for proc in first:
        proc.send_signal(signal.SIGKILL)
    eventually(lambda: set(states(cluster).values()) == {"lost"})
    assert cluster.snapshot().problem is None  # nothing is wrong: it waits for nodes
    with pytest.raises(cb.ClusterStateError) as refused:
        cluster.mpirun(["true"], np=1)
    said = str(refused.value)
    assert said.startswith(f"Cluster {cluster.name!r} has no nodes now: Node n0 (")
    assert "Node n1 (" in said
    assert "was lost" in said
    assert f"Nodes join with: {cluster.join_command}; " in said
    with pytest.raises(cb.ReadyTimeoutError, match=r"0 of at least 2 nodes joined \(none\)"):
        cluster.wait_ready(timeout=0.5)  # not returned at once with nobody there
    for i in range(2):
        agents(cluster.join_command, f"m{i}")
    cluster.wait_ready(timeout=60)
    assert [n.name for n in cluster.nodes] == ["m0", "m1"]
    assert cluster.mpirun(["true"], np=2).wait(60).ok


def test_stop_closes_the_rendezvous_and_agents_leave(elastic, agents):
    cluster = elastic(1, 2, last_call=0.2)
    procs = [agents(cluster.join_command, f"n{i}") for i in range(2)]
    cluster.wait_ready(timeout=60)
    # Both reached the store (a round of one may complete before the other starts, on a
    # loaded machine): an agent that never reached it exits 3 once its first contact ran out.
    deadline = time.monotonic() + 60
    while set(cluster._provider.head.reports()) != {"n0", "n1"}:
        assert time.monotonic() < deadline, cluster._provider.head.reports()
        time.sleep(0.05)
    cluster.stop()
    assert [p.wait(timeout=30) for p in procs] == [0, 0]
    assert cluster._provider.token_file is not None
    assert not cluster._provider.token_file.exists()


def join_url_of(server: StoreServer, rest: str) -> str:
    """A join URL to ``server``'s store: ``rest`` is the run id and the settings."""
    host, port = server.address
    return f"tcp://{host}:{port}/{rest}&fingerprint={server.fingerprint}"


def test_agents_exit_when_the_head_is_gone_for_their_lease(tmp_path, agents):
    secret = write_secret(tmp_path / "token")
    server = StoreServer(secret=secret).start()
    url = join_url_of(server, "lease-test?min=1&max=1&last_call=0.1")
    try:
        proc = agents(
            f"x worker join {url} --token-file {tmp_path / 'token'}", "n0", "--lease", "1"
        )
        time.sleep(1.0)  # joined and heartbeating
        assert proc.poll() is None
    finally:
        server.close()  # the head dies without closing the rendezvous
    assert proc.wait(timeout=30) == 3
    assert "exits" in (tmp_path / "agent-n0.stderr").read_text()


def test_joining_a_closed_rendezvous_exits(tmp_path, agents):
    secret = write_secret(tmp_path / "token")
    with StoreServer(secret=secret) as server:
        server.start()
        from clusterbook.rendezvous.backends.tcp import TcpBackend

        with TcpBackend(server.url, secret) as client:
            client.set_state(encode(RendezvousState(closed=True)))
        url = join_url_of(server, "closed-test?min=1&max=2")
        proc = agents(f"x worker join {url} --token-file {tmp_path / 'token'}", "n0")
        assert proc.wait(timeout=30) == 0
        assert "closed" in (tmp_path / "agent-n0.stderr").read_text()


def test_bad_settings_are_refused_like_torch():
    with pytest.raises(
        cb.ConfigError,
        match=r"The maximum number of nodes \(1\) must be greater "
        r"than or equal to the minimum number of nodes \(2\)\.",
    ):
        cb.Cluster.elastic(2, 1)
    with pytest.raises(cb.ConfigError, match="last_call must be a duration > 0"):
        cb.Cluster.elastic(1, 2, last_call=0)


def test_the_head_asks_agents_to_stop_a_jobs_processes(elastic, agents):
    cluster = elastic(1, 1, last_call=0.1)
    agents(cluster.join_command, "n0")
    cluster.wait_ready(timeout=60)
    token = f"{cluster.id}:feedbeef"
    stray = subprocess.Popen(  # a rank the launcher lost track of, tagged with its job
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={"CLUSTERBOOK_JOB": token, "PATH": "/usr/bin:/bin"},
    )
    bystander = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        env={"CLUSTERBOOK_JOB": f"{cluster.id}:otherjob", "PATH": "/usr/bin:/bin"},
    )
    try:
        cluster._provider.reach.stop_job(token)
        assert stray.wait(timeout=30) != 0
        assert bystander.poll() is None
    finally:
        for p in (stray, bystander):
            p.kill()
            p.wait()


@pytest.mark.sshd
def test_an_agent_can_start_its_own_sshd_and_report_its_key(elastic, agents, tmp_path):
    import shutil
    import socket
    from pathlib import Path

    from tests.conftest import require

    require(Path("/usr/sbin/sshd").exists(), "OpenSSH sshd is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    node = f"sshd-{tmp_path.name[-10:]}".replace("_", "-")
    cluster = elastic(1, 1, last_call=0.1)
    try:
        agents(cluster.join_command, node, "--start-sshd", str(port))
        cluster.wait_ready(timeout=60)
        report = cluster._provider.head.reports()[node]
        assert report.sshd_port == port
        key = report.sshd_host_key
        assert key is not None
        assert key.startswith("ssh-ed25519 ")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            assert conn.recv(64).startswith(b"SSH-2.0-")
        on_disk = Path.home() / ".clusterbook" / f"sshd-{node}" / "ssh_host_ed25519_key.pub"
        assert on_disk.read_text().split()[:2] == key.split()[:2]
        cluster.stop()
        eventually(lambda: _refused(port), timeout=20)  # the agent stopped its sshd on exit
    finally:
        shutil.rmtree(Path.home() / ".clusterbook" / f"sshd-{node}", ignore_errors=True)


def _refused(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


RESTARTS = """\
import os, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
restart = os.environ["CLUSTERBOOK_RESTART"]
print(f"rank {comm.rank} of {comm.size} restart {restart}", flush=True)
if restart == "0":
    comm.Barrier()
    print("started", flush=True)
    time.sleep(600)  # until the round changes
while not os.path.exists(os.environ.get("RELEASE", "/")):  # held until the test looked
    time.sleep(0.05)
"""


def test_a_job_restarts_on_the_round_left_when_an_agent_is_killed(elastic, agents, program):
    cluster = elastic(2, 3, last_call=0.3)
    procs = [agents(cluster.join_command, f"n{i}") for i in range(3)]
    cluster.wait_ready(timeout=60)
    job = cluster.mpirun(
        ["python", program("restarts.py", RESTARTS)],
        restarts=2,
        oversubscribe=True,  # three nodes on this machine, which may have fewer cores
        timeout=120,
    )
    ranks_started(job, 3)
    procs[1].send_signal(signal.SIGKILL)
    result = job.wait(timeout=120)
    assert result.ok, result.summary()
    assert [(a.outcome, a.reason) for a in result.attempts] == [
        ("node-lost", "node n1 lost"),
        ("ok", "succeeded"),
    ]
    assert result.restarts == 1
    assert [n.name for n in job.plan.nodes] == ["n0", "n2"]
    second = sorted(job.logs().query("attempt == 2").line)
    assert second == ["rank 0 of 2 restart 1", "rank 1 of 2 restart 1"]


def test_a_job_restarts_on_the_larger_round_when_a_node_joins(elastic, agents, program, tmp_path):
    cluster = elastic(2, 3, last_call=0.3)
    for i in range(2):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    release = tmp_path / "release"
    job = cluster.mpirun(
        ["python", program("restarts.py", RESTARTS)],
        restarts=1,
        restart_on_join=True,
        timeout=120,
        env={"RELEASE": str(release)},
    )
    ranks_started(job, 2)
    agents(cluster.join_command, "late")
    eventually(lambda: job.attempt == 2 and states(cluster).get("late") == "running", timeout=60)
    # status() shows the attempt running, the restart count and why the attempt before ended.
    frame = cluster.status().set_index("node")
    assert frame.loc["late", ["job", "attempt", "restarts", "last_reason"]].tolist() == [
        job.id,
        2,
        1,
        "node late joined",
    ]
    release.touch()
    result = job.wait(timeout=120)
    assert result.ok, result.summary()
    assert [(a.outcome, a.reason) for a in result.attempts] == [
        ("node-joined", "node late joined"),
        ("ok", "succeeded"),
    ]
    assert job.np == 3
    second = sorted(job.logs().query("attempt == 2").line)
    assert second == [f"rank {r} of 3 restart 1" for r in range(3)]


def test_without_restart_on_join_a_joining_node_leaves_the_job_alone(elastic, agents, program):
    cluster = elastic(2, 3, last_call=0.3)
    for i in range(2):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    job = cluster.mpirun(["python", program("restarts.py", RESTARTS)], restarts=1, timeout=120)
    ranks_started(job, 2)
    agents(cluster.join_command, "late")
    eventually(lambda: len(cluster.nodes) == 3, timeout=30)
    assert not job.done()
    assert job.attempt == 1
    job.cancel()
