"""A live view of a cluster: header, progress, nodes, their use, jobs, and buttons to stop
things.

The widget is a view over :class:`~clusterbook.status.ClusterSnapshot` values: it subscribes to
the cluster, pushes every snapshot through a :class:`~clusterbook_widgets.throttle.Throttle`
(at most ten updates a second), renders each with the pure functions of
:mod:`clusterbook.views.html` and only assigns the HTML widgets' values; a part whose rows did
not change is not rendered again. Long tables show a page of rows under a
:class:`~clusterbook_widgets.paging.Pager`; the nodes' use is plotted for the nodes of the page
(:mod:`clusterbook_widgets.usage`). Heartbeat ages and uptime change without an event, so it
also polls ``cluster.snapshot()`` every ``refresh`` seconds until the cluster has stopped.
"""

from __future__ import annotations

import contextlib
import html
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import ipywidgets as widgets

from clusterbook.durations import Duration, duration, optional_duration
from clusterbook.status import ClusterSnapshot
from clusterbook.views.html import (
    PAGE,
    page_of,
    render_header,
    render_jobs,
    render_nodes,
    render_progress,
)
from clusterbook_widgets.paging import Pager
from clusterbook_widgets.throttle import Scheduler, ThreadScheduler, Throttle
from clusterbook_widgets.usage import UsagePlots

__all__ = ["ClusterWidget", "display_cluster"]

_log = logging.getLogger("clusterbook")


class _Job(Protocol):
    @property
    def id(self) -> str: ...

    def done(self) -> bool: ...

    def cancel(self) -> Any: ...


class _Cluster(Protocol):
    """What the widget needs of a cluster (:class:`clusterbook.Cluster` has it all)."""

    @property
    def jobs(self) -> Sequence[_Job]: ...

    def snapshot(self) -> ClusterSnapshot: ...

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]: ...

    def stop(self) -> None: ...


