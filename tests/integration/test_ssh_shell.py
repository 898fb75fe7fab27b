"""The paramiko shell against a real OpenSSH sshd on loopback: commands, files, host keys,
and every failure translated into an SSHError that names the host."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import signal
import socket
import stat
import time
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.ssh import paramiko_transport
from clusterbook.ssh.hostkeys import AcceptNew, Fingerprints, HostKey, KnownHosts, fingerprint
from clusterbook.ssh.keys import generate_keypair
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.paramiko_shell import (
    _SEND_SLICE,
    ParamikoShell,
    _send_all,
    connect,
    wait_for_news,
)
from clusterbook.ssh.paramiko_transport import handshake_count
from clusterbook.ssh.shell import RemoteShell
from clusterbook.ssh.sshd import Sshd, start_sshd
from tests.conftest import require

pytestmark = pytest.mark.sshd

USER = os.environ.get("USER") or "root"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory):
    require(
        shutil.which("sshd") is not None or Path("/usr/sbin/sshd").exists(),
        "OpenSSH sshd is not installed (apt-get install openssh-server)",
    )
    base = tmp_path_factory.mktemp("sshd")
    keys = generate_keypair(base / "client", "test-cluster")
    (base / "authorized_keys").write_text(keys.public_line + "\n")
    server = start_sshd(base / "server", authorized_keys=base / "authorized_keys")
    try:
        yield server, keys, base
    finally:
        server.stop()


def host_key(server: Sshd) -> HostKey:
    kind, blob = server.host_public_key.split()[:2]
    return HostKey(kind, blob)


@pytest.fixture
def known_hosts(sshd, tmp_path) -> Path:
    server, _, _ = sshd
    path = tmp_path / "known_hosts"
    path.write_text(f"[127.0.0.1]:{server.port} {server.host_public_key}\n")
    return path


@pytest.fixture
def shell(sshd, known_hosts):
    server, keys, _ = sshd
    sh = connect(
        "127.0.0.1",
        port=server.port,
        user=USER,
        identity=keys.private_path,
        policy=KnownHosts(known_hosts),
    )
    yield sh
    sh.close()


def test_commands_are_quoted_word_by_word(shell, tmp_path):
    assert isinstance(shell, RemoteShell)
    marker = tmp_path / "injected"
    result = shell.run(["echo", "a  b", "$HOME", f"; touch {marker}", "$(id)", "`id`"])
    assert result.returncode == 0
    assert result.stdout == f"a  b $HOME ; touch {marker} $(id) `id`\n"
    assert not marker.exists()


def test_exit_codes_stderr_input_and_env(shell):
    result = shell.run(["sh", "-c", "echo oops >&2; exit 3"])
    assert (result.returncode, result.stderr) == (3, "oops\n")
    with pytest.raises(cb.RemoteCommandError, match="exit code 3: oops") as info:
        shell.run(["sh", "-c", "echo oops >&2; exit 3"], check=True)
    assert info.value.host == "127.0.0.1"
    assert shell.run(["cat"], input=b"bytes\x00in").stdout == "bytes\x00in"
    value = 'it\'s "q" $X `id` \\ \nnew line é'
    out = shell.run(["python3", "-c", "import os; print(repr(os.environ['V']))"], env={"V": value})
    assert out.stdout.strip() == repr(value)


def test_a_large_input_arrives_whole(shell):
    data = os.urandom(20 << 20)  # hundreds of packets, more than a channel window
    out = shell.run(["sha256sum"], input=data, timeout=120, check=True)
    assert out.stdout.split()[0] == hashlib.sha256(data).hexdigest()


class _Channel:
    """Takes at most ``per_call`` bytes a call, then nothing once ``closed_after`` is sent."""

    def __init__(self, per_call: int, closed_after: int | None = None) -> None:
        self.per_call, self.closed_after, self.got = per_call, closed_after, bytearray()

    def send(self, view: memoryview) -> int:
        if self.closed_after is not None and len(self.got) >= self.closed_after:
            return 0
        taken = bytes(view[: self.per_call])
        self.got += taken
        return len(taken)


def test_send_all_sends_everything_in_order_and_stops_on_a_closed_channel():
    data = os.urandom(3 * _SEND_SLICE + 5)
    chan = _Channel(per_call=70_001)
    _send_all(chan, data)  # type: ignore[arg-type]
    assert bytes(chan.got) == data
    with pytest.raises(OSError, match="closed"):
        _send_all(_Channel(per_call=1000, closed_after=5000), data)  # type: ignore[arg-type]


def test_one_connection_serves_many_commands(sshd, known_hosts):
    server, keys, _ = sshd
    before = handshake_count()
    sh = connect(
        "127.0.0.1",
        port=server.port,
        user=USER,
        identity=keys.private_path,
        policy=KnownHosts(known_hosts),
    )
    try:
        for i in range(5):
            assert sh.run(["echo", str(i)]).stdout == f"{i}\n"
    finally:
        sh.close()
    assert handshake_count() - before == 1


def test_command_timeout(shell):
    with pytest.raises(cb.SSHTimeoutError, match=r"ran over its 0\.5 s"):
        shell.run(["sleep", "30"], timeout=0.5)
    assert shell.run(["true"]).returncode == 0  # the connection is still usable


class _CountingWait:
    """The shell's wait for news on a channel, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, chan: object) -> None:
        self.calls += 1
        wait_for_news(chan)  # type: ignore[arg-type]


