"""The event loop under the store and the control server, on its own: what connections may cost
it (the gate's decisions, pure), and a real loop serving a small echo service over TCP: pending
connections pushed out or dropped, a burst let in one by one, accept errors that pause and go
on, and the end of the loop told to its service."""

from __future__ import annotations

import datetime
import errno
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends.tcp_gate import Limits, next_pause, wait_for_room
from clusterbook.rendezvous.backends.tcp_loop import Connection, FrameLoop
from clusterbook.rendezvous.backends.wire import FRAME_HEADER, ProtocolError

WAIT = 30.0  # generous bound for "eventually"
HELLO = 16  # the largest frame before a connection is let in


# -- the gate's decisions ----------------------------------------------------------------------


def test_accept_pauses_longer_each_time_it_fails_up_to_a_bound() -> None:
    limits = Limits(backoff=(0.05, 1.0))
    pauses = [0.0]
    for _ in range(8):
        pauses.append(next_pause(pauses[-1], limits))
    assert pauses[1:] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0, 1.0]


def test_accept_waits_for_room_only_while_the_oldest_pending_is_young() -> None:
    limits = Limits(pending=4, patience=1.0)
    assert wait_for_room(3, 100.0, limits, 100.0) is None  # room left
    assert wait_for_room(0, None, limits, 100.0) is None
    assert wait_for_room(4, 100.0, limits, 100.5) == 101.0  # full, the oldest waited 0.5 s
    assert wait_for_room(4, 100.0, limits, 101.0) is None  # it waited long enough: out it goes
    assert wait_for_room(9, 100.0, Limits(pending=4), 100.0) is None  # no patience: at once


@pytest.mark.parametrize(
    ("kwargs", "named", "shown"),
    [
        ({"handshake": 0}, "Limits.handshake", "0"),
        ({"handshake": float("nan")}, "Limits.handshake", "nan"),
        ({"patience": -1}, "Limits.patience", "-1"),
        ({"pending": 0}, "Limits.pending", "0"),
        ({"connections": 2.5}, "Limits.connections", "2.5"),
        ({"pending": True}, "Limits.pending", "True"),
        ({"backoff": (1.0,)}, "Limits.backoff", "(1.0,)"),
        ({"backoff": (1.0, 0.5)}, "at least its first", "(1.0, 0.5)"),
        ({"backoff": (0.0, 1.0)}, "first pause", "0.0"),
    ],
)
def test_bad_limits_are_config_errors_naming_the_value(
    kwargs: dict, named: str, shown: str
) -> None:
    with pytest.raises(ConfigError, match=named) as info:
        Limits(**kwargs)
    assert f"got {shown}" in str(info.value)


def test_limits_given_as_durations_keep_their_seconds() -> None:
    limits = Limits(handshake="5s", patience=datetime.timedelta(0), backoff=("50ms", "1s"))
    assert (limits.handshake, limits.patience, limits.backoff) == (5.0, 0.0, (0.05, 1.0))


# -- a real loop -------------------------------------------------------------------------------


class Echo:
    """Lets a connection in on its first frame, b"hi" (answering b"in"), then echoes frames."""

    def __init__(self) -> None:
        self.loop: FrameLoop[Connection] | None = None
        self.ends: list[bool] = []
        self.stops: list[BaseException | None] = []

    def connection(self, sock: socket.socket) -> Connection:
        return Connection(sock, HELLO)

    def frame(self, conn: Connection, payload: bytes) -> None:
        assert self.loop is not None
        if conn.limit == HELLO:
            if payload != b"hi":
                raise ProtocolError("not a hello")
            conn.limit = 1024
            self.loop.let_in(conn)
            payload = b"in"
        self.loop.send(conn, payload)

    def ended(self, conn: Connection, clean: bool) -> None:
        self.ends.append(clean)

    def stopped(self, failure: BaseException | None) -> None:
        self.stops.append(failure)


class FlakyListener(socket.socket):
    """A listener whose ``accept`` fails (out of descriptors) while :attr:`failing` is set,
    counting every call."""

    def __init__(self) -> None:
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.failing = threading.Event()
        self.calls = 0

    def accept(self):
        self.calls += 1
        if self.failing.is_set():
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


@pytest.fixture
def serve() -> Iterator[Callable[..., tuple[FrameLoop[Connection], Echo, tuple[str, int]]]]:
    loops: list[FrameLoop[Connection]] = []

    def make(listener: socket.socket | None = None, **kw: object):
        if listener is None:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        echo = Echo()
        kw.setdefault("limits", Limits(handshake=WAIT))
        loop = FrameLoop(
            listener, echo, name="The echo server", thread="echo-loop",
            log=logging.getLogger("tests.echo"), **kw,
        )  # fmt: skip
        echo.loop = loop
        loop.start()
        loops.append(loop)
        return loop, echo, listener.getsockname()

    yield make
    for loop in loops:
        loop.close()


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload


def ask(sock: socket.socket, payload: bytes) -> bytes:
    """Send a frame; its answer's payload, b"" if the connection ended first."""
    sock.sendall(frame(payload))
    sock.settimeout(WAIT)
    got = b""
    try:
        while len(got) < FRAME_HEADER.size or len(got) < FRAME_HEADER.size + int.from_bytes(
            got[: FRAME_HEADER.size], "big"
        ):
            chunk = sock.recv(4096)
            if not chunk:
                return b""
            got += chunk
    except ConnectionResetError:
        return b""
    return got[FRAME_HEADER.size :]


