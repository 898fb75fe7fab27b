"""A live, filterable view of a job's output.

A daemon thread iterates ``job.stream()`` into a bounded buffer (the newest ``max_lines``
records); every line is also in the job directory's ``rank-N.log`` files, from which "Load
older" pages earlier lines back in. Redraws go through a
:class:`~clusterbook_widgets.throttle.Throttle` (at most ten a second however fast ranks
write) and :func:`~clusterbook.views.lines.render_lines`; the widget only assigns values.
The thread keeps the view live after the cell that made it has finished.
"""

from __future__ import annotations

import contextlib
import html
import logging
import threading
from collections import Counter, deque
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

import ipywidgets as widgets

from clusterbook.durations import Duration
from clusterbook.launch import LAUNCHER_RANK, LogRecord, read_log_file
from clusterbook.spec import validate_positive_int
from clusterbook.views.lines import render_lines
from clusterbook.views.style import MUTED_COLOUR
from clusterbook_widgets.throttle import Scheduler, Throttle

__all__ = ["LogViewer"]

_log = logging.getLogger("clusterbook")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_MICROSECOND = timedelta(microseconds=1)


class _All:
    """The value of the filters' "all" option: a Dropdown shows no option as selected when
    its value is None, so "all" needs a value of its own."""

    def __repr__(self) -> str:
        return "all"


_ALL = _All()


def _chosen(value: Any) -> Any:
    return None if value is None or value is _ALL else value


class _Job(Protocol):
    """What the viewer needs of a job (:class:`clusterbook.launch.job.Job` has it all)."""

    id: str
    np: int
    directory: Path

    def stream(self) -> Iterator[LogRecord]: ...


def _micros(when: float) -> int:
    # The files keep microseconds (see logs.format_log_lines); compare records at that precision.
    return (datetime.fromtimestamp(when, timezone.utc) - _EPOCH) // _MICROSECOND


def _identity(record: LogRecord) -> tuple[int, int, str, str]:
    return (_micros(record.time), record.rank, record.stream, record.line)


