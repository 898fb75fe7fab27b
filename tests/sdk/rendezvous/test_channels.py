"""The channels agents dial to the head: a real channel server (TLS, the store's kind of
certificate) and a real dialler serving a real daemon server, the launcher's side run as MPI
runs it (a program of its own, ssh's arguments)."""

from __future__ import annotations

import contextlib
import os
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterbook.errors import ConfigError
from clusterbook.launch.daemon_server import DaemonServer
from clusterbook.launch.daemons import CHANNELS
from clusterbook.rendezvous import channels
from clusterbook.rendezvous.api import RendezvousSettings
from clusterbook.rendezvous.backends._tls import make_certificate
from clusterbook.rendezvous.channels import ChannelServer
from clusterbook.rendezvous.dialler import Dialler
from clusterbook.rendezvous.registry import channel_port, join_url, parse_join_url
from tests.sdk.launch.test_daemons import (
    TOKEN,
    helper,
    launch,
    launcher_gone_takes_its_daemon,
    sleeps,
)

SECRET = b"s" * 32


@pytest.fixture(scope="module")
def certificate():
    return make_certificate()


@pytest.fixture
def head(tmp_path, certificate) -> Iterator[ChannelServer]:
    """The head's channel server, serving the launcher's helper in ``tmp_path``; ``node1``
    is the node ``n1``."""
    server = ChannelServer("127.0.0.1", certificate, SECRET)
    server.start()
    server.listen_at(tmp_path / CHANNELS)
    server.route({"node1": "n1"})
    yield server
    server.close()


def dial(server: ChannelServer, certificate, node: str = "n1", secret: bytes = SECRET):
    """An agent's dialler (and its daemon server) for ``node``, dialled once."""
    daemons = DaemonServer(None, env={"KEPT": "yes"})
    dialler = Dialler(("127.0.0.1", server.port), certificate.fingerprint, secret, node, daemons)
    dialler.start()
    return dialler, daemons


@pytest.fixture
def agent(head, certificate) -> Iterator[Dialler]:
    dialler, daemons = dial(head, certificate)
    assert dialler.first(10.0)
    yield dialler
    dialler.close()
    daemons.close()


