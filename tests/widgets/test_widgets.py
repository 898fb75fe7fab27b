"""Throttle, ClusterWidget and LogViewer, headless: no kernel, no browser.

The fakes below stand in for a cluster, a job and the clock; they are injected into the code
under test, never patched in.
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.errors import ClusterError
from clusterbook.launch.logs import LogRecord, read_log_file
from clusterbook.launch.logstore import LogStore
from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus
from clusterbook_widgets.cluster_widget import ClusterWidget, display_cluster
from clusterbook_widgets.log_viewer import LogViewer
from clusterbook_widgets.throttle import ThreadScheduler, Throttle

# -- fakes -------------------------------------------------------------------------------


class ManualScheduler:
    """A clock that moves only when told; due calls run on the thread that moves it."""

    def __init__(self) -> None:
        self.time = 0.0
        self._lock = threading.Lock()
        self._seq = itertools.count()
        self._queue: list[list] = []  # [due, seq, fn, cancelled]

    def now(self) -> float:
        return self.time

    def call_later(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        entry = [self.time + delay, next(self._seq), fn, False]
        with self._lock:
            self._queue.append(entry)

        def cancel() -> None:
            entry[3] = True

        return cancel

    @property
    def pending(self) -> int:
        with self._lock:
            return sum(1 for e in self._queue if not e[3])

    def advance(self, seconds: float = 0.0) -> None:
        end = self.time + seconds
        while True:
            with self._lock:
                due = [e for e in self._queue if not e[3] and e[0] <= end]
                if not due:
                    break
                entry = min(due, key=lambda e: (e[0], e[1]))
                self._queue.remove(entry)
            self.time = max(self.time, entry[0])
            entry[2]()
        self.time = end


class FakeJob:
    def __init__(self, job_id: str, done: bool = False) -> None:
        self.id = job_id
        self.done = done
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1
        self.done = True


class FakeCluster:
    """snapshot(), subscribe(), jobs and stop(), like clusterbook.Cluster; publish() is the
    test's handle to announce a change."""

    def __init__(self, snapshot: ClusterSnapshot, jobs: list[FakeJob] | None = None) -> None:
        self.current = snapshot
        self.jobs = jobs or []
        self.callbacks: dict[int, Callable[[ClusterSnapshot], None]] = {}
        self._keys = itertools.count()
        self.snapshot_calls = 0
        self.stop_calls = 0
        self.stop_error: Exception | None = None
        # an elastic cluster's join command names its token file: never to be shown
        self.join_command = "clusterbook worker join tcp://h:1 --token-file /secret/token"

    def snapshot(self) -> ClusterSnapshot:
        self.snapshot_calls += 1
        return self.current

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        key = next(self._keys)
        self.callbacks[key] = callback
        return lambda: self.callbacks.pop(key, None)

    def publish(self, snapshot: ClusterSnapshot) -> None:
        self.current = snapshot
        for callback in list(self.callbacks.values()):
            callback(snapshot)

    def stop(self) -> None:
        self.stop_calls += 1
        if self.stop_error is not None:
            raise self.stop_error
        self.publish(replace(self.current, state="stopped", nodes=()))


def snapshot(name: str = "demo", state: str = "running", **kw: object) -> ClusterSnapshot:
    fields: dict[str, object] = {
        "kind": "local",
        "nodes": (NodeStatus("n1", "host1", 2, "ready"),),
        "jobs": (),
        "launcher": "/usr/bin/mpirun",
        "run_dir": "/tmp/runs/demo",
        "uptime": 1.0,
    }
    fields.update(kw)
    return ClusterSnapshot(name=name, state=state, **fields)  # type: ignore[arg-type]


RUNNING = JobStatus("job-0002", 2, ("python", "x.py"), "running", None, None)


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.005)


# -- Throttle ----------------------------------------------------------------------------


def make_throttle(interval: float = 0.1):
    clock = ManualScheduler()
    calls: list[tuple[float, object]] = []
    throttle = Throttle(interval, lambda v: calls.append((clock.now(), v)), scheduler=clock)
    return throttle, clock, calls


def test_first_value_goes_out_at_once():
    throttle, clock, calls = make_throttle()
    throttle.push("a")
    assert calls == []  # never on the pushing thread
    clock.advance(0)
    assert calls == [(0.0, "a")]


def test_a_burst_of_1000_pushes_is_coalesced_and_the_last_value_delivered():
    throttle, clock, calls = make_throttle(0.1)
    for i in range(1000):
        throttle.push(i)
        clock.advance(0.001)  # 1,000 values over one second
    clock.advance(1.0)
    values = [v for _, v in calls]
    assert values[-1] == 999
    assert len(calls) <= 11  # leading call plus one per 0.1 s
    assert len(calls) >= 10  # a steady stream is shown steadily, not only at the end
    times = [t for t, _ in calls]
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert values == sorted(values)