class LogViewer(widgets.VBox):
    """Live output of ``job``, filtered by rank, host and text.

    Parameters
    ----------
    job
        A :class:`clusterbook.launch.job.Job` (anything with ``stream()``, ``np`` and
        ``directory``).
    max_lines
        Records kept in memory; older ones are read back from the files on "Load older".
    page_size
        Records one "Load older" pages in (each page raises the bound by as many).
    interval
        Minimum seconds between two redraws.
    scheduler
        Clock and timers of the redraw throttle (default: real threads).
    """

    def __init__(
        self,
        job: _Job,
        max_lines: int = 2000,
        *,
        page_size: int = 500,
        interval: Duration = 0.1,
        scheduler: Scheduler | None = None,
    ) -> None:
        for name, value in (("max_lines", max_lines), ("page_size", page_size)):
            validate_positive_int(value, name)
        controls, scroller = self._make_controls(page_size)
        super().__init__([controls, scroller, self.status_html])
        self._parts: tuple[widgets.Widget, ...] = (
            *controls.children,
            controls,
            self.output_html,
            scroller,
            self.status_html,
        )
        self._job = job
        self._np = int(getattr(job, "np", 0) or 0)
        self.max_lines = max_lines
        self.page_size = page_size
        self._lock = threading.Lock()
        self._records: deque[LogRecord] = deque(maxlen=max_lines)
        self._hosts: dict[int, str] = {}  # rank -> host, as the records say
        self._note = ""
        self._error: str | None = None
        self._syncing = False  # options being replaced: not a user's choice
        self._closed = False
        self._stop = threading.Event()
        self._ended = threading.Event()
        self._throttle: Throttle[object] = Throttle(interval, self._draw, scheduler=scheduler)
        self._sync_options()
        for control in (self.rank_filter, self.host_filter, self.search_box):
            control.observe(self._on_control, "value")
        self.follow_toggle.observe(self._on_follow, "value")
        self.load_older_button.on_click(lambda _: self._load_older_clicked())
        self.refresh()
        self._thread = threading.Thread(
            target=self._read, name=f"clusterbook-logs-{getattr(job, 'id', '?')}", daemon=True
        )
        self._thread.start()

    # -- public API -----------------------------------------------------------------------

    @property
    def records(self) -> list[LogRecord]:
        """The records in memory, oldest first."""
        with self._lock:
            return list(self._records)

    @property
    def ended(self) -> bool:
        """Whether the job's stream has ended (every line was read)."""
        return self._ended.is_set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the job's output has all been read; False if ``timeout`` passed first."""
        return self._ended.wait(timeout)

    def refresh(self) -> None:
        """Redraw now, on this thread, and send what is shown even where it has not changed:
        a draw the reader's thread made may have gone out under another cell's message, which
        a notebook runner (nbclient, papermill) does not apply, leaving an older view in the
        notebook's saved widget state."""
        self._throttle.push(None)
        self._throttle.flush()
        if not self._closed:
            for shown in (self.output_html, self.status_html):
                shown.send_state("value")

    def load_older(self) -> int:
        """Page in up to ``page_size`` records older than the oldest in memory, from the job's
        ``rank-N.log`` and ``launcher.log`` files; return how many were loaded."""
        directory = Path(self._job.directory)
        with self._lock:
            hosts = dict(self._hosts)
            oldest = _micros(self._records[0].time) if self._records else None
            # Records at the oldest instant that are in memory already (a tie across ranks).
            at_oldest = Counter(_identity(r) for r in self._records if _micros(r.time) == oldest)
        found: list[LogRecord] = []
        for path in sorted(directory.glob("rank-*.log")):
            number = path.stem.removeprefix("rank-")
            if number.isdigit():
                found += read_log_file(path, int(number), hosts.get(int(number), "?"))
        if (directory / "launcher.log").exists():
            launcher = hosts.get(LAUNCHER_RANK, "?")
            found += read_log_file(directory / "launcher.log", LAUNCHER_RANK, launcher)
        older: list[LogRecord] = []
        for r in found:
            when = _micros(r.time)
            if oldest is None or when < oldest:
                older.append(r)
            elif when == oldest:
                if at_oldest[_identity(r)]:
                    at_oldest[_identity(r)] -= 1  # this one is in memory already
                else:
                    older.append(r)
        older.sort(key=lambda r: _micros(r.time))  # stable: each file's order is kept
        page = older[-self.page_size :]
        with self._lock:
            self._records = deque(
                [*page, *self._records], maxlen=(self._records.maxlen or 0) + len(page)
            )
            for r in page:
                self._hosts.setdefault(r.rank, r.host)
        self._note = (
            f"loaded {len(page)} older lines" if page else "no older lines in the job's files"
        )
        self.refresh()
        return len(page)

    def close(self) -> None:
        """Stop reading (the thread ends at the next line or when the job ends) and close."""
        if getattr(self, "_closed", True):
            with contextlib.suppress(Exception):
                super().close()
            return
        self._closed = True
        self._stop.set()
        self._throttle.close()
        for part in self._parts:
            part.close()
        super().close()

    # -- internals ------------------------------------------------------------------------

    def _make_controls(self, page_size: int) -> tuple[widgets.HBox, widgets.Box]:
        """The filters and buttons (in a row), and the scrolling box of the lines."""
        self.rank_filter = widgets.Dropdown(
            description="Rank", options=[("all", _ALL)], layout=widgets.Layout(width="160px")
        )
        self.host_filter = widgets.Dropdown(
            description="Host", options=[("all", _ALL)], layout=widgets.Layout(width="220px")
        )
        self.search_box = widgets.Text(
            description="Search", placeholder="text in a line", continuous_update=True
        )
        self.follow_toggle = widgets.ToggleButton(
            value=True,
            description="Follow",
            icon="play",
            tooltip="Redraw as lines arrive; off: the view holds still (lines are still kept)",
        )
        self.load_older_button = widgets.Button(
            description="Load older",
            icon="history",
            tooltip=f"Read {page_size} earlier lines back from the job's rank-N.log files",
        )
        self.status_html = widgets.HTML()
        self.output_html = widgets.HTML()
        controls = widgets.HBox(
            [
                self.rank_filter,
                self.host_filter,
                self.search_box,
                self.follow_toggle,
                self.load_older_button,
            ]
        )
        # column-reverse keeps the scroll position at the newest line as lines arrive.
        scroller = widgets.Box(
            [self.output_html],
            layout=widgets.Layout(
                max_height="400px", overflow="auto", display="flex", flex_flow="column-reverse"
            ),
        )
        return controls, scroller

    def _read(self) -> None:
        try:
            for record in self._job.stream():
                if self._stop.is_set():
                    return
                with self._lock:
                    self._records.append(record)
                    self._hosts.setdefault(record.rank, record.host)
                if self.follow_toggle.value:
                    self._throttle.push(None)
        except Exception as exc:
            _log.exception("clusterbook log viewer stopped reading")
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._ended.set()
            self._throttle.push(None)

    def _on_control(self, change: dict[str, Any]) -> None:
        if self._syncing:
            return
        if change["new"] is None and change["owner"] in (self.rank_filter, self.host_filter):
            change["owner"].value = _ALL  # None means "all" too; show it selected
            return
        self._throttle.push(None)

    def _on_follow(self, change: dict[str, Any]) -> None:
        self.follow_toggle.icon = "play" if change["new"] else "pause"
        self._throttle.push(None)

    def _load_older_clicked(self) -> None:
        try:
            self.load_older()
        except OSError as exc:
            self._note = f"could not read the job's files: {exc}"
            self.refresh()

    def _sync_options(self) -> None:
        with self._lock:
            hosts = dict(self._hosts)
        ranks = sorted(set(range(self._np)) | {r for r in hosts if r != LAUNCHER_RANK})
        rank_options = [("all", _ALL), *((str(r), r) for r in ranks)]
        if LAUNCHER_RANK in hosts:
            rank_options.append(("launcher", LAUNCHER_RANK))
        host_options = [("all", _ALL), *((h, h) for h in sorted(set(hosts.values())))]
        self._syncing = True
        try:
            for dropdown, options in (
                (self.rank_filter, rank_options),
                (self.host_filter, host_options),
            ):
                if tuple(options) != tuple(dropdown.options):
                    chosen = dropdown.value
                    dropdown.options = options
                    # ipywidgets selects the first option when options change; keep the choice.
                    if chosen in [v for _, v in options]:
                        dropdown.value = chosen
        finally:
            self._syncing = False

    def _draw(self, _: object) -> None:
        if self._closed:
            return
        self._sync_options()
        records = self.records
        self.output_html.value = render_lines(
            records,
            rank=_chosen(self.rank_filter.value),
            host=_chosen(self.host_filter.value),
            search=self.search_box.value,
            limit=len(records),
        )
        state = (
            "ended" if self._ended.is_set() else ("live" if self.follow_toggle.value else "paused")
        )
        with self._lock:
            bound = self._records.maxlen
        parts = [
            state,
            f"{len(records)} lines in memory (at most {bound})",
            f"every line is in the rank-N.log files of {self._job.directory}",
        ]
        if self._note:
            parts.append(self._note)
        if self._error:
            parts.append(f"stopped reading: {self._error}")
        self.status_html.value = (
            f'<span class="cb-log-status" style="color:{MUTED_COLOUR};font-size:11px">'
            + html.escape(" · ".join(parts))
            + "</span>"
        )
