"""The frames clusterbook returns say their units: every duration is ``timedelta64[ns]``
(``NaT`` where there is none), and a memory column names its unit in its name."""

from __future__ import annotations

import os
import re
import socket
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from clusterbook.head import catalog
from clusterbook.head.record import ClusterRecord, write_record
from clusterbook.launch.logs import DTYPES
from clusterbook.launch.result import TIMELINE_DTYPES
from clusterbook.nodes.commands import COMMAND_DTYPES, NodeRun, runs_frame
from clusterbook.status import NODE_DTYPES, ClusterSnapshot, NodeStatus, nodes_frame

#: Every frame's dtypes, by what returns it.
FRAMES = {
    "Cluster.status()": NODE_DTYPES,
    "Cluster.run_on_nodes()": COMMAND_DTYPES,
    "cb.clusters()": catalog.CLUSTER_DTYPES,
    "job.logs()": DTYPES,
    "result.timeline()": TIMELINE_DTYPES,
}
#: A column that holds how long something takes or is: its name says so.
DURATION = re.compile(r"duration|_age$|time_left|elapsed|uptime|timeout|wait")
#: What a quantity of bytes is named with: its unit.
MEMORY = re.compile(r"memory|bytes|_gib$|_mib$")
UNITS = re.compile(r"_(bytes|kib|mib|gib)$")


@pytest.mark.parametrize("frame", sorted(FRAMES))
def test_every_duration_column_is_a_timedelta(frame: str) -> None:
    durations = {c: t for c, t in FRAMES[frame].items() if DURATION.search(c)}
    assert all(t == "timedelta64[ns]" for t in durations.values()), durations
    timedeltas = {c for c, t in FRAMES[frame].items() if t.startswith("timedelta")}
    assert timedeltas == set(durations)  # and what is one is named as one


@pytest.mark.parametrize("frame", sorted(FRAMES))
def test_every_memory_column_names_its_unit(frame: str) -> None:
    memory = [c for c in FRAMES[frame] if MEMORY.search(c)]
    assert all(UNITS.search(c) for c in memory), memory


def test_status_has_the_heartbeat_age_and_time_left_as_timedeltas_and_memory_in_gib() -> None:
    snapshot = ClusterSnapshot(
        "c", "local", "running",
        nodes=(
            NodeStatus("a", "h", 2, "joined", heartbeat_age=0.25, memory=24 * 2**30,
                       memory_used=25.0),
            NodeStatus("b", "h", 2, "lost"),
        ),
        jobs=(), launcher=None, run_dir="/tmp", uptime=1.0, time_left=(90.4, "life_span"),
    )  # fmt: skip
    frame = nodes_frame(snapshot)
    assert frame["heartbeat_age"].tolist()[0] == pd.Timedelta(milliseconds=250)
    assert frame["heartbeat_age"].isna().tolist() == [False, True]
    assert frame["time_left"].tolist() == [pd.Timedelta(seconds=90)] * 2
    assert frame["memory_gib"].tolist()[0] == 24.0
    assert frame["memory_used_gib"].tolist()[0] == 6.0  # 25% of 24 GiB
    assert frame["memory_gib"].isna().tolist() == [False, True]
    assert not {"memory", "memory_used"} & set(frame.columns)


def test_a_command_on_the_nodes_says_how_long_it_took_as_a_timedelta() -> None:
    frame = runs_frame([NodeRun("a", "h", 0, "", "", 1.5), NodeRun("b", "h", None, "", "x", 0.0)])
    assert frame["duration"].tolist() == [pd.Timedelta(seconds=1.5), pd.Timedelta(0)]


def test_durations_are_to_the_microsecond_float_seconds_carry() -> None:
    # A clock's difference in float seconds: its digits past the microsecond are noise.
    took = runs_frame([NodeRun("a", "h", 0, "", "", 0.0069239141)])["duration"][0]
    assert took == pd.Timedelta(microseconds=6924)
    node = NodeStatus("a", "h", 1, "joined", heartbeat_age=0.0069239141)
    snapshot = ClusterSnapshot("c", "local", "running", (node,), (), None, "/tmp", 1.0)
    assert nodes_frame(snapshot)["heartbeat_age"][0] == pd.Timedelta(microseconds=6924)


def test_the_clusters_list_has_the_time_left_as_a_timedelta_and_what_stops_it(
    tmp_path: Path,
) -> None:
    for name, created, changes in (
        ("bounded-1", 100.0, {"life_span": 3600.0}),
        ("idle-2", 200.0, {"idle_timeout": 600.0, "idle_since": 1000.0}),
        ("free-3", 300.0, {}),
    ):
        directory = tmp_path / name
        directory.mkdir()
        record = ClusterRecord(
            id=name, name=name, kind="local", state="running", directory=str(directory),
            created=created, started=created, head_pid=os.getpid(),
            head_host=socket.gethostname(), nodes=(),
        )  # fmt: skip
        write_record(replace(record, **changes))  # type: ignore[arg-type]
    frame = catalog.clusters_frame(tmp_path, now=1100.0).set_index("id")
    assert frame.loc["bounded-1", "time_left"] == pd.Timedelta(seconds=100 + 3600 - 1100)
    assert frame.loc["bounded-1", "stops_by"] == "life_span"
    assert frame.loc["idle-2", "time_left"] == pd.Timedelta(seconds=1000 + 600 - 1100)
    assert frame.loc["idle-2", "stops_by"] == "idle_timeout"
    assert pd.isna(frame.loc["free-3", "time_left"])
    assert pd.isna(frame.loc["free-3", "stops_by"])
