"""The agent's side and the launcher's side of daemons started by a node's agent: a real
server on a private socket, the launcher's side run as the MPI launcher runs it (a program of
its own, ssh's arguments), and what each end does when the other goes."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clusterbook.launch import daemons
from clusterbook.launch.daemon_server import DaemonServer
from clusterbook.launch.daemons import forward_name, ping

TOKEN = "c1:job-7"  # noqa: S105 - a job tag


@pytest.fixture
def server(tmp_path):
    """A server whose socket is where the head's forward would be for host ``node1``."""
    srv = DaemonServer(
        str(tmp_path / forward_name("node1")), env={"KEPT": "yes", "SSH_CLIENT": "x"}
    )
    srv.start()
    yield srv
    srv.close()


def helper(directory: Path, cold: str = "/bin/false") -> list[str]:
    return [sys.executable, "-S", "-I", daemons.__file__, str(directory), cold]


def launch(tmp_path: Path, *args: str, token: str = TOKEN, cold: str = "/bin/false", **kw):
    """Run the launcher's side as Open MPI and MPICH do: ssh's options, the host, the words."""
    env = {**os.environ, "CLUSTERBOOK_JOB": token}
    argv = [*helper(tmp_path, cold), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, **kw)


def test_the_daemon_runs_with_its_output_and_exit_code_relayed(server, tmp_path):
    words = ["-x", "-o", "BatchMode=yes", "node1", "echo out $KEPT; echo err >&2;", "exit 7"]
    done = launch(tmp_path, *words)
    assert (done.returncode, done.stdout, done.stderr) == (7, "out yes\n", "err\n")


def test_the_daemon_carries_its_job_tag_and_not_what_says_ssh_ran_it(server, tmp_path):
    done = launch(tmp_path, "root@node1", 'echo "$CLUSTERBOOK_JOB/${SSH_CLIENT-none}"')
    assert done.stdout == f"{TOKEN}/none\n", done


def test_a_daemon_killed_by_a_signal_ends_as_ssh_says_it(server, tmp_path):
    assert launch(tmp_path, "node1", "kill -9 $$").returncode == 128 + 9


def test_the_agents_tag_is_refused_and_the_launcher_goes_over_ssh(server, tmp_path):
    cold = tmp_path / "ssh"
    cold.write_text('#!/bin/sh\necho "cold $*"\n')
    cold.chmod(0o700)
    done = launch(tmp_path, "node1", "prted", token="c1:agents", cold=str(cold))  # noqa: S106
    assert done.stdout == "cold node1 prted\n"
    assert "the agent on node1 did not start the MPI daemon" in done.stderr
    assert "needs its job's tag" in done.stderr


def test_no_agent_there_and_the_launcher_goes_over_ssh(tmp_path):
    cold = tmp_path / "ssh"
    cold.write_text('#!/bin/sh\necho "cold $*"\n')
    cold.chmod(0o700)
    done = launch(tmp_path, "-o", "X=1", "node2", "hydra_pmi_proxy", "--x", cold=str(cold))
    assert done.stdout == "cold -o X=1 node2 hydra_pmi_proxy --x\n"
    with pytest.raises(FileNotFoundError):
        ping(str(tmp_path / forward_name("node2")), 1.0)


def test_the_socket_is_private_and_answers(server, tmp_path):
    assert stat.S_IMODE(os.stat(server.path).st_mode) == 0o600
    ping(server.path, 5.0)


def test_a_launcher_gone_takes_its_daemon_with_it(server, tmp_path):
    launcher_gone_takes_its_daemon(tmp_path)


def launcher_gone_takes_its_daemon(tmp_path: Path) -> None:
    """Kill the launcher's helper of a daemon on ``node1``; its daemon must end with it."""
    pid_file = tmp_path / "pid"
    proc = subprocess.Popen(
        [*helper(tmp_path), "node1", f"sleep 300 & echo $! > {pid_file}; wait"],
        env={**os.environ, "CLUSTERBOOK_JOB": TOKEN},
    )
    try:
        deadline = time.monotonic() + 10
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        sleeper = psutil.Process(int(pid_file.read_text()))
        proc.kill()
        proc.wait(10)
        sleeper.wait(10)  # raises if it outlives its launcher
    finally:
        proc.kill()
        proc.wait(10)


