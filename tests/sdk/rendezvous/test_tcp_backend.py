"""The TCP store: the backend contract, authentication, framing, long-poll watch, the
connection-loss fast path, timeouts and the secret's token file."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousConnectionError
from clusterbook.rendezvous.backends import _tls, tcp, wire
from clusterbook.rendezvous.backends.tcp import (
    MAX_FRAME,
    MAX_WHOLE,
    TcpBackend,
    parse_url,
    read_secret,
    write_secret,
)
from clusterbook.rendezvous.backends.tcp_server import StoreServer
from tests.sdk.rendezvous.contract import SETTINGS, RemoteBackendContract

WAIT = 30.0  # generous bound for "eventually"
NOBODY = "sha256:" + "0" * 64  # the fingerprint of no certificate: for addresses with no store


def url_of(port: int, fingerprint: str = NOBODY) -> str:
    return f"tcp://127.0.0.1:{port}?fingerprint={fingerprint}"


def tls_connect(server: StoreServer) -> ssl.SSLSocket:
    """A TLS connection to ``server`` made by hand (its certificate checked), before the
    clusterbook handshake."""
    sock = socket.create_connection(server.address, timeout=WAIT)
    return _tls.client_tls(sock, server.fingerprint, time.monotonic() + WAIT)


def wait_for(predicate: Callable[[], object], timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def closed_by_peer(sock: socket.socket, timeout: float = WAIT) -> bool:
    """Whether the peer closes ``sock`` (EOF or reset) within ``timeout``, reading any data."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


class Later:
    """A call on a thread of its own, to look at before and after it returns."""

    def __init__(self, call) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call) -> None:
        try:
            self.result = call()
        except BaseException as exc:
            self.error = exc

    def running_after(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return self.thread.is_alive()

    def get(self) -> object:
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the call did not return"
        if self.error is not None:
            raise self.error
        return self.result


class TestTcpBackend(RemoteBackendContract):
    answers_views = True

    @pytest.fixture
    def backend(self, make_server, make_client):
        return make_client(make_server().url)

    @pytest.fixture
    def backend_pair(self, make_server, make_client):
        url = make_server().url
        return make_client(url), make_client(url)

    @pytest.fixture
    def unreachable(self, make_client):
        port = free_port()
        return lambda: make_client(url_of(port), timeout=1.0)


# --- a raw peer speaking the protocol by hand -----------------------------------------------------


def raw_session(server: StoreServer, secret: bytes, node: str = "") -> wire.Channel:
    """A connection made by hand, after its hello was accepted."""
    chan = wire.Channel(tls_connect(server))
    chan.send(wire.hello(secret, node))
    assert chan.recv(time.monotonic() + WAIT) == b"O"
    return chan


def frame(payload: bytes) -> bytes:
    """A frame as the wire carries it inside TLS."""
    return wire.FRAME_HEADER.pack(len(payload)) + payload


def assert_serves(server: StoreServer, secret: bytes) -> None:
    client = TcpBackend(server.url, secret, timeout=WAIT)
    try:
        state = client.get_state()
        _, token, won = client.set_state(b"still serving", None if state is None else state[1])
        assert won
        assert client.get_state() == (b"still serving", token)
    finally:
        client.close()


# --- authentication and framing -------------------------------------------------------------------


def test_wrong_secret_fails_authentication_and_server_stays_usable(make_server, secret) -> None:
    server = make_server()
    bad = TcpBackend(server.url, secrets.token_bytes(32), timeout=WAIT)
    with pytest.raises(RendezvousConnectionError, match="Authentication") as info:
        bad.get_state()
    assert server.url in str(info.value)
    with pytest.raises(RendezvousConnectionError, match="Authentication"):
        bad.set_state(b"evil")
    bad.close()
    assert_serves(server, secret)


def test_a_hello_with_another_secret_gets_a_refusal_and_the_end(make_server, secret, caplog):
    caplog.set_level(logging.WARNING, logger=tcp.__name__)
    server = make_server()
    with tls_connect(server) as sock:
        sock.sendall(frame(wire.hello(secrets.token_bytes(32), "n1")))
        sock.sendall(frame(b"G"))  # sent at once after it: never answered
        assert read_until_closed(sock) == frame(b"N")
    wait_for(lambda: "authentication failed" in caplog.text)
    assert server.connected_nodes == frozenset()
    assert_serves(server, secret)


@pytest.mark.parametrize(
    "hello",
    [
        b"G",  # a request instead of the hello
        b"CBRDZV3\n" + b"\x00\x20" + b"\x00" * 32,  # another version's magic
        wire.MAGIC + b"\x00\x40" + b"\x00" * 32,  # a secret shorter than it says
        wire.MAGIC + b"\x00",  # cut short
    ],
)
def test_a_malformed_hello_is_dropped(make_server, secret, hello) -> None:
    server = make_server()
    with tls_connect(server) as sock:
        sock.sendall(frame(hello))
        assert read_until_closed(sock) == b""
    assert_serves(server, secret)


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x00\x00\x00\x05hello",
        b"\x00\x00\x00\x28" + wire.MAGIC + b"\x00" * 32,  # a hello, but outside TLS
        os.urandom(300),
    ],
)
def test_garbage_instead_of_a_tls_handshake_is_dropped(make_server, secret, garbage) -> None:
    server = make_server()
    with socket.create_connection(server.address, timeout=WAIT) as sock:
        sock.sendall(garbage)
        assert closed_by_peer(sock)
    assert_serves(server, secret)


