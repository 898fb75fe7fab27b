"""The control channel on its own: the handshake that proves the secret both ways without
sending it, and a control server (real Unix sockets) whose connections cost a bounded amount,
which backs off when it cannot accept and says so when its loop ends."""

from __future__ import annotations

import os
import selectors
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.head.control import (
    MAGIC,
    NONCE,
    PROOF,
    ControlClient,
    check_head,
    client_proof,
    head_challenge,
    nonce_of,
    unix_dial,
)
from clusterbook.head.control_server import ControlServer, Limits
from clusterbook.head.record import ClusterRecord, write_record
from clusterbook.rendezvous.backends.wire import FRAME_HEADER, AuthFailed, ProtocolError

HANDLERS = {"echo": lambda request: {"said": request.get("text")}}


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


def read_frame(sock: socket.socket) -> bytes:
    """One frame's payload; b"" when the connection ended first."""
    head = _exactly(sock, FRAME_HEADER.size)
    if len(head) < FRAME_HEADER.size:
        return b""
    (size,) = FRAME_HEADER.unpack(head)
    return _exactly(sock, size)


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def ended(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the server closed ``sock`` (within ``timeout`` s: a bound, not a figure)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def served(tmp_path) -> Iterator[tuple[ControlServer, Path]]:
    server = ControlServer(tmp_path, HANDLERS, limits=Limits(handshake=30, pending=3))
    try:
        yield server, tmp_path
    finally:
        server.close()


def client(directory: Path, token: Path | None = None) -> ControlClient:
    path = directory / "control.sock"
    return ControlClient(unix_dial(path), token or directory / "token", where=str(path))


def raw(directory: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(directory / "control.sock"))
    return sock


# -- the handshake ---------------------------------------------------------------------------


def test_each_side_proves_the_secret_bound_to_both_nonces_and_its_role() -> None:
    secret, other = b"s" * 32, b"o" * 32
    mine, theirs = os.urandom(NONCE), os.urandom(NONCE)
    answer = head_challenge(secret, mine, theirs)
    assert check_head(secret, mine, answer) == theirs
    for wrong in (other, secret[:-1] + b"x"):
        with pytest.raises(AuthFailed, match="did not prove"):
            check_head(wrong, mine, answer)
    with pytest.raises(AuthFailed):  # an answer made for another client's nonce
        check_head(secret, os.urandom(NONCE), answer)
    # The head's proof is no client proof (a head cannot be used to answer for a client).
    assert answer[NONCE:] != client_proof(secret, mine, theirs)
    assert len(client_proof(secret, mine, theirs)) == PROOF
    assert secret not in answer
    assert secret.hex().encode() not in answer
    assert nonce_of(MAGIC + mine) == mine
    for bad in (b"", MAGIC, MAGIC + mine + b"x", b"CBRDZV4\n" + mine):
        with pytest.raises(ProtocolError):
            nonce_of(bad)


def test_a_fake_head_learns_a_nonce_and_nothing_of_the_secret(tmp_path) -> None:
    token = tmp_path / "token"
    token.write_text("ab" * 32 + "\n")
    token.chmod(0o600)
    ours, theirs = socket.socketpair()
    got = bytearray()

    def fake_head() -> None:
        with theirs:
            got.extend(read_frame(theirs))
            theirs.sendall(frame(os.urandom(NONCE + PROOF)))  # it cannot make the proof
            theirs.settimeout(5)
            while chunk := theirs.recv(4096):
                got.extend(chunk)

    thread = threading.Thread(target=fake_head)
    thread.start()
    fake = ControlClient(lambda deadline: ours, token, where="a fake head")
    with pytest.raises(cb.ClusterStateError, match="do not share the cluster's secret"):
        fake.call("run_on_nodes", argv=["id", "-un"])
    thread.join(10)
    assert bytes(got[: len(MAGIC)]) == MAGIC
    assert len(got) == len(MAGIC) + NONCE  # its nonce; no proof, no request
    assert bytes.fromhex("ab" * 32) not in got
    assert b"ab" * 32 not in got


def test_the_head_refuses_a_wrong_or_replayed_proof_and_serves_the_right_one(served) -> None:
    _, directory = served
    secret = bytes.fromhex((directory / "token").read_text())
    mine = os.urandom(NONCE)
    with raw(directory) as sock:
        sock.sendall(frame(MAGIC + mine))
        theirs = check_head(secret, mine, read_frame(sock))
        proof = client_proof(secret, mine, theirs)
        sock.sendall(frame(proof))
        assert read_frame(sock) == b"O"
        sock.sendall(frame(b'{"op": "echo", "text": "hi"}'))
        assert read_frame(sock) == b'{"said": "hi"}'
    for shown in (proof, os.urandom(PROOF)):  # a proof seen before; a made-up one
        with raw(directory) as sock:
            sock.sendall(frame(MAGIC + mine))
            read_frame(sock)
            sock.sendall(frame(shown))
            assert read_frame(sock) == b"N"
            assert ended(sock)
    assert client(directory).call("echo", text="still") == {"said": "still"}


# -- what connections may cost ---------------------------------------------------------------


def test_a_new_connection_pushes_out_the_oldest_that_has_not_proved_the_secret(served) -> None:
    _, directory = served  # at most 3 wait to prove it
    idle, more = [raw(directory) for _ in range(3)], []
    try:
        talking = client(directory)
        assert talking.call("echo", text="x") == {"said": "x"}  # the first idle one went
        assert ended(idle[0])
        assert not ended(idle[2], 0.2)
        more = [raw(directory) for _ in range(3)]  # they push out the rest, not the client
        assert all(ended(sock) for sock in idle[1:])
        assert talking.call("echo", text="y") == {"said": "y"}
    finally:
        for sock in idle + more:
            sock.close()
        talking.close()


def test_a_connection_that_does_not_prove_the_secret_in_time_is_closed(tmp_path) -> None:
    server = ControlServer(tmp_path, HANDLERS, limits=Limits(handshake=0.2))
    try:
        with raw(tmp_path) as silent, raw(tmp_path) as halfway:
            halfway.sendall(frame(MAGIC + os.urandom(NONCE)))
            assert read_frame(halfway)  # the head's challenge; then nothing more from here
            assert ended(silent)
            assert ended(halfway)
        assert client(tmp_path).call("echo", text="z") == {"said": "z"}
    finally:
        server.close()


def test_connections_over_the_cap_are_closed_at_once_and_the_open_ones_go_on(tmp_path) -> None:
    server = ControlServer(tmp_path, HANDLERS, limits=Limits(connections=2))
    first, second = client(tmp_path), client(tmp_path)
    try:
        assert first.call("echo", text="1") == second.call("echo", text="1") == {"said": "1"}
        with raw(tmp_path) as third:
            assert ended(third)
        with pytest.raises(cb.ClusterStateError, match="Cannot reach the cluster's head"):
            client(tmp_path).call("echo", text="3")
        assert first.call("echo", text="2") == {"said": "2"}
        first.close()
        assert client(tmp_path).call("echo", text="4") == {"said": "4"}  # a place came free
    finally:
        second.close()
        server.close()


# A head out of file descriptors: it fails to accept, pauses, and serves once some are free.
OUT_OF_FILES = """\
import os, resource, sys
from pathlib import Path
from clusterbook.head.control_server import ControlServer
server = ControlServer(Path(sys.argv[1]), {"echo": lambda r: {"said": r.get("text")}})
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
fillers = []
while True:
    try:
        fillers.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        break
print("full", flush=True)
sys.stdin.readline()
for fd in fillers:
    os.close(fd)
print("freed", flush=True)
sys.stdin.readline()
server.close()
"""


def test_a_head_out_of_file_descriptors_pauses_accepting_and_then_serves(tmp_path) -> None:
    head = subprocess.Popen(
        [sys.executable, "-c", OUT_OF_FILES, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert head.stdin is not None
    assert head.stdout is not None
    assert head.stderr is not None
    try:
        assert head.stdout.readline() == "full\n"
        waiting = client(tmp_path)
        answer: list[object] = []
        thread = threading.Thread(target=lambda: answer.append(waiting.call("echo", text="w")))
        thread.start()  # its connection waits in the backlog while accept fails
        time.sleep(0.5)  # let the head fail to accept a few times
        head.stdin.write("\n")
        head.stdin.flush()
        assert head.stdout.readline() == "freed\n"
        thread.join(15)
        assert answer == [{"said": "w"}]
        assert client(tmp_path).call("echo", text="v") == {"said": "v"}
        waiting.close()
        head.stdin.write("\n")
        head.stdin.flush()
        assert head.wait(15) == 0
    finally:
        if head.poll() is None:
            head.kill()
            head.wait(10)
    assert "cannot accept ([Errno 24] Too many open files)" in head.stderr.read()


# -- a loop that ends ------------------------------------------------------------------------


class FailingSelector(selectors.DefaultSelector):
    """A selector whose ``select`` fails on its ``fail_at``-th call."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.calls, self.fail_at = 0, fail_at

    def select(self, timeout=None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls >= self.fail_at:
            raise RuntimeError("the selector broke")
        return super().select(timeout)


def test_a_control_server_whose_loop_ends_says_so_and_takes_nothing_more(tmp_path) -> None:
    told: list[str] = []
    server = ControlServer(
        tmp_path, HANDLERS, on_failure=told.append, selector=lambda: FailingSelector(3)
    )
    first = client(tmp_path)
    assert server.address == str(tmp_path / "control.sock")
    with pytest.raises(cb.ClusterStateError, match="Cannot reach the cluster's head"):
        first.call("echo", text="x")  # the loop failed while it answered
    deadline = time.monotonic() + 10
    while not told and time.monotonic() < deadline:
        time.sleep(0.01)
    assert told == [server.failure]
    assert "The control server stopped (RuntimeError: the selector broke)" in told[0]
    assert "stop file" in told[0]
    assert server.address is None
    assert not (tmp_path / "control.sock").exists()
    assert not (tmp_path / "token").exists()
    server.close()


# -- where the head is -----------------------------------------------------------------------


def test_a_run_directory_too_long_for_a_socket_address_still_serves(tmp_path) -> None:
    deep = tmp_path / ("d" * 100) / ("e" * 100)
    deep.mkdir(parents=True, mode=0o700)
    assert len(str(deep / "control.sock")) > 108  # more than sockaddr_un holds
    server = ControlServer(deep, HANDLERS)
    try:
        assert server.address == str(deep / "control.sock")
        assert stat.S_ISSOCK((deep / "control.sock").lstat().st_mode)
        assert client(deep).call("echo", text="far") == {"said": "far"}
    finally:
        server.close()
    assert not (deep / "control.sock").exists()


def test_a_handle_asks_no_head_that_runs_on_another_machine(tmp_path) -> None:
    record = ClusterRecord(
        "c-1", "c", "local", "running", str(tmp_path), created=1.0, head_pid=os.getpid(),
        head_host="elsewhere", address=str(tmp_path / "control.sock"),
    )  # fmt: skip
    write_record(record)
    attached = cb.Cluster.attach(str(tmp_path))
    with pytest.raises(cb.ClusterStateError, match=r"head runs on elsewhere; it takes requests"):
        attached.run_on_nodes(["true"])


def test_dialing_a_socket_whose_backlog_is_full_waits_for_room_instead_of_failing(
    tmp_path,
) -> None:
    path = tmp_path / "control.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(0)
    queued = []
    for _ in range(8):  # fill the backlog: a Unix socket then answers EAGAIN at once
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            sock.connect(str(path))
        except BlockingIOError:
            sock.close()
            break
        queued.append(sock)
    else:
        pytest.fail("the backlog never filled")
    room = threading.Event()

    def make_room() -> None:
        room.wait(10)
        for _ in queued:
            listener.accept()[0].close()

    helper = threading.Thread(target=make_room)
    helper.start()
    try:
        threading.Timer(0.2, room.set).start()
        sock = unix_dial(path)(time.monotonic() + 10)
        sock.close()
        assert room.is_set()  # it connected only once the backlog had room
    finally:
        room.set()
        helper.join()
        for sock in queued:
            sock.close()
        listener.close()
