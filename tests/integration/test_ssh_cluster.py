"""SSH clusters on fake hosts (network namespaces with their own hostname and real sshd):
bootstrap, MPI across hosts with both flavours, host key refusal, clean-up."""

from __future__ import annotations

import contextlib
import getpass
import json
import stat
import sys
import time
import warnings

import psutil
import pytest

import clusterbook as cb
from clusterbook.paths import cluster_dir as head_dir
from clusterbook.paths import default_run_root
from tests.testbed import AGENT_NAME
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

HOSTNAME_ALLREDUCE = """\
import os, socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank)
print(f"rank {comm.rank} on {socket.gethostname()} sum {total} env {os.environ['TRICKY']!r}")
"""
TRICKY = 'it\'s "q" $HOME `id` \\ \nline two'
SLEEPER = """\
import time
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()
print("started", flush=True)
time.sleep(600)
"""


@pytest.fixture(autouse=True)
def no_cluster_keys_left(testbed):
    """Every test leaves the nodes' authorized_keys as it found them."""
    yield
    left = {h.name: h.authorized_keys.read_text().count("clusterbook:") for h in testbed.hosts}
    assert set(left.values()) == {0}, f"cluster keys left behind: {left}"


def ssh_cluster(bed, python, tmp_path, slots=1, **kw):
    return bed.cluster(python, tmp_path / "run", slots=slots, **kw)


def cluster_dir(host, cluster):
    return host.home / ".clusterbook" / "clusters" / cluster.id


def stray_processes(bed, wait=5.0):
    """Command lines of processes in the fake hosts other than their sshd, after giving
    closing ssh sessions up to ``wait`` seconds to end."""
    deadline = time.monotonic() + wait
    while True:
        out = {}
        for h in bed.hosts:
            for pid in h.processes():
                if pid == h.sshd.pid:
                    continue
                with contextlib.suppress(psutil.Error):
                    out.setdefault(h.name, []).append(" ".join(psutil.Process(pid).cmdline()))
        if not out or time.monotonic() > deadline:
            return out
        time.sleep(0.1)