def test_genuine_frame_is_answered(make_server, secret) -> None:
    server = make_server()
    chan = raw_session(server, secret)
    with chan.sock:
        chan.send(b"G")
        assert chan.recv(time.monotonic() + WAIT) == b"s" + wire.HEAD.pack(0, 0)


@pytest.mark.parametrize("meddling", ["flip a bit", "replay a record"])
def test_tls_drops_a_connection_whose_records_were_changed_on_the_way(
    make_server, make_client, secret, meddling
) -> None:
    """The wire's integrity is TLS's: a bit flipped in a record, or a record sent again, ends
    the connection, and the write it carried happens once or not at all."""
    server = make_server()
    proxy = Proxy(server.address)
    try:
        client = make_client(url_of(proxy.port, server.fingerprint), node="n1", timeout=WAIT)
        assert client.get_state() is None  # connected, hello accepted
        if meddling == "flip a bit":
            proxy.meddle = lambda data: data[:-1] + bytes([data[-1] ^ 1])
            with pytest.raises(RendezvousConnectionError):
                client.set_state(b"meddled")
        else:
            proxy.meddle = lambda data: data + data
            assert client.set_state(b"meddled")[2]  # answered before the copy arrived
        wait_for(lambda: "n1" not in server.connected_nodes)  # then the connection ended
    finally:
        proxy.close()
    watcher = make_client(server.url)
    current = watcher.get_state()
    if meddling == "flip a bit":
        assert current is None
    else:
        assert current == (b"meddled", 1)  # the genuine record, once
    assert_serves(server, secret)


def test_secret_crosses_the_wire_only_inside_tls(make_server, make_client, secret) -> None:
    server = make_server()
    proxy = Proxy(server.address)
    try:
        url = url_of(proxy.port, server.fingerprint)
        client = make_client(url, node="n1")
        _, token, _ = client.set_state(b"visible-state-marker")
        assert client.get_state() == (b"visible-state-marker", token)
        assert client.watch(token, 0.05) == (b"visible-state-marker", token)
        client.close()
        other = secrets.token_bytes(32)
        with pytest.raises(RendezvousConnectionError, match="Authentication"):
            make_client(url, secret=other).get_state()
        wait_for(lambda: proxy.connections == 2 and proxy.finished == 2)
    finally:
        proxy.close()
    traffic = bytes(proxy.upstream) + bytes(proxy.downstream)
    assert len(traffic) > 1000  # the capture did see the sessions
    assert b"visible-state-marker" not in traffic  # encrypted (more in test_tls.py)
    assert wire.MAGIC not in traffic
    for key in (secret, other):
        for form in (key, key.hex().encode(), key.hex().upper().encode()):
            assert form not in traffic


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything ``sock`` receives until the peer closes it (or WAIT passes: a failure)."""
    sock.settimeout(WAIT)
    data = bytearray()
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        raise AssertionError("the peer kept the connection open") from None
    except OSError:  # reset, or a TLS session ended without its close_notify
        pass
    return bytes(data)


class Proxy:
    """Forwards connections to ``target`` and records the bytes each way."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.upstream = bytearray()
        self.downstream = bytearray()
        self.connections = 0
        self.finished = 0
        self.sockets: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        # Once set, the next chunk the client sends goes through it (then it is cleared).
        self.meddle: Callable[[bytes], bytes] | None = None
        self.accepter = threading.Thread(target=self.accept, daemon=True)
        self.accepter.start()

    def accept(self) -> None:
        while not self.stop.is_set():
            try:
                down, _ = self.listener.accept()
            except TimeoutError:
                continue
            down.settimeout(None)
            up = socket.create_connection(self.target)
            self.sockets += [down, up]
            self.connections += 1
            for src, dst, log in ((down, up, self.upstream), (up, down, self.downstream)):
                thread = threading.Thread(target=self.pump, args=(src, dst, log), daemon=True)
                self.threads.append(thread)
                thread.start()

    def pump(self, src: socket.socket, dst: socket.socket, log: bytearray) -> None:
        try:
            while data := src.recv(65536):
                with self.lock:
                    log += data
                    meddle = self.meddle if log is self.upstream else None
                    if meddle is not None:
                        self.meddle = None
                        data = meddle(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)
            if log is self.upstream:
                with self.lock:
                    self.finished += 1

    def close(self) -> None:
        self.stop.set()
        self.accepter.join(WAIT)
        self.listener.close()
        for sock in self.sockets:
            with contextlib.suppress(OSError):  # wakes a pump blocked in recv
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self.threads:
            thread.join(WAIT)


