"""LogViewer, headless: a job's output from a list, a queue or a real LogStore, its HTML
read, older lines paged in from the rank files."""

from __future__ import annotations

import queue
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clusterbook.launch.logs import LogRecord, read_log_file
from clusterbook.launch.logstore import LogStore
from clusterbook_widgets.log_viewer import LogViewer
from tests.widgets.fakes import ManualScheduler


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


class FakeLogJob:
    """A job whose output comes from a list, or live from a queue (None ends it)."""

    def __init__(self, directory: Path, np: int = 2, records=None, live=None) -> None:
        self.id = "job-0001"
        self.np = np
        self.directory = directory
        self._records = list(records or [])
        self._live: queue.Queue | None = live

    def stream(self) -> Iterator[LogRecord]:
        yield from self._records
        while self._live is not None:
            item = self._live.get()
            if item is None:
                return
            yield item


class StoreJob:
    """A job backed by a real LogStore, which writes the real rank-N.log files."""

    def __init__(self, store: LogStore, np: int) -> None:
        self.id = "job-0007"
        self.np = np
        self.directory = store.directory
        self._store = store

    def stream(self) -> Iterator[LogRecord]:
        return self._store.stream()


def rec(rank: int, line: str, stream: str = "stdout", host: str | None = None) -> LogRecord:
    return LogRecord(1.7e9, rank, host or ("alpha" if rank % 2 == 0 else "beta"), stream, line)


def body_lines(html: str) -> list[str]:
    bodies = re.findall(r'<div class="cb-line[^"]*"[^>]*>(.*?)</div>', html)
    return [re.sub(r"<[^>]+>", "", b) for b in bodies]


def finished_viewer(records, tmp_path: Path, **kw: object):
    clock = ManualScheduler()
    viewer = LogViewer(FakeLogJob(tmp_path, records=records), scheduler=clock, **kw)  # type: ignore[arg-type]
    assert viewer.join(5)
    clock.advance(1.0)
    return viewer, clock


SAMPLE = [
    rec(0, "rank0 starts"),
    rec(1, "rank1 starts"),
    rec(1, "rank1 ERROR: disk full", "stderr"),
    rec(0, "rank0 done"),
    rec(-1, "launcher says hi", "stderr", host="head"),
]


def test_viewer_shows_every_line_and_offers_the_ranks_and_hosts_seen(tmp_path: Path):
    viewer, _ = finished_viewer(SAMPLE, tmp_path)
    assert len(body_lines(viewer.output_html.value)) == 5
    assert [label for label, _ in viewer.rank_filter.options] == ["all", "0", "1", "launcher"]
    assert [label for label, _ in viewer.host_filter.options] == ["all", "alpha", "beta", "head"]
    assert "ended" in viewer.status_html.value
    viewer.close()


def test_viewer_filters_by_rank_host_and_search(tmp_path: Path):
    viewer, clock = finished_viewer(SAMPLE, tmp_path)
    viewer.rank_filter.value = 1
    clock.advance(0.1)
    assert body_lines(viewer.output_html.value) == [
        "[rank 1@beta] rank1 starts",
        "[rank 1@beta] rank1 ERROR: disk full",
    ]
    viewer.rank_filter.value = None
    viewer.host_filter.value = "alpha"
    clock.advance(0.1)
    assert body_lines(viewer.output_html.value) == [
        "[rank 0@alpha] rank0 starts",
        "[rank 0@alpha] rank0 done",
    ]
    viewer.host_filter.value = None
    viewer.search_box.value = "error"
    clock.advance(0.1)
    assert body_lines(viewer.output_html.value) == ["[rank 1@beta] rank1 ERROR: disk full"]
    assert "<mark>ERROR</mark>" in viewer.output_html.value
    viewer.close()


def test_viewer_filters_show_all_selected_also_after_choosing_it_again(tmp_path: Path):
    # A Dropdown whose value is None shows no option selected: "all" needs its own value.
    viewer, clock = finished_viewer(SAMPLE, tmp_path)
    for dropdown in (viewer.rank_filter, viewer.host_filter):
        assert (dropdown.index, dropdown.label) == (0, "all")
    viewer.rank_filter.index = 2  # what picking "1" in the browser sends
    clock.advance(0.1)
    assert len(body_lines(viewer.output_html.value)) == 2
    viewer.rank_filter.index = 0
    clock.advance(0.1)
    assert (viewer.rank_filter.index, viewer.rank_filter.label) == (0, "all")
    assert len(body_lines(viewer.output_html.value)) == 5
    viewer.rank_filter.value = None  # None from code also means all, and shows it
    assert (viewer.rank_filter.index, viewer.rank_filter.label) == (0, "all")
    viewer.close()


def test_viewer_styles_stderr_and_escapes_lines(tmp_path: Path):
    records = [rec(0, "<script>alert(1)</script>"), rec(0, "oops", "stderr")]
    viewer, _ = finished_viewer(records, tmp_path)
    out = viewer.output_html.value
    assert "<script>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert '<div class="cb-line cb-err" style="color:#c53030">' in out
    assert out.count("cb-err") == 1
    viewer.close()


def test_viewer_keeps_only_the_newest_max_lines(tmp_path: Path):
    records = [rec(0, f"line {i}") for i in range(50)]
    viewer, _ = finished_viewer(records, tmp_path, max_lines=5)
    assert [r.line for r in viewer.records] == [f"line {i}" for i in range(45, 50)]
    assert body_lines(viewer.output_html.value)[0] == "[rank 0@alpha] line 45"
    assert "line 44" not in viewer.output_html.value
    viewer.close()