def until(check, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def test_a_launch_runs_through_the_agents_channel_with_its_output_and_exit_code(
    head, agent, tmp_path
):
    cold = tmp_path / "ssh"
    cold.write_text("#!/bin/sh\necho cold\n")  # it would say so, had the channel not served
    cold.chmod(0o700)
    words = ["-x", "-o", "BatchMode=yes", "root@node1", 'echo "out $KEPT $CLUSTERBOOK_JOB";']
    done = launch(tmp_path, *words, "echo err >&2; exit 7", cold=str(cold))
    assert (done.returncode, done.stdout, done.stderr) == (7, f"out yes {TOKEN}\n", "err\n")
    # The agent dialled again after it: a second launch at once finds a channel too, and the
    # launcher's helper ends as soon as its daemon does.
    began = time.monotonic()
    for _ in range(3):
        assert launch(tmp_path, "node1", "echo again", cold=str(cold)).stdout == "again\n"
    assert time.monotonic() - began < 20  # (a bound on a hang, not a speed)
    until(lambda: head.has("n1"))


def test_the_agent_names_a_free_port_of_its_node_on_its_channel_which_stays(head, agent):
    [channel] = head._idle["n1"]
    for _ in range(3):
        port = head.free_port("n1")
        with socket.socket() as sock:
            sock.bind(("", port))  # free: torch's store can listen there
    # Answered on the channel, which stays for the next launch: the agent dialled no other.
    assert head._idle["n1"] == [channel]
    with pytest.raises(OSError, match="n2 has no channel"):
        head.free_port("n2")


def test_a_host_without_a_channel_is_launched_as_before(head, agent, tmp_path):
    cold = tmp_path / "ssh"
    cold.write_text('#!/bin/sh\necho "cold $*"\n')
    cold.chmod(0o700)
    done = launch(tmp_path, "node2", "prted", cold=str(cold))
    assert done.stdout == "cold node2 prted\n"
    assert not head.has("n2")


def test_only_an_agent_showing_the_secret_gets_in(head, certificate):
    dialler, daemons = dial(head, certificate, node="n2", secret=b"x" * 32)
    try:
        assert not dialler.first(10.0)
        assert not head.has("n2")
    finally:
        dialler.close()
        daemons.close()


def test_an_agent_does_not_talk_to_a_head_with_another_certificate(head):
    other = make_certificate()
    daemons = DaemonServer(None)
    dialler = Dialler(("127.0.0.1", head.port), other.fingerprint, SECRET, "n1", daemons)
    dialler.start()
    try:
        assert not dialler.first(10.0)
        assert not head.has("n1")
    finally:
        dialler.close()


def test_a_stranger_that_speaks_no_tls_is_closed_and_the_channels_go_on(head, agent, tmp_path):
    with socket.create_connection(("127.0.0.1", head.port)) as stranger:
        stranger.sendall(b"not tls\n")
        stranger.settimeout(10)
        with contextlib.suppress(ConnectionResetError):
            while stranger.recv(100):  # a TLS alert at most, then its end (a timeout fails)
                pass
        # The agent's channel still serves.
        assert launch(tmp_path, "node1", "echo fine").stdout == "fine\n"


def test_connections_that_say_nothing_do_not_keep_an_agent_out(head, certificate):
    # More than may show who they are at once, none saying a word: the oldest are pushed out
    # once they had their moment, long before they would time out, and the agent gets in.
    many = channels._HELLOS.pending + 8
    strangers = [socket.create_connection(("127.0.0.1", head.port)) for _ in range(many)]
    try:
        dialler, daemons = dial(head, certificate, node="n2")
        try:
            until(lambda: head.has("n2"), within=channels.HELLO_WITHIN - 2)
        finally:
            dialler.close()
            daemons.close()
        strangers[0].settimeout(channels.HELLO_WITHIN - 2)
        assert strangers[0].recv(100) == b""  # ended by the server, not timed out
    finally:
        for stranger in strangers:
            stranger.close()


def test_the_helpers_socket_is_private(head, tmp_path):
    assert stat.S_IMODE(os.stat(tmp_path / CHANNELS).st_mode) == 0o600


def test_a_launcher_gone_takes_its_daemon_with_it(head, agent, tmp_path):
    launcher_gone_takes_its_daemon(tmp_path)  # through the channel, as through the socket


def test_a_head_gone_ends_the_daemons_it_started_and_the_agent_dials_again(tmp_path, certificate):
    first = ChannelServer("127.0.0.1", certificate, SECRET)
    port = first.start()
    first.listen_at(tmp_path / CHANNELS)
    first.route({"node1": "n1"})
    dialler, daemons = dial(first, certificate)
    proc = None
    try:
        assert dialler.first(10.0)
        proc = subprocess.Popen(
            [*helper(tmp_path), "node1", "sleep 300"],
            env={**os.environ, "CLUSTERBOOK_JOB": TOKEN},
        )
        until(lambda: bool(sleeps()))
        first.close()
        assert proc.wait(10) == 255  # as ssh's, when the connection ends first
        assert not (tmp_path / CHANNELS).exists()
        left = sleeps()
        psutil.wait_procs(left, timeout=10)
        assert not [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        # A head that serves on the same port again gets the agent's channel back.
        again = ChannelServer("127.0.0.1", certificate, SECRET, port=port)
        again.start()
        try:
            until(lambda: again.has("n1"), within=15.0)
        finally:
            again.close()
    finally:
        if proc is not None:
            proc.kill()
            proc.wait(10)
        dialler.close()
        daemons.close()
        first.close()


def test_closing_the_head_closes_the_idle_channels_and_the_helpers_socket(tmp_path, certificate):
    server = ChannelServer("127.0.0.1", certificate, SECRET)
    server.start()
    server.listen_at(tmp_path / CHANNELS)
    dialler, daemons = dial(server, certificate)
    try:
        assert dialler.first(10.0)
        until(lambda: server.has("n1"))
        server.close()
        assert not server.has("n1")
        assert not Path(tmp_path / CHANNELS).exists()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
    finally:
        dialler.close()
        daemons.close()
        server.close()


def test_the_join_url_names_the_channels_port_and_the_store_url_does_not():
    settings = RendezvousSettings(run_id="c1", min_nodes=1, max_nodes=2)
    store = "tcp://10.0.0.1:29400?fingerprint=sha256:" + "ab" * 32
    url = join_url(store, settings, channel=40123)
    assert channel_port(url) == 40123
    assert parse_join_url(url)[0] == store  # the store's client never sees it
    assert channel_port(join_url(store, settings)) is None
    with pytest.raises(ConfigError, match=r"names '99999' as the port of the head's channel"):
        channel_port(url.replace("40123", "99999"))
