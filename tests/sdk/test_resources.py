"""The head's resource history, with an injected clock: bounded by its span and its interval
whatever the cluster's age, one sample per report interval, silent nodes let go of, answers
of a window and downsampled to a bounded size, and its table form."""

from __future__ import annotations

import json

import pandas as pd
import pytest

import clusterbook as cb
from clusterbook.resources import (
    RESOURCE_DTYPES,
    ResourceHistory,
    Sample,
    downsample,
    empty_answer,
    resources_frame,
)
from clusterbook.sample_ring import Ring


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def report(history: ResourceHistory, node: str, t: float, cpu: float = 50.0) -> None:
    history.add(node, t, cpu=cpu, memory_used_gib=2.0, memory_gib=8.0, gpu=None)


def test_the_history_is_bounded_by_its_span_whatever_the_clusters_age() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, span=60.0, clock=clock)
    start = clock.now
    for i in range(10 * 60):  # ten times the span, a report a second
        clock.now = start + i
        report(history, "n0", clock.now, cpu=float(i % 100))
    series = history.answer()["nodes"]["n0"]
    assert len(series["t"]) <= 61  # the span's worth, the ends included
    assert series["t"][-1] == clock.now
    assert series["t"][0] >= clock.now - 60
    assert series["cpu"][-1] == float((10 * 60 - 1) % 100)


def test_reports_closer_than_the_interval_keep_one_sample_the_newest() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, clock=clock)
    report(history, "n0", clock.now, cpu=10.0)
    report(history, "n0", clock.now + 0.2, cpu=20.0)  # a join, then a heartbeat at once
    report(history, "n0", clock.now + 0.2, cpu=30.0)  # the same report seen again
    report(history, "n0", clock.now + 1.0, cpu=40.0)
    clock.now += 1.0
    series = history.answer()["nodes"]["n0"]
    assert series["t"] == [clock.now - 0.8, clock.now]
    assert series["cpu"] == [20.0, 40.0]


def test_a_node_that_stopped_reporting_is_let_go_of_after_the_span() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, span=60.0, clock=clock)
    report(history, "gone", clock.now)
    for _ in range(60):
        clock.now += 1.0
        report(history, "stays", clock.now)
    assert history.nodes() == ["gone", "stays"]  # within the span
    for _ in range(30):  # the span and a sweep's period (30 s) later
        clock.now += 1.0
        report(history, "stays", clock.now)
    assert history.nodes() == ["stays"]  # swept while the others report, unasked
    assert list(history.answer()["nodes"]) == ["stays"]


def test_a_window_answers_its_last_seconds_and_the_version_counts_changes() -> None:
    clock = Clock()
    history = ResourceHistory(2.0, clock=clock)
    assert history.answer() == {"interval": 2.0, **empty_answer(2.0)}
    for i in range(10):
        report(history, "n0", clock.now + 2 * i)
    version = history.version
    clock.now += 18
    assert history.version == version  # reading changes nothing
    series = history.answer(window=5)["nodes"]["n0"]
    assert series["t"] == [clock.now - 4, clock.now - 2, clock.now]
    assert history.answer(window="4s")["nodes"]["n0"]["t"] == series["t"]
    assert series["memory_used_gib"] == [2.0] * 3
    assert series["memory_gib"] == 8.0
    assert series["gpu"] == [None] * 3
    report(history, "n0", clock.now + 2)
    assert history.version == version + 1


@pytest.mark.parametrize("bad", [0, -1, "soon", True])
def test_a_bad_window_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(cb.ConfigError, match="window"):
        ResourceHistory(1.0).answer(bad)


def test_an_answer_of_many_nodes_is_downsampled_to_a_bounded_size() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, span=600.0, clock=clock, budget=3000)
    start = clock.now
    for i in range(600):
        clock.now = start + i
        for n in range(20):
            report(history, f"n{n}", clock.now, cpu=float(i))
    answer = history.answer()
    assert answer["interval"] == 4.0  # 600 a node, 150 a node at most: runs of 4
    lengths = {len(s["t"]) for s in answer["nodes"].values()}
    assert lengths == {150}
    series = answer["nodes"]["n0"]
    assert series["t"][-1] == clock.now  # the newest report ends the last run
    assert series["cpu"][-1] == (596 + 597 + 598 + 599) / 4
    assert len(json.dumps(answer)) < 20 * 150 * 60  # what the bound is for