# --- frame size -----------------------------------------------------------------------------------


def test_state_over_the_limit_is_refused_before_sending(make_server, make_client) -> None:
    client = make_client(make_server().url)
    _, token, _ = client.set_state(b"small")
    with pytest.raises(ConfigError, match=f"carries at most {MAX_WHOLE} bytes"):
        client.set_state(b"x" * (MAX_WHOLE + 1), token)
    assert client.get_state() == (b"small", token)


def test_state_at_the_limit_round_trips(make_server, make_client) -> None:
    url = make_server().url
    a, b = make_client(url, timeout=WAIT), make_client(url, timeout=WAIT)
    big = bytes(range(256)) * (MAX_WHOLE // 256) + b"\x07" * (MAX_WHOLE % 256)
    assert len(big) == MAX_WHOLE
    _, token, won = a.set_state(big)
    assert won
    assert b.get_state() == (big, token)
    assert b.read_state(None, 0.0) == (big, token)


def test_a_state_larger_than_a_frame_is_written_by_the_head_and_read_in_parts(
    make_server, make_client, caplog
) -> None:
    server: StoreServer = make_server()
    head = server.local_client(timeout=WAIT)
    try:
        big = os.urandom(MAX_FRAME + wire.PART_SIZE // 2)  # two frames' worth, three parts
        state, token = head.update(lambda blob: big)  # on the store's side: no frame holds it
        assert (state, head.read_state(None, 0.0)) == (big, (big, token))
    finally:
        head.close()
    node = make_client(server.url, timeout=WAIT)
    assert node.read_state(None, 0.0) == (big, token)  # over TLS, in parts
    assert node.read_state(token - 1, 5.0) == (big, token)
    with caplog.at_level(logging.WARNING), pytest.raises(RendezvousConnectionError):
        node.get_state()  # whole, it would be a frame over the limit
    assert "read it with read_state()" in caplog.text
    assert node.read_state(None, 0.0) == (big, token)  # the next call connects again


def test_a_read_in_parts_is_of_one_state_whatever_is_written_meanwhile(
    make_server, make_client, secret
) -> None:
    server: StoreServer = make_server()
    head = server.local_client(timeout=WAIT)
    old = b"a" * (wire.PART_SIZE + 10)
    try:
        _, token = head.update(lambda blob: old)
        chan = raw_session(server, secret)
        with chan.sock:
            chan.send(b"R" + wire.token_spec(None) + wire.SECONDS.pack(0.0))
            first = chan.recv(time.monotonic() + WAIT)
            _, new_token = head.update(lambda blob: b"b" * len(old))  # between the parts
            chan.send(b"N" + wire.PART.pack(len(first) - 1 - wire.HEAD.size - wire.PART.size))
            second = chan.recv(time.monotonic() + WAIT)
    finally:
        head.close()
    assert new_token > token
    for reply in (first, second):
        has, said = wire.HEAD.unpack_from(reply, 1)
        (total,) = wire.PART.unpack_from(reply, 1 + wire.HEAD.size)
        assert (reply[:1], has, said, total) == (b"p", 1, token, len(old))
    parts = [r[1 + wire.HEAD.size + wire.PART.size :] for r in (first, second)]
    assert b"".join(parts) == old
    assert_serves(server, secret)


def test_a_part_of_no_read_ends_the_connection(make_server, secret) -> None:
    server = make_server()
    chan = raw_session(server, secret)
    chan.send(b"N" + wire.PART.pack(5))
    assert closed_by_peer(chan.sock)
    chan.sock.close()
    assert_serves(server, secret)


def test_frames_over_the_limit_are_refused(make_server, secret) -> None:
    server = make_server()
    chan = raw_session(server, secret)
    with chan.sock:
        # Announce one byte more than the limit: the server drops the connection without
        # waiting for (or allocating) the rest.
        chan.sock.setblocking(True)
        chan.sock.sendall(wire.FRAME_HEADER.pack(MAX_FRAME + 1) + b"S" * 1024)
        assert read_until_closed(chan.sock) == b""
    with tls_connect(server) as sock:  # before the hello, a frame larger than one
        sock.sendall(wire.FRAME_HEADER.pack(64 * 1024) + wire.MAGIC)
        assert read_until_closed(sock) == b""
    assert_serves(server, secret)


# --- watch ----------------------------------------------------------------------------------------


def test_watch_wakes_every_waiter_on_a_write(make_server, make_client) -> None:
    url = make_server().url
    writer = make_client(url)
    _, token, _ = writer.set_state(b"one")
    waiters = [make_client(url, node=f"w{i}") for i in range(3)]
    for waiter in waiters:  # connected before they wait
        waiter.get_state()
    results: dict[int, object] = {}

    def wait(i: int) -> None:
        results[i] = waiters[i].watch(token, 120.0)

    threads = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    _, new, won = writer.set_state(b"two", token)
    assert won
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "a watcher was not woken by the write"
    assert results == {i: (b"two", new) for i in range(3)}


def test_watch_of_an_empty_store_waits_for_the_first_write(make_server, make_client) -> None:
    url = make_server().url
    a, b = make_client(url), make_client(url)
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(b.watch(None, 120.0)))
    thread.start()
    _, token, _ = a.set_state(b"first")
    thread.join(WAIT)
    assert got == [(b"first", token)]


def test_one_client_serializes_calls_from_many_threads(make_server, make_client) -> None:
    client = make_client(make_server().url, timeout=WAIT)
    client.set_state(b"0")

    def increment() -> None:
        for _ in range(25):
            while True:
                state, token = client.get_state()
                if client.set_state(str(int(state) + 1).encode(), token)[2]:
                    break

    threads = [threading.Thread(target=increment) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert client.get_state() == (b"100", 101)


# --- connection loss ------------------------------------------------------------------------------


class LostLog:
    """An on_lost callback recording its calls; it marks the node lost in the state."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.lock = threading.Lock()

    def __call__(self, node: str, state: bytes) -> bytes:
        with self.lock:
            self.calls.append((node, state))
        return state + b"|lost:" + node.encode()

    def nodes(self) -> list[str]:
        with self.lock:
            return [node for node, _ in self.calls]


def drop(client: TcpBackend) -> None:
    """End the client's connection abruptly, as a dying process or network would: no goodbye."""
    client._chan.sock.shutdown(socket.SHUT_RDWR)


def graces_over(server: StoreServer) -> None:
    wait_for(lambda: server._protocol.losses_pending == 0)


def test_lost_connection_calls_on_lost_and_wakes_watchers(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=0.25)
    watcher = make_client(server.url)
    _, token, _ = watcher.set_state(b"base")
    node = make_client(server.url, node="n1")
    node.get_state()
    assert server.connected_nodes == {"n1"}
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(watcher.watch(token, 120.0)))
    thread.start()
    drop(node)
    thread.join(WAIT)
    assert lost.calls == [("n1", b"base")]
    assert got == [(b"base|lost:n1", token + 1)]
    assert server.connected_nodes == set()


def test_on_lost_waits_for_the_grace(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=0.5)
    node = make_client(server.url, node="n1")
    node.set_state(b"base")
    dropped = time.monotonic()
    drop(node)
    wait_for(lambda: lost.calls)
    assert time.monotonic() - dropped >= 0.45


def test_node_lost_while_it_waits_in_a_watch(make_server, make_client, secret) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost)
    setter = make_client(server.url)
    _, token, _ = setter.set_state(b"base")
    chan = raw_session(server, secret, node="n3")
    # The watch request reaches the server before the end of the connection does, so the server
    # is inside the watch (of two minutes) when the connection ends.
    chan.send(b"W" + wire.token_spec(token) + wire.SECONDS.pack(120.0))
    chan.sock.shutdown(socket.SHUT_RDWR)
    chan.sock.close()
    wait_for(lambda: lost.calls)
    assert lost.calls == [("n3", b"base")]
    assert setter.get_state() == (b"base|lost:n3", token + 1)


