"""Jobs on local clusters with the real Open MPI and the real MPICH (both from PyPI)."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.launch.logs import read_log_file
from clusterbook.launch.parse import MAX_LINE

pytestmark = pytest.mark.mpi

ALLREDUCE = """\
from mpi4py import MPI
import sys
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(f"rank {comm.rank} of {comm.size} sum {total}", flush=True)
print(f"note from {comm.rank}", file=sys.stderr, flush=True)
"""

RAISES = """\
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 1:
    raise ValueError("rank one gives up")
comm.Barrier()
print("never here")
"""

EXITS = """\
import sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
if comm.rank == 0:
    sys.exit(3)
comm.Barrier()
"""

HANGS = """\
import time
from mpi4py import MPI
comm = MPI.COMM_WORLD
print("started", flush=True)
if comm.rank == 0:
    time.sleep(600)  # rank zero never reaches the barrier
comm.Barrier()
"""


def test_allreduce_on_four_ranks(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=2, slots=2)
    # Four ranks on every machine, cores or not.
    job = cluster.mpirun(
        ["python", program("allreduce.py", ALLREDUCE)], np=4, oversubscribe=True, timeout=120
    )
    result = job.wait()

    assert result.ok, result.summary()
    assert result.rank_exit_codes == {0: 0, 1: 0, 2: 0, 3: 0}
    logs = job.logs()
    assert list(logs.columns) == ["time", "rank", "host", "stream", "line", "partial", "attempt"]
    out = logs[logs.stream == "stdout"].sort_values("rank")
    assert out.line.tolist() == [f"rank {r} of 4 sum 10" for r in range(4)]
    err = logs[logs.stream == "stderr"].sort_values("rank")
    assert err.line.tolist() == [f"note from {r}" for r in range(4)]
    assert set(logs.host) == {socket.gethostname()}
    assert not any("\x1e" in line for line in logs.line)  # wrapper markers are not log lines
    for rank in range(4):
        on_disk = read_log_file(job.directory / f"rank-{rank}.log", rank)
        assert [r.line for r in on_disk if r.stream == "stdout"] == [f"rank {rank} of 4 sum 10"]
    saved = json.loads((job.directory / "result.json").read_text())
    assert saved["returncode"] == 0


def test_env_arrives_byte_for_byte(mpi_python, make_cluster, program):
    value = 'it\'s "quoted" $HOME `id` \\back\nnew line\ttab é €'
    script = program("env.py", "import os\nprint(repr(os.environ['TRICKY']))\n")
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=2, env={"TRICKY": value}, timeout=120)
    assert job.wait().ok
    assert job.logs().line.tolist() == [repr(value)] * 2


def test_a_binding_in_launcher_args_is_the_one_the_job_gets(mpi_python, make_cluster):
    # The launchers refuse a second --bind-to: clusterbook leaves its own out, and the ranks
    # run as the job's own says (here: unbound, on every CPU this process may use).
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("binding to cores shows only with two CPUs or more")
    cluster = make_cluster(mpi_python, workers=1, slots=2)
    affinity = ["python", "-c", "import os; print(len(os.sched_getaffinity(0)))"]
    bound = cluster.mpirun(affinity, np=2, timeout=120)
    assert bound.wait().ok
    assert bound.logs().line.tolist() == ["1", "1"]  # clusterbook's: a core each
    flag = "--bind-to" if cluster.launcher.flavour is cb.MPIFlavour.OPENMPI else "-bind-to"
    free = cluster.mpirun(affinity, np=2, timeout=120, launcher_args=[flag, "none"])
    assert free.wait().ok, free.wait().summary()
    assert free.logs().line.tolist() == [str(cpus)] * 2


def test_a_rank_that_raises_ends_the_job(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", program("raises.py", RAISES)], np=2, timeout=120)
    result = job.wait()

    assert not result.ok
    assert not result.timed_out  # the other rank did not hang in its barrier
    assert result.failed_ranks == [1]
    failure = result.failed[0]
    assert failure.host == socket.gethostname()
    assert "ValueError: rank one gives up" in failure.last_lines
    assert "ValueError: rank one gives up" in result.summary()
    with pytest.raises(cb.JobFailedError, match="Rank 1"):
        result.check()
    assert "never here" not in job.logs().line.tolist()


def test_a_rank_that_exits_nonzero_ends_the_job(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", program("exits.py", EXITS)], np=2, timeout=120)
    result = job.wait()
    assert not result.timed_out
    assert result.failed_ranks == [0]
    assert result.failed[0].exit_code == 3


def test_timeout_dumps_every_rank_stack_then_stops(mpi_python, make_cluster, program):
    script = program("hangs.py", HANGS)
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=2, timeout=3)
    result = job.wait(timeout=120)

    assert result.timed_out
    assert not result.ok
    assert "timed out" in result.summary()
    logs = job.logs()
    for rank, where in ((0, "time.sleep(600)"), (1, "comm.Barrier()")):
        lines = logs[(logs["rank"] == rank) & (logs.stream == "stderr")].line.tolist()
        assert any("most recent call first" in line for line in lines), lines
        line_no = HANGS.splitlines().index(next(s for s in HANGS.splitlines() if where in s)) + 1
        assert any(f'File "{script}", line {line_no}' in line for line in lines), lines


LEAVES = """\
import subprocess, sys
# Left running in the background, holding the rank's output: the launcher waits for it.
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
print("done", flush=True)
"""


def test_a_job_ends_with_its_ranks_though_one_left_a_process_holding_its_output(
    mpi_python, make_cluster, program, tmp_path
):
    cluster = make_cluster(mpi_python)
    marker = str(tmp_path / "left-behind")
    job = cluster.mpirun(["python", program("leaves.py", LEAVES), marker], np=2, timeout=300)
    result = job.wait(timeout=120)  # the launcher alone would wait for the 600 s sleep
    assert result.ok, result.summary()
    assert not result.timed_out
    assert sorted(job.logs().query("rank >= 0").line) == ["done", "done"]
    assert any("still running" in note and "stopped" in note for note in result.notes)
    from tests.conftest import wait_gone

    assert wait_gone(marker, 10) == []  # what the ranks left went with the job


def test_cancel_stops_every_process(mpi_python, make_cluster, program, tmp_path):
    script = program("sleeper.py", HANGS)
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=2)
    first = next(iter(job.stream()))
    assert first.line == "started"
    assert job.cancel()
    result = job.wait()
    assert result.cancelled
    assert not result.ok
    assert result.failed == ()  # ranks we stopped did not fail on their own
    from tests.conftest import processes_mentioning

    assert processes_mentioning(script) == []


def test_stream_yields_records_while_the_job_runs(mpi_python, make_cluster, program, tmp_path):
    gate = tmp_path / "gate"
    script = program(
        "gated.py",
        "import os, time\nprint('waiting', flush=True)\n"
        f"while not os.path.exists({str(gate)!r}): time.sleep(0.01)\nprint('through')\n",
    )
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=1, timeout=120)
    seen = []
    for record in job.stream():
        seen.append(record.line)
        if record.line == "waiting":
            assert not job.done()  # live: the job cannot end before the gate opens
            gate.touch()
    assert seen == ["waiting", "through"]
    assert job.wait().ok


def test_awkward_output_survives(mpi_python, make_cluster, program):
    script = program(
        "awkward.py",
        "import os, sys\n"
        "os.write(1, b'half'); sys.stdout.flush()\n"
        "os.write(1, b' and half\\n')\n"
        "os.write(1, b'bad \\xff\\xfe bytes\\n')\n"
        "os.write(1, b'x' * 200000 + b'\\n')\n"
        "os.write(1, b'no newline at the end')\n",
    )
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=1, timeout=120)
    assert job.wait().ok
    lines = job.logs().line.tolist()
    assert lines[0] == "half and half"
    assert lines[1] == "bad \ufffd\ufffd bytes"
    assert "".join(lines[2:-1]) == "x" * 200000
    assert max(len(line) for line in lines) <= MAX_LINE
    assert lines[-1] == "no newline at the end"


def test_a_50_mb_line_reaches_the_log_whole_and_the_job_ends(mpi_python, make_cluster, program):
    # Open MPI's mpirun held such a line until its end, spinning for minutes on it.
    size = 50_000_000
    script = program(
        "huge.py",
        "import os\n"
        "os.write(1, b'before\\n')\n"
        "chunk = b'0123456789' * 100_000\n"
        f"for _ in range({size} // len(chunk)):\n"
        "    os.write(1, chunk)\n"
        "os.write(1, b'\\nAFTER\\n')\n",
    )
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", script], np=1, timeout=120)
    result = job.wait()
    assert result.ok, result.summary()
    on_disk = read_log_file(job.directory / "rank-0.log", 0)
    assert on_disk[0].line == "before"
    assert on_disk[-1].line == "AFTER"
    pieces = on_disk[1:-1]
    assert [p.partial for p in pieces] == [True] * (len(pieces) - 1) + [False]
    assert "".join(p.line for p in pieces) == "0123456789" * (size // 10)
    assert max(len(p.line) for p in pieces) <= MAX_LINE
    logs = job.logs()
    assert logs.line.iloc[-1] == "AFTER"
    assert logs.partial.sum() == len(pieces) - 1


def test_oversubscribe_runs_more_ranks_than_slots(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=1, slots=1)
    with pytest.raises(cb.ConfigError, match="np=3 is more than the cluster's 1 slots"):
        cluster.mpirun(["python", "-c", "pass"], np=3)
    job = cluster.mpirun(
        ["python", program("a.py", ALLREDUCE)], np=3, oversubscribe=True, timeout=120
    )
    assert job.wait().ok, job.wait().summary()


def test_stop_leaves_no_process(mpi_python, tmp_path, program):
    script = program("sleeper.py", HANGS)
    cluster = cb.Cluster.local(1, 2, python=mpi_python, run_dir=tmp_path / "run")
    with cluster:
        jobs = [cluster.mpirun(["python", script], np=2) for _ in range(2)]
        for job in jobs:
            next(iter(job.stream()))
        assert cluster.status().state.tolist() == ["running"]
    from tests.conftest import processes_mentioning

    assert processes_mentioning(script) == []
    assert all(job.outcome is not None and job.outcome.cancelled for job in jobs)
    assert cluster.status().state.tolist() == ["left"]
    cluster.stop()  # idempotent


def test_status_shows_nodes_and_ranks(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=2, slots=2)
    frame = cluster.status()
    assert frame.node.tolist() == ["local-0", "local-1"]
    assert frame.state.tolist() == ["joined", "joined"]
    # What the agents report: load, memory in use and the machine's memory.
    import psutil

    total = psutil.virtual_memory().total / 2**30
    assert frame["memory_gib"].tolist() == [total] * 2
    assert all(0 < used < total for used in frame["memory_used_gib"])
    assert all(load >= 0 for load in frame["load"])
    job = cluster.mpirun(["python", program("s.py", HANGS)], np=3, oversubscribe=True)
    next(iter(job.stream()))
    frame = cluster.status()
    assert frame.state.tolist() == ["running", "running"]
    assert frame.ranks.tolist() == [[0, 1], [2]]
    job.cancel()
    assert cluster.status().state.tolist() == ["joined", "joined"]
    assert "2 nodes, 4 slots" in repr(cluster)


def test_logs_are_on_disk_while_the_job_runs(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python)
    job = cluster.mpirun(["python", program("s.py", HANGS)], np=2)
    got = threading.Event()
    for record in job.stream():
        if record.line == "started":
            got.set()
            break
    assert got.is_set()
    path = Path(job.directory) / f"rank-{record.rank}.log"
    assert "started" in path.read_text()  # readable before the job ends
    job.cancel()


def test_subscribers_see_every_change(mpi_python, tmp_path, program):
    seen: list[cb.ClusterSnapshot] = []
    done = threading.Event()

    def record(snapshot: cb.ClusterSnapshot) -> None:
        seen.append(snapshot)
        if snapshot.jobs and snapshot.jobs[-1].state == "succeeded":
            done.set()

    cluster = cb.Cluster.local(1, 2, python=mpi_python, run_dir=tmp_path / "run")
    unsubscribe = cluster.subscribe(record)
    with cluster:
        job = cluster.mpirun(["python", program("a.py", ALLREDUCE)], np=2, timeout=120)
        job.wait()
        assert done.wait(10)
        unsubscribe()
        cluster.mpirun(["python", "-c", "pass"], np=1, timeout=120).wait()
    # Heartbeats publish too; what matters is the order of the changes seen.
    states: list[tuple[str, tuple[str, ...]]] = []
    for s in seen:
        entry = (s.state, tuple(j.state for j in s.jobs))
        if not states or states[-1] != entry:
            states.append(entry)
    assert states[-3:] == [
        ("running", ()),
        ("running", ("running",)),
        ("running", ("succeeded",)),
    ]
    assert all(len(s.jobs) <= 1 for s in seen)  # nothing after unsubscribe
    running = next(s for s in seen if s.jobs and s.jobs[0].state == "running")
    assert running.nodes[0].state == "running"
    assert running.nodes[0].ranks == (0, 1)


def test_a_finished_job_has_a_timeline_of_its_ranks(mpi_python, make_cluster, program):
    cluster = make_cluster(mpi_python, workers=2, slots=1)
    job = cluster.mpirun(["python", program("a.py", ALLREDUCE)], np=2, timeout=120)
    result = job.wait()
    assert result.ok, result.summary()
    frame = result.timeline()
    assert frame["rank"].tolist() == [0, 1]
    assert frame["exit_code"].tolist() == [0, 0]
    assert (frame["end"] >= frame["start"]).all()
    assert frame["host"].notna().all()
    assert "cb-timeline" in job._repr_html_()
