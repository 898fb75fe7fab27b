"""The TCP store's TLS: the wire is encrypted, the head's certificate is pinned by the fingerprint
in the URL, the token still keeps out whoever lacks it, and an old URL says what to do."""

from __future__ import annotations

import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousSettings,
    RendezvousTimeout,
)
from clusterbook.rendezvous.backends import _tls, tcp, wire
from clusterbook.rendezvous.backends.tcp import TcpBackend, write_secret
from clusterbook.rendezvous.registry import join_url, parse_join_url
from clusterbook.rendezvous.state import decode
from tests.sdk.rendezvous.test_tcp_backend import (
    WAIT,
    Proxy,
    read_until_closed,
    tls_connect,
    url_of,
    wait_for,
)

NODE = "node-zebra-7"
# A JSON object's opening, as the state, the steps and the reports all begin: `{"key":`.
JSON_OBJECT = re.compile(rb'\{"[A-Za-z_]{2,}":')


def test_an_agents_traffic_with_the_head_is_encrypted(make_server, make_client, secret, tmp_path):
    server = make_server()
    proxy = Proxy(server.address)  # a relay that records the bytes each way
    token = tmp_path / "token"
    write_secret(token, secret)
    settings = RendezvousSettings("tls-run", 1, 1, timeout=RendezvousTimeout(last_call=0.1))
    url = join_url(url_of(proxy.port, server.fingerprint), settings)
    stderr = open(tmp_path / "agent.err", "w+")  # noqa: SIM115 - read back on failure
    argv = [sys.executable, "-m", "clusterbook", "worker", "join", url]
    agent = subprocess.Popen(
        [*argv, "--token-file", str(token), "--slots", "2", "--node-id", NODE],
        stdout=subprocess.DEVNULL,
        stderr=stderr,
    )
    watcher = make_client(server.url)
    try:

        def beats() -> list[float]:
            current = watcher.get_state()
            state = decode(current[0]) if current else None
            if state is None or NODE not in state.participants:
                return []
            return [state.last_heartbeats[NODE]]

        wait_for(lambda: beats() or agent.poll() is not None)
        assert agent.poll() is None, (tmp_path / "agent.err").read_text()
        joined = beats()[0]
        wait_for(lambda: beats()[0] > joined)  # a heartbeat went through the relay too
        plain = watcher.get_state()  # what went through the relay, as the store holds it
        agent.send_signal(signal.SIGTERM)  # it leaves cleanly, through the relay
        agent.wait(WAIT)
        wait_for(lambda: proxy.finished == proxy.connections)
    finally:
        agent.kill()
        agent.wait(WAIT)
        stderr.close()
        proxy.close()
    # What the agent said and heard, in plaintext, holds its name and JSON objects:
    assert plain is not None
    assert NODE.encode() in plain[0]
    assert JSON_OBJECT.search(plain[0])
    # On the wire there is none of it: TLS records only, and no name, JSON or secret in them.
    up, down = bytes(proxy.upstream), bytes(proxy.downstream)
    assert proxy.connections >= 2  # the agent's store client and its watcher
    assert len(up) > 1000
    assert len(down) > 1000
    assert up[:1] == b"\x16"  # a TLS handshake record: the ClientHello
    traffic = up + down
    assert NODE.encode() not in traffic
    assert JSON_OBJECT.search(traffic) is None
    for marker in (b'"participants"', b'"node"', b"tls-run", wire.MAGIC):
        assert marker not in traffic
    for form in (secret, secret.hex().encode(), secret.hex().upper().encode()):
        assert form not in traffic


def test_a_store_with_another_certificate_is_refused_before_anything_is_sent(
    make_server, make_client, caplog
) -> None:
    caplog.set_level(logging.INFO, logger=tcp.__name__)
    genuine = make_server()
    impostor = make_server()  # the same secret even, but a certificate of its own
    assert impostor.fingerprint != genuine.fingerprint
    url = url_of(impostor.address[1], genuine.fingerprint)
    client = make_client(url, node="n1", timeout=WAIT)
    with pytest.raises(RendezvousConnectionError) as info:
        client.get_state()
    message = str(info.value)
    assert "fingerprint does not match" in message
    assert f"fingerprint {impostor.fingerprint}, not {genuine.fingerprint}" in message
    assert "join URL" in message
    with pytest.raises(RendezvousConnectionError, match="fingerprint does not match"):
        client.set_state(b"for the impostor")
    # The impostor got no proof of the secret, no hello, no request: the client hung up.
    wait_for(lambda: impostor._loop.connections == 0)
    assert "authentication failed" not in caplog.text
    assert impostor.connected_nodes == frozenset()
    assert make_client(impostor.url).get_state() is None
    # By hand: the handshake completes, and the certificate is the impostor's.
    with pytest.raises(_tls._WrongCertificate):
        _tls.client_tls(
            socket.create_connection(impostor.address, timeout=WAIT),
            genuine.fingerprint,
            time.monotonic() + WAIT,
        )