def test_a_burst_at_one_instant_is_a_single_call_with_the_latest_value():
    throttle, clock, calls = make_throttle()
    for i in range(1000):
        throttle.push(i)
    clock.advance(5.0)
    assert calls == [(0.0, 999)]
    assert clock.pending == 0


def test_trailing_call_delivers_what_came_during_the_interval():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push("a")
    clock.advance(0)
    clock.advance(0.03)
    throttle.push("b")
    throttle.push("c")
    clock.advance(0.05)
    assert [v for _, v in calls] == ["a"]
    clock.advance(0.02)
    assert calls[-1] == (pytest.approx(0.1), "c")
    assert len(calls) == 2


def test_push_after_a_quiet_interval_is_a_leading_call_again():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push(1)
    clock.advance(0)
    clock.advance(0.5)
    throttle.push(2)
    clock.advance(0)
    assert calls == [(0.0, 1), (0.5, 2)]


def test_flush_delivers_now_and_the_next_call_keeps_the_interval():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push(1)
    throttle.flush()
    assert calls == [(0.0, 1)]
    clock.advance(0)  # the call scheduled by push finds nothing left to deliver
    assert len(calls) == 1
    throttle.push(2)
    clock.advance(0.05)
    assert len(calls) == 1
    clock.advance(0.05)
    assert calls[-1] == (pytest.approx(0.1), 2)


def test_close_drops_the_pending_value_and_ignores_later_pushes():
    throttle, clock, calls = make_throttle()
    throttle.push(1)
    throttle.close()
    throttle.push(2)
    clock.advance(1.0)
    assert calls == []
    assert throttle.closed


def test_a_failing_call_does_not_stop_later_ones(caplog: pytest.LogCaptureFixture):
    clock = ManualScheduler()
    seen: list[int] = []

    def call(value: int) -> None:
        seen.append(value)
        if value == 1:
            raise RuntimeError("boom")

    throttle = Throttle(0.1, call, scheduler=clock)
    throttle.push(1)
    clock.advance(0)
    throttle.push(2)
    clock.advance(0.1)
    assert seen == [1, 2]
    assert "throttled clusterbook update failed" in caplog.text


def test_throttle_validates_its_arguments():
    with pytest.raises(ValueError, match="interval"):
        Throttle(-1, print)
    with pytest.raises(TypeError, match="callable"):
        Throttle(0.1, None)


def test_real_threads_pushing_1000_values_are_throttled():
    calls: list[tuple[float, object]] = []
    done = threading.Event()

    def call(value: object) -> None:
        calls.append((time.monotonic(), value))
        if value == "last":
            done.set()

    throttle = Throttle(0.05, call, scheduler=ThreadScheduler())
    start = time.monotonic()

    def pusher(k: int) -> None:
        for i in range(250):
            throttle.push((k, i))
            time.sleep(0.0004)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    throttle.push("last")
    assert done.wait(5.0)
    elapsed = time.monotonic() - start
    throttle.close()
    assert calls[-1][1] == "last"
    assert len(calls) <= elapsed / 0.05 + 2
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(calls)]
    assert min(gaps) >= 0.05 - 0.005


# -- ClusterWidget -----------------------------------------------------------------------


def make_widget(cluster: FakeCluster | None = None, **kw: object):
    clock = ManualScheduler()
    cluster = cluster or FakeCluster(snapshot())
    kw.setdefault("refresh", None)
    widget = ClusterWidget(cluster, scheduler=clock, **kw)  # type: ignore[arg-type]
    return widget, cluster, clock


def test_widget_shows_the_cluster_at_once():
    widget, cluster, _ = make_widget()
    assert "<b>demo</b>" in widget.header_html.value
    assert "host1" in widget.nodes_html.value
    assert "No jobs yet." in widget.jobs_html.value
    assert "1 of 1 nodes ready" in widget.progress_html.value
    assert len(cluster.callbacks) == 1
    assert widget.stop_job_button.disabled  # nothing is running
    assert not widget.stop_cluster_button.disabled


def test_a_published_snapshot_reaches_the_html_after_the_throttle():
    widget, cluster, clock = make_widget()
    clock.advance(0.02)
    nodes = (NodeStatus("n1", "host1", 2, "running", ranks=(0, 1), job="job-0002"),)
    cluster.publish(snapshot("renamed", nodes=nodes, jobs=(RUNNING,)))
    assert "<b>demo</b>" in widget.header_html.value  # within the interval: not yet
    clock.advance(0.08)
    assert "<b>renamed</b>" in widget.header_html.value
    assert "job-0002" in widget.jobs_html.value
    assert "cb-state-running" in widget.nodes_html.value
    assert not widget.stop_job_button.disabled
    assert widget.snapshot is cluster.current


def test_a_change_of_the_clusters_own_state_is_drawn_at_once():
    widget, cluster, clock = make_widget()
    clock.advance(0.02)
    cluster.publish(snapshot(state="stopping"))
    assert ">stopping<" in widget.header_html.value  # not held for the throttle's interval
    cluster.publish(snapshot("renamed", state="stopping"))
    assert "<b>demo</b>" in widget.header_html.value  # the same state: throttled as ever
    clock.advance(0.1)
    assert "<b>renamed</b>" in widget.header_html.value