def test_a_command_that_ends_its_output_early_is_waited_for_not_spun_on(shell):
    # The output ends (the channel's end arrives) a second before the exit status: the channel's
    # file number is readable from then on, and a loop that selects on it would spin.
    counter = _CountingWait()
    counted = ParamikoShell(shell.host, shell.port, shell._transport, wait=counter)
    late_exit = ["sh", "-c", "echo out; exec >&- 2>&-; sleep 1; exit 3"]
    began = time.monotonic()
    result = counted.run(late_exit)
    assert (result.returncode, result.stdout) == (3, "out\n")
    process = counted.start(late_exit)
    assert process.readline(10) == b"out\n"
    assert process.close()[0] == 3
    took = time.monotonic() - began
    # A spin makes thousands of calls in those seconds; waiting makes one per piece of news
    # (data, the end, the status: a few per command) or per _WAIT (0.2 s) without any, never
    # one that returns at once after the end.
    assert counter.calls <= took / 0.2 + 10, (counter.calls, took)


@pytest.mark.parametrize("impl", ["ssh", "local"])
def test_write_copy_remove(impl, shell, tmp_path):
    sh = shell if impl == "ssh" else LocalShell()
    target = tmp_path / "secret.env"
    sh.write_file(str(target), b"TOKEN='x'\n", mode=0o600)
    assert target.read_bytes() == b"TOKEN='x'\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    sh.write_file(str(target), b"again\n", mode=0o644)  # replaced atomically
    assert target.read_bytes() == b"again\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o644
    source = tmp_path / "src.txt"
    source.write_bytes(b"payload")
    sh.copy(source, str(tmp_path / "dst.txt"), mode=0o640)
    assert (tmp_path / "dst.txt").read_bytes() == b"payload"
    assert stat.S_IMODE((tmp_path / "dst.txt").stat().st_mode) == 0o640
    sh.remove([str(target), str(tmp_path / "dst.txt"), str(tmp_path / "never-there")])
    assert not target.exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_unknown_host_is_refused_with_its_fingerprint(sshd, tmp_path):
    server, keys, _ = sshd
    with pytest.raises(cb.HostKeyUnknownError) as info:
        connect(
            "127.0.0.1",
            port=server.port,
            user=USER,
            identity=keys.private_path,
            policy=KnownHosts(tmp_path / "empty_known_hosts"),
            timeout=5,
        )
    fp = fingerprint(host_key(server).blob)
    assert info.value.fingerprint == fp
    assert fp in str(info.value)
    assert "accept-new" in str(info.value)