def sleeps() -> list[psutil.Process]:
    """The ``sleep`` processes under this one (one that ends meanwhile is not)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if p.name() == "sleep":
                found.append(p)
    return found


def test_closing_the_server_ends_its_daemons_and_removes_the_socket(tmp_path):
    srv = DaemonServer(str(tmp_path / forward_name("node1")))
    srv.start()
    proc = subprocess.Popen(
        [*helper(tmp_path), "node1", "sleep 300"],
        env={**os.environ, "CLUSTERBOOK_JOB": TOKEN},
    )
    try:
        deadline = time.monotonic() + 10
        while not sleeps():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        srv.close()
        assert proc.wait(10) != 0
        assert not os.path.exists(srv.path)
        left = sleeps()
        psutil.wait_procs(left, timeout=5)
        assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    finally:
        proc.kill()
        proc.wait(10)


def _launches_as_it_closes(srv: DaemonServer, count: int) -> tuple[list, list]:
    """``count`` launches on threads of their own, let go together with ``srv.close()``: the
    daemons started, and the launches refused."""
    import threading

    started: list[subprocess.Popen[bytes]] = []
    refused: list[ValueError] = []
    go = threading.Barrier(count + 1)

    def launch() -> None:
        go.wait()
        try:
            started.append(srv._spawn("exec sleep 300", TOKEN))
        except ValueError as exc:
            refused.append(exc)

    threads = [threading.Thread(target=launch) for _ in range(count)]
    for t in threads:
        t.start()
    go.wait()
    srv.close()
    for t in threads:
        t.join(30)
    return started, refused


def test_a_daemon_started_while_the_server_closes_is_ended_with_it(tmp_path):
    """A launch that comes as the agent stops: its daemon is either refused or ended by the
    close (it was filed before the close looked), never left running."""
    for _ in range(10):
        started, refused = _launches_as_it_closes(DaemonServer(str(tmp_path / "d.sock")), 4)
        assert len(started) + len(refused) == 4
        assert all("stopping" in str(e) for e in refused)
        try:
            for proc in started:
                assert proc.wait(10) != 0  # ended by the close, not left running
        finally:
            for proc in started:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)
                proc.wait()
                for pipe in (proc.stdout, proc.stderr):
                    if pipe is not None:
                        pipe.close()


def test_the_launchers_side_loads_none_of_the_servers_modules():
    # The launcher's side starts once per node per job: threads, subprocesses and hashlib's
    # OpenSSL, json's re are the agent's side's (~7 ms of CPU more at every warm job's start).
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(daemons.__file__)!r}); import daemons; "
        "print(daemons.forward_name('node1')); print(' '.join(sorted(sys.modules)))"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-I", "-c", code], capture_output=True, text=True, timeout=30
    )
    name, loaded = done.stdout.splitlines()
    assert name == "d-" + hashlib.sha256(b"node1").hexdigest()[:16] + ".sock"
    heavy = {"json", "re", "subprocess", "threading", "contextlib", "hashlib", "_hashlib", "signal"}
    assert heavy.isdisjoint(loaded.split()), heavy & set(loaded.split())


def test_the_messages_are_json_as_json_writes_and_reads_them():
    tricky = {"command": 'a "b" \\ \n\t é \udcff 💡', "token": "c1:j", "pid": 7, "ping": True}
    assert daemons.dumps(tricky) == json.dumps(tricky).encode()
    assert daemons.loads(json.dumps(tricky).encode() + b" ") == tricky
    for bad in (b"", b"[1]", b'{"a": 1} x', b'{"a": NaN}', b"{"):
        with pytest.raises(ValueError, match=r"JSON|Expecting"):
            daemons.loads(bad)
