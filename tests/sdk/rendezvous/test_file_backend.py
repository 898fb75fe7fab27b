"""The shared-directory store: the backend contract, atomic compare-and-set across processes and
threads, whole states for readers, locations and errors."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousConnectionError, RendezvousStateError
from clusterbook.rendezvous.backends.file import FileBackend
from tests.sdk.rendezvous.contract import RemoteBackendContract

WAIT = 120.0  # generous bound for "eventually"


class TestFileBackend(RemoteBackendContract):
    @pytest.fixture
    def backend(self, tmp_path: Path) -> FileBackend:
        return FileBackend(tmp_path / "store")

    @pytest.fixture
    def backend_pair(self, tmp_path: Path) -> tuple[FileBackend, FileBackend]:
        return FileBackend(tmp_path / "store"), FileBackend(tmp_path / "store")

    @pytest.fixture
    def unreachable(self, tmp_path: Path):
        blocker = tmp_path / "a-file"
        blocker.write_bytes(b"")  # a directory cannot be made under a file, not even by root
        return lambda: FileBackend(blocker / "store")


# --- atomic compare-and-set -----------------------------------------------------------------------

INCREMENTER = """
import json, os, sys, time
from clusterbook.rendezvous.backends.file import FileBackend

store, go, count = FileBackend(sys.argv[1]), sys.argv[2], int(sys.argv[3])
deadline = time.monotonic() + 60
while not os.path.exists(go) and time.monotonic() < deadline:
    time.sleep(0.001)
wins, losses = [], 0
while len(wins) < count:
    state, token = store.get_state()
    new = str(int(state) + 1).encode()
    _, now, won = store.set_state(new, token)
    if won:
        wins.append([now, int(new)])
    else:
        losses += 1