def test_changed_host_key_is_refused_under_every_policy(sshd, tmp_path):
    server, keys, _ = sshd
    other = generate_keypair(tmp_path / "other", "x").public_line.split()
    wrong = f"[127.0.0.1]:{server.port} {other[0]} {other[1]}\n"
    (tmp_path / "kh").write_text(wrong)
    policies = [
        KnownHosts(tmp_path / "kh"),
        AcceptNew(tmp_path / "kh"),
        Fingerprints({"127.0.0.1": fingerprint(other[1])}),
    ]
    for policy in policies:
        with pytest.raises(cb.HostKeyChangedError, match="CHANGED"):
            connect(
                "127.0.0.1",
                port=server.port,
                user=USER,
                identity=keys.private_path,
                policy=policy,
                timeout=5,
            )
    assert (tmp_path / "kh").read_text() == wrong  # accept-new did not overwrite it


def test_accept_new_records_the_key_then_holds_it(sshd, tmp_path):
    server, keys, _ = sshd
    record = tmp_path / "cluster_known_hosts"
    for _ in range(2):
        connect(
            "127.0.0.1",
            port=server.port,
            user=USER,
            identity=keys.private_path,
            policy=AcceptNew(record),
        ).close()
    lines = record.read_text().splitlines()
    assert lines == [f"[127.0.0.1]:{server.port} {' '.join(server.host_public_key.split()[:2])}"]
    assert stat.S_IMODE(record.stat().st_mode) == 0o600


def test_fingerprint_policy_accepts_the_right_key(sshd):
    server, keys, _ = sshd
    fp = fingerprint(host_key(server).blob)
    connect(
        "127.0.0.1",
        port=server.port,
        user=USER,
        identity=keys.private_path,
        policy=Fingerprints({f"127.0.0.1:{server.port}": fp}),
    ).close()


def test_wrong_key_is_an_auth_error(sshd, known_hosts, tmp_path):
    server, _, _ = sshd
    stranger = generate_keypair(tmp_path / "stranger", "x")
    with pytest.raises(cb.SSHAuthError, match="refused the keys tried") as info:
        connect(
            "127.0.0.1",
            port=server.port,
            user=USER,
            identity=stranger.private_path,
            policy=KnownHosts(known_hosts),
            timeout=5,
        )
    assert info.value.host == "127.0.0.1"
    assert str(stranger.private_path) in str(info.value)  # the key that was tried


def test_connection_failures_name_the_host(sshd, known_hosts):
    _, keys, _ = sshd
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(cb.SSHConnectError, match=f"refused the connection.*port {free}"):
        connect(
            "127.0.0.1",
            port=free,
            user=USER,
            identity=keys.private_path,
            policy=KnownHosts(known_hosts),
            timeout=5,
        )
    with pytest.raises(cb.SSHConnectError, match="does not resolve"):
        connect(
            "no-such-host.invalid",
            user=USER,
            identity=keys.private_path,
            policy=KnownHosts(known_hosts),
            timeout=5,
        )
    with pytest.raises(cb.ConfigError, match="starts with '-'"):
        connect(
            "-oProxyCommand=x",
            user=USER,
            identity=keys.private_path,
            policy=KnownHosts(known_hosts),
        )
    with pytest.raises(cb.ConfigError, match="does not exist"):
        connect("127.0.0.1", user=USER, identity="/no/such/key", policy=KnownHosts(known_hosts))


def test_a_hung_sshd_times_out(sshd, known_hosts):
    server, keys, _ = sshd
    os.kill(server.pid, signal.SIGSTOP)
    try:
        with pytest.raises(cb.SSHTimeoutError, match=r"127\.0\.0\.1"):
            connect(
                "127.0.0.1",
                port=server.port,
                user=USER,
                identity=keys.private_path,
                policy=KnownHosts(known_hosts),
                timeout=1,
            )
    finally:
        os.kill(server.pid, signal.SIGCONT)


@pytest.fixture
def timers(monkeypatch) -> list[tuple]:
    """The timer threads paramiko's packet layer starts from now on (none is)."""
    started: list[tuple] = []

    class Timer:  # records, and runs nothing
        def __init__(self, *args: object) -> None:
            started.append(args)

        def start(self) -> None: ...

        def cancel(self) -> None: ...

    monkeypatch.setattr("paramiko.packet.threading.Timer", Timer)  # paramiko's, not ours
    return started