class ClusterWidget(widgets.VBox):
    """A live view of ``cluster``.

    Parameters
    ----------
    cluster
        A :class:`clusterbook.Cluster` (or anything with ``snapshot()``, ``subscribe()``,
        ``jobs`` and ``stop()``; and ``resource_history()`` for the plots).
    interval
        Minimum seconds between two redraws (0.1: at most ten a second).
    refresh
        Seconds between polls of ``cluster.snapshot()`` (None: redraw on events only).
    min_nodes, max_nodes
        Bounds of an elastic cluster, shown in the progress bar (default: those its
        snapshots carry).
    scheduler
        Clock and timers for the throttle and the polls (default: real threads).
    page_size
        Rows of the nodes and jobs tables a page.
    plot_window, plot_interval
        Seconds of the nodes' use the plots show, and the least seconds between two
        redraws of them (a cluster without ``resource_history()`` shows none).
    """

    def __init__(
        self,
        cluster: _Cluster,
        *,
        interval: Duration = 0.1,
        refresh: Duration | None = 1.0,
        min_nodes: int | None = None,
        max_nodes: int | None = None,
        scheduler: Scheduler | None = None,
        page_size: int = PAGE,
        plot_window: Duration = 60.0,
        plot_interval: Duration = 0.5,
    ) -> None:
        refresh = optional_duration(refresh, "refresh")  # seconds from here on
        self._scheduler: Scheduler = scheduler or ThreadScheduler()
        self.nodes_pager = Pager(page_size, lambda: self._repaint())
        self.jobs_pager = Pager(page_size, lambda: self._repaint())
        self.usage = UsagePlots(
            getattr(cluster, "resource_history", None),
            window=duration(plot_window, "plot_window"),
            points=120,  # a point a report at 1 s: nothing averaged
            interval=duration(plot_interval, "plot_interval", zero=True),
            scheduler=self._scheduler,
        )
        self._drawn: dict[str, object] = {}  # what each part shows: unchanged, not rendered
        self.renders: Counter[str] = Counter()  # how often each part was rendered
        self.header_html = widgets.HTML()
        self.progress_html = widgets.HTML()
        self.nodes_html = widgets.HTML()
        self.jobs_html = widgets.HTML()
        self.message_html = widgets.HTML()
        self.stop_job_button = widgets.Button(
            description="Stop job", icon="stop", tooltip="Cancel the newest running job"
        )
        self.stop_cluster_button = widgets.Button(
            description="Stop cluster",
            icon="power-off",
            button_style="danger",
            tooltip="Stop every job and release the nodes",
        )
        self.stop_job_button.on_click(lambda _: self._act(self.stop_job))
        self.stop_cluster_button.on_click(lambda _: self._act(self.stop_cluster))
        buttons = widgets.HBox([self.stop_job_button, self.stop_cluster_button, self.message_html])
        super().__init__(
            [
                self.header_html,
                self.progress_html,
                self.nodes_pager,
                self.nodes_html,
                self.usage.html,
                self.jobs_pager,
                self.jobs_html,
                buttons,
            ]
        )
        self._parts: tuple[widgets.Widget, ...] = (*self.children, *buttons.children)
        self._cluster = cluster
        self._min_nodes, self._max_nodes = min_nodes, max_nodes
        self._refresh = refresh
        self._closed = False
        self._cancel_poll: Callable[[], None] | None = None
        self.snapshot: ClusterSnapshot | None = None
        self._throttle: Throttle[ClusterSnapshot] = Throttle(
            interval, self._show, scheduler=self._scheduler
        )
        self._unsubscribe: Callable[[], None] | None = cluster.subscribe(self._on_change)
        self._throttle.push(cluster.snapshot())
        self._throttle.flush()
        if self.snapshot is not None:
            self.usage.changed(self._page_names(self.snapshot), now=True)
        self._schedule_poll()

    # -- actions --------------------------------------------------------------------------

    def stop_job(self) -> str | None:
        """Cancel the newest running job (waits until it has ended); return its id, or None
        when no job is running."""
        for job in reversed(self._cluster.jobs):
            if not job.done():
                self._say(f"Stopping {job.id}…")
                job.cancel()
                self._say(f"Stopped {job.id}.")
                self._push_now()
                return job.id
        self._say("No job is running.")
        return None

    def stop_cluster(self) -> None:
        """Stop the cluster (its jobs first)."""
        self._say("Stopping the cluster…")
        self._cluster.stop()
        self._say("Cluster stopped.")
        self._push_now()

    def close(self) -> None:
        """Unsubscribe from the cluster, stop polling and close the widget and its parts."""
        if getattr(self, "_closed", True):
            # Not constructed, or closed already; ipywidgets also calls close() from __del__.
            with contextlib.suppress(Exception):
                super().close()
            return
        self._closed = True
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            with contextlib.suppress(Exception):
                unsubscribe()
        cancel, self._cancel_poll = self._cancel_poll, None
        if cancel is not None:
            cancel()
        self._throttle.close()
        self.usage.close()
        for part in self._parts:
            part.close()
        super().close()

    # -- internals ------------------------------------------------------------------------

    def _on_change(self, snapshot: ClusterSnapshot) -> None:
        """A new snapshot: shown within the throttle's interval; a change of the cluster's own
        state (started, stopping, stopped) at once, on the thread that made it, so that the
        widget shows it before that call returns (they are few)."""
        shown = self.snapshot
        self._throttle.push(snapshot)
        if shown is None or shown.state != snapshot.state:
            self._throttle.flush()
        self.usage.changed(self._page_names(snapshot))

    def _page_names(self, snapshot: ClusterSnapshot) -> list[str]:
        """The nodes of the page of the nodes table (as the pager stands now)."""
        pager = self.nodes_pager
        start, end, _ = page_of(len(snapshot.nodes), pager.page, pager.per_page)
        return [n.name for n in snapshot.nodes[start:end]]

    def _repaint(self) -> None:
        """A page turned: the tables and the plots of the new page, at once."""
        if self.snapshot is not None and not self._closed:
            self._show(self.snapshot)
            self.usage.changed(self._page_names(self.snapshot), now=True)

    def _show(self, snapshot: ClusterSnapshot) -> None:
        if self._closed:
            return
        self.snapshot = snapshot
        self.header_html.value = render_header(snapshot)
        low = self._min_nodes if self._min_nodes is not None else snapshot.min_nodes
        high = self._max_nodes if self._max_nodes is not None else snapshot.max_nodes
        if self._drawn.get("progress") != (snapshot.nodes, low, high):
            self.renders["progress"] += 1
            self._drawn["progress"] = (snapshot.nodes, low, high)
            self.progress_html.value = render_progress(snapshot, low, high)
        start, _ = self.nodes_pager.rows(len(snapshot.nodes))
        if self._drawn.get("nodes") != (snapshot.nodes, start):
            self.renders["nodes"] += 1
            self._drawn["nodes"] = (snapshot.nodes, start)
            self.nodes_html.value = render_nodes(
                snapshot, self.nodes_pager.page, self.nodes_pager.per_page
            )
        start, _ = self.jobs_pager.rows(len(snapshot.jobs))
        if self._drawn.get("jobs") != (snapshot.jobs, start):
            self.renders["jobs"] += 1
            self._drawn["jobs"] = (snapshot.jobs, start)
            self.jobs_html.value = render_jobs(
                snapshot, self.jobs_pager.page, self.jobs_pager.per_page
            )
        live = snapshot.state not in ("stopping", "stopped")
        self.stop_job_button.disabled = not (
            live and any(j.state == "running" for j in snapshot.jobs)
        )
        self.stop_cluster_button.disabled = not live

    def _say(self, text: str) -> None:
        self.message_html.value = f'<span class="cb-message">{html.escape(text)}</span>'

    def _act(self, action: Callable[[], object]) -> None:
        # A button's error goes to the widget; raising here would only reach the kernel log.
        try:
            action()
        except Exception as exc:
            _log.exception("clusterbook widget action failed")
            self._say(f"Failed: {exc}")

    def _push_now(self) -> None:
        if not self._closed:
            self._throttle.push(self._cluster.snapshot())

    def _schedule_poll(self) -> None:
        if self._refresh is not None and not self._closed:
            self._cancel_poll = self._scheduler.call_later(self._refresh, self._poll)

    def _poll(self) -> None:
        if self._closed:
            return
        try:
            snapshot = self._cluster.snapshot()
        except Exception:
            _log.exception("clusterbook widget could not take a snapshot")
            snapshot = None
        if snapshot is not None:
            self._throttle.push(snapshot)
            if snapshot.state == "stopped":
                return  # nothing changes any more; events still arrive if it ever does
        self._schedule_poll()


def display_cluster(cluster: _Cluster, **options: Any) -> ClusterWidget:
    """A :class:`ClusterWidget` of ``cluster`` (what displaying a cluster in a notebook shows;
    ``Cluster._repr_mimebundle_`` can return ``display_cluster(self)._repr_mimebundle_(...)``).
    ``options`` are those of :class:`ClusterWidget`."""
    return ClusterWidget(cluster, **options)