def test_killed_client_process_is_lost(make_server, make_client, secret) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost)
    watcher = make_client(server.url)
    _, token, _ = watcher.set_state(b"base")
    code = (
        "import sys\n"
        "from clusterbook.rendezvous.backends.tcp import TcpBackend\n"
        "url, secret = sys.stdin.readline().split()\n"
        "client = TcpBackend(url, bytes.fromhex(secret), node='worker-7')\n"
        "state, token = client.get_state()\n"
        "print('ready', flush=True)\n"
        "client.watch(token, 600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        proc.stdin.write(f"{server.url} {secret.hex()}\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == "ready\n"
        wait_for(lambda: "worker-7" in server.connected_nodes)
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(watcher.watch(token, 120.0)))
        thread.start()
        proc.send_signal(signal.SIGKILL)
        thread.join(WAIT)
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stdin.close()
        proc.stdout.close()
    assert lost.nodes() == ["worker-7"]
    assert got == [(b"base|lost:worker-7", token + 1)]


def test_clean_close_never_calls_on_lost(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost)
    setter = make_client(server.url)
    _, token, _ = setter.set_state(b"base")
    leaver = make_client(server.url, node="leaver")
    leaver.get_state()
    leaver.close()
    assert "leaver" not in server.connected_nodes
    # A node that closes while it waits in a watch also leaves cleanly.
    waiter = make_client(server.url, node="waiter")
    waiter.get_state()
    waiting = Later(lambda: waiter.watch(token, 120.0))
    wait_for(lambda: waiter._lock.locked())
    waiter.close()
    with pytest.raises(RendezvousConnectionError, match="closed"):
        waiting.get()
    wait_for(lambda: "waiter" not in server.connected_nodes)
    # A node lost afterwards is reported, and only it.
    marker = make_client(server.url, node="marker")
    marker.get_state()
    drop(marker)
    wait_for(lambda: lost.calls)
    graces_over(server)
    assert lost.nodes() == ["marker"]