def test_a_connection_starts_no_timer_thread_for_its_handshake(timers, shell):
    assert shell.run(["true"]).returncode == 0
    packetizer = shell._transport.packetizer
    assert isinstance(packetizer, paramiko_transport._Packetizer)
    assert packetizer._handshake_done
    assert not packetizer.handshake_timed_out()
    assert timers == []


def test_a_handshake_that_stalls_after_the_banner_ends_at_its_deadline():
    """A peer that says its version and then nothing: the transport's reads see the deadline
    pass and end it (a negotiation failure), well before start_client's own timeout."""
    import paramiko

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        peer, _ = listener.accept()
    with contextlib.closing(peer), contextlib.closing(client):
        peer.sendall(b"SSH-2.0-stalled\r\n")
        transport = paramiko.Transport(client, packetizer_class=paramiko_transport._Packetizer)
        transport.handshake_timeout = 0.3
        try:
            with pytest.raises((paramiko.SSHException, EOFError)) as failed:
                transport.start_client(timeout=60)
            assert "timed out" not in str(failed.value)  # not start_client's 60 s
            assert transport.packetizer.handshake_timed_out()
        finally:
            transport.close()


def test_private_key_is_0600_and_never_shown(tmp_path):
    pair = generate_keypair(tmp_path / "k", "c1")
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    assert "PRIVATE" not in repr(pair)
    assert pair.public_line.startswith("ssh-ed25519 ")
    assert pair.public_line.endswith(" clusterbook:c1")
    with pytest.raises(FileExistsError):
        generate_keypair(tmp_path / "k", "c1")  # never overwritten


@pytest.mark.parametrize("impl", ["ssh", "local"])
def test_output_streams_while_the_command_runs(impl, shell, tmp_path):
    sh = shell if impl == "ssh" else LocalShell()
    gate = tmp_path / "gate"
    seen: list[tuple[str, bytes]] = []

    def on_output(stream: str, chunk: bytes) -> None:
        seen.append((stream, chunk))
        if b"waiting" in chunk:
            assert not gate.exists()  # the command is still running when its output arrives
            gate.touch()

    script = (
        f"echo waiting; while [ ! -e {shlex.quote(str(gate))} ]; do sleep 0.01; done; echo done >&2"
    )
    result = sh.run(["sh", "-c", script], on_output=on_output, timeout=30)
    assert result.returncode == 0
    assert b"".join(c for s, c in seen if s == "stdout") == b"waiting\n"
    assert b"".join(c for s, c in seen if s == "stderr") == b"done\n"


def test_a_stopped_sshd_ends_its_sessions_unless_told_to_keep_them(tmp_path):
    keys = generate_keypair(tmp_path / "client", "test-cluster")
    (tmp_path / "authorized_keys").write_text(keys.public_line + "\n")
    for keep in (True, False):
        server = start_sshd(
            tmp_path / f"server-{keep}", authorized_keys=tmp_path / "authorized_keys"
        )
        sessions: list[psutil.Process] = []
        try:
            known = tmp_path / "known_hosts"
            known.write_text(f"[127.0.0.1]:{server.port} {server.host_public_key}\n")
            sh = connect(
                "127.0.0.1",
                port=server.port,
                user=USER,
                identity=keys.private_path,
                policy=KnownHosts(known),
            )
            sessions = psutil.Process(server.pid).children(recursive=True)
            assert sessions  # the connection's own sshd
            server.stop(keep_sessions=keep)
            if keep:  # as after a restart of OpenSSH's sshd: the connection goes on
                assert sh.run(["echo", "still"]).stdout == "still\n"
            else:  # its sessions ended (not dying) once stop() returned
                assert not [p for p in sessions if p.is_running() and p.status() != "zombie"]
            sh.close()
        finally:
            server.stop()
            for p in sessions:  # a kept one outlives its sshd: it is this test's to end
                with contextlib.suppress(psutil.Error):
                    p.kill()
