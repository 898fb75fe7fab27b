"""ClusterWidget, headless (no kernel, no browser): a fake cluster and clock injected, its
HTML read; and what a notebook is given to display for a real cluster."""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Callable
from dataclasses import replace

import pytest

import clusterbook as cb
from clusterbook.errors import ClusterError
from clusterbook.status import ClusterSnapshot, JobStatus, NodeStatus
from clusterbook_widgets.cluster_widget import ClusterWidget, display_cluster
from tests.widgets.fakes import ManualScheduler


class FakeJob:
    def __init__(self, job_id: str, done: bool = False) -> None:
        self.id = job_id
        self.ended = done
        self.cancels = 0

    def done(self) -> bool:
        return self.ended

    def cancel(self) -> bool:
        self.cancels += 1
        self.ended = True
        return True


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


@pytest.mark.parametrize("refresh", [2, datetime.timedelta(seconds=2), "2s", "2000ms"])
def test_the_refresh_is_a_duration_in_any_form(refresh: object) -> None:
    widget, cluster, clock = make_widget(refresh=refresh)
    calls = cluster.snapshot_calls
    clock.advance(1.9)
    assert cluster.snapshot_calls == calls  # not yet
    clock.advance(0.1)
    assert cluster.snapshot_calls == calls + 1
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


def test_a_displayed_cluster_carries_the_live_widget_a_static_view_and_its_repr(tmp_path):
    cluster = cb.Cluster.local(2, 1, run_dir=tmp_path / "run")
    bundle = cluster._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle  # live where widgets run
    assert bundle["text/plain"] == repr(cluster)  # a terminal, and the saved fallback
    assert "cb-header" in bundle["text/html"]  # GitHub, nbviewer: the state when saved
    assert "local-1" in bundle["text/html"]