def test_a_call_that_finds_close_begun_says_goodbye_for_it(make_server, make_client) -> None:
    # close() marks the client closed before it sends its goodbye; a call in another thread
    # that sees the mark first ends the connection, and must say goodbye itself, or the store
    # takes the node for lost.
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=0.05)
    setter = make_client(server.url)
    setter.set_state(b"base")
    node = make_client(server.url, node="closing")
    node.get_state()
    node._closed = True  # the moment between close()'s mark and its goodbye
    with pytest.raises(RendezvousConnectionError, match="is closed"):
        node.get_state()
    wait_for(lambda: "closing" not in server.connected_nodes)
    graces_over(server)
    assert lost.calls == []


def test_reconnect_within_the_grace_cancels_it(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=2.0)
    stays = make_client(server.url, node="stays")
    leaves = make_client(server.url, node="leaves")
    _, token, _ = stays.set_state(b"base")
    leaves.get_state()
    drop(stays)
    drop(leaves)
    wait_for(lambda: not server.connected_nodes)
    # Both come back within the grace, on new connections; one then leaves cleanly.
    back = make_client(server.url, node="stays")
    assert back.get_state() == (b"base", token)
    gone = make_client(server.url, node="leaves")
    gone.get_state()
    gone.close()
    assert server.connected_nodes == {"stays"}
    marker = make_client(server.url, node="marker")
    marker.get_state()
    drop(marker)
    wait_for(lambda: lost.calls)
    graces_over(server)
    assert lost.nodes() == ["marker"]
    assert back.get_state() == (b"base|lost:marker", token + 1)


def test_lose_now_calls_a_dropped_node_lost_without_its_grace(make_server, make_client) -> None:
    # The caller knows the node's work ended (MPI lost its daemon there): a dropped connection
    # is lost at once; a live one, one gone cleanly and one never seen are left alone.
    lost = LostLog()
    server = make_server(on_lost=lost, lost_grace=600.0)
    live = make_client(server.url, node="live")
    _, token, _ = live.set_state(b"base")
    left = make_client(server.url, node="left")
    left.get_state()
    left.close()
    dropped = make_client(server.url, node="dropped")
    dropped.get_state()
    drop(dropped)
    wait_for(lambda: server.connected_nodes == {"live"})
    assert server.lose_now(["live", "left", "dropped", "unknown"]) == ["dropped"]
    assert lost.nodes() == ["dropped"]
    assert live.get_state() == (b"base|lost:dropped", token + 1)
    # Its grace's end, later, does nothing more; and asking again calls nothing.
    assert server._protocol.losses_pending == 0
    assert server.lose_now(["dropped"]) == []
    assert lost.nodes() == ["dropped"]