def test_downsampling_averages_runs_that_end_at_the_newest_sample() -> None:
    samples = [Sample(float(t), float(t), None if t % 2 else 1.0, None) for t in range(7)]
    kept = downsample(samples, 3)
    assert [s.t for s in kept] == [0.0, 3.0, 6.0]
    assert [s.cpu for s in kept] == [0.0, 2.0, 5.0]
    assert [s.memory_used_gib for s in kept] == [1.0, 1.0, 1.0]  # the known ones only
    assert [s.gpu for s in kept] == [None, None, None]
    assert downsample(samples, 1) == samples


def test_the_frame_has_a_row_per_node_and_sample_with_fixed_dtypes() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, clock=clock)
    report(history, "n0", clock.now - 1, cpu=10.0)
    report(history, "n0", clock.now, cpu=20.0)
    history.add("n1", clock.now, cpu=None, memory_used_gib=None, memory_gib=None, gpu=75.0)
    frame = resources_frame(history.answer())
    assert list(frame.columns) == list(RESOURCE_DTYPES)
    assert {c: str(t) for c, t in frame.dtypes.items()} == RESOURCE_DTYPES
    assert frame["node"].tolist() == ["n0", "n0", "n1"]
    assert frame["cpu_percent"].tolist()[:2] == [10.0, 20.0]
    assert frame["cpu_percent"].isna().tolist() == [False, False, True]
    assert frame["gpu_percent"].tolist()[2] == 75.0
    assert frame["time"].iloc[1] == pd.Timestamp(clock.now, unit="s", tz="UTC")
    empty = resources_frame({"interval": 1.0, "nodes": {}})
    assert {c: str(t) for c, t in empty.dtypes.items()} == RESOURCE_DTYPES


def test_the_clusters_sum_is_of_the_nodes_heard_from_lately() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, clock=clock)
    for i in range(7):
        clock.now += 1
        history.add("a", clock.now, cpu=20.0, memory_used_gib=2.0, memory_gib=8.0, gpu=None)
        if i < 2:  # b reports twice, then falls silent
            history.add("b", clock.now, cpu=60.0, memory_used_gib=6.0, memory_gib=16.0, gpu=90.0)
    cluster = history.answer()["cluster"]
    # Each interval's first report takes the sum of what was known then: b's first report
    # comes after a's, so it counts from the second interval on, until 3 intervals of silence.
    assert cluster["cpu"] == [20.0, 40.0, 40.0, 40.0, 40.0, 20.0, 20.0]
    assert cluster["memory_used_gib"] == [2.0, 8.0, 8.0, 8.0, 8.0, 2.0, 2.0]
    assert cluster["gpu"] == [None, 90.0, 90.0, 90.0, 90.0, None, None]
    assert cluster["memory_gib"] == 8.0  # b no longer counts
    assert cluster["t"] == sorted(cluster["t"])


def test_an_answer_names_the_nodes_asked_for_and_as_many_points_as_asked() -> None:
    clock = Clock()
    history = ResourceHistory(1.0, clock=clock)
    for i in range(100):
        clock.now += 1
        for node in ("a", "b", "c"):
            report(history, node, clock.now, cpu=float(i))
    answer = history.answer(nodes=["c", "a", "unknown"], points=10)
    assert list(answer["nodes"]) == ["c", "a"]
    assert answer["interval"] == 10.0
    assert [len(s["t"]) for s in answer["nodes"].values()] == [10, 10]
    assert len(answer["cluster"]["t"]) == 10
    assert answer["nodes"]["a"]["cpu"][-1] == sum(range(90, 100)) / 10
    with pytest.raises(cb.ConfigError, match="points must be a positive whole number"):
        history.answer(points=0)


def test_a_ring_keeps_at_most_twice_its_bound_and_answers_its_bound() -> None:
    ring = Ring(10)
    for t in range(100):
        ring.append(Sample(float(t), float(t), None, 1.0))
        assert len(ring) < 20  # the oldest go in bulk, a move per 10 samples
    assert [s.t for s in ring.since(0.0)] == [float(t) for t in range(90, 100)]
    assert ring.last() == Sample(99.0, 99.0, None, 1.0)  # None kept as not known
    ring.append(Sample(99.5, 5.0, 2.0, None), replace=True)
    assert ring.last() == Sample(99.5, 5.0, 2.0, None)
    ring.drop_before(99.0)
    assert [s.t for s in ring.since(0.0)] == [99.5]