def write_store(tmp_path: Path, n_steps: int) -> LogStore:
    """Ranks 0 and 1 each write a line per step, both at the same instant (a tie on the
    microsecond the files keep)."""
    steps = iter(range(10**6))
    store = LogStore(
        tmp_path,
        {0: "alpha", 1: "beta"},
        launcher_host="head",
        clock=lambda: 1_700_000_000.0 + next(steps) // 2 * 0.001,
    )
    for step in range(n_steps):
        store.add(0, "stdout", f"r0 step {step}")
        store.add(1, "stderr" if step % 5 == 0 else "stdout", f"r1 step {step}")
    return store


def test_load_older_pages_lines_back_in_from_the_rank_files(tmp_path: Path):
    store = write_store(tmp_path, 30)  # 60 lines
    store.add(None, "stderr", "launcher line")
    store.close()
    expected = [(r.rank, r.stream, r.line) for r in read_all(tmp_path)]
    clock = ManualScheduler()
    viewer = LogViewer(StoreJob(store, 2), max_lines=8, page_size=20, scheduler=clock)  # type: ignore[arg-type]
    assert viewer.join(5)
    assert [r.line for r in viewer.records][-1] == "launcher line"
    assert len(viewer.records) == 8
    # the newest 8 split a tie: r1 of step 26 is kept, r0 of step 26 (same time) is not
    assert viewer.records[0].line == "r1 step 26"

    assert viewer.load_older() == 20
    got = [(r.rank, r.stream, r.line) for r in viewer.records]
    assert got == expected[-28:]  # contiguous, the tie resolved without a duplicate
    assert {r.rank: r.host for r in viewer.records} == {0: "alpha", 1: "beta", -1: "head"}
    clock.advance(1.0)
    assert "loaded 20 older lines" in viewer.status_html.value
    assert "[rank 0@alpha] r0 step 17" in body_lines(viewer.output_html.value)

    assert viewer.load_older() == 20
    assert viewer.load_older() == 13
    assert [(r.rank, r.stream, r.line) for r in viewer.records] == expected
    assert viewer.load_older() == 0
    clock.advance(1.0)
    assert "no older lines" in viewer.status_html.value
    viewer.close()


def read_all(directory: Path) -> list[LogRecord]:
    # Every line the store wrote, in the order written (files per rank, merged by time).
    records = read_log_file(directory / "rank-0.log", 0)
    records += read_log_file(directory / "rank-1.log", 1)
    records += read_log_file(directory / "launcher.log", -1)
    return sorted(records, key=lambda r: (r.time, r.rank if r.rank >= 0 else 99))


def test_load_older_button_pages_in_one_page(tmp_path: Path):
    store = write_store(tmp_path, 10)
    store.close()
    clock = ManualScheduler()
    viewer = LogViewer(StoreJob(store, 2), max_lines=4, page_size=6, scheduler=clock)  # type: ignore[arg-type]
    assert viewer.join(5)
    viewer.load_older_button.click()
    assert [r.line for r in viewer.records][:2] == ["r0 step 5", "r1 step 5"]
    assert len(viewer.records) == 10
    clock.advance(1.0)
    assert "10 lines in memory (at most 10)" in viewer.status_html.value
    viewer.close()


def test_load_older_counts_repeated_lines_at_the_same_instant(tmp_path: Path):
    store = LogStore(tmp_path, {0: "alpha"}, launcher_host="head", clock=lambda: 1.7e9)
    for _ in range(3):
        store.add(0, "stdout", "same")
    store.close()
    viewer = LogViewer(StoreJob(store, 1), max_lines=1, scheduler=ManualScheduler())  # type: ignore[arg-type]
    assert viewer.join(5)
    assert viewer.load_older() == 2  # the one in memory is not loaded twice, the others are
    assert [r.line for r in viewer.records] == ["same"] * 3
    viewer.close()


def test_load_older_without_files_loads_nothing(tmp_path: Path):
    viewer, clock = finished_viewer([rec(0, "only line")], tmp_path / "missing")
    assert viewer.load_older() == 0
    clock.advance(1.0)
    assert "no older lines" in viewer.status_html.value
    assert [r.line for r in viewer.records] == ["only line"]
    viewer.close()


def test_viewer_follows_live_output_and_close_stops_its_thread(tmp_path: Path):
    live: queue.Queue = queue.Queue()
    clock = ManualScheduler()
    viewer = LogViewer(FakeLogJob(tmp_path, live=live), scheduler=clock)  # type: ignore[arg-type]
    assert "No output yet." in viewer.output_html.value
    live.put(rec(0, "first"))
    wait_for(lambda: len(viewer.records) == 1)
    clock.advance(0.1)
    assert body_lines(viewer.output_html.value) == ["[rank 0@alpha] first"]
    assert "live" in viewer.status_html.value

    viewer.follow_toggle.value = False  # paused: new lines are kept but not drawn
    clock.advance(0.1)
    live.put(rec(1, "second"))
    wait_for(lambda: len(viewer.records) == 2)
    clock.advance(0.5)
    assert body_lines(viewer.output_html.value) == ["[rank 0@alpha] first"]
    assert "paused" in viewer.status_html.value
    viewer.follow_toggle.value = True
    clock.advance(0.1)
    assert body_lines(viewer.output_html.value)[-1] == "[rank 1@beta] second"

    viewer.close()
    live.put(rec(0, "after close"))
    assert viewer.join(5)  # the thread saw the stop at its next line and ended
    assert [r.line for r in viewer.records] == ["first", "second"]


def test_viewer_refuses_bad_sizes(tmp_path: Path):
    with pytest.raises(ValueError, match="max_lines"):
        LogViewer(FakeLogJob(tmp_path), max_lines=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="page_size"):
        LogViewer(FakeLogJob(tmp_path), page_size=0)  # type: ignore[arg-type]