def test_client_reconnects_on_demand_and_keeps_its_node(make_server, make_client) -> None:
    lost = LostLog()
    server = make_server(on_lost=lost)
    client = make_client(server.url, node="n1")
    _, token, _ = client.set_state(b"base")
    drop(client)
    # The next call connects again by itself (a write too: nothing was in flight).
    assert client.set_state(b"again", token)[2]
    assert "n1" in server.connected_nodes
    graces_over(server)
    assert lost.calls == []


def test_on_lost_returning_none_leaves_the_state(make_server, make_client) -> None:
    calls: list[str] = []
    server = make_server(on_lost=lambda node, state: calls.append(node))
    node = make_client(server.url, node="n1")
    _, token, _ = node.set_state(b"base")
    drop(node)
    wait_for(lambda: calls)
    graces_over(server)
    assert make_client(server.url).get_state() == (b"base", token)


# --- timeouts and server failures -----------------------------------------------------------------

SERVER_PROGRAM = (
    "import sys, time\n"
    "from clusterbook.rendezvous.backends.tcp_server import StoreServer\n"
    "server = StoreServer(secret=bytes.fromhex(sys.stdin.readline().strip())).start()\n"
    "print(server.url, flush=True)\n"
    "time.sleep(600)\n"
)


def test_server_killed_while_a_client_waits(make_client, secret) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER_PROGRAM],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdin.write(secret.hex() + "\n")
        proc.stdin.flush()
        url = proc.stdout.readline().strip()
        client = make_client(url, timeout=2.0)
        _, token, _ = client.set_state(b"base")
        waiting = Later(lambda: client.watch(token, 600.0))
        wait_for(lambda: client._lock.locked())
        proc.send_signal(signal.SIGKILL)
        with pytest.raises(RendezvousConnectionError) as info:
            waiting.get()  # within WAIT: far less than the watch's 600 s
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stdin.close()
        proc.stdout.close()
    assert url in str(info.value)
    with pytest.raises(RendezvousConnectionError, match="refused"):
        client.get_state()


def test_store_that_does_not_answer_times_out(make_client) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog), never answers
        url = url_of(silent.getsockname()[1])
        client = make_client(url, timeout=1.0)
        start = time.monotonic()
        with pytest.raises(RendezvousConnectionError, match="no answer") as info:
            client.get_state()
        assert time.monotonic() - start < WAIT
        assert url in str(info.value)
        with pytest.raises(RendezvousConnectionError, match="no answer"):
            client.watch(None, 0.5)


def test_unreachable_error_names_the_address_and_the_fix(make_client) -> None:
    url = url_of(free_port())
    with pytest.raises(RendezvousConnectionError) as info:
        make_client(url, timeout=1.0).watch(None, 0.1)
    message = str(info.value)
    assert url in message
    assert "store server is running" in message


def test_server_close_ends_calls_joins_threads_and_is_idempotent(make_client, secret) -> None:
    server = StoreServer(secret=secret).start()
    try:
        client = make_client(server.url, node="n1")
        _, token, _ = client.set_state(b"base")
        waiting = Later(lambda: client.watch(token, 600.0))
        wait_for(lambda: client._lock.locked())
    finally:
        server.close()
    with pytest.raises(RendezvousConnectionError):
        waiting.get()
    assert not [t for t in threading.enumerate() if t.name.startswith("clusterbook-store")]
    server.close()
    with pytest.raises(RendezvousConnectionError):
        make_client(server.url, timeout=1.0).get_state()


def test_client_reconnects_after_a_server_restart(make_client, secret) -> None:
    first = StoreServer(secret=secret).start()
    port = first.address[1]
    client = make_client(first.url)
    try:
        client.set_state(b"old")
    finally:
        first.close()
    # The same certificate: a client pins the one its URL names.
    second = StoreServer("127.0.0.1", port, secret=secret, certificate=first.certificate).start()
    try:
        assert client.get_state() is None  # a new, empty store
        assert client.set_state(b"new")[:2] == (b"new", 1)
    finally:
        second.close()


def test_no_reverse_dns_lookups(monkeypatch, make_server, make_client) -> None:
    def forbidden(*args: object) -> None:
        raise AssertionError(f"reverse DNS lookup {args}")

    for name in ("getfqdn", "gethostbyaddr", "getnameinfo"):
        monkeypatch.setattr(socket, name, forbidden)
    url = make_server().url
    a, b = make_client(url, node="n1"), make_client(url)
    _, token, _ = a.set_state(b"x")
    assert b.watch(None, 1.0) == (b"x", token)


def test_closed_client_refuses_calls(make_server, make_client) -> None:
    client = make_client(make_server().url)
    client.get_state()
    client.close()
    with pytest.raises(RendezvousConnectionError, match="closed"):
        client.get_state()


