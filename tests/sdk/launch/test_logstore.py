"""LogStore: files written as records arrive, markers, the bounded buffer and live streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import pytest

from clusterbook.errors import RunDirError
from clusterbook.launch.logs import LAUNCHER_RANK, read_log_file, records_frame
from clusterbook.launch.logstore import LogBudget, LogStore
from clusterbook.launch.rankwrap import MARK

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


class FakeClock:
    """Returns T0, T0 + 0.25, T0 + 0.5, ... (exact in binary, so times round-trip exactly)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        now = T0 + 0.25 * self.calls
        self.calls += 1
        return now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def make_store(tmp_path: Path, clock: FakeClock) -> Iterator:
    stores: list[LogStore] = []

    def make(**kwargs: object) -> LogStore:
        kwargs.setdefault("launcher_host", "head")
        hosts = kwargs.pop("hosts", {0: "node0", 1: "node1"})
        store = LogStore(tmp_path, hosts, clock=clock, **kwargs)  # type: ignore[arg-type]
        stores.append(store)
        return store

    yield make
    for store in stores:
        store.close()


def lines(store: LogStore) -> list[tuple[int, str, str, str]]:
    return [(r.rank, r.host, r.stream, r.line) for r in store.records()]


# -- files ---------------------------------------------------------------------------------


def test_records_reach_files_before_close(tmp_path: Path, make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "hello")
    store.add(1, "stderr", "warning: x")
    store.add(0, "stderr", "  indented  ")
    store.add(None, None, "mpirun says hi")
    assert not store.closed
    assert (tmp_path / "rank-0.log").read_text(encoding="utf-8") == (
        "2023-11-14T22:13:20.000000+00:00 out hello\n"
        "2023-11-14T22:13:20.500000+00:00 err   indented  \n"
    )
    assert (tmp_path / "rank-1.log").read_text(encoding="utf-8") == (
        "2023-11-14T22:13:20.250000+00:00 err warning: x\n"
    )
    assert (tmp_path / "launcher.log").read_text(encoding="utf-8") == (
        "2023-11-14T22:13:20.750000+00:00 err mpirun says hi\n"
    )


def test_read_log_file_round_trips(tmp_path: Path, make_store) -> None:
    store = make_store()
    texts = [
        ("stdout", "plain"),
        ("stderr", "  leading and trailing spaces  "),
        ("stdout", ""),
        ("stdout", "caf\u00e9 \u2713 tab\there"),
        ("stderr", "out err look-alike words"),
    ]
    for stream, text in texts:
        store.add(0, stream, text)
    back = read_log_file(tmp_path / "rank-0.log", 0, host="node0")
    assert back == store.records()
    assert [(r.stream, r.line) for r in back] == texts
    assert [r.time for r in back] == [T0 + 0.25 * i for i in range(len(texts))]


def test_launcher_records(make_store) -> None:
    store = make_store()
    store.add(None, "stdout", "launcher out")
    store.add(None, None, "launcher err")
    assert lines(store) == [
        (LAUNCHER_RANK, "head", "stdout", "launcher out"),
        (LAUNCHER_RANK, "head", "stderr", "launcher err"),
    ]
    assert store.tail(LAUNCHER_RANK) == ["launcher out", "launcher err"]


def test_unknown_rank_host_is_question_mark(make_store) -> None:
    store = make_store()
    store.add(5, "stdout", "who am i")
    assert lines(store) == [(5, "?", "stdout", "who am i")]


def test_add_after_close_is_dropped(tmp_path: Path, make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "kept")
    assert not store.wait_closed(0)
    store.close()
    assert store.closed
    assert store.wait_closed(0)
    store.add(0, "stdout", "too late")
    assert [r.line for r in store.records()] == ["kept"]
    assert [r.line for r in read_log_file(tmp_path / "rank-0.log", 0)] == ["kept"]


