"""What connections that have not shown the secret may cost a real TCP store: a deadline to
show it, a cap on how many wait to (a flood pushes out its own connections, not the nodes'),
and a store out of file descriptors that pauses accepting instead of spinning, and serves its
nodes once descriptors are free again."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil
import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends.tcp import TcpBackend
from clusterbook.rendezvous.backends.tcp_gate import Limits
from clusterbook.rendezvous.backends.tcp_server import LIMITS, StoreServer
from clusterbook.rendezvous.backends.url import parse_url
from tests.sdk.rendezvous.test_tcp_backend import (
    Later,
    assert_serves,
    closed_by_peer,
    tls_connect,
)

WAIT = 30.0


def test_a_connection_that_does_not_show_the_secret_in_time_is_dropped(
    make_server, secret, caplog
) -> None:
    caplog.set_level("INFO", logger="clusterbook.rendezvous.backends.tcp")
    server = make_server(limits=Limits(handshake=0.3))
    with socket.create_connection(server.address) as no_tls, tls_connect(server) as no_hello:
        assert closed_by_peer(no_tls)
        assert closed_by_peer(no_hello)
    assert "The rendezvous store dropped a connection: not let in within 0.3 s." in caplog.text
    assert_serves(server, secret)


def test_a_flood_of_silent_connections_pushes_out_its_own_and_the_nodes_go_on(
    make_server, make_client
) -> None:
    server = make_server(limits=Limits(handshake=WAIT, pending=8, patience=0.1))
    node = make_client(server.url, node="n1", timeout=WAIT)
    _, token, _ = node.set_state(b"base")
    silent = [socket.create_connection(server.address) for _ in range(40)]
    try:
        # At most 8 wait to show the secret: the others were pushed out, the oldest first.
        assert sum(closed_by_peer(sock, 5.0) for sock in silent[:32]) == 32
        assert server._loop.connections <= 1 + 8
        late = make_client(server.url, node="n2", timeout=WAIT)  # gets in meanwhile
        assert late.get_state() == (b"base", token)
        assert node.set_state(b"on", token)[2]
        assert server.connected_nodes == {"n1", "n2"}
    finally:
        for sock in silent:
            sock.close()


def test_limits_that_are_not_limits_are_a_config_error_naming_them() -> None:
    with pytest.raises(ConfigError, match=r"limits must be a Limits \(.*tcp_gate\), got 64;"):
        StoreServer(secret=b"s" * 32, limits=64)  # type: ignore[arg-type]
    assert StoreServer(secret=b"s" * 32)._limits is LIMITS


# A store that may open 48 files: a flood of connections uses them up.
OUT_OF_FILES = """\
import logging, resource, sys
from clusterbook.rendezvous.backends.tcp_server import StoreServer
logging.basicConfig(level=logging.WARNING, format="%(message)s")
server = StoreServer(secret=bytes.fromhex(sys.stdin.readline().strip())).start()
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (48, hard))
print(server.url, flush=True)
sys.stdin.readline()
server.close()
"""


def test_a_store_out_of_file_descriptors_pauses_accepting_and_then_serves_its_nodes(
    secret, tmp_path
) -> None:
    log = tmp_path / "store.log"  # a file, not a pipe: a full pipe would stop a store that spins
    with log.open("w") as stderr:
        store = subprocess.Popen(
            [sys.executable, "-c", OUT_OF_FILES],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
        )  # fmt: skip
    assert store.stdin is not None
    assert store.stdout is not None
    flood: list[socket.socket] = []
    try:
        store.stdin.write(secret.hex() + "\n")
        store.stdin.flush()
        url = store.stdout.readline().strip()
        for _ in range(200):  # silent, past its 48 descriptors
            flood.append(socket.create_connection(parse_url(url), timeout=WAIT))
        node = TcpBackend(url, secret, node="n1", timeout=WAIT)
        joining = Later(lambda: node.set_state(b"after the flood"))  # waits in the backlog
        process = psutil.Process(store.pid)
        before = process.cpu_times()
        time.sleep(1.0)  # it cannot accept all this while
        after = process.cpu_times()
        for sock in flood:
            sock.close()
        assert joining.get()[2]  # served once the flood let go of the descriptors
        node.close()
        other = TcpBackend(url, secret, node="n2", timeout=WAIT)
        assert other.get_state() == (b"after the flood", 1)
        other.close()
        store.stdin.write("\n")
        store.stdin.flush()
        assert store.wait(WAIT) == 0
    finally:
        for sock in flood:
            sock.close()
        if store.poll() is None:
            store.kill()
            store.wait(WAIT)
    # It paused instead of trying again at once: a store that spins on a failing accept burns
    # CPU meanwhile (the loop has nothing else to do), and said so at every failure.
    used = (after.user + after.system) - (before.user + before.system)
    assert used < 0.2, f"the store used {used:.2f} s of CPU in 1 s of flood"
    errors = log.read_text()
    assert "The rendezvous store cannot accept ([Errno 24] Too many open files)" in errors
    assert errors.count("cannot accept") <= 2