# --- configuration --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "127.0.0.1:29400",
        "http://127.0.0.1:29400",
        "tcp://127.0.0.1",
        "tcp://:29400",
        "tcp://127.0.0.1:0",
        "tcp://127.0.0.1:99999",
        "tcp://127.0.0.1:port",
        "tcp://127.0.0.1:29400/path",
        "tcp://127.0.0.1:29400?x=1",
        "tcp://user@127.0.0.1:29400",
        " tcp://127.0.0.1:29400",
        "",
    ],
)
def test_bad_urls_are_config_errors_naming_the_value(url: str, secret) -> None:
    with pytest.raises(ConfigError) as info:
        TcpBackend(url, secret)
    assert repr(url) in str(info.value)


def test_url_forms() -> None:
    assert parse_url("tcp://10.0.0.1:29400") == ("10.0.0.1", 29400)
    assert parse_url("tcp://head.local:1") == ("head.local", 1)
    assert parse_url("tcp://[::1]:29400") == ("::1", 29400)
    with pytest.raises(ConfigError):
        parse_url(29400)


def test_bad_client_and_server_settings(secret) -> None:
    with pytest.raises(ConfigError, match="16"):
        TcpBackend("tcp://127.0.0.1:1", b"short")
    with pytest.raises(ConfigError, match="bytes"):
        TcpBackend("tcp://127.0.0.1:1", secret.hex())  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="node id"):
        TcpBackend("tcp://127.0.0.1:1", secret, node="")
    with pytest.raises(ConfigError, match="timeout"):
        TcpBackend("tcp://127.0.0.1:1", secret, timeout=0)
    with pytest.raises(ConfigError, match="grace"):
        StoreServer(secret=secret, lost_grace=-1)
    with pytest.raises(ConfigError, match="port"):
        StoreServer(port=70000, secret=secret)


def test_server_on_a_busy_port_is_a_config_error(make_server, secret) -> None:
    port = make_server().address[1]
    with pytest.raises(ConfigError, match=str(port)):
        StoreServer("127.0.0.1", port, secret=secret).start()


def test_server_url_and_address(make_server) -> None:
    server = make_server()
    host, port = server.address
    assert host == "127.0.0.1"
    assert port > 0
    assert server.url == f"tcp://127.0.0.1:{port}?fingerprint={server.fingerprint}"


# --- the secret's token file ----------------------------------------------------------------------


def test_write_secret_creates_a_0600_file_in_one_step(tmp_path) -> None:
    path = tmp_path / "secret"
    old = os.umask(0)  # even a permissive umask cannot widen it
    try:
        secret = write_secret(path)
    finally:
        os.umask(old)
    assert len(secret) == 32
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert path.read_text().strip() == secret.hex()
    assert read_secret(path) == secret


def test_write_secret_refuses_to_overwrite(tmp_path) -> None:
    path = tmp_path / "secret"
    first = write_secret(path)
    with pytest.raises(ConfigError, match="overwrite"):
        write_secret(path, secrets.token_bytes(32))
    assert read_secret(path) == first


def test_write_secret_does_not_follow_a_planted_symlink(tmp_path) -> None:
    target = tmp_path / "elsewhere"
    link = tmp_path / "secret"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match="overwrite"):
        write_secret(link)
    assert not target.exists()


def test_write_secret_keeps_a_given_secret(tmp_path) -> None:
    secret = bytes(range(32))
    assert write_secret(tmp_path / "s", secret) == secret
    assert read_secret(tmp_path / "s") == secret


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_read_secret_refuses_a_file_others_can_read(tmp_path, mode: int) -> None:
    path = tmp_path / "secret"
    write_secret(path)
    os.chmod(path, mode)
    with pytest.raises(ConfigError, match=f"chmod 600 {path}"):
        read_secret(path)
    os.chmod(path, 0o600)
    assert len(read_secret(path)) == 32


def test_read_secret_bad_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no secret file"):
        read_secret(tmp_path / "missing")
    bad = tmp_path / "bad"
    fd = os.open(bad, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"not hex at all\n")
    os.close(fd)
    with pytest.raises(ConfigError, match="hex"):
        read_secret(bad)


# --- the head's own connections ------------------------------------------------------------