def ended(sock: socket.socket, timeout: float = WAIT) -> bool:
    """Whether the loop closed ``sock`` within ``timeout`` s (a bound, not a figure)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def wait_for(predicate: Callable[[], object]) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.01)


def test_frames_are_served_once_let_in_and_a_bad_first_frame_ends_the_connection(serve) -> None:
    loop, echo, address = serve()
    with socket.create_connection(address) as sock:
        assert ask(sock, b"hi") == b"in"
        assert ask(sock, b"x" * 500) == b"x" * 500  # over the hello's limit, now allowed
    with socket.create_connection(address) as sock:
        assert ask(sock, b"hello") == b""  # not "hi": a protocol error, the end
    with socket.create_connection(address) as sock:
        assert ask(sock, b"x" * (HELLO + 1)) == b""  # over the limit before it is let in
    wait_for(lambda: len(echo.ends) == 3)
    assert loop.connections == 0


def test_a_connection_not_let_in_within_the_handshake_time_is_closed(serve) -> None:
    _, _, address = serve(limits=Limits(handshake=0.2))
    with socket.create_connection(address) as talking, socket.create_connection(address) as mute:
        assert ask(talking, b"hi") == b"in"
        assert ended(mute)
        assert ask(talking, b"still") == b"still"


def test_a_burst_over_the_pending_cap_is_let_in_one_by_one_not_pushed_out(serve) -> None:
    # Sixteen peers connect at once, then each says its hello in turn: while the oldest
    # pending one is young, the others wait in the listen backlog instead of pushing it out.
    loop, _, address = serve(limits=Limits(pending=4, patience=WAIT, handshake=WAIT))
    burst = [socket.create_connection(address) for _ in range(16)]
    try:
        assert [ask(sock, b"hi") for sock in burst] == [b"in"] * 16
        assert loop.connections == 16
    finally:
        for sock in burst:
            sock.close()


def test_a_flood_of_silent_connections_pushes_out_its_own_and_the_others_go_on(serve) -> None:
    loop, _, address = serve(limits=Limits(pending=4, patience=0.1, handshake=WAIT))
    talking = socket.create_connection(address)
    silent = []
    try:
        assert ask(talking, b"hi") == b"in"
        silent = [socket.create_connection(address) for _ in range(20)]
        assert sum(ended(sock, 5.0) for sock in silent[:16]) == 16  # at most 4 wait at a time
        assert loop.connections <= 1 + 4
        with socket.create_connection(address) as late:  # still let in, pushing one out
            assert ask(late, b"hi") == b"in"
        assert ask(talking, b"on") == b"on"
    finally:
        for sock in [talking, *silent]:
            sock.close()


def test_accept_errors_pause_a_little_longer_each_time_and_then_it_serves(serve, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="tests.echo")
    listener = FlakyListener()
    listener.failing.set()
    _, _, address = serve(listener, limits=Limits(backoff=(0.05, 0.4), handshake=WAIT))
    with socket.create_connection(address) as sock:  # waits in the backlog meanwhile
        wait_for(lambda: listener.calls >= 3)  # failed, paused 0.05 s, 0.1 s, ...
        time.sleep(0.5)  # let it fail on: a loop that spins calls accept thousands of times
        listener.failing.clear()
        assert ask(sock, b"hi") == b"in"
    assert listener.calls < 15  # failures, after pauses of 0.05 + 0.1 + 0.2 + 0.4...
    warned = [r for r in caplog.records if "cannot accept" in r.getMessage()]
    assert len(warned) == 1  # said once, not at every failure
    assert "The echo server cannot accept ([Errno 24] Too many open files)" in warned[0].message


def test_over_the_connection_cap_the_next_is_closed_at_once(serve) -> None:
    loop, _, address = serve(limits=Limits(connections=2, handshake=WAIT))
    first, second = socket.create_connection(address), socket.create_connection(address)
    try:
        assert ask(first, b"hi") == ask(second, b"hi") == b"in"
        with socket.create_connection(address) as third:
            assert ended(third)
        first.close()
        wait_for(lambda: loop.connections == 1)
        with socket.create_connection(address) as fourth:  # a place came free
            assert ask(fourth, b"hi") == b"in"
    finally:
        first.close()
        second.close()


def test_work_from_other_threads_runs_on_the_loop_until_it_is_closed(serve) -> None:
    loop, echo, _ = serve()
    ran: list[str] = []
    assert loop.submit(lambda: ran.append(threading.current_thread().name))
    ours, theirs = socket.socketpair()
    with ours:
        assert loop.adopt(theirs)
        assert ask(ours, b"hi") == b"in"  # served like any other, without the listener
        loop.close()
        assert ended(ours)
    assert ran == ["echo-loop"]
    assert echo.stops == [None]
    assert not loop.submit(lambda: ran.append("late"))
    spare, other = socket.socketpair()
    with spare, other:
        assert not loop.adopt(other)  # the caller keeps it
    assert not [t for t in threading.enumerate() if t.name == "echo-loop"]


def test_timers_run_in_order_on_the_loop(serve) -> None:
    loop, _, _ = serve()
    fired: list[int] = []
    done = threading.Event()

    def arm() -> None:
        loop.later(0.05, fired.append, 2)
        loop.later(0.0, fired.append, 1)
        loop.later(0.1, lambda: (fired.append(3), done.set()))

    loop.submit(arm)
    assert done.wait(WAIT)
    assert fired == [1, 2, 3]


def test_a_loop_that_fails_tells_its_service_and_closes_everything(serve) -> None:
    loop, echo, address = serve()
    with socket.create_connection(address) as sock:
        assert ask(sock, b"hi") == b"in"

        def broken() -> None:
            raise RuntimeError("a bug in the service")

        loop.submit(broken)
        wait_for(lambda: echo.stops)
        assert ended(sock)
    [failure] = echo.stops
    assert isinstance(failure, RuntimeError)
    assert loop.closed
    assert not loop.submit(lambda: None)
