"""Unit tests of a cluster's life outside its kernel: durations, the stop decision, the keeper,
the record, and the catalog of clusters (listing, finding, pruning)."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.durations import optional_duration
from clusterbook.head import catalog
from clusterbook.head.keeper import Keeper
from clusterbook.head.record import (
    ClusterRecord,
    JobEntry,
    head_ended,
    is_stale,
    read_record,
    write_atomic,
    write_record,
)
from clusterbook.lifetime import Lifetime, decide, format_duration
from clusterbook.status import NodeStatus

# -- durations -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(90, 90.0), (1.5, 1.5), ("90", 90.0), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0),
     ("1h30m", 5400.0), ("7d", 604800.0), (" 2H ", 7200.0), ("1w", 604800.0), (None, None)],
)  # fmt: skip
def test_durations_are_seconds_or_text(given: object, seconds: float | None) -> None:
    assert optional_duration(given, "life_span") == seconds


@pytest.mark.parametrize("bad", ["", "soon", "2x", "-5", 0, -1, "h", True, float("inf"), "1h 2"])
def test_a_bad_duration_names_the_option_and_the_forms(bad: object) -> None:
    with pytest.raises(
        cb.ConfigError, match=r"life_span must be a duration > 0, got .*; give seconds"
    ):
        optional_duration(bad, "life_span")


def test_durations_read_as_a_person_says_them() -> None:
    assert [format_duration(s) for s in (0.4, 45, 125, 3600, 3900, 90000)] == [
        "0s", "45s", "2m05s", "1h00m", "1h05m", "1d01h",
    ]  # fmt: skip


def test_cluster_options_take_durations_and_refuse_bad_ones() -> None:
    c = cb.Cluster.local(workers=1, life_span="2h", idle_timeout="30m", retention="7d")
    assert (c._options.life_span, c._options.idle_timeout, c._options.retention) == (
        7200.0, 1800.0, 604800.0,
    )  # fmt: skip
    with pytest.raises(cb.ConfigError, match="idle_timeout must be a duration > 0, got 'later'"):
        cb.Cluster.local(workers=1, idle_timeout="later")


# -- the decision --------------------------------------------------------------------------


def test_stop_file_stops_at_once_whatever_the_bounds() -> None:
    d = decide(Lifetime(), now=5, started=0, idle_since=None, stop_file=True, warned=False)
    assert d.stop == "its stop file appeared"


def test_life_span_warns_a_minute_before_once_then_stops() -> None:
    life = Lifetime(life_span=600)
    kw = {"started": 0.0, "idle_since": None, "stop_file": False}
    assert decide(life, now=500, warned=False, **kw).warn is None
    assert decide(life, now=545, warned=False, **kw).warn == "stops in 55s (life_span)"
    assert decide(life, now=546, warned=True, **kw).warn is None
    assert decide(life, now=599, warned=True, **kw).stop is None
    assert decide(life, now=600, warned=True, **kw).stop == "after 10m (life_span)"


def test_idle_timeout_counts_only_while_no_job_runs() -> None:
    life = Lifetime(idle_timeout=60)
    busy = decide(life, now=1000, started=0, idle_since=None, stop_file=False, warned=False)
    assert busy.stop is None
    assert busy.warn is None
    idle = decide(life, now=1000, started=0, idle_since=930, stop_file=False, warned=False)
    assert idle.stop == "idle for 1m (idle_timeout)"
    assert Lifetime(life_span=100, idle_timeout=60).deadline(0, 50) == (100, "life_span")
    assert Lifetime(life_span=100, idle_timeout=60).deadline(0, 10) == (70, "idle_timeout")


# -- the keeper ----------------------------------------------------------------------------


def _record(tmp_path: Path, **changes: object) -> ClusterRecord:
    base = ClusterRecord(
        id="c-1", name="c", kind="local", state="running", directory=str(tmp_path),
        created=100.0, started=100.0, head_pid=os.getpid(), head_host=socket.gethostname(),
        nodes=(NodeStatus("n0", "localhost", 2, "ready"),),
    )  # fmt: skip
    return replace(base, **changes)  # type: ignore[arg-type]


def test_a_record_is_written_as_its_fields_and_read_back_whole(tmp_path) -> None:
    job = JobEntry(
        "job-0001",
        "failed",
        str(tmp_path / "jobs" / "job-0001"),
        2,
        ("python", "x.py"),
        failed_ranks=(1,),
    )
    record = _record(
        tmp_path, jobs=(job,), extra={"facts": {"n0": {"gpus": [], "load": [0.5, None]}}}
    )
    assert json.loads(record.to_json()) == json.loads(json.dumps(asdict(record)))
    write_record(record)
    assert read_record(tmp_path) == record
    with pytest.raises(TypeError, match="not a record's value"):
        replace(record, extra={"when": object()}).to_json()


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_keeper_writes_on_change_warns_and_stops_once(tmp_path, caplog) -> None:
    clock, stops, busy = Clock(100.0), [], [False]
    writes: list[int] = []

    def write() -> None:
        writes.append(1)
        write_record(_record(tmp_path))

    keeper = Keeper(
        tmp_path, Lifetime(life_span=120), write=write, stop=stops.append,
        jobs=lambda: (int(busy[0]), 0), started=100.0, clock=clock,
    )  # fmt: skip
    keeper.write()
    assert read_record(tmp_path).id == "c-1"
    assert len(writes) == 1
    keeper.tick()
    assert len(writes) == 1  # nothing changed: nothing written
    keeper.changed()
    keeper.tick()
    assert len(writes) == 2
    assert keeper.time_left() == (120.0, "life_span")
    clock.now = 170.0
    with caplog.at_level(logging.WARNING, "clusterbook.cluster.facade"):
        keeper.tick()
        keeper.tick()
    assert [r.getMessage() for r in caplog.records] == ["The cluster stops in 50s (life_span)"]
    clock.now = 220.0
    keeper.tick()
    keeper.tick()
    deadline = time.monotonic() + 5
    while not stops and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    assert stops == ["after 2m (life_span)"]


def test_keeper_idle_clock_restarts_when_a_job_ends(tmp_path) -> None:
    clock, busy = Clock(0.0), [False]
    keeper = Keeper(
        tmp_path, Lifetime(idle_timeout=30), write=lambda: write_record(_record(tmp_path)),
        stop=lambda why: None, jobs=lambda: (int(busy[0]), 0), started=0.0, clock=clock,
    )  # fmt: skip
    assert keeper.time_left() == (30.0, "idle_timeout")
    busy[0] = True
    clock.now = 10.0
    keeper.tick()
    assert keeper.idle_since is None
    assert keeper.time_left() is None
    busy[0] = False
    clock.now = 50.0
    keeper.tick()
    assert keeper.idle_since == 50.0
    assert keeper.time_left() == (30.0, "idle_timeout")


def test_keeper_looks_often_enough_to_stop_within_a_second() -> None:
    import inspect

    interval = inspect.signature(Keeper).parameters["interval"].default
    assert 0 < interval <= 0.5  # a stop file is seen within a second, with room to act


def test_keeper_acts_on_the_stop_file(tmp_path) -> None:
    stops: list[str] = []
    keeper = Keeper(
        tmp_path, Lifetime(), write=lambda: write_record(_record(tmp_path)), stop=stops.append,
        jobs=lambda: (0, 0), started=0.0, clock=Clock(1.0),
    )  # fmt: skip
    keeper.tick()
    (tmp_path / "stop").touch()
    keeper.tick()
    time.sleep(0.1)
    assert stops == ["its stop file appeared"]


# -- the record ----------------------------------------------------------------------------


def test_record_round_trips_and_holds_no_token(tmp_path) -> None:
    tag = "c-abc"  # the tag of the job's processes, not a secret
    directory = str(tmp_path / "jobs" / "job-0001")
    job = JobEntry("job-0001", "succeeded", directory, 2, ("python", "x.py"),
                   started=1.0, ended=2.0, returncode=0, token=tag)  # fmt: skip
    record = _record(tmp_path, jobs=(job,), life_span=60.0)
    write_record(record)
    assert read_record(tmp_path) == record
    data = json.loads((tmp_path / "cluster.json").read_text())
    assert data["jobs"][0]["argv"] == ["python", "x.py"]
    assert data["life_span"] == 60.0
    assert not list(tmp_path.glob(".cluster.json.*"))  # no temporary file left


@pytest.mark.parametrize(
    "text", ['{"id": "x", "na', "[1, 2]", '{"id": "x"}', "", '{"id": 3, "name": "n"}']
)
def test_a_damaged_record_is_refused_with_its_path(tmp_path, text: str) -> None:
    (tmp_path / "cluster.json").write_text(text)
    with pytest.raises(cb.RecordError, match="not a cluster record") as info:
        read_record(tmp_path)
    assert info.value.path == str(tmp_path / "cluster.json")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"name": "../../victim"}, r"its name '\.\./\.\./victim' is not a cluster's name: 1-63"),
        ({"id": ".."}, r"its id '\.\.' is not a cluster id: 1-127 letters"),
        ({"id": "a/b"}, "its id 'a/b' is not a cluster id"),
        ({"state": "sleeping"}, "its state 'sleeping' is none of created, starting, running"),
        ({"head_pid": "12"}, "its head_pid '12' is not int"),
        ({"head_pid": True}, "its head_pid True is not int"),
        ({"jobs": [{"id": "../../x", "state": "succeeded", "directory": "/", "np": 1,
                    "argv": []}]}, r"a job's id '\.\./\.\./x' is not 'job-'"),
        ({"jobs": [{"id": "job-0001", "state": "running", "directory": "/", "np": 1,
                    "argv": [], "token": "a b"}]}, "the token of job job-0001, 'a b', is not"),
    ],
)  # fmt: skip
def test_a_record_whose_values_clusterbook_never_writes_is_refused(
    tmp_path, changes: dict[str, object], message: str
) -> None:
    data = json.loads(_record(tmp_path).to_json()) | changes
    (tmp_path / "cluster.json").write_text(json.dumps(data))
    with pytest.raises(cb.RecordError, match="is not a cluster record") as info:
        read_record(tmp_path)
    assert re.search(message, str(info.value)), str(info.value)
    assert info.value.path == str(tmp_path / "cluster.json")


def test_a_record_that_says_it_is_elsewhere_is_refused(tmp_path) -> None:
    here, elsewhere = tmp_path / "here", tmp_path / "elsewhere"
    here.mkdir()
    elsewhere.mkdir()
    write_atomic(here / "cluster.json", _record(elsewhere).to_json())
    with pytest.raises(cb.RecordError, match=r"says its cluster's directory is .*elsewhere, but"):
        read_record(here)
    # Read through a link to it, a record is where it says it is.
    write_record(_record(here))
    (tmp_path / "link").symlink_to(here)
    assert read_record(tmp_path / "link").directory == str(here)


@pytest.mark.parametrize("where", ["outside", "linked-jobs", "another-id"])
def test_a_record_whose_job_is_not_in_its_jobs_directory_is_refused(tmp_path, where) -> None:
    run, victim = tmp_path / "run", tmp_path / "victim"
    run.mkdir()
    (victim / "job-0001").mkdir(parents=True)
    directory = {
        "outside": victim / "job-0001",
        "linked-jobs": run / "jobs" / "job-0001",  # jobs/ is a link to elsewhere
        "another-id": run / "jobs" / "job-0002",
    }[where]
    if where == "linked-jobs":
        (run / "jobs").symlink_to(victim)
    job = JobEntry("job-0001", "succeeded", str(directory), 1, ("x",), ended=1.0)
    write_record(_record(run, jobs=(job,)))
    with pytest.raises(cb.RecordError, match=r"says job job-0001 is in .* not in .*run/jobs/job"):
        read_record(run)


def test_a_directory_without_a_record_is_not_a_clusters(tmp_path) -> None:
    with pytest.raises(cb.RecordError, match="is not a cluster's directory: it has no"):
        read_record(tmp_path)


def test_a_record_whose_head_died_is_stale_only_on_its_own_host(tmp_path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not is_stale(_record(tmp_path))  # our own pid: alive
    assert is_stale(_record(tmp_path, head_pid=dead.pid))
    assert not is_stale(_record(tmp_path, head_pid=dead.pid, head_host="elsewhere"))
    assert not is_stale(_record(tmp_path, head_pid=dead.pid, state="stopped"))


def test_a_record_whose_head_pid_is_another_process_now_is_stale(tmp_path) -> None:
    from clusterbook.head.liveness import own_mark

    started, program = own_mark()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        head = {"head_started": started, "head_program": program}
        assert not is_stale(_record(tmp_path, **head))  # this process: the head
        assert is_stale(_record(tmp_path, head_pid=other.pid, **head))
        assert not is_stale(_record(tmp_path, head_pid=other.pid))  # no start time: unknown
    finally:
        other.kill()
        other.wait()


def test_head_ended_waits_for_the_heads_process_and_no_longer_than_asked(tmp_path) -> None:
    from clusterbook.head.liveness import process_mark

    ending = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    try:
        mark = process_mark(ending.pid)
        assert mark is not None
        head = {"head_pid": ending.pid, "head_started": mark[1], "head_program": mark[2]}
        record = _record(tmp_path, state="stopped", **head)
        assert not head_ended(record, time.monotonic() + 0.05)  # still there: False, at once
        assert head_ended(record, time.monotonic() + 30)  # it ends (a zombie: ended)
        assert ending.wait(5) == 0
    finally:
        ending.kill()
        ending.wait()
    assert head_ended(record, time.monotonic())  # reaped
    assert head_ended(_record(tmp_path, head_host="elsewhere"), time.monotonic())  # cannot tell


# -- the catalog ---------------------------------------------------------------------------


def _cluster_dir(root: Path, name: str, **changes: object) -> Path:
    path = root / name
    path.mkdir(parents=True)
    write_record(_record(path, id=name, name=name.split("-")[0], **changes))
    return path


def test_clusters_are_listed_running_first_and_a_damaged_one_does_not_break_it(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _cluster_dir(tmp_path, "old-1", state="stopped", created=1.0, stopped=5.0)
    _cluster_dir(tmp_path, "live-2", created=2.0)
    _cluster_dir(tmp_path, "gone-3", created=3.0, head_pid=dead.pid)
    (tmp_path / "junk-4").mkdir()
    (tmp_path / "junk-4" / "cluster.json").write_text("{half")
    (tmp_path / "not-a-cluster").mkdir()
    frame = catalog.clusters_frame(tmp_path)
    assert frame["id"].tolist() == ["live-2", "gone-3", "old-1", "junk-4"]
    assert frame["state"].tolist() == ["running", "stale", "stopped", "damaged"]
    assert "head is gone" in frame["problem"][1]
    assert "junk-4" in frame["problem"][3]
    assert "not a cluster record" in frame["problem"][3]
    assert {c: str(t) for c, t in frame.dtypes.items()} == catalog.CLUSTER_DTYPES
    empty = catalog.clusters_frame(tmp_path / "none")
    assert {c: str(t) for c, t in empty.dtypes.items()} == catalog.CLUSTER_DTYPES


def test_find_by_id_name_or_directory_and_say_what_exists(tmp_path) -> None:
    a = _cluster_dir(tmp_path, "alpha-1", created=1.0)
    _cluster_dir(tmp_path, "alpha-2", created=2.0)
    assert catalog.find("alpha-1", tmp_path).path == a
    assert catalog.find("alpha", tmp_path).id == "alpha-2"  # the newest of that name
    assert catalog.find(str(a)).id == "alpha-1"
    with pytest.raises(cb.UnknownClusterError, match=r"No cluster 'beta'.*there are: alpha-2, "
                       r"alpha-1") as info:  # fmt: skip
        catalog.find("beta", tmp_path)
    assert info.value.known == ("alpha-2", "alpha-1")
    with pytest.raises(cb.UnknownClusterError, match="there is none"):
        catalog.find("beta", tmp_path / "empty")
    with pytest.raises(cb.RecordError, match=r"has no cluster\.json"):
        catalog.find(str(tmp_path / "alpha-1" / ".."), tmp_path)


def test_a_cluster_elsewhere_is_linked_into_the_root_and_found(tmp_path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "mine" / "c-9"
    elsewhere.mkdir(parents=True)
    write_record(_record(elsewhere, id="c-9"))
    catalog.link(elsewhere, "c-9", root)
    assert catalog.find("c-9", root).record.directory == str(elsewhere)  # type: ignore[union-attr]


def test_claim_numbers_an_id_taken_and_keeps_a_directory_given(tmp_path, monkeypatch) -> None:
    root = tmp_path / "root"
    monkeypatch.setenv("CLUSTERBOOK_RUN_ROOT", str(root))
    first = catalog.claim("c-20260101-000000", root / "c-20260101-000000", own_run_dir=True)
    again = catalog.claim("c-20260101-000000", root / "c-20260101-000000", own_run_dir=True)
    assert first == ("c-20260101-000000", root / "c-20260101-000000")
    assert again == ("c-20260101-000000-2", root / "c-20260101-000000-2")
    given = tmp_path / "mine"
    assert catalog.claim("d-20260101-000000", given, own_run_dir=False) == (
        "d-20260101-000000",
        given,
    )
    assert given.is_dir()
    assert (root / "d-20260101-000000").resolve() == given  # found by its id


def test_prune_removes_exactly_what_outlived_its_retention(tmp_path) -> None:
    now = time.time()
    day = 86400.0

    def job(n: int, state: str, ended: float | None, path: Path) -> JobEntry:
        directory = path / "jobs" / f"job-{n:04d}"
        directory.mkdir(parents=True)
        return JobEntry(f"job-{n:04d}", state, str(directory), 1, ("x",), ended=ended)

    old = _cluster_dir(tmp_path, "old-1", state="stopped", stopped=now - 8 * day, retention=7 * day)
    recent = _cluster_dir(
        tmp_path, "recent-2", state="stopped", stopped=now - day, retention=7 * day
    )
    forever = _cluster_dir(tmp_path, "kept-3", state="stopped", stopped=now - 30 * day)
    live = tmp_path / "live-4"
    live.mkdir()
    jobs = (job(1, "succeeded", now - 9 * day, live), job(2, "running", None, live),
            job(3, "failed", now - 2 * day, live))  # fmt: skip
    write_record(_record(live, id="live-4", name="live", retention=7 * day, jobs=jobs))

    dry = catalog.prune(dry_run=True, root=tmp_path)
    assert sorted(r.path.name for r in dry) == ["job-0001", "old-1"]
    assert old.exists()
    assert Path(jobs[0].directory).exists()
    done = catalog.prune(root=tmp_path)
    assert [r.path for r in done] == [r.path for r in dry]
    assert not old.exists()
    assert not Path(jobs[0].directory).exists()
    assert recent.exists()
    assert forever.exists()
    assert live.exists()
    assert Path(jobs[1].directory).exists()
    assert Path(jobs[2].directory).exists()
    # --older-than overrides every cluster's retention, never a live cluster or running job.
    catalog.prune(older_than=1.0, root=tmp_path)
    assert not recent.exists()
    assert not forever.exists()
    assert live.exists()
    assert Path(jobs[1].directory).exists()
    assert not Path(jobs[2].directory).exists()


def test_prune_lists_no_job_outside_its_clusters_jobs_directory(tmp_path) -> None:
    run, mine = tmp_path / "run", tmp_path / "mine"
    (run / "jobs" / "job-0001").mkdir(parents=True)
    mine.mkdir()
    jobs = (JobEntry("job-0001", "succeeded", str(run / "jobs" / "job-0001"), 1, ("x",),
                     ended=1.0),
            JobEntry("job-0002", "succeeded", str(mine), 1, ("x",), ended=1.0))  # fmt: skip
    found = catalog.Found(run, _record(run, retention=1.0, jobs=jobs))  # not read: not checked
    removals = catalog.prunable([found], now=100.0, older_than=None)
    assert [r.path for r in removals] == [run / "jobs" / "job-0001"]
    assert removals[0].within == run / "jobs"


# -- work_dir ------------------------------------------------------------------------------


def test_work_dir_is_the_run_dir_or_a_url_to_copy_it_to(tmp_path) -> None:
    local = cb.Cluster.local(work_dir=tmp_path / "wd")
    assert local.run_dir == tmp_path / "wd"
    assert local._options.work_dir is None
    remote = cb.Cluster.local(work_dir="sftp://me@host/runs/x")
    assert remote._options.work_dir == "sftp://me@host/runs/x"
    assert remote._options.own_run_dir  # the jobs still write to a local directory
    for bad, message in [
        ({"work_dir": 3}, "work_dir must be a directory or an fsspec URL, got 3"),
        ({"work_dir": "/a", "run_dir": "/b"}, "name two directories"),
        ({"work_dir_options": [1]}, "work_dir_options must be a mapping"),
    ]:
        with pytest.raises(cb.ConfigError, match=message):
            cb.Cluster.local(**bad)  # type: ignore[arg-type]


def test_a_relative_run_dir_is_made_absolute_for_the_processes_that_read_the_record(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert cb.Cluster.local(run_dir="runs/c").run_dir == tmp_path / "runs" / "c"


def test_the_mirror_copies_the_newest_record_and_ended_jobs(tmp_path) -> None:
    import fsspec

    from clusterbook.head.mirror import Mirror

    job = tmp_path / "jobs" / "job-0001"
    job.mkdir(parents=True)
    for name in ("job.json", "rank-0.log", "result.json", "hostfile", "notes.tmp"):
        (job / name).write_text(name)
    mirror = Mirror("memory://mirror-test/c1")
    for n in range(50):
        mirror.record(f'{{"n": {n}}}')
    mirror.job(job)
    mirror.job(job)  # once is enough
    mirror.close()
    fs = fsspec.filesystem("memory")
    assert fs.cat("/mirror-test/c1/cluster.json") == b'{"n": 49}'
    copied = sorted(
        p.rsplit("/", 1)[1] for p in fs.ls("/mirror-test/c1/jobs/job-0001", detail=False)
    )
    assert copied == ["hostfile", "job.json", "rank-0.log", "result.json"]


def test_a_url_without_its_file_system_says_what_to_install() -> None:
    from clusterbook.head.mirror import Mirror

    with pytest.raises(cb.ConfigError, match=r"Cannot use work_dir='nosuchfs://x/y'"):
        Mirror("nosuchfs://x/y")
