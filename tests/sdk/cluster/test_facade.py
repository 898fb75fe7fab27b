"""The Cluster facade against the shipped FakeProvider: lifecycle, the start context,
status, lost nodes, files, specs. No agent, no sshd; jobs run a stand-in launcher."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.providers.registry import provider_kinds, register_provider
from clusterbook.status import ClusterSnapshot
from clusterbook.testing import FakeProvider

# Runs no rank: says, as Open MPI's tagged output would, that each of -n N ranks exited 0
# (unless FAKE_MPIRUN_SILENT is set: as when a node's daemon died, mpirun exits 0 unheard).
STAND_IN = """\
#!/bin/sh
if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 5.0.11"; exit 0; fi
n=1
while [ $# -gt 0 ]; do [ "$1" = -n ] && n=$2; shift; done
sleep "${FAKE_MPIRUN_SLEEP:-0}"
r=0
[ -n "${FAKE_MPIRUN_SILENT-}" ] && exit 0
while [ $r -lt $n ]; do printf '[1,%d]<stderr>: \\036CB exit 0\\n' $r; r=$((r+1)); done
"""


@pytest.fixture
def launcher(tmp_path: Path) -> str:
    path = tmp_path / "bin" / "mpirun"
    path.parent.mkdir()
    path.write_text(STAND_IN)
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def make(launcher: str, tmp_path: Path) -> Iterator:
    made: list[cb.Cluster] = []

    def cluster(provider: FakeProvider, **options: object) -> cb.Cluster:
        options = {"launcher": launcher, "run_dir": tmp_path / f"run{len(made)}", **options}
        c = cb.Cluster(provider, ClusterOptions.make(provider.kind, **options))
        made.append(c)
        return c

    yield cluster
    for c in made:
        c.stop()


def test_start_gives_the_provider_its_context_and_stop_releases_once(make) -> None:
    fake = FakeProvider(nodes=2, slots=3)
    cluster = make(fake, name="demo", env={"SEED": "1"})
    assert cluster.status().state.tolist() == ["pending", "pending"]
    with cluster:
        (ctx,) = fake.calls.started
        # The id (unique among this user's clusters) names its files and processes on nodes.
        assert cluster.id.startswith("demo-")
        assert (ctx.cluster_id, ctx.env) == (cluster.id, {"SEED": "1"})
        job = cluster.mpirun(["true"], np=1)
        assert job.plan.job_token.startswith(f"{cluster.id}:")
        assert job.wait(30).ok
        assert ctx.launcher.flavour is cb.MPIFlavour.OPENMPI
        assert cluster.total_slots == 6
        assert cluster.status().state.tolist() == ["ready", "ready"]
    assert fake.calls.stopped == 1
    cluster.stop()
    assert fake.calls.stopped == 1


def test_a_failed_start_raises_the_providers_error_and_leaves_the_cluster_unstarted(make):
    fake = FakeProvider(fail_start=cb.BootstrapError({"node2": ["no mpi4py there"]}))
    cluster = make(fake)
    with pytest.raises(cb.BootstrapError, match="node2: no mpi4py there"):
        cluster.start()
    assert cluster.state == "created"


def test_changes_the_provider_reports_reach_subscribers(make) -> None:
    fake = FakeProvider(nodes=2)
    cluster = make(fake).start()
    seen: list[ClusterSnapshot] = []
    unsubscribe = cluster.subscribe(seen.append)
    fake.lose("fake-1")
    assert [n.state for n in seen[-1].nodes] == ["ready", "lost"]
    fake.report_problem("status is stale")
    assert seen[-1].problem == "status is stale"
    assert "PROBLEM: status is stale" in repr(cluster)
    unsubscribe()
    fake.report_problem(None)
    assert seen[-1].problem == "status is stale"


def test_the_snapshot_carries_an_elastic_clusters_bounds(make) -> None:
    assert make(FakeProvider()).snapshot().min_nodes is None
    snapshot = make(FakeProvider(bounds=(2, 8))).snapshot()
    assert (snapshot.min_nodes, snapshot.max_nodes) == (2, 8)


def test_nodes_that_are_not_ready_say_so(make) -> None:
    fake = FakeProvider(ready=False)
    cluster = make(fake).start()
    with pytest.raises(cb.ReadyTimeoutError):
        cluster.wait_ready(timeout=0.1)
    with pytest.raises(cb.ClusterStateError, match=r"no nodes yet; call cluster.wait_ready"):
        cluster.mpirun(["true"])
    fake.make_ready()
    cluster.wait_ready(timeout=0.1)
    assert len(cluster.nodes) == 2


def test_nodes_lost_for_good_are_said_alike_by_status_wait_ready_and_mpirun(make) -> None:
    fake = FakeProvider(nodes=2)
    cluster = make(fake).start()
    seen: list[ClusterSnapshot] = []
    cluster.subscribe(seen.append)
    why = "Both nodes were lost for good (their agents gave up); start a new cluster."
    fake.lose_all_for_good(why)
    assert seen[-1].problem == why  # told as it happened
    assert cluster.snapshot().problem == why
    assert f"PROBLEM: {why}" in repr(cluster)
    with pytest.raises(cb.ClusterStateError) as waited:
        cluster.wait_ready(timeout=30)
    with pytest.raises(cb.ClusterStateError) as ran:
        cluster.mpirun(["true"], np=1)
    assert str(waited.value) == str(ran.value) == why
    assert cluster.jobs == []


def test_no_job_starts_on_a_cluster_that_lost_a_node(make) -> None:
    fake = FakeProvider(nodes=2)
    cluster = make(fake).start()
    fake.lose("fake-0")
    with pytest.raises(cb.ClusterStateError, match="lost 1 of its nodes: Node fake-0"):
        cluster.mpirun(["true"], np=1)
    assert cluster.jobs == []


def test_a_running_job_fails_naming_the_node_that_was_lost(make) -> None:
    fake = FakeProvider(nodes=2)
    cluster = make(fake).start()
    job = cluster.mpirun(["true"], np=2, env={"FAKE_MPIRUN_SLEEP": "60"})
    assert not job.done()
    fake.lose("fake-1")
    result = job.wait(timeout=30)
    assert isinstance(job.error, cb.NodeLostError)
    assert job.error.node == "fake-1"
    assert "Node fake-1 (localhost) was lost" in (result.error or "")
    assert not result.ok
    # The provider was asked to stop what the job left on the nodes.
    assert fake.calls.stopped_jobs == [job.plan.job_token]


def test_ranks_that_never_report_are_not_a_success_and_a_node_lost_meanwhile_is_named(
    make,
) -> None:
    fake = FakeProvider(nodes=2)
    cluster = make(fake).start()
    silent = {"FAKE_MPIRUN_SILENT": "1"}
    result = cluster.mpirun(["true"], np=2, env=silent).wait(timeout=30)
    assert result.returncode == 0
    assert not result.ok
    assert result.unreported_ranks == [0, 1]
    assert "Ranks 0, 1 ended without reporting an exit code" in result.summary()

    # The launcher exits 0 first; the head learns of the lost node a moment later.
    job = cluster.mpirun(["true"], np=2, env=silent)
    threading.Timer(0.3, fake.lose, args=("fake-1",)).start()
    result = job.wait(timeout=30)
    assert not result.ok
    assert isinstance(job.error, cb.NodeLostError)
    assert "Node fake-1 (localhost) was lost" in (result.error or "")
    assert [a.outcome for a in result.attempts] == ["node-lost"]


def test_put_and_gather_go_through_the_provider(make, tmp_path: Path) -> None:
    fake = FakeProvider(gather_files={"a.txt": b"A", "have.txt": b"theirs"})
    cluster = make(fake).start()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x").write_text("x")
    cluster.put(tmp_path / "data")
    assert [f.path for f in fake.calls.put[0].files] == [str(tmp_path / "data" / "x")]
    out = tmp_path / "out"
    out.mkdir()
    (out / "have.txt").write_text("mine")  # never overwritten: the provider is told to skip it
    assert cluster.gather(out) == [out / "a.txt"]
    assert (out / "have.txt").read_text() == "mine"


def test_from_spec_builds_any_registered_kind_and_names_the_known_ones(launcher, tmp_path):
    with pytest.raises(cb.ConfigError, match=r"Unknown cluster kind 'slurmm'.*'elastic'"):
        cb.Cluster.from_spec({"kind": "slurmm"})
    with pytest.raises(cb.ConfigError, match=r"'local' cluster spec does not fit.*workers"):
        cb.Cluster.from_spec({"kind": "local", "wrokers": 2})
    with pytest.raises(cb.ConfigError, match="Cluster name"):
        cb.Cluster.from_spec({"kind": "local", "name": "bad name"})
    register_provider("fake", FakeProvider)
    assert "fake" in provider_kinds()
    cluster = cb.Cluster.from_spec(
        {"kind": "fake", "nodes": 3, "slots": 2, "launcher": launcher, "run_dir": tmp_path}
    )
    with cluster:
        assert cluster.kind == "fake"
        assert cluster.total_slots == 6


def test_run_on_nodes_gives_a_row_per_node_with_code_output_and_time(make) -> None:
    cluster = make(FakeProvider(nodes=2))
    with pytest.raises(cb.ClusterStateError, match="not started"):
        cluster.run_on_nodes(["true"])
    cluster.start()
    frame = cluster.run_on_nodes(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert list(frame.columns) == ["node", "host", "returncode", "stdout", "stderr", "duration"]
    assert frame.node.tolist() == ["fake-0", "fake-1"]
    assert frame.returncode.tolist() == [3, 3]
    assert str(frame.returncode.dtype) == "Int64"
    assert frame.stdout.tolist() == ["out\n", "out\n"]
    assert frame.stderr.tolist() == ["err\n", "err\n"]
    assert (frame.duration >= pd.Timedelta(0)).all()


def test_run_on_nodes_stops_what_runs_over_its_time_and_says_what_was_not_found(make) -> None:
    cluster = make(FakeProvider(nodes=1)).start()
    slow = cluster.run_on_nodes(["sh", "-c", "echo started; sleep 30"], timeout=0.5)
    assert slow.returncode.isna().all()
    assert slow.stdout[0] == "started\n"
    assert "ran over its 0.5 s" in slow.stderr[0]
    assert slow.duration[0] < pd.Timedelta(seconds=10)
    missing = cluster.run_on_nodes(["no-such-program-xyz"])
    assert missing.returncode.tolist() == [127]
    assert "no-such-program-xyz" in missing.stderr[0]
    with pytest.raises(cb.ConfigError, match="not the string"):
        cluster.run_on_nodes("hostname")  # type: ignore[arg-type]
    with pytest.raises(cb.ConfigError, match="timeout must be a duration"):
        cluster.run_on_nodes(["true"], timeout=0)


def test_every_frame_has_the_same_columns_and_dtypes_whatever_its_rows(make) -> None:
    from clusterbook.launch.logs import DTYPES, LogRecord, records_frame
    from clusterbook.launch.result import TIMELINE_DTYPES, JobResult
    from clusterbook.nodes.commands import COMMAND_DTYPES, NodeRun, runs_frame
    from clusterbook.status import NODE_DTYPES, NodeStatus, nodes_frame

    def dtypes(frame) -> dict[str, str]:  # type: ignore[no-untyped-def]
        return {c: str(t) for c, t in frame.dtypes.items()}

    empty = make(FakeProvider(nodes=1)).snapshot()
    full = replace(
        empty,
        nodes=(
            NodeStatus("a", "h", 2, "joined", round=3, heartbeat_age=0.5, load=0.1, pid=9),
            NodeStatus("b", "h", 2, "lost"),  # no agent facts: <NA>, not None, not NaN
        ),
    )
    for snapshot in (replace(empty, nodes=()), full):
        assert dtypes(nodes_frame(snapshot)) == NODE_DTYPES
    assert list(nodes_frame(full)["state"].cat.categories)[:3] == ["pending", "ready", "joined"]
    assert nodes_frame(full)["pid"].isna().tolist() == [False, True]
    records = [LogRecord(1.7e9, 0, "h", "stdout", "x"), LogRecord(1.7e9, -1, "h", "stderr", "y")]
    for rows in ([], records):
        assert dtypes(records_frame(rows)) == DTYPES
    runs = [NodeRun("a", "h", None, "", "stopped", 1.0), NodeRun("b", "h", 0, "ok", "", 0.1)]
    for rows in ([], runs):
        assert dtypes(runs_frame(rows)) == COMMAND_DTYPES
    ended = JobResult("job-1", 0, {0: 0, 1: 9}, (), 1.0, rank_times={0: (1.7e9, 1.7e9 + 1)})
    for result in (JobResult("job-0", None, {}, (), 0.0), ended):
        assert dtypes(result.timeline()) == TIMELINE_DTYPES
    assert ended.timeline()["end"].isna().tolist() == [False, True]  # NaT: never reported


DISPLAY_WITHOUT_WIDGETS = """\
import sys
sys.modules["clusterbook_widgets"] = None  # the Jupyter layer is not installed
import clusterbook as cb
from clusterbook.testing import FakeProvider
cluster = cb.Cluster(FakeProvider(nodes=2))
bundle = cluster._repr_mimebundle_()
print(sorted(bundle))
print(bundle["text/plain"] == repr(cluster), "fake-1" in bundle["text/html"])
"""


def test_a_cluster_shows_as_static_html_and_text_without_the_jupyter_layer() -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", DISPLAY_WITHOUT_WIDGETS],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["['text/html', 'text/plain']", "True True"]


def test_jobs_and_results_show_a_readable_summary_and_static_html(make) -> None:
    from IPython.lib.pretty import pretty

    cluster = make(FakeProvider(nodes=1)).start()
    job = cluster.mpirun(["true"], np=1)
    result = job.wait(timeout=30)
    assert pretty(result) == result.summary()  # terminal IPython: the summary, not fields
    assert result.state == "succeeded"
    html = result._repr_html_()
    assert "cb-state-succeeded" in html
    assert "Job job-0001 succeeded" in html
    page = job._repr_html_()
    assert "job-0001" in page
    assert "cb-state-succeeded" in page
    assert "var(--jp-" in page  # JupyterLab's theme colours, with fallbacks


def test_start_put_and_gather_draw_bars_when_asked(
    make, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cluster = make(FakeProvider(nodes=2, gather_files={"a.txt": b"A" * 3000}))
    fake_cluster.start(progress=True)
    assert "starting 2 fake nodes" in capsys.readouterr().err  # what the provider does now
    (tmp_path / "data.bin").write_bytes(b"x" * 5000)
    fake_cluster.put(tmp_path / "data.bin", progress=True)
    drawn = capsys.readouterr().err
    assert "put: 4.88kB" in drawn  # the bytes sent, scaled, left on the screen
    fake_cluster.gather(tmp_path / "out", progress=True)
    drawn = capsys.readouterr().err
    assert "gather: 2.93kB" in drawn
    fake_cluster.stop()


def test_automatic_bars_stay_quiet_without_a_watcher(
    make, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_cluster = make(FakeProvider(nodes=2, gather_files={"a.txt": b"A" * 3000}))
    with fake_cluster:
        (tmp_path / "data.bin").write_bytes(b"x" * 5000)
        fake_cluster.put(tmp_path / "data.bin")
        fake_cluster.gather(tmp_path / "out")
        fake_cluster.wait_ready(5)
    assert capsys.readouterr().err == ""


def test_a_bad_progress_value_stops_the_call_before_it_starts(make, tmp_path: Path) -> None:
    fake = FakeProvider(nodes=2)
    fake_cluster = make(fake)
    with pytest.raises(cb.ConfigError, match="progress must be"):
        fake_cluster.start(progress="yes")  # type: ignore[arg-type]
    assert fake_cluster.state == "created"
    assert fake.calls.started == []
    assert not fake_cluster.run_dir.exists()
    with fake_cluster:
        with pytest.raises(cb.ConfigError, match="'on'"):
            fake_cluster.put(tmp_path, progress="on")  # type: ignore[arg-type]
        with pytest.raises(cb.ConfigError, match="progress must be"):
            fake_cluster.gather(tmp_path / "out", progress=1)  # type: ignore[arg-type]
        with pytest.raises(cb.ConfigError, match="progress must be"):
            fake_cluster.wait_ready(5, progress="x")  # type: ignore[arg-type]
    assert fake.calls.put == []
