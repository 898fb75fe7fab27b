"""Clusters seen from other processes, with real processes and real MPI: the record, the
stop file, life span and idle timeout, attaching, the CLI (ls, status, logs, stop, prune), a
killed head, and Job.load."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.paths import cluster_dir
from tests.conftest import wait_gone

CLI = [sys.executable, "-m", "clusterbook"]

# A head in its own process: a local cluster and a job whose ranks print then wait for a file.
HEAD = """\
import sys, time
import clusterbook as cb
python, script, go, name = sys.argv[1:5]
cluster = cb.Cluster.local(1, 2, python=python, name=name).start()
job = cluster.mpirun(["python", script, go], np=2)
seen = 0
for record in job.stream():
    seen += record.line.startswith("line 4")
    if seen == 2:
        break
print(cluster.id, flush=True)
time.sleep(600)
"""

RANKS = """\
import os, sys, time
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
for i in range(5):
    print(f"line {i} of rank {rank}", flush=True)
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.05)
print(f"done {rank}", flush=True)
"""


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def head(openmpi_python, tmp_path):
    """Start a head process with a running job; yield (process, cluster id, go file)."""
    script = tmp_path / "ranks.py"
    script.write_text(RANKS)
    go = tmp_path / "go"
    name = f"hd-{os.getpid()}-{tmp_path.name[-10:]}".replace("_", "-")
    proc = subprocess.Popen(
        [sys.executable, "-c", HEAD, openmpi_python, f"{script}", str(go),
         name],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    try:
        assert proc.stdout is not None
        cluster_id = proc.stdout.readline().strip()
        assert cluster_id.startswith(name), cluster_id
        yield proc, cluster_id, go
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        assert not wait_gone(str(script), 10)


def _wait(condition, timeout: float = 10.0) -> float:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.02)
    return time.monotonic() - start


def test_record_follows_the_cluster_and_nothing_is_left_in_the_home_dir(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(2, 1, python=openmpi_python, run_dir=tmp_path / "c")
    with cluster:
        text = (tmp_path / "c" / "cluster.json").read_text()
        secrets = [p.read_bytes() for p in cluster_dir(cluster.id).rglob("*") if p.is_file()]
        assert secrets  # the rendezvous token and the node key are there, not in the record
        assert not any(s.strip() and s.strip().decode(errors="replace") in text for s in secrets)
        record = json.loads(text)
        assert record["state"] == "running"
        assert record["head_pid"] == os.getpid()
        assert [n["slots"] for n in record["nodes"]] == [1, 1]
        running = cluster.mpirun(["python", "-c", "print('hi')"], np=2)
        # Written at once when a job starts (a head killed next must leave its token).
        job = json.loads((tmp_path / "c" / "cluster.json").read_text())["jobs"][0]
        assert job["token"] == running.plan.job_token
        assert job["directory"].endswith("jobs/job-0001")
        running.wait(60)

        def state() -> str:
            return json.loads((tmp_path / "c" / "cluster.json").read_text())["jobs"][0]["state"]

        _wait(lambda: state() == "succeeded")
        # Found by its id under the run root, where it is linked.
        assert cb.clusters()["id"].tolist()[0] == cluster.id
    record = json.loads((tmp_path / "c" / "cluster.json").read_text())
    assert record["state"] == "stopped"
    assert record["stop_reason"] == "stop() was called"
    assert record["stopped"] >= record["started"] >= record["created"]
    assert not cluster_dir(cluster.id).exists()


def test_stop_file_stops_the_cluster_within_a_second_and_cancels_its_job(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=tmp_path / "c").start()
    try:
        job = cluster.mpirun(["python", "-c", "import time; print('up', flush=True); "
                              "time.sleep(60)"], np=2)  # fmt: skip
        _wait(lambda: len([r for r in job.logs()["line"] if r == "up"]) == 2, 30)
        (tmp_path / "c" / "stop").touch()
        # Acted on at the keeper's next tick (0.2 s: see the keeper's unit tests); no
        # wall-clock bound here, the job's SIGTERM grace comes on top and the CI is loaded.
        _wait(lambda: cluster.state == "stopped", 10)
        assert job.outcome is not None
        assert job.outcome.cancelled
        record = cb.Cluster.attach(str(tmp_path / "c")).record
        assert record.stop_reason == "its stop file appeared"
        assert not (tmp_path / "c" / "stop").exists()
    finally:
        cluster.stop()


def test_life_span_stops_the_cluster_and_shows_time_left(openmpi_python, tmp_path):
    from clusterbook.views.html import render_header

    cluster = cb.Cluster.local(1, 1, python=openmpi_python, life_span=4).start()
    try:
        left = cluster.time_left
        assert left is not None
        assert 0 < left <= 4
        assert cluster.status()["time_left"].notna().all()
        header = render_header(cb.Cluster.attach(cluster.id).snapshot())
        assert re.search(r"stops in [0-4]s \(life_span\)", header), header
        _wait(lambda: cluster.state == "stopped", 15)
        assert cluster.time_left is None
        assert cb.Cluster.attach(cluster.id).record.stop_reason == "after 4s (life_span)"
    finally:
        cluster.stop()


def test_idle_timeout_waits_for_the_running_job(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 1, python=openmpi_python, idle_timeout=1.0).start()
    try:
        job = cluster.mpirun(["python", "-c", "import time; time.sleep(2.5)"], np=1)
        time.sleep(1.5)
        assert cluster.state == "running"
        assert cluster.time_left is None
        job.wait(30)
        ended = time.monotonic()
        _wait(lambda: cluster.state == "stopped", 10)
        assert time.monotonic() - ended >= 0.8
        assert job.outcome is not None
        assert job.outcome.ok
        assert cb.Cluster.attach(cluster.id).record.stop_reason == "idle for 1s (idle_timeout)"
    finally:
        cluster.stop()


def test_another_process_sees_the_cluster_reads_its_logs_and_stops_it(head, tmp_path):
    _proc, cluster_id, go = head
    listed = cli("ls")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[0].split()[:4] == ["ID", "NAME", "KIND", "STATE"]
    row = next(line for line in listed.stdout.splitlines() if line.startswith(cluster_id))
    assert row.split()[3] == "running"
    assert "1 (1 running)" in row

    status = cli("status", cluster_id)
    assert status.returncode == 0, status.stderr
    assert f"({cluster_id}) local running" in status.stdout
    assert "job-0001  running  2" in status.stdout

    logs = cli("logs", cluster_id, "--rank", "1")
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.splitlines() == [f"[1] line {i} of rank 1" for i in range(5)]

    # Follow the job live from another process until it ends: every line, none twice.
    follow = subprocess.Popen([*CLI, "logs", cluster_id, "job-0001", "-f"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    threading.Timer(1.0, go.touch).start()
    out, _ = follow.communicate(timeout=60)
    assert follow.returncode == 0
    lines = out.splitlines()
    for rank in (0, 1):
        assert [ln for ln in lines if ln.startswith(f"[{rank}]")] == [
            *(f"[{rank}] line {i} of rank {rank}" for i in range(5)), f"[{rank}] done {rank}",
        ]  # fmt: skip

    attached = cb.Cluster.attach(cluster_id)
    assert attached.state == "running"
    assert attached.job("job-0001").wait(30).ok
    # The head rewrites the record within a tick (0.2 s) of the job's end.
    _wait(lambda: attached.status()["state"].tolist() == ["joined"], 5)

    stopped = cli("stop", cluster_id)
    assert stopped.returncode == 0, stopped.stderr
    # Through the head's control server, which says who asked.
    assert re.search(
        rf"^Cluster {cluster_id} stopped \(stopped by an attached handle \(pid \d+\)\)\.$",
        stopped.stdout,
        re.M,
    )
    assert attached.state == "stopped"
    again = cli("stop", cluster_id)
    assert again.returncode == 0
    assert "already stopped" in again.stdout


def test_a_killed_head_is_stale_and_stop_cleans_what_it_left(head, tmp_path):
    proc, cluster_id, _go = head
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    frame = cb.clusters()
    row = frame[frame["id"] == cluster_id].iloc[0]
    assert row["state"] == "stale"
    assert "head is gone" in row["problem"]
    attached = cb.Cluster.attach(cluster_id)
    assert attached.state == "stale"
    assert "is gone; stop() cleans what is left" in (attached.snapshot().problem or "")
    # Two processes stop it at once: one cleans, both return, the record says stopped.
    both = [subprocess.Popen([*CLI, "stop", cluster_id], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]  # fmt: skip
    outs = [p.communicate(timeout=60)[0] for p in both]
    assert [p.returncode for p in both] == [0, 0], outs
    record = attached.record
    assert record.state == "stopped"
    assert "was gone; stopped by pid" in (record.stop_reason or "")
    assert record.jobs[0].state == "cancelled"


def test_unknown_ids_and_damaged_records_are_refused_clearly(tmp_path):
    missing = cli("status", "no-such-cluster")
    assert missing.returncode == 1
    assert "No cluster 'no-such-cluster' under" in missing.stderr
    with pytest.raises(cb.RecordError, match=r"has no cluster\.json"):
        cb.Cluster.attach(str(tmp_path))
    (tmp_path / "cluster.json").write_text('{"id": "x", "na')
    with pytest.raises(cb.RecordError, match="may be half-written") as info:
        cb.Cluster.attach(str(tmp_path))
    assert info.value.path == str(tmp_path / "cluster.json")
    with pytest.raises(cb.RecordError, match="not a job's directory"):
        cb.Job.load(tmp_path)


def test_a_finished_job_is_loaded_from_its_files(mpi_python, tmp_path):
    with cb.Cluster.local(1, 2, python=mpi_python, run_dir=tmp_path / "c") as cluster:
        program = (
            "import sys; from mpi4py import MPI; r = MPI.COMM_WORLD.rank; "
            "print('out', r, flush=True); MPI.COMM_WORLD.Barrier(); sys.exit(3 if r else 0)"
        )
        job = cluster.mpirun(["python", "-c", program], np=2)
        result = job.wait(60)
    loaded = cb.Job.load(job.directory)
    assert loaded.done()
    assert loaded.outcome == result
    assert (loaded.id, loaded.np, loaded.argv) == (job.id, 2, job.argv)
    frame = loaded.logs()
    assert {(r, line) for r, line in zip(frame["rank"], frame["line"], strict=True) if r >= 0} >= {
        (0, "out 0"), (1, "out 1"),
    }  # fmt: skip
    assert frame.dtypes.to_dict() == job.logs().dtypes.to_dict()
    assert set(frame["host"][frame["rank"] >= 0]) != {"?"}
    assert "out 1" in loaded.logs(rank=1)["line"].tolist()
    assert set(loaded.logs(rank=1)["rank"]) == {1}
    with pytest.raises(cb.ClusterStateError, match="cancel it through its cluster"):
        _not_done_cancel(job.directory)


def _not_done_cancel(directory: Path) -> None:
    """A loaded job still running cannot be cancelled from its files alone."""
    copy = directory.parent / "job-9999"
    copy.mkdir()
    (copy / "job.json").write_text((directory / "job.json").read_text())
    cb.Job.load(copy).cancel()


def test_prune_from_the_cli_removes_exactly_the_finished_runs(
    openmpi_python, tmp_path, monkeypatch
):
    monkeypatch.setenv("CLUSTERBOOK_RUN_ROOT", str(tmp_path / "runs"))  # these clusters only
    with cb.Cluster.local(1, 1, python=openmpi_python) as old:
        old.mpirun(["python", "-c", "pass"], np=1).wait(60)
    live = cb.Cluster.local(1, 1, python=openmpi_python).start()
    try:
        job = live.mpirun(["python", "-c", "pass"], np=1)
        job.wait(60)
        dry = cli("prune", "--older-than", "0.001", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert f"would remove {old.run_dir} (cluster {old.id} stopped" in dry.stdout
        assert f"would remove {job.directory} (job job-0001 of {live.id} ended" in dry.stdout
        assert old.run_dir.exists()
        done = cli("prune", "--older-than", "0.001")
        assert done.returncode == 0
        assert done.stdout.count("removed ") == 2
        assert not old.run_dir.exists()
        assert not job.directory.exists()
        assert live.run_dir.exists()
        assert (live.run_dir / "cluster.json").exists()
        bad = cli("prune", "--older-than", "soon")
        assert bad.returncode == 2
        assert "--older-than must be a duration > 0, got 'soon'" in bad.stderr
    finally:
        live.stop()


def test_exec_runs_a_command_on_every_node_of_a_running_cluster(openmpi_python, tmp_path):
    with cb.Cluster.local(2, 1, python=openmpi_python, run_dir=tmp_path / "c") as cluster:
        ok = cli("exec", cluster.id, "--", "sh", "-c", "echo out; echo err >&2")
        assert ok.returncode == 0, ok.stderr
        assert sorted(ok.stdout.splitlines()) == ["[local-0] out", "[local-1] out"]
        assert sorted(ok.stderr.splitlines()) == ["[local-0] err", "[local-1] err"]
        bad = cli("exec", cluster.id, "--timeout", "5", "--", "sh", "-c", "exit 3")
        assert bad.returncode == 1
        assert "clusterbook: local-0 (localhost): exit code 3" in bad.stderr
        slow = cli("exec", cluster.id, "--timeout", "0.5", "--", "sleep", "30")
        assert slow.returncode == 1
        assert "stopped at its timeout, or not reached" in slow.stderr
        empty = cli("exec", cluster.id)
        assert empty.returncode == 2
        assert "needs a command" in empty.stderr


def test_cb_run_shows_a_bar_of_the_ranks_that_ended(openmpi_python, tmp_path):
    program = (
        "import sys, clusterbook as cb\n"
        "c = cb.Cluster.local(1, 2, python=sys.argv[1], run_dir=sys.argv[2])\n"
        "r = cb.run(['python', '-c', 'import time; time.sleep(1.5)'], np=2, cluster=c,\n"
        "           progress=True)\n"
        "print(r.ok)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program, openmpi_python, str(tmp_path / "c")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"
    assert re.search(r"running job-0001: .*0/2", proc.stderr), proc.stderr
    assert re.search(r"running job-0001: .*2/2", proc.stderr), proc.stderr
