"""A cluster's resource history, asked of the cluster and of a handle attached through its
directory (the head's real control server), on the shipped FakeProvider, whose nodes report
what the test says: the same answer both ways, as a frame too, and none once it stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.resources import RESOURCE_DTYPES
from clusterbook.testing import FakeProvider
from tests.sdk.cluster.test_facade import STAND_IN

NOW = 1_800_000_000.0


class Clock:
    """The wall clock of the nodes' reports: it stands until a test moves it."""

    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[tuple[cb.Cluster, FakeProvider, Clock]]:
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    options = ClusterOptions.make("fake", launcher=str(launcher), run_dir=tmp_path / "run")
    clock = Clock()
    provider = FakeProvider(nodes=2, report_interval=2.0, clock=clock)
    running = cb.Cluster(provider, options).start()
    yield running, provider, clock
    running.stop()


def test_the_cluster_and_an_attached_handle_answer_the_same_history(
    fake: tuple[cb.Cluster, FakeProvider, Clock],
) -> None:
    cluster, provider, clock = fake
    assert cluster.resource_history()["nodes"] == {}
    for cpu in (10.0, 30.0, 50.0):
        provider.report_usage(
            {
                "fake-0": {"cpu": cpu, "memory_used_gib": 1.5, "memory_gib": 16.0, "gpu": 80.0},
                "fake-1": {"cpu": cpu / 2, "memory_used_gib": 3.0, "memory_gib": 16.0},
            }
        )
        clock.now += 2
    clock.now -= 2  # the last report is now
    answer = cluster.resource_history()
    # The sum, once an interval: at its first report, of the latest report of each node.
    assert answer["cluster"]["cpu"] == [10.0, (30 + 5) / 2, (50 + 15) / 2]
    assert answer["cluster"]["memory_used_gib"] == [1.5, 4.5, 4.5]
    assert answer["cluster"]["memory_gib"] == 32.0
    assert {k: v for k, v in answer.items() if k != "cluster"} == {
        "interval": 2.0,
        "nodes": {
            "fake-0": {
                "t": [NOW, NOW + 2, NOW + 4],
                "cpu": [10.0, 30.0, 50.0],
                "memory_used_gib": [1.5] * 3,
                "memory_gib": 16.0,
                "gpu": [80.0] * 3,
            },
            "fake-1": {
                "t": [NOW, NOW + 2, NOW + 4],
                "cpu": [5.0, 15.0, 25.0],
                "memory_used_gib": [3.0] * 3,
                "memory_gib": 16.0,
                "gpu": [None] * 3,
            },
        },
    }
    with cb.Cluster.attach(cluster.run_dir) as handle:
        assert handle.resource_history() == answer
        only = handle.resource_history(nodes=["fake-1"], points=2)
        assert list(only["nodes"]) == ["fake-1"]
        assert only["nodes"]["fake-1"]["cpu"] == [5.0, 20.0]
        assert handle.resource_history(window="3s") == cluster.resource_history(3)
        assert len(handle.resource_history(window=3)["nodes"]["fake-0"]["t"]) == 2
        frame = handle.resources()
        pd.testing.assert_frame_equal(frame, cluster.resources())
        assert {c: str(t) for c, t in frame.dtypes.items()} == RESOURCE_DTYPES
        assert frame.groupby("node")["cpu_percent"].mean().to_dict() == {
            "fake-0": 30.0,
            "fake-1": 15.0,
        }
        for asking in (cluster, handle):
            with pytest.raises(cb.ConfigError, match="window"):
                asking.resource_history(window="soon")
        cluster.stop()
        assert handle.resource_history()["nodes"] == {}  # gone with its head