def test_partial_pieces_are_marked_in_memory_in_files_and_frames(
    tmp_path: Path, make_store
) -> None:
    store = make_store()
    store.add(0, "stdout", "piece 1 ", partial=True)
    store.add(0, "stdout", "piece 2 ", partial=True)
    store.add(0, "stdout", "end")
    store.add(0, "stderr", f"{MARK} exit 0 looks like a marker", partial=True)
    assert [(r.line, r.partial) for r in store.records()] == [
        ("piece 1 ", True),
        ("piece 2 ", True),
        ("end", False),
        (f"{MARK} exit 0 looks like a marker", True),  # a piece is never a marker
    ]
    assert store.exit_codes == {}
    text = (tmp_path / "rank-0.log").read_text(encoding="utf-8")
    codes = [line.split(" ", 2)[1] for line in text.split("\n") if line]
    assert codes == ["out+", "out+", "out", "err+"]
    assert read_log_file(tmp_path / "rank-0.log", 0, host="node0") == store.records()
    assert list(records_frame(store.records())["partial"]) == [True, True, False, True]


def test_carriage_returns_inside_a_line_round_trip_through_the_file(
    tmp_path: Path, make_store
) -> None:
    store = make_store()
    store.add(0, "stdout", "10%\r50%\r100%")
    store.add(0, "stdout", "next")
    back = read_log_file(tmp_path / "rank-0.log", 0)
    assert [r.line for r in back] == ["10%\r50%\r100%", "next"]


def test_buffer_is_bounded_in_bytes_too(tmp_path: Path, make_store) -> None:
    store = make_store(max_bytes=1000)
    for i in range(10):
        store.add(0, "stdout", str(i) * 300, partial=i < 9)
    assert [r.line[0] for r in store.records()] == ["7", "8", "9"]
    on_disk = read_log_file(tmp_path / "rank-0.log", 0)
    assert "".join(r.line for r in on_disk) == "".join(str(i) * 300 for i in range(10))


def test_tails_keep_the_start_of_huge_lines_only(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "x" * 100_000)
    (kept,) = store.tail(0)
    assert len(kept) == 2000
    assert kept.endswith("\u2026")


def test_a_write_error_keeps_records_in_memory_and_is_reported_once(
    tmp_path: Path, make_store
) -> None:
    store = make_store()
    errors: list[Exception] = []
    store.on_write_error(errors.append)
    store.add(0, "stdout", "on disk")
    (tmp_path / "rank-1.log").mkdir()  # rank 1's file cannot be opened
    store.add(1, "stdout", "only in memory")
    store.add(0, "stdout", "in memory too")
    assert [r.line for r in store.records()] == ["on disk", "only in memory", "in memory too"]
    assert len(errors) == 1
    assert errors[0] is store.write_error
    assert isinstance(store.write_error, RunDirError)
    assert store.write_error.path == str(tmp_path / "rank-1.log")
    assert str(tmp_path / "rank-1.log") in str(store.write_error)
    assert "run_dir=" in str(store.write_error)
    assert [r.line for r in read_log_file(tmp_path / "rank-0.log", 0)] == ["on disk"]
    store.close()  # no error escapes


def test_full_disk_error_names_the_path_and_no_space_left() -> None:
    import errno
    import os

    err = RunDirError.from_os_error("/runs/x/rank-0.log", OSError(errno.ENOSPC, os.strerror(28)))
    assert "/runs/x/rank-0.log" in str(err)
    assert "no space left on device" in str(err)
    assert "Free space there" in str(err)


# -- markers -------------------------------------------------------------------------------


def test_start_marker_sets_host_and_pid_and_is_not_a_record(tmp_path: Path, make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "early")
    store.add(0, "stderr", f"{MARK} start node7 1234")
    store.add(0, "stdout", "late")
    assert store.hosts[0] == "node7"
    assert store.pids == {0: 1234}
    assert lines(store) == [(0, "node0", "stdout", "early"), (0, "node7", "stdout", "late")]
    assert [r.line for r in read_log_file(tmp_path / "rank-0.log", 0)] == ["early", "late"]
    assert store.tail(0) == ["early", "late"]