print(json.dumps({"wins": wins, "losses": losses}))
"""


def test_processes_racing_on_compare_and_set_lose_no_update(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    _, start, _ = FileBackend(directory).set_state(b"0")
    go = tmp_path / "go"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", INCREMENTER, str(directory), str(go), "25"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    try:
        go.write_bytes(b"")
        results = [json.loads(p.communicate(timeout=WAIT)[0]) for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert [p.returncode for p in procs] == [0, 0, 0, 0]
    for result in results:  # each process saw its own tokens grow
        tokens = [token for token, _ in result["wins"]]
        assert tokens == sorted(tokens)
    wins = sorted(win for result in results for win in result["wins"])
    # Every increment won with its own token, in order: tokens strictly increase and the
    # counter went up by one with each of them.
    assert [token for token, _ in wins] == list(range(start + 1, start + 101))
    assert [value for _, value in wins] == list(range(1, 101))
    assert FileBackend(directory).get_state() == (b"100", start + 100)


def test_threads_with_their_own_backends_lose_no_update(tmp_path: Path) -> None:
    # POSIX locks belong to the process: threads must not slip past each other.
    directory = tmp_path / "store"
    FileBackend(directory).set_state(b"0")
    wins: list[int] = []
    lock = threading.Lock()

    def increment() -> None:
        store = FileBackend(directory)
        for _ in range(25):
            while True:
                state, token = store.get_state()
                _, now, won = store.set_state(str(int(state) + 1).encode(), token)
                if won:
                    with lock:
                        wins.append(now)
                    break

    threads = [threading.Thread(target=increment) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert sorted(wins) == list(range(2, 102))
    assert FileBackend(directory).get_state() == (b"100", 101)


def test_readers_never_see_a_torn_state(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    writer, reader = FileBackend(directory), FileBackend(directory)
    size = 1 << 20
    _, token, _ = writer.set_state(bytes([0]) * size)
    done = threading.Event()
    seen: set[int] = set()

    def write() -> None:
        nonlocal token
        for i in range(1, 41):
            _, token, won = writer.set_state(bytes([i]) * size, token)
            assert won
        done.set()

    thread = threading.Thread(target=write)
    thread.start()
    try:
        while not done.is_set():
            state, _ = reader.get_state()
            assert len(state) == size
            assert state.count(state[0]) == size, "a read saw parts of two states"
            seen.add(state[0])
    finally:
        thread.join(WAIT)
    assert len(seen) > 1  # the reads did overlap the writes


def test_a_lock_held_elsewhere_blocks_writers_not_readers(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = FileBackend(directory, timeout=0.5)
    _, token, _ = store.set_state(b"base")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR)\n"
            "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n",
            str(directory / "lock"),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(RendezvousConnectionError, match="Could not lock") as info:
            store.set_state(b"blocked", token)
        assert str(directory) in str(info.value)
        assert store.get_state() == (b"base", token)
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert holder.wait(WAIT) == 0
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    assert store.set_state(b"free", token) == (b"free", token + 1, True)


# --- watch ----------------------------------------------------------------------------------------


def test_watch_sees_a_write_by_another_process(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = FileBackend(directory)
    _, token, _ = store.set_state(b"one")
    writer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from clusterbook.rendezvous.backends.file import FileBackend\n"
            "sys.stdin.readline()\n"
            "FileBackend(sys.argv[1]).set_state(b'two', int(sys.argv[2]))\n",
            str(directory),
            str(token),
        ],
        stdin=subprocess.PIPE,
        text=True,
    )
    try:
        writer.stdin.write("go\n")
        writer.stdin.flush()
        got = store.watch(token, WAIT)
        assert writer.wait(WAIT) == 0
    finally:
        writer.kill()
        writer.wait()
        writer.stdin.close()
    assert got == (b"two", token + 1)


def test_watch_of_an_empty_store_waits_for_the_first_write(tmp_path: Path) -> None:
    a, b = FileBackend(tmp_path / "store"), FileBackend(tmp_path / "store")
    got: list[object] = []
    thread = threading.Thread(target=lambda: got.append(b.watch(None, WAIT)))
    thread.start()
    _, token, _ = a.set_state(b"first")
    thread.join(WAIT)
    assert got == [(b"first", token)]


# --- layout and locations -------------------------------------------------------------------------


def test_directory_is_created_0700_and_holds_only_state_and_lock(tmp_path: Path) -> None:
    directory = tmp_path / "deep" / "er" / "store"
    old = os.umask(0)
    try:
        store = FileBackend(directory)
        assert store.get_state() is None
    finally:
        os.umask(old)
    assert os.stat(directory).st_mode & 0o777 == 0o700
    _, token, _ = store.set_state(b"one")
    for i in range(5):
        _, token, _ = store.set_state(b"x%d" % i, token)
    store.set_state(b"loses", token - 1)
    assert sorted(os.listdir(directory)) == ["lock", "state"]  # no temp file left behind
    assert os.stat(directory / "state").st_mode & 0o777 == 0o600


def test_state_and_token_persist_across_backends(tmp_path: Path) -> None:
    _, token, _ = FileBackend(tmp_path / "store").set_state(b"kept")
    again = FileBackend(tmp_path / "store")
    assert again.get_state() == (b"kept", token)
    assert again.set_state(b"next", token) == (b"next", token + 1, True)


def test_file_url_path_and_pathlike_name_the_same_store(tmp_path: Path) -> None:
    directory = tmp_path / "my store"
    by_path = FileBackend(directory)
    _, token, _ = by_path.set_state(b"shared")
    url = "file://" + str(directory).replace(" ", "%20")
    for store in (
        FileBackend(url),
        FileBackend(str(directory)),
        FileBackend("file://localhost" + str(directory).replace(" ", "%20")),
    ):
        assert store.get_state() == (b"shared", token)
    assert FileBackend(url).path == directory


def test_relative_path_is_fixed_at_construction(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = FileBackend("rel")
    monkeypatch.chdir("/")
    store.set_state(b"here")
    assert (tmp_path / "rel" / "state").exists()


@pytest.mark.parametrize(
    "location", ["", "http://host/dir", "file://otherhost/dir", "file:///dir?x=1", 42, b"/tmp/x"]
)
def test_bad_locations_are_config_errors(location: object) -> None:
    with pytest.raises(ConfigError) as info:
        FileBackend(location)  # type: ignore[arg-type]
    assert repr(location) in str(info.value)


@pytest.mark.parametrize("call", ["get_state", "set_state", "watch"])
def test_unreachable_directory_error_names_the_path(tmp_path: Path, call: str) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    store = FileBackend(blocker / "store")
    args = {"get_state": (), "set_state": (b"x",), "watch": (None, 0.1)}[call]
    with pytest.raises(RendezvousConnectionError) as info:
        getattr(store, call)(*args)
    assert str(blocker / "store") in str(info.value)
    assert "writable" in str(info.value)


def test_vanished_directory_is_a_connection_error(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = FileBackend(directory)
    store.set_state(b"one")
    for name in os.listdir(directory):
        os.unlink(directory / name)
    os.rmdir(directory)
    with pytest.raises(RendezvousConnectionError, match=str(directory)):
        store.get_state()  # not an empty store
    with pytest.raises(RendezvousConnectionError, match=str(directory)):
        store.watch(None, 0.1)
    directory.write_bytes(b"")  # and something else took its place
    with pytest.raises(RendezvousConnectionError, match=str(directory)):
        store.set_state(b"two")
    with pytest.raises(RendezvousConnectionError, match=str(directory)):
        store.get_state()


@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped"])
def test_corrupt_state_is_a_state_error(tmp_path: Path, damage: str) -> None:
    store = FileBackend(tmp_path / "store")
    _, token, _ = store.set_state(b"a state of some length")
    path = tmp_path / "store" / "state"
    data = bytearray(path.read_bytes())
    if damage == "garbage":
        data = bytearray(b"{not a state}")
    elif damage == "truncated":
        data = data[:-1]
    else:
        data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(RendezvousStateError, match=str(path)):
        store.get_state()
    with pytest.raises(RendezvousStateError):
        store.set_state(b"over it", token)


def test_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="lock timeout"):
        FileBackend(tmp_path, timeout=0)
    with pytest.raises(ConfigError, match="poll interval"):
        FileBackend(tmp_path, poll_interval=float("nan"))


def test_settings_given_as_durations_are_read_as_seconds(tmp_path: Path) -> None:
    store = FileBackend(tmp_path, timeout="1m", poll_interval=datetime.timedelta(milliseconds=20))
    assert store.watch(None, 0.05) is None  # nothing stored: polled every 20 ms until then
    with pytest.raises(ConfigError, match=r"The lock timeout must be a duration > 0, got '1 min'"):
        FileBackend(tmp_path, timeout="1 min")


def test_watch_polls_cheaply_until_the_timeout(tmp_path: Path) -> None:
    store = FileBackend(tmp_path / "store", poll_interval=0.02)
    _, token, _ = store.set_state(b"one")
    start = time.monotonic()
    assert store.watch(token, 0.3) == (b"one", token)
    assert time.monotonic() - start >= 0.29