def test_a_burst_of_snapshots_is_drawn_at_most_ten_times_a_second():
    widget, cluster, clock = make_widget()
    drawn: list[str] = []
    widget.header_html.observe(lambda change: drawn.append(change["new"]), "value")
    for i in range(1000):
        cluster.publish(snapshot(f"c{i}"))
        clock.advance(0.001)
    clock.advance(0.2)
    assert 1 <= len(drawn) <= 11
    assert "<b>c999</b>" in drawn[-1]


def test_stop_cluster_button_calls_stop():
    widget, cluster, clock = make_widget()
    widget.stop_cluster_button.click()
    assert cluster.stop_calls == 1
    assert "Cluster stopped." in widget.message_html.value
    clock.advance(0.1)
    assert ">stopped<" in widget.header_html.value
    assert widget.stop_cluster_button.disabled
    assert widget.stop_job_button.disabled


def test_stop_job_button_cancels_the_newest_running_job():
    jobs = [FakeJob("job-0001"), FakeJob("job-0002"), FakeJob("job-0003", done=True)]
    widget, cluster, _ = make_widget(FakeCluster(snapshot(jobs=(RUNNING,)), jobs))
    assert not widget.stop_job_button.disabled
    widget.stop_job_button.click()
    assert [j.cancels for j in jobs] == [0, 1, 0]
    assert "Stopped job-0002." in widget.message_html.value
    assert widget.stop_job() == "job-0001"
    assert widget.stop_job() is None
    assert "No job is running." in widget.message_html.value
    assert cluster.stop_calls == 0


def test_a_failed_action_is_shown_escaped_in_the_widget():
    widget, cluster, _ = make_widget()
    cluster.stop_error = ClusterError("agent <b>node1</b> did not answer")
    widget.stop_cluster_button.click()
    assert "Failed: agent &lt;b&gt;node1&lt;/b&gt; did not answer" in widget.message_html.value


def test_close_unsubscribes_and_stops_polling():
    widget, cluster, clock = make_widget(refresh=1.0)
    clock.advance(0)
    assert clock.pending == 1  # the next poll
    widget.close()
    assert cluster.callbacks == {}
    assert clock.pending == 0
    before = widget.header_html.value
    cluster.publish(snapshot("after-close"))
    clock.advance(5.0)
    assert widget.header_html.value == before
    widget.close()  # twice is fine


def test_polls_refresh_uptime_until_the_cluster_stops():
    widget, cluster, clock = make_widget(refresh=1.0)
    calls = cluster.snapshot_calls
    cluster.current = snapshot(uptime=125.0)  # changed without an event
    clock.advance(1.0)
    assert cluster.snapshot_calls == calls + 1
    clock.advance(0.1)
    assert "up 2m 05s" in widget.header_html.value
    cluster.current = snapshot(state="stopped")
    clock.advance(1.0)
    clock.advance(0.1)
    assert ">stopped<" in widget.header_html.value
    assert clock.pending == 0  # a stopped cluster is not polled any more
    widget.close()


def test_elastic_bounds_are_shown_in_the_progress_bar():
    nodes = (NodeStatus("a", "ha", 1, "joined"), NodeStatus("b", "hb", 1, "pending"))
    # The snapshot says the bounds: the widget need not be told.
    cluster = FakeCluster(snapshot(nodes=nodes, min_nodes=2, max_nodes=3))
    widget, _, _ = make_widget(cluster)
    assert "1 nodes joined (min 2, max 3), 1 more needed, 1 waiting" in widget.progress_html.value


def test_display_cluster_gives_a_displayable_widget_without_secrets():
    cluster = FakeCluster(snapshot())
    widget = display_cluster(cluster, refresh=None, scheduler=ManualScheduler())
    assert isinstance(widget, ClusterWidget)
    bundle = widget._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == widget.model_id
    shown = (
        " ".join(w.value for w in (widget.header_html, widget.progress_html, widget.nodes_html))
        + widget.jobs_html.value
    )
    assert "/secret/token" not in shown
    assert "token" not in shown
    widget.close()


def test_widget_refuses_a_bad_refresh():
    with pytest.raises(ValueError, match="refresh"):
        ClusterWidget(FakeCluster(snapshot()), refresh=0)  # type: ignore[arg-type]


# -- LogViewer ---------------------------------------------------------------------------


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


def test_a_displayed_cluster_carries_the_live_widget_a_static_view_and_its_repr(tmp_path):
    cluster = cb.Cluster.local(2, 1, run_dir=tmp_path / "run")
    bundle = cluster._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live where widgets run
    assert bundle["text/plain"] == repr(cluster)  # a terminal, and the saved fallback
    assert "cb-header" in bundle["text/html"]  # GitHub, nbviewer: the state when saved
    assert "local-1" in bundle["text/html"]