def test_start_marker_without_pid(make_store) -> None:
    store = make_store()
    store.add(1, "stderr", f"{MARK} start gpu-box")
    assert store.hosts[1] == "gpu-box"
    assert store.pids == {}
    assert store.records() == []


def test_exit_markers_record_codes_order_and_fire_callbacks(tmp_path: Path, make_store) -> None:
    store = make_store(hosts={})
    seen: list[tuple[int, int]] = []
    store.on_exit(lambda rank, code: seen.append((rank, code)))
    store.add(2, "stderr", f"{MARK} exit 3")
    store.add(0, "stderr", f"{MARK} exit 0")
    store.add(1, "stderr", f"{MARK} exit 143")
    store.add(2, "stderr", f"{MARK} exit 9")  # a second report of rank 2 changes nothing
    assert store.exit_codes == {2: 3, 0: 0, 1: 143}
    assert store.exit_order == [2, 0, 1]
    assert seen == [(2, 3), (0, 0), (1, 143)]
    assert store.records() == []
    assert list(tmp_path.iterdir()) == []


def test_every_exit_listener_is_called(make_store) -> None:
    store = make_store()
    first: list[tuple[int, int]] = []
    second: list[tuple[int, int]] = []
    store.on_exit(lambda rank, code: first.append((rank, code)))
    store.on_exit(lambda rank, code: second.append((rank, code)))
    store.add(1, "stderr", f"{MARK} exit 1")
    assert first == second == [(1, 1)]


def test_marker_after_partial_line_keeps_the_text(make_store) -> None:
    store = make_store()
    tails_at_exit: list[list[str]] = []
    store.on_exit(lambda rank, code: tails_at_exit.append(store.tail(rank)))
    store.add(0, "stderr", f"progress 50%{MARK} exit 7")
    assert lines(store) == [(0, "node0", "stderr", "progress 50%")]
    assert store.exit_codes == {0: 7}
    # The callback runs once the text is stored, so a failure report can show it.
    assert tails_at_exit == [["progress 50%"]]


@pytest.mark.parametrize(
    ("rank", "stream", "text"),
    [
        (0, "stdout", f"{MARK} exit 3"),  # markers only come on stderr
        (0, "stdout", f"{MARK} start node7 1234"),
        (None, "stderr", f"{MARK} exit 3"),  # the launcher has no markers
        (0, "stderr", f"{MARK} exit abc"),  # malformed
        (0, "stderr", f"{MARK} exit 3 trailing words"),
        (0, "stderr", f"{MARK} stop 3"),
    ],
)
def test_non_markers_are_plain_text(rank: int | None, stream: str, text: str, make_store) -> None:
    store = make_store()
    seen: list[tuple[int, int]] = []
    store.on_exit(lambda r, c: seen.append((r, c)))
    store.add(rank, stream, text)
    assert [r.line for r in store.records()] == [text]
    assert store.exit_codes == {}
    assert store.pids == {}
    assert store.hosts == {0: "node0", 1: "node1"}
    assert seen == []


# -- lines that arrive together -----------------------------------------------------------


def test_lines_added_together_are_the_records_and_file_lines_added_one_by_one(
    tmp_path: Path, make_store
) -> None:
    texts = ["a", "", "b\rc", "piece-", "rest", "é"]
    one = make_store()
    for i, text in enumerate(texts):
        one.add(1, "stdout", text, partial=i == 3)
    one.close()
    by_one = [r[1:] for r in one.records()], (tmp_path / "rank-1.log").read_bytes().decode()
    (tmp_path / "rank-1.log").unlink()
    together = make_store()
    together.add_lines(1, "stdout", texts, frozenset({3}))
    together.close()
    records = together.records()
    assert [r[1:] for r in records] == by_one[0]
    assert len({r.time for r in records}) == 1  # they arrived at one time
    stamp = datetime.fromtimestamp(records[0].time, timezone.utc).isoformat(timespec="microseconds")
    written = (tmp_path / "rank-1.log").read_bytes().decode()
    assert written == "".join(
        f"{stamp} out{'+' if i == 3 else ''} {t}\n" for i, t in enumerate(texts)
    )
    assert [line.split(" ", 1)[-1] for line in written.split("\n")] == [
        line.split(" ", 1)[-1] for line in by_one[1].split("\n")
    ]


