"""A node agent's own sshd (``clusterbook worker join --start-sshd``) with a real OpenSSH client:
the cluster's key gets a session and a connection to the agent's Unix socket (how the head
reaches the agent that starts MPI's daemons), and nothing else: no other socket, no TCP port,
nothing the other way; a key marked ``restrict`` alone gets no socket either."""

from __future__ import annotations

import getpass
import socket
import socketserver
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterbook.ssh.agent_sshd import start_agent_sshd
from clusterbook.ssh.sshd import Sshd
from tests.integration.test_sshd_testbed import make_client_key, require_sshd

pytestmark = [pytest.mark.sshd, pytest.mark.root]

GREETING = b"the agent answers\n"


class _Greeter(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.sendall(GREETING)


@pytest.fixture
def agent_socket(tmp_path: Path) -> Iterator[Path]:
    """A Unix socket on the host that greets whoever connects (the agent's, standing in)."""
    path = tmp_path / "agent.sock"
    server = socketserver.ThreadingUnixStreamServer(str(path), _Greeter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield path
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def sshd(tmp_path: Path, agent_socket: Path) -> Iterator[tuple[Sshd, list[str]]]:
    """The agent's sshd with a client key as the cluster's, and the ssh command that logs in."""
    require_sshd()
    key, public = make_client_key(tmp_path)
    with start_agent_sshd(tmp_path / "sshd", public.strip(), socket=str(agent_socket)) as running:
        known = tmp_path / "known_hosts"
        known.write_text(f"[127.0.0.1]:{running.port} {running.host_public_key}\n")
        ssh = ["ssh", "-F", "none", "-p", str(running.port), "-i", str(key),
               "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
               "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}",
               "-o", "ConnectTimeout=5", f"{getpass.getuser()}@127.0.0.1"]  # fmt: skip
        yield running, ssh


def _through(ssh: list[str], local: Path, remote: Path) -> bytes:
    """What a connection to ``remote`` on the host says, through ``ssh -L local:remote``."""
    forward = subprocess.Popen(
        [*ssh[:-1], "-N", "-o", "ExitOnForwardFailure=yes", "-L", f"{local}:{remote}", ssh[-1]],
        stderr=subprocess.PIPE,
    )
    try:
        give_up = time.monotonic() + 15
        while not local.exists():
            assert forward.poll() is None, forward.stderr.read() if forward.stderr else b""
            assert time.monotonic() < give_up, "ssh -L made no socket in 15 s"
            time.sleep(0.05)
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(10)
            conn.connect(str(local))
            said = b""
            while chunk := conn.recv(100):
                said += chunk
            return said
    finally:
        # SIGKILL: a loaded machine has seen ssh take over 10 s to act on SIGTERM; the test is
        # about what the forward reaches, not how ssh ends.
        forward.kill()
        forward.wait()


def test_the_clusters_key_reaches_a_socket_of_the_host_and_gets_a_session(
    sshd: tuple[Sshd, list[str]], agent_socket: Path, tmp_path: Path
) -> None:
    _, ssh = sshd
    assert _through(ssh, tmp_path / "here.sock", agent_socket) == GREETING
    session = subprocess.run([*ssh, "echo", "in"], capture_output=True, text=True, timeout=30)
    assert (session.returncode, session.stdout) == (0, "in\n"), session.stderr


def test_the_clusters_key_reaches_no_other_socket_and_no_port(
    sshd: tuple[Sshd, list[str]], agent_socket: Path, tmp_path: Path
) -> None:
    running, ssh = sshd
    other = tmp_path / "other.sock"
    server = socketserver.ThreadingUnixStreamServer(str(other), _Greeter)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert _through(ssh, tmp_path / "here.sock", other) == b""
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
    tcp = subprocess.run(
        [*ssh[:-1], "-W", f"127.0.0.1:{running.port}", ssh[-1]],
        input="", capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert tcp.returncode != 0
    assert "administratively prohibited" in tcp.stderr


def test_the_clusters_key_gets_no_remote_forwarding(
    sshd: tuple[Sshd, list[str]], agent_socket: Path, tmp_path: Path
) -> None:
    _, ssh = sshd
    back = tmp_path / "back.sock"
    for spec in (f"{back}:{agent_socket}", f"0:{agent_socket}"):  # a socket there, a port
        remote = subprocess.run(
            [*ssh[:-1], "-N", "-o", "ExitOnForwardFailure=yes", "-R", spec, ssh[-1]],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert remote.returncode == 255, spec
        assert "forwarding failed" in remote.stderr, remote.stderr
    assert not back.exists()


def test_a_key_marked_restrict_alone_reaches_no_socket(
    sshd: tuple[Sshd, list[str]], agent_socket: Path, tmp_path: Path
) -> None:
    running, ssh = sshd
    keys = running.directory / "authorized_keys"
    line = keys.read_text().split(" ", 1)[1]
    keys.write_text(f"restrict {line}")  # sshd reads it at each login; its config allows it
    assert _through(ssh, tmp_path / "here.sock", agent_socket) == b""