def test_without_the_token_a_client_learns_nothing_and_changes_nothing(
    make_server, make_client, secret
) -> None:
    server = make_server()
    owner = make_client(server.url)
    _, token, _ = owner.set_state(b"the-state")
    # The right certificate, a wrong token: every call is refused.
    intruder = make_client(server.url, secret=secrets.token_bytes(32), node="intruder")
    calls = [
        intruder.get_state,
        lambda: intruder.set_state(b"evil"),
        lambda: intruder.set_state(b"evil", token),
        lambda: intruder.watch(token, 1.0),
    ]
    for call in calls:
        with pytest.raises(RendezvousConnectionError, match="Authentication") as info:
            call()
        assert b"the-state".decode() not in str(info.value)
    assert "intruder" not in server.connected_nodes
    # By hand, inside TLS: requests instead of the handshake get nothing back but the end.
    with tls_connect(server) as sock:
        sock.sendall(wire.FRAME_HEADER.pack(1) + b"G")
        assert read_until_closed(sock) == b""
    with tls_connect(server) as sock:
        sock.sendall(wire.FRAME_HEADER.pack(10) + b"S" + wire.token_spec(token))
        assert read_until_closed(sock) == b""
    # A hello with another secret, and requests right behind it: a refusal, and the end.
    with tls_connect(server) as sock:
        hello = wire.hello(secrets.token_bytes(32), "intruder")
        get, cas = b"G", b"S" + wire.token_spec(token) + b"evil"
        sock.sendall(b"".join(wire.FRAME_HEADER.pack(len(m)) + m for m in (hello, get, cas)))
        assert read_until_closed(sock) == wire.FRAME_HEADER.pack(1) + b"N"  # no state, no token
    # Nothing changed: the same state under the same fencing token.
    assert owner.get_state() == (b"the-state", token)


def test_an_old_style_url_without_a_fingerprint_says_what_to_do(secret, tmp_path) -> None:
    old = "tcp://10.0.0.1:29400"
    with pytest.raises(ConfigError) as info:
        TcpBackend(old, secret)
    message = str(info.value)
    assert repr(old) in message
    assert "names no certificate fingerprint" in message
    assert "?fingerprint=sha256:" in message
    assert "join URL" in message
    for bad in ("sha256:abc", "md5:" + "0" * 32, "0" * 64, "sha256:" + "g" * 64):
        with pytest.raises(ConfigError, match="not of the form sha256:HEX"):
            TcpBackend(f"{old}?fingerprint={bad}", secret)
    # An agent given an old join URL says the same and exits at once, with the usage code.
    token = tmp_path / "token"
    write_secret(token, secret)
    argv = [sys.executable, "-m", "clusterbook", "worker", "join", f"{old}/run?min=1&max=1"]
    done = subprocess.run(
        [*argv, "--token-file", str(token), "--slots", "1", "--node-id", "n1"],
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 2, done.stderr
    assert "names no certificate fingerprint" in done.stderr
    assert "join URL" in done.stderr


def test_the_join_url_carries_the_fingerprint_to_the_store_url(make_server) -> None:
    server = make_server()
    settings = RendezvousSettings("run-1", 2, 4)
    url = join_url(server.url, settings)
    assert f"fingerprint={server.fingerprint}" in url
    store, parsed = parse_join_url(url)
    assert store == server.url
    assert (parsed.run_id, parsed.min_nodes, parsed.max_nodes) == ("run-1", 2, 4)
    # Fingerprints are compared in their canonical form: colons and upper case are the same.
    digits = server.fingerprint.removeprefix("sha256:").upper()
    pretty = "SHA256:" + ":".join(digits[i : i + 2] for i in range(0, 64, 2))
    with TcpBackend(url_of(server.address[1], pretty), secrets.token_bytes(32)) as client:
        assert client.url == server.url


def _serves(context, certificate) -> bool:
    """Whether a TLS client completes a handshake with ``context`` and sees ``certificate``."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
        server = context.wrap_socket(peer, server_side=True, do_handshake_on_connect=False)
        answer = []

        def handshake() -> None:
            server.settimeout(WAIT)
            server.do_handshake()
            answer.append(True)

        thread = threading.Thread(target=handshake)
        thread.start()
        try:
            tls = _tls.client_tls(client, certificate.fingerprint, time.monotonic() + WAIT)
            shown = _tls.fingerprint_of(tls.getpeercert(binary_form=True))
            tls.close()
        finally:
            thread.join(WAIT)
            server.close()
    return bool(answer) and shown == certificate.fingerprint


def test_the_servers_key_is_loaded_from_memory_not_from_a_file(monkeypatch) -> None:
    def no_files(*args, **kwargs):
        raise AssertionError("the key went through a temporary directory")

    monkeypatch.setattr(tempfile, "TemporaryDirectory", no_files)
    certificate = _tls.make_certificate()
    assert _serves(_tls.server_context(certificate), certificate)


def test_without_in_memory_files_the_key_goes_through_a_private_directory_removed_at_once(
    monkeypatch, tmp_path
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    certificate = _tls.make_certificate()
    context = _tls.server_context(certificate)
    assert list(tmp_path.iterdir()) == []
    assert _serves(context, certificate)