def test_markers_among_lines_added_together(make_store) -> None:
    store = make_store(hosts={})
    seen: list[tuple[int, int, list[str]]] = []
    store.on_exit(lambda rank, code: seen.append((rank, code, store.tail(rank))))
    store.add_lines(
        3,
        "stderr",
        [f"{MARK} start node9 77", "Traceback", "long-", f"tail{MARK} exit 1", "after"],
        frozenset({2}),
    )
    assert [(r.line, r.partial, r.host) for r in store.records()] == [
        ("Traceback", False, "node9"),
        ("long-", True, "node9"),
        ("tail", False, "node9"),
        ("after", False, "node9"),
    ]
    assert (store.pids, store.exit_codes) == ({3: 77}, {3: 1})
    # Told once every line of the batch is stored: a failure report has them all.
    assert seen == [(3, 1, ["Traceback", "long-", "tail", "after"])]


def test_a_piece_that_looks_like_a_marker_is_text(make_store) -> None:
    store = make_store()
    store.add_lines(0, "stderr", [f"{MARK} exit 4", "x"], frozenset({0}))
    assert [r.line for r in store.records()] == [f"{MARK} exit 4", "x"]
    assert store.exit_codes == {}


def test_a_clusters_jobs_share_one_bound_and_ended_jobs_read_their_files(
    tmp_path: Path, clock: FakeClock
) -> None:
    budget = LogBudget(max_records=5, max_bytes=1 << 20)

    def store(name: str) -> LogStore:
        (tmp_path / name).mkdir()
        return LogStore(tmp_path / name, {0: "n0"}, launcher_host="h", clock=clock, budget=budget)

    first = store("job-1")
    first.add_lines(0, "stdout", ["a", "b", "c"])
    first.add(None, "stderr", "launcher says")
    before = first.records()
    first.close()
    second = store("job-2")
    second.add_lines(0, "stdout", ["d"])
    assert first.held == (4, 16)  # 5 records in all: they fit
    second.add_lines(0, "stdout", ["e", "f"])
    assert first.held == (0, 0)  # 7: the ended job's buffer goes
    assert budget.held == (3, 3)
    assert first.records() == before  # read back from its files
    assert list(first.stream()) == before
    assert list(first.stream(from_start=False)) == []
    third = store("job-3")
    third.add_lines(0, "stdout", [str(i) for i in range(4)])
    assert budget.held == (7, 7)  # running jobs keep theirs (each is bounded on its own)
    for s in (second, third):
        s.close()
    assert [r.line for r in third.records()] == ["0", "1", "2", "3"]


def test_a_let_go_buffer_reads_back_the_newest_its_bound_allows(tmp_path: Path, make_store) -> None:
    store = make_store(max_records=3)
    store.add_lines(0, "stdout", ["1", "2"])
    store.add_lines(1, "stdout", ["3", "4"])
    held = store.records()
    store.close()
    store.release()
    assert store.records() == held == [r for r in held if r.line in {"2", "3", "4"}]


def test_an_open_store_is_never_let_go(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "x")
    store.release()
    assert [r.line for r in store.records()] == ["x"]


# -- buffer and tails ----------------------------------------------------------------------


def test_bounded_buffer_keeps_newest_files_keep_all(tmp_path: Path, make_store) -> None:
    store = make_store(max_records=3)
    for i in range(7):
        store.add(0, "stdout", f"line {i}")
    assert [r.line for r in store.records()] == ["line 4", "line 5", "line 6"]
    on_disk = read_log_file(tmp_path / "rank-0.log", 0)
    assert [r.line for r in on_disk] == [f"line {i}" for i in range(7)]