def test_mpirun_across_hosts_and_clean_stop(testbed, mpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    cluster = ssh_cluster(testbed, mpi_python, tmp_path, env={"TRICKY": TRICKY})
    with cluster:
        for h in testbed.hosts:
            d = cluster_dir(h, cluster)
            assert stat.S_IMODE((d / "id_ed25519").stat().st_mode) == 0o600
            assert stat.S_IMODE(d.stat().st_mode) == 0o700
            known = (d / "known_hosts").read_text()
            for other in testbed.hosts:  # node-to-node trust comes from the real host keys
                assert other.host_public_key.split()[1] in known
            assert f"clusterbook:{cluster.id}" in h.authorized_keys.read_text()
            assert '"state": "ready"' in (d / "status.json").read_text()
            assert not (d / "env.sh").exists()  # env= values go to the ranks, not to disks
        job = cluster.mpirun(["python", str(script)], np=len(testbed.hosts), timeout=120)
        result = job.wait()
        assert result.ok, result.summary() + "\n" + "\n".join(job.logs().line)
        logs = job.logs()
        lines = sorted(logs[logs.stream == "stdout"].line)
        n = len(testbed.hosts)
        total = n * (n - 1) // 2
        assert lines == [f"rank {r} on node{r + 1} sum {total} env {TRICKY!r}" for r in range(n)]
        by_rank = logs[logs["rank"] >= 0].groupby("rank").host.first().to_dict()
        assert by_rank == {r: f"node{r + 1}" for r in range(n)}
        frame = cluster.status()
        assert frame.node.tolist() == [h.addr for h in testbed.hosts]
        # One agent per node, started over its ssh connection, heartbeating from the node.
        assert frame.host.tolist() == [h.name for h in testbed.hosts]
        assert set(frame.state) == {"joined"}
        assert frame.heartbeat_age.notna().all()
        # A node whose Python has clusterbook starts one interpreter: its agent is a fork of
        # its bootstrap session (same command line), named for what it is and tagged as the
        # cluster's agents; else (MPICH's venv here) the agent is a Python of its own.
        for pid in frame.pid:
            agent = psutil.Process(int(pid))
            assert agent.environ()["CLUSTERBOOK_JOB"] == f"{cluster.id}:agents"
            if mpi_python == sys.executable:
                assert agent.name() == AGENT_NAME
                assert agent.cmdline()[0] == mpi_python
                assert agent.cmdline()[-1] == "session"
            else:
                exec_argv = [sys.executable, "-m", "clusterbook", "worker", "join"]
                assert agent.cmdline()[:5] == exec_argv
    # Stopped, the nodes show as having left (not as pending, as if they had never joined).
    after = cluster.status()
    assert after.node.tolist() == [h.addr for h in testbed.hosts]
    assert set(after.state) == {"left"}
    assert after.heartbeat_age.isna().all()  # no age that stands still after the end
    for h in testbed.hosts:
        assert not cluster_dir(h, cluster).exists()
        keys = h.authorized_keys.read_text()
        assert "clusterbook:" not in keys
        assert keys.strip()  # the testbed's own key is still there
    assert stray_processes(testbed) == {}


def test_stop_kills_running_ranks_on_every_host(testbed, mpi_python, tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    cluster = ssh_cluster(testbed, mpi_python, tmp_path)
    with cluster:
        job = cluster.mpirun(["python", str(script)], np=len(testbed.hosts))
        seen = set()
        for record in job.stream():
            if record.line == "started":
                seen.add(record.host)
            if len(seen) == len(testbed.hosts):
                break
        assert seen == {h.name for h in testbed.hosts}
    assert job.outcome is not None
    assert job.outcome.cancelled
    assert stray_processes(testbed) == {}


def test_unknown_hosts_are_refused_at_once(testbed, tmp_path, openmpi_python):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cluster = ssh_cluster(testbed, openmpi_python, tmp_path, known_hosts=empty)
    with pytest.raises(cb.BootstrapError) as info:
        cluster.start()
    assert set(info.value.problems) == {h.addr for h in testbed.hosts}
    assert "is not known" in str(info.value)
    assert "accept-new" in str(info.value)
    assert stray_processes(testbed) == {}


def test_accept_new_then_a_changed_key_is_refused(testbed, tmp_path, openmpi_python):
    record = tmp_path / "tofu_known_hosts"
    cluster = ssh_cluster(
        testbed, openmpi_python, tmp_path, host_keys="accept-new", known_hosts=record
    )
    with cluster:
        pass
    assert len(record.read_text().splitlines()) == len(testbed.hosts)
    victim = testbed.hosts[1]
    victim.swap_host_key()
    again = ssh_cluster(
        testbed, openmpi_python, tmp_path, host_keys="accept-new", known_hosts=record
    )
    try:
        with pytest.raises(cb.BootstrapError, match="CHANGED") as info:
            again.start()
        assert list(info.value.problems) == [victim.addr]
        assert again.state == "created"
    finally:
        again.stop()
        testbed.write_known_hosts()


def test_node_to_node_ssh_refuses_a_changed_key(testbed, mpi_python, tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    victim = testbed.hosts[2]
    # A cold launch logs in to every node for each job (a warm one runs over the connection
    # checked at start: tests/integration/test_warm_launch.py).
    cluster = ssh_cluster(testbed, mpi_python, tmp_path, env={"TRICKY": "x"}, launch="cold")
    cluster.start()
    try:
        # After bootstrap, a key rotated by a restart of its sshd (the node's agent stays
        # connected): the launcher's own ssh must refuse it. (A host reinstalled outright
        # would end the agent's session too, and be reported lost instead.)
        victim.swap_host_key(keep_sessions=True)
        job = cluster.mpirun(["python", str(script)], np=len(testbed.hosts), timeout=60)
        result = job.wait()
        assert not result.ok
        text = "\n".join(job.logs().line)
        assert "Host key verification failed" in text or "CHANGED" in text, text
    finally:
        # The head's own connection to the victim, checked when it was made, is still
        # there: stop() cleans that host as every other.
        with warnings.catch_warnings():
            warnings.simplefilter("error", cb.CleanupWarning)
            cluster.stop()
        testbed.write_known_hosts()
    for h in testbed.hosts:
        assert not cluster_dir(h, cluster).exists()
        assert "clusterbook:" not in h.authorized_keys.read_text()


def test_link_down_is_reported_with_the_host(testbed, tmp_path, openmpi_python):
    down = testbed.hosts[0]
    down.link_down()
    try:
        cluster = ssh_cluster(testbed, openmpi_python, tmp_path, connect_timeout=2)
        with pytest.raises(cb.BootstrapError) as info:
            cluster.start()
        assert list(info.value.problems) == [down.addr]
        assert "No answer" in str(info.value) or "did not complete" in str(info.value)
    finally:
        down.link_up()


def test_paused_sshd_times_out(testbed, tmp_path, openmpi_python):
    paused = testbed.hosts[1]
    paused.pause_sshd()
    try:
        cluster = ssh_cluster(testbed, openmpi_python, tmp_path, connect_timeout=2)
        with pytest.raises(cb.BootstrapError) as info:
            cluster.start()
        assert list(info.value.problems) == [paused.addr]
    finally:
        paused.resume_sshd()


def test_wrong_port_is_refused(testbed, tmp_path, openmpi_python):
    cluster = ssh_cluster(testbed, openmpi_python, tmp_path, port=2222, connect_timeout=1)
    with pytest.raises(cb.BootstrapError, match="refused the connection"):
        cluster.start()


def test_preflight_names_the_host_and_the_fix(testbed, tmp_path, openmpi_python):
    cluster = ssh_cluster(testbed, openmpi_python, tmp_path, slots=64)
    with pytest.raises(cb.BootstrapError) as info:
        cluster.start()
    for h in testbed.hosts:
        (problem,) = info.value.problems[h.addr]
        assert "64 slots asked, but the node has" in problem
    for h in testbed.hosts:  # nothing was installed
        assert "clusterbook:" not in h.authorized_keys.read_text()


def test_a_command_runs_on_every_node_over_the_kept_sessions(testbed, openmpi_python, tmp_path):
    with ssh_cluster(testbed, openmpi_python, tmp_path) as cluster:
        frame = cluster.run_on_nodes(["sh", "-c", "hostname; test $(hostname) != node2"])
        rows = dict(zip(frame.stdout.str.strip(), frame.returncode, strict=True))
        assert rows == {"node1": 0, "node2": 1, "node3": 0}
        assert frame.host.tolist() == [h.addr for h in testbed.hosts]


def test_cb_run_on_ssh_hosts_leaves_nothing_on_the_nodes(testbed, tmp_path, openmpi_python):
    script = tmp_path / "allreduce.py"
    script.write_text(HOSTNAME_ALLREDUCE)
    cluster = ssh_cluster(testbed, openmpi_python, tmp_path, env={"TRICKY": TRICKY})
    result = cb.run(["python", str(script)], np=len(testbed.hosts), cluster=cluster)
    assert result.ok, result.summary()
    assert sorted(result.rank_hosts.values()) == sorted(h.name for h in testbed.hosts)
    assert cluster.state == "stopped"
    assert stray_processes(testbed) == {}
    for h in testbed.hosts:
        assert not cluster_dir(h, cluster).exists()
    assert not head_dir(cluster.id).exists()  # nor on this machine, the head


def test_work_dir_over_sftp_on_a_fake_host_gets_the_record_and_the_logs(
    testbed, tmp_path, openmpi_python
):
    host = testbed.hosts[0]
    remote = host.home / "mirror" / "run1"
    url = f"sftp://{getpass.getuser()}@{host.addr}{remote}"
    options = {"key_filename": str(testbed.identity), "known_hosts": str(testbed.known_hosts)}
    testbed.write_known_hosts()
    cluster = cb.Cluster.local(1, 2, python=openmpi_python, work_dir=url, work_dir_options=options)
    assert cluster.run_dir.parent == default_run_root()  # the jobs write locally, fast
    with cluster:
        result = cluster.mpirun(["python", "-c", "print('mirrored')"], np=2).wait(60)
        assert result.ok
    record = json.loads((remote / "cluster.json").read_text())
    assert record["state"] == "stopped"
    assert record["id"] == cluster.id
    job = remote / "jobs" / "job-0001"
    for rank in (0, 1):
        assert (job / f"rank-{rank}.log").read_text().rstrip().endswith(" out mirrored")
    assert json.loads((job / "result.json").read_text())["returncode"] == 0
    assert not list(remote.rglob("token"))  # the control token stays local


def test_work_dir_over_sftp_refuses_an_unknown_host_key(testbed, tmp_path, openmpi_python):
    host = testbed.hosts[0]
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    url = f"sftp://{getpass.getuser()}@{host.addr}{host.home}/mirror/run2"
    options = {"key_filename": str(testbed.identity), "known_hosts": str(empty)}
    cluster = cb.Cluster.local(1, 1, python=openmpi_python, work_dir=url, work_dir_options=options)
    with pytest.raises(cb.HostKeyUnknownError, match=host.addr):
        cluster.start()
    assert cluster.state == "created"
    assert not (host.home / "mirror" / "run2").exists()