def test_a_local_client_is_served_like_any_other_without_network_or_tls(make_server) -> None:
    server = make_server()
    local = server.local_client()
    remote = TcpBackend(server.url, server._secret)
    try:
        _, token, won = local.set_state(b"from the head")
        assert won
        assert remote.get_state() == (b"from the head", token)
        waiting = Later(lambda: local.watch(token, WAIT))
        wait_for(lambda: local._lock.locked())
        _, newer, _ = remote.set_state(b"from a node", token)
        assert waiting.get() == (b"from a node", newer)
        assert local._chan is not None
        assert local._chan.sock.family == socket.AF_UNIX  # a socket pair: no port, no TLS
        assert not isinstance(local._chan.sock, ssl.SSLSocket)
    finally:
        local.close()
        remote.close()


def test_a_local_connection_still_says_the_secret(make_server, secret) -> None:
    server = make_server()
    stranger = TcpBackend(server.url, secrets.token_bytes(32), dial=server._local_socket)
    try:
        with pytest.raises(RendezvousConnectionError, match="secret"):
            stranger.get_state()
    finally:
        stranger.close()
    assert_serves(server, secret)


def test_closing_the_server_ends_a_local_clients_wait(make_server) -> None:
    server = make_server()
    local = server.local_client(timeout=2.0)
    _, token, _ = local.set_state(b"x")
    waiting = Later(lambda: local.watch(token, 600.0))
    wait_for(lambda: local._lock.locked())
    server.close()
    with pytest.raises(RendezvousConnectionError):
        waiting.get()
    with pytest.raises(RendezvousConnectionError):
        local.get_state()  # it cannot reconnect to a closed server
    local.close()


class _CountingSSLSocket(ssl.SSLSocket):
    """The server's side of a TLS connection, counting its reads (successful or not)."""

    reads = 0

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        type(self).reads += 1
        return super().recv(buflen, flags)


def test_the_server_reads_each_request_once_not_until_a_read_fails(
    make_server, make_client
) -> None:
    # A read that finds nothing costs a system call and an exception: per request, at every
    # node of every round. The selector says when more comes.
    server = make_server()
    server._context.sslsocket_class = _CountingSSLSocket
    client = make_client(server.url)
    client.set_state(b"x" * 100_000)  # a frame of several TLS records: read whole
    assert client.get_state() == (b"x" * 100_000, 1)
    before = _CountingSSLSocket.reads
    for _ in range(50):
        client.get_state()
    assert _CountingSSLSocket.reads - before <= 55  # about one a request, not two


class _ClientSSLSocket(ssl.SSLSocket):
    """A client's side of a TLS connection, counting the reads that found nothing."""

    empty = 0

    def recv_into(self, buffer, nbytes: int = 0, flags: int = 0) -> int:  # type: ignore[override]
        try:
            return super().recv_into(buffer, nbytes, flags)
        except ssl.SSLWantReadError:
            type(self).empty += 1
            raise


def counting_dial(server: StoreServer) -> Callable[[float], socket.socket]:
    """Connects to ``server`` as a client does (its certificate pinned), in TLS sockets that
    count their empty reads."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    context.sslsocket_class = _ClientSSLSocket

    def dial(deadline: float) -> socket.socket:
        sock = socket.create_connection(server.address, timeout=WAIT)
        return _tls.client_tls(sock, server.fingerprint, deadline, context=context)

    return dial


def test_a_client_waits_for_its_answer_instead_of_reading_before_it_came(
    make_server, make_client
) -> None:
    server = make_server()
    client = make_client(server.url, dial=counting_dial(server))
    client.get_state()
    assert isinstance(client._chan.sock, _ClientSSLSocket)  # the reads below are counted
    client.set_state(b"x" * 100_000)  # an answer of several TLS records: read whole
    assert client.get_state() == (b"x" * 100_000, 1)
    client.set_state(b"y" * 100, 1)
    before = _ClientSSLSocket.empty
    for _ in range(50):
        assert client.get_state() == (b"y" * 100, 2)
    assert _ClientSSLSocket.empty - before <= 5  # not one failed read per call


def test_a_node_reads_a_state_larger_than_a_frame_whole_when_it_must(
    make_server, make_client
) -> None:
    from clusterbook.rendezvous.handler import RendezvousHandler
    from clusterbook.rendezvous.state import RendezvousState, encode

    server: StoreServer = make_server()
    big = RendezvousState(wait_list={"late"}, node_info={"far": {"user": "u" * MAX_FRAME}})
    head = server.local_client(timeout=WAIT)
    try:
        head.update(lambda blob: encode(big))
    finally:
        head.close()
    node = make_client(server.url, node="me", timeout=WAIT)
    handler = RendezvousHandler(node, SETTINGS, "me", beat_thread=False)
    try:
        assert handler.is_closed() is False  # the state whole: read in parts
        assert handler.num_nodes_waiting() == 1
    finally:
        handler.shutdown()