def test_tail_keeps_last_lines_per_rank_beyond_the_buffer(make_store) -> None:
    store = make_store(max_records=2, tail_lines=3)
    for i in range(5):
        store.add(0, "stdout" if i % 2 else "stderr", f"r0 {i}")
        store.add(1, "stdout", f"r1 {i}")
    assert store.tail(0) == ["r0 2", "r0 3", "r0 4"]
    assert store.tail(1) == ["r1 2", "r1 3", "r1 4"]
    assert store.tail(9) == []
    assert [r.line for r in store.records()] == ["r0 4", "r1 4"]


# -- streaming -----------------------------------------------------------------------------


def test_stream_from_start_in_thread_gets_everything_and_ends(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "before")
    received: list[str] = []
    reader = threading.Thread(
        target=lambda: received.extend(r.line for r in store.stream()), daemon=True
    )
    reader.start()
    for i in range(200):
        store.add(i % 2, "stdout", f"line {i}")
    store.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert received == ["before", *(f"line {i}" for i in range(200))]


def test_stream_not_from_start_gets_records_added_after_it_started(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "before")
    received: list[str] = []
    listening = threading.Event()

    def read() -> None:
        for record in store.stream(from_start=False):
            received.append(record.line)
            listening.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    # Handshake: add pings until the reader has seen one, so it is surely following.
    deadline = time.monotonic() + 10
    while not listening.wait(0.005):
        assert time.monotonic() < deadline, "reader never started"
        store.add(0, "stdout", "ping")
    store.add(0, "stdout", "after 1")
    store.add(1, "stderr", "after 2")
    store.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert "before" not in received
    pings = received.index("after 1")
    assert pings >= 1
    assert set(received[:pings]) == {"ping"}
    assert received[pings:] == ["after 1", "after 2"]


def test_stream_of_closed_store_yields_buffer_then_ends(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "a")
    store.add(1, "stdout", "b")
    store.close()
    assert [r.line for r in store.stream()] == ["a", "b"]
    assert list(store.stream(from_start=False)) == []


def test_slow_reader_skips_to_oldest_kept_record(make_store) -> None:
    store = make_store(max_records=3)
    store.add(0, "stdout", "r0")
    store.add(0, "stdout", "r1")
    it = store.stream()
    assert next(it).line == "r0"  # the reader now holds a batch of r0, r1
    for i in range(2, 12):
        store.add(0, "stdout", f"r{i}")  # r2..r8 fall out of the buffer unseen
    assert next(it).line == "r1"
    assert [next(it).line for _ in range(3)] == ["r9", "r10", "r11"]
    store.add(0, "stdout", "r12")
    assert next(it).line == "r12"
    store.close()
    assert list(it) == []


def test_two_readers_each_get_every_record(make_store) -> None:
    store = make_store()
    results: list[list[str]] = [[], []]
    readers = [
        threading.Thread(
            target=lambda out=out: out.extend(r.line for r in store.stream()), daemon=True
        )
        for out in results
    ]
    for reader in readers:
        reader.start()
    for i in range(50):
        store.add(0, "stdout", str(i))
    store.close()
    for reader in readers:
        reader.join(timeout=10)
        assert not reader.is_alive()
    assert results[0] == results[1] == [str(i) for i in range(50)]


# -- DataFrame -----------------------------------------------------------------------------


def test_records_frame_columns_and_utc_times(make_store) -> None:
    store = make_store()
    store.add(0, "stdout", "x")
    store.add(None, "stderr", "y")
    frame = records_frame(store.records())
    assert list(frame.columns) == ["time", "rank", "host", "stream", "line", "partial", "attempt"]
    assert str(frame["time"].dt.tz) == "UTC"
    assert list(frame["time"]) == [
        pd.Timestamp(datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)),
        pd.Timestamp(datetime(2023, 11, 14, 22, 13, 20, 250_000, tzinfo=timezone.utc)),
    ]
    assert frame["rank"].dtype == "int64"
    assert list(frame["rank"]) == [0, LAUNCHER_RANK]
    assert list(frame["host"]) == ["node0", "head"]
    assert list(frame["stream"]) == ["stdout", "stderr"]
    assert list(frame["line"]) == ["x", "y"]
