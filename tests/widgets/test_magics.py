"""``%cluster`` and ``%%mpirun`` in a real IPython shell with real local clusters and the venv's
Open MPI (their arguments: test_arguments.py; the rank script: test_mpirun_cell.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from IPython import get_ipython
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import clusterbook as cb
from clusterbook.nodes.tasks.program import ENTRY
from clusterbook_widgets.cell_job import CellError
from clusterbook_widgets.magics import ClusterMagics
from tests.conftest import processes_mentioning, wait_gone

# -- the magics, for real ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def ip():  # type: ignore[no-untyped-def]
    # start_ipython() returns the shell only the first time it is called in a session.
    return start_ipython() or get_ipython()


def cluster_processes(before: set[int]) -> list[psutil.Process]:
    """Live descendants of this process that were not there before (but the session's guard,
    which watches every job for as long as the kernel lives)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.pid in before or p.status() == psutil.STATUS_ZOMBIE:
                continue
            if ENTRY not in p.cmdline():
                found.append(p)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def magics(ip, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ClusterMagics]:  # type: ignore[no-untyped-def]
    """The magics on the test shell, with run directories under ``tmp_path``; no process of
    any cluster may be left afterwards."""
    monkeypatch.setenv("CLUSTERBOOK_RUN_ROOT", str(tmp_path))
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    m = ClusterMagics(ip)
    ip.register_magics(m)
    yield m
    m.stop_cluster()
    deadline = time.monotonic() + 5
    while (left := cluster_processes(before)) and time.monotonic() < deadline:
        time.sleep(0.05)
    left += wait_gone(str(tmp_path), timeout=0.5)
    names = []
    for p in left:
        with contextlib.suppress(psutil.Error):
            names.append(p.cmdline())
            p.kill()
    assert not left, f"processes left after the test: {names}"


@pytest.fixture
def cluster(magics: ClusterMagics, openmpi_python: str, tmp_path: Path) -> cb.Cluster:
    """A started local cluster of one node with two slots, current in ``magics``."""
    magics.cluster = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=tmp_path / "run")
    return magics.cluster.start()


class InterruptedAsItStarts:
    """The notebook's cluster, whose ``mpirun`` is interrupted (the stop button) as it returns:
    the job started, but the magic does not hold it yet. Everything else is the cluster's."""

    def __init__(self, cluster: cb.Cluster) -> None:
        self._cluster = cluster

    def __getattr__(self, name: str) -> object:
        return getattr(self._cluster, name)

    def mpirun(self, *args: object, **kwargs: object) -> cb.Job:
        self._cluster.mpirun(*args, **kwargs)  # type: ignore[arg-type]
        raise KeyboardInterrupt


def test_an_interrupt_as_the_job_starts_cancels_it_too(
    ip, magics: ClusterMagics, cluster: cb.Cluster, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    started = tmp_path / "started"
    cell = f"import time\nopen({str(started)!r}, 'a').close()\ntime.sleep(120)\n"
    magics.cluster = InterruptedAsItStarts(cluster)  # type: ignore[assignment]
    with capture_output() as out, pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("mpirun", "-n 2", cell)
    (job,) = cluster.jobs
    assert job.done()
    assert job.outcome is not None
    assert job.outcome.cancelled
    assert "interrupted; job-0001 was cancelled" in out.stderr
    assert processes_mentioning(str(cluster.run_dir / "cells")) == []


def test_mpirun_retries_a_failed_cell_and_says_so(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    cell = "import os, sys\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.rank\n"
    cell += "attempt = os.environ['CLUSTERBOOK_ATTEMPT']\nprint('try', attempt, 'rank', r)\n"
    cell += "if attempt == '1' and r == 1:\n    raise RuntimeError('flaky')\n"
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2 --retries 1 --backoff 0.1", cell)
    assert "%%mpirun: attempt 2\n" in out.stderr
    assert "[0] try 2 rank 0\n" in out.stdout
    assert "[1] try 2 rank 1\n" in out.stdout
    (job,) = cluster.jobs
    assert job.outcome is not None
    assert job.outcome.ok
    assert [a.outcome for a in job.outcome.attempts] == ["failure", "ok"]
    with pytest.raises(cb.ConfigError, match=r"The deadline \(1 s\) is shorter than one attempt"):
        ip.run_cell_magic("mpirun", "-n 1 --deadline 1 --timeout 5", "print(1)")


def test_mpirun_clean_none_keeps_a_failed_cells_ranks_until_the_cluster_stops(  # type: ignore[no-untyped-def]
    ip, magics: ClusterMagics, cluster: cb.Cluster
) -> None:
    cell = "from mpi4py import MPI\nif MPI.COMM_WORLD.rank == 1:\n    raise RuntimeError('bad')\n"
    cell += "MPI.COMM_WORLD.Barrier()\n"
    with capture_output(), pytest.raises(cb.JobFailedError) as raised:
        ip.run_cell_magic("mpirun", "-n 2 --clean none", cell)
    (job,) = cluster.jobs
    assert job.outcome is not None
    assert raised.value.result == job.outcome
    kept = {k.rank: k.pid for k in job.outcome.kept if k.rank is not None}
    assert set(kept) == {0, 1}
    said = str(raised.value)
    assert f"Kept stopped for inspection (--clean none): rank 0 pid {kept[0]}, rank 1 pid" in said
    assert "RuntimeError: bad" in said
    assert all(psutil.Process(pid).status() == psutil.STATUS_STOPPED for pid in kept.values())
    magics.stop_cluster()
    assert not [pid for pid in kept.values() if _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # a zombie has ended
    except psutil.Error:
        return False


def test_mpirun_streams_every_rank_with_its_prefix(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    cell = "import sys\nfrom mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
    cell += "print('hello from', r)\nprint('note', r, file=sys.stderr)\n"
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2", cell)
    assert "[0] hello from 0\n" in out.stdout
    assert "[1] hello from 1\n" in out.stdout
    assert "[0] note 0\n" in out.stderr
    assert "[1] note 1\n" in out.stderr
    assert "note" not in out.stdout
    (job,) = cluster.jobs
    assert job.outcome is not None
    assert job.outcome.ok
    assert job.np == 2
    script = (cluster.run_dir / "cells" / "cell-0001" / "cell.py").read_text()
    assert repr("print('hello from', r)\n") in script  # the cell, in the cluster's run dir


def test_push_makes_variables_visible_on_every_rank(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns["x"] = {"alpha": [1, 2, 3]}
    ip.user_ns["k"] = 7
    cell = "import os\nprint('got', x['alpha'], k, os.environ['OMPI_COMM_WORLD_RANK'])\n"
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2 --push x,k", cell)
    assert "[0] got [1, 2, 3] 7 0\n" in out.stdout
    assert "[1] got [1, 2, 3] 7 1\n" in out.stdout
    push = next((cluster.run_dir / "cells").glob("*/push.pkl"))
    assert push.stat().st_mode & 0o777 == 0o600  # notebook values are nobody else's


def test_functions_and_closures_defined_in_the_notebook_reach_every_rank(
    ip, cluster: cb.Cluster
) -> None:  # type: ignore[no-untyped-def]
    ip.run_cell("def make_scale(k):\n    return lambda v: v * k\nscale = make_scale(3)\n")
    ip.run_cell("class Point:\n    def __init__(self, x):\n        self.x = x\n")
    ip.run_cell("p = Point(5)\nsquare = lambda v: v * v\n")
    ip.user_ns.pop("made", None)
    cell = "from mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
    cell += "print('got', square(r + 2), scale(r), p.x)\nmade = [square(r + 2), scale(r)]\n"
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2 --push square,scale,p --pull made", cell)
    assert "[0] got 4 0 5\n" in out.stdout, out.stderr
    assert "[1] got 9 3 5\n" in out.stdout
    assert ip.user_ns["made"] == [[4, 0], [9, 3]]


def test_a_function_is_not_pulled_back_and_the_rank_says_why(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns.pop("made", None)
    with capture_output(), pytest.raises(cb.JobFailedError) as raised:
        ip.run_cell_magic("mpirun", "-n 1 --pull made", "made = lambda: 1\n")
    said = str(raised.value)
    assert said.startswith("job-0001 failed: rank 0 exited with code 1 on ")
    assert "Rank 0's last lines:\n    --pull made: rank 0's value cannot be sent back (" in said
    assert "pull plain data" in said
    assert said.endswith("\n--pull made: not set, the job did not succeed.")
    assert "made" not in ip.user_ns


def test_a_value_that_cannot_be_sent_is_named(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    import threading

    ip.user_ns["lock"] = threading.Lock()
    ip.user_ns["fine"] = 1
    with pytest.raises(CellError, match="--push lock: lock objects cannot be sent to the ranks"):
        ip.run_cell_magic("mpirun", "-n 1 --push fine,lock", "print(1)")
    assert magics.cluster is None  # nothing was started for a cell that cannot run


def test_push_of_an_undefined_name_says_so(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns.pop("nothing_here", None)
    ip.user_ns["fine"] = 1
    with pytest.raises(UsageError) as raised:
        ip.run_cell_magic("mpirun", "-n 1 --no-raise --push fine,nothing_here", "print(1)")
    assert str(raised.value) == (
        "%%mpirun: --push nothing_here: not defined in the notebook; define it first, or leave "
        "it out of --push."
    )
    assert magics.cluster is None  # nothing was started for a cell that cannot run


def test_pull_sets_the_ranks_values_in_rank_order(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns.pop("y", None)
    cell = "from mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
    cell += "y = {'rank': r, 'sq': (r + 3) ** 2}\n"
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2 --pull y", cell)
    assert out.stderr == ""
    assert ip.user_ns["y"] == [{"rank": 0, "sq": 9}, {"rank": 1, "sq": 16}]


BOTH_FAIL = "from mpi4py import MPI\nMPI.COMM_WORLD.Barrier()\n"
BOTH_FAIL += "def f():\n    raise ValueError('boom on purpose')\nf()\ny = 1\n"


def test_a_failed_cell_raises_its_error_told_once_with_its_ranks(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns.pop("y", None)
    with capture_output() as out, pytest.raises(cb.JobFailedError) as raised:
        ip.run_cell_magic("mpirun", "-n 2 --pull y", BOTH_FAIL)
    (job,) = cluster.jobs
    assert raised.value.result == job.outcome
    said = str(raised.value)
    # The ranks that failed and where; the error once, with its ranks, and the cell's lines.
    assert re.fullmatch(
        r"job-0001 failed: ranks? [01](, 1)? exited with code 1 on \S+\.", said.split("\n")[0]
    )
    assert said.count("ValueError: boom on purpose") == 1, said
    assert "\nError on ranks 0, 1:\nTraceback (most recent call last):\n" in said
    assert '  File "<mpirun cell 1>", line 5, in <module>\n    f()\n' in said
    assert said.endswith("\n--pull y: not set, the job did not succeed.")
    assert "MPI_ABORT" not in said + out.stderr
    assert "Traceback" not in out.stderr  # told in the error, not printed as well
    assert "y" not in ip.user_ns


def test_no_raise_prints_a_failed_cells_error_and_returns(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    ip.user_ns.pop("y", None)
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 2 --pull y --no-raise", BOTH_FAIL)
    err = out.stderr
    assert err.count("ValueError: boom on purpose") == 1, err
    assert err.count("Traceback (most recent call last):") == 1, err
    assert "Error on ranks 0, 1:\nTraceback (most recent call last):\n" in err
    assert '  File "<mpirun cell 1>", line 5, in <module>\n    f()\n' in err
    assert "MPI_ABORT" not in err  # the launcher's banner says nothing the error does not
    assert "--pull y: not set, the job did not succeed." in err
    assert "y" not in ip.user_ns
    (job,) = cluster.jobs
    assert job.outcome is not None
    assert not job.outcome.ok


def test_timeout_shows_each_ranks_stack_and_stops(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    cell = "import time\nprint('waiting', flush=True)\nwhile True:\n    time.sleep(0.1)\n"
    with capture_output() as out, pytest.raises(cb.JobFailedError) as raised:
        ip.run_cell_magic("mpirun", "-n 2 --timeout 2", cell)
    err = out.stderr
    for rank in (0, 1):
        assert f"[{rank}] Current thread 0x" in err, err
        assert f'[{rank}]   File "<mpirun cell 1>", line 4 in <module>' in err
    assert "most recent call first" in err
    assert "_clusterbook_cell" not in err  # the runner's own frames are not the user's
    assert str(raised.value) == (
        "job-0001: timed out after 2 s; the job was stopped.\n"
        "Where each rank was is in its stack above (most recent call first)."
    )
    (job,) = cluster.jobs
    assert job.outcome is not None
    assert job.outcome.timed_out
    assert processes_mentioning(str(cluster.run_dir / "cells")) == []


def test_interrupt_cancels_the_job_and_propagates(ip, cluster: cb.Cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    started = tmp_path / "started"
    cell = f"import time\nopen({str(started)!r}, 'a').close()\ntime.sleep(120)\n"

    def interrupt() -> None:  # what the notebook's stop button does to the kernel
        deadline = time.monotonic() + 20
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    t0 = time.monotonic()
    with capture_output() as out, pytest.raises(KeyboardInterrupt):
        ip.run_cell_magic("mpirun", "-n 2", cell)
    assert time.monotonic() - t0 < 20
    assert started.exists()
    (job,) = cluster.jobs
    assert job.done()
    assert job.outcome is not None
    assert job.outcome.cancelled
    assert "interrupted; job-0001 was cancelled" in out.stderr
    assert processes_mentioning(str(cluster.run_dir / "cells")) == []


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("-n 0", "-n must be >= 1, got 0"),
        ("-n x", "-n must be a whole number >= 1, got 'x'"),
        ("--pull 1bad", "'1bad' is not a Python variable name"),
        ("--frob", "unrecognized arguments: --frob"),
    ],
)
def test_bad_mpirun_arguments_raise_a_usage_error(
    ip, magics: ClusterMagics, line: str, said: str
) -> None:  # type: ignore[no-untyped-def]
    with capture_output() as out, pytest.raises(UsageError) as raised:
        ip.run_cell_magic("mpirun", f"{line} --no-raise", "print('should not run')")
    message, usage = str(raised.value).split("\nusage: ")
    assert message.startswith("%%mpirun: ")
    assert said in message
    assert usage.startswith("%%mpirun [-h] [-n N]")
    assert "should not run" not in out.stdout
    assert magics.cluster is None


def test_a_syntax_error_is_told_once_and_nothing_runs(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(CellError) as raised:
        ip.run_cell_magic("mpirun", "-n 2", "x = (\n")
    assert str(raised.value) == (
        "the cell is not valid Python, so no rank runs it:\n"
        '  File "<mpirun cell>", line 1\n    x = (\n        ^\n'
        "SyntaxError: '(' was never closed"
    )
    assert isinstance(raised.value.__cause__, SyntaxError)
    assert magics.cluster is None
    with capture_output() as out:  # --no-raise: printed, as it was
        ip.run_cell_magic("mpirun", "-n 2 --no-raise", "x = (\n")
    assert out.stderr.startswith("%%mpirun: the cell is not valid Python, so no rank runs it:")
    assert out.stderr.rstrip().endswith("SyntaxError: '(' was never closed")
    assert magics.cluster is None


def test_mpirun_without_a_cluster_starts_a_local_one(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    with capture_output() as out:
        ip.run_cell_magic("mpirun", "-n 1", "print('alone')")
    assert "[0] alone\n" in out.stdout
    assert out.stdout.startswith("Started <Cluster ")
    assert magics.cluster is not None
    assert magics.cluster.kind == "local"
    assert magics.cluster.state == "running"


def test_too_many_ranks_raises_the_rule_in_the_magics_words(ip, cluster: cb.Cluster) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(cb.ConfigError) as raised:
        ip.run_cell_magic("mpirun", "-n 3", "print(1)")
    said = str(raised.value)
    assert said.startswith("-n 3 is more than the cluster's 2 slots")
    assert "or pass --oversubscribe to run" in said  # the magic's options, not Python's
    assert "=" not in said
    assert cluster.jobs == []


def test_cluster_local_status_stop(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    with capture_output() as out:
        ip.run_line_magic("cluster", "local --workers 1 --slots 2")
    first = magics.cluster
    assert first is not None
    assert first.state == "running"
    assert out.stdout == f"Started {first!r}.\n"
    assert [n.slots for n in first.nodes] == [2]

    # A bad new cluster raises, and leaves the current one alone.
    with pytest.raises(cb.ConfigError, match=r"^Host '-evil' starts with '-'"):
        ip.run_line_magic("cluster", "ssh -- -evil:2")
    assert magics.cluster is first
    assert first.state == "running"

    with capture_output() as out:
        ip.run_line_magic("cluster", "status")
    (shown,) = out.outputs
    if importlib.util.find_spec("clusterbook_widgets.cluster_widget") is None:
        assert "local-0" in shown.data["text/plain"]
    else:  # the live widget stands in for the table
        assert "application/vnd.jupyter.widget-view+json" in shown.data
        assert first.name in shown.data["text/plain"]

    with capture_output() as out:
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    second = magics.cluster
    assert second is not first
    assert second is not None
    assert first.state == "stopped"  # a new cluster replaces the old one
    assert f"Stopped cluster {first.name!r}." in out.stdout

    with capture_output() as out:
        ip.run_line_magic("cluster", "stop")
    assert out.stdout == f"Stopped cluster {second.name!r}.\n"
    assert second.state == "stopped"
    assert magics.cluster is None

    with capture_output() as out:
        ip.run_line_magic("cluster", "status")
        ip.run_line_magic("cluster", "stop")
    assert out.stdout == (
        "No cluster is running; start one with %cluster local --workers 2.\nNo cluster to stop.\n"
    )


def test_cluster_scale_asks_the_notebooks_cluster(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(cb.ClusterStateError, match=r"No cluster to scale: start one"):
        ip.run_line_magic("cluster", "scale 2")
    with capture_output():
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    # A local cluster's nodes do not change: its Resizer says so, and what grows.
    with pytest.raises(cb.ConfigError, match=r"cluster\.scale\(\) grows and shrinks Slurm"):
        ip.run_line_magic("cluster", "scale 2")
    assert magics.cluster is not None
    assert magics.cluster.state == "running"


class AdaptRecorder:
    """A handle in the notebook's place that keeps what ``adapt`` was asked."""

    name, state = "recorded", "running"

    def __init__(self) -> None:
        self.asked: list[tuple[int, int, object, object]] = []

    def adapt(self, minimum: int, maximum: int, *, interval: object, grace: object) -> None:
        self.asked.append((minimum, maximum, interval, grace))

    def stop(self) -> None:
        pass


def test_cluster_adapt_asks_the_notebooks_cluster(ip, magics: ClusterMagics) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(cb.ClusterStateError, match=r"No cluster to adapt: start one"):
        ip.run_line_magic("cluster", "adapt 1 2")
    recorder = AdaptRecorder()
    magics.cluster = recorder  # type: ignore[assignment]
    with capture_output() as out:
        ip.run_line_magic("cluster", "adapt 1 3")
        ip.run_line_magic("cluster", "adapt 2 2 --interval 5s --grace 2m")
    assert recorder.asked == [(1, 3, 30.0, 60.0), (2, 2, 5.0, 120.0)]
    assert "'recorded' adapts between 1 and 3 node(s)" in out.stdout
    magics.cluster = None
    with capture_output():
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    # A local cluster's nodes do not change: its Resizer says so.
    with pytest.raises(cb.ConfigError, match=r"cluster\.adapt\(\) grows and shrinks Slurm"):
        ip.run_line_magic("cluster", "adapt 1 2")
    assert magics.cluster is not None
    assert magics.cluster.state == "running"


@pytest.mark.parametrize(
    ("line", "said"),
    [
        ("", "usage: %cluster"),
        ("adapt 3 1", "adapt 3 1: MIN must be at most MAX; give the fewest nodes first"),
        ("adapt 0 2", "MIN must be >= 1, got 0"),
        ("adapt 1 x", "MAX must be a whole number >= 1, got 'x'"),
        ("adapt 1 2 --interval soon", "--interval must be a duration > 0, got 'soon'"),
        ("adapt 1 2 --grace -3", "--grace must be a duration > 0, got '-3' (it is negative)"),
        ("adapt 1", "required: MAX"),
        ("launch", "invalid choice: 'launch'"),
        ("local --workers 0", "--workers must be >= 1"),
        ("ssh", "HOST[:SLOTS]"),
        ("scale 0", "N must be >= 1"),
        ("scale", "N"),
    ],
)
def test_bad_cluster_arguments_raise_a_usage_error(
    ip, magics: ClusterMagics, line: str, said: str
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(UsageError) as raised:
        ip.run_line_magic("cluster", line)
    message, usage = str(raised.value).split("\nusage: ")
    assert message.startswith("%cluster")
    assert usage.startswith("%cluster")
    assert said in str(raised.value)
    assert magics.cluster is None


def test_current_cluster_is_the_one_the_magics_started(ip, magics) -> None:
    from clusterbook_widgets import current_cluster

    assert current_cluster(ip) is None
    with capture_output():
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    cluster = current_cluster(ip)
    assert cluster is magics.cluster
    assert cluster.state == "running"
    assert current_cluster() is cluster  # the running IPython is ip
    with capture_output():
        ip.run_line_magic("cluster", "stop")
    assert current_cluster(ip) is None


def test_cluster_attach_then_mpirun_goes_through_the_head(  # type: ignore[no-untyped-def]
    ip, magics: ClusterMagics, openmpi_python: str, tmp_path: Path
) -> None:
    owner = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=tmp_path / "owned").start()
    try:
        with capture_output() as out:
            ip.run_line_magic("cluster", f"attach {owner.id}")
        assert f"Attached to <Cluster '{owner.name}' local running (attached" in out.stdout
        ip.user_ns["k"] = 5
        ip.user_ns.pop("y", None)
        cell = "from mpi4py import MPI\ny = k * (MPI.COMM_WORLD.rank + 1)\nprint('y is', y)\n"
        with capture_output() as out:
            ip.run_cell_magic("mpirun", "-n 2 --push k --pull y", cell)
        assert "[0] y is 5\n" in out.stdout, out.stderr
        assert "[1] y is 10\n" in out.stdout
        assert ip.user_ns["y"] == [5, 10]
        assert [j.id for j in owner.jobs] == ["job-0001"]  # the head ran it, as its own job
    finally:
        owner.stop()


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def test_a_magics_error_is_shown_as_its_message_and_the_users_own_keep_their_frames(
    ip, magics: ClusterMagics
) -> None:  # type: ignore[no-untyped-def]
    with capture_output() as out:
        run = ip.run_cell("%cluster ssh -- -evil:2")
    assert isinstance(run.error_in_exec, cb.ConfigError)
    shown = ANSI.sub("", out.stdout)
    assert shown.startswith("ConfigError: Host '-evil' starts with '-', which ssh and mpirun")
    assert "File " not in shown  # no frame of the magic's, nor of IPython's
    assert "Traceback" not in shown
    # The same type raised by the notebook's own code is shown with its frames.
    with capture_output() as out:
        run = ip.run_cell("import clusterbook as cb\nraise cb.ConfigError('mine')\n")
    assert isinstance(run.error_in_exec, cb.ConfigError)
    assert "Traceback (most recent call last)" in ANSI.sub("", out.stdout)


def test_a_cluster_that_cannot_be_reached_raises_and_the_current_one_stays(
    ip, magics: ClusterMagics
) -> None:  # type: ignore[no-untyped-def]
    with capture_output():
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    first = magics.cluster
    assert first is not None
    with pytest.raises(cb.UnknownClusterError, match=r"^No cluster 'no-such-cluster' under "):
        ip.run_line_magic("cluster", "attach no-such-cluster")
    assert magics.cluster is first
    assert first.state == "running"


def test_mpirun_does_not_run_the_cell_elsewhere_when_the_notebooks_cluster_stopped(
    ip, magics: ClusterMagics
) -> None:  # type: ignore[no-untyped-def]
    with capture_output():
        ip.run_line_magic("cluster", "local --workers 1 --slots 1")
    first = magics.cluster
    assert first is not None
    first.stop()  # its time ran out, or another kernel stopped it
    with pytest.raises(cb.ClusterStateError, match=f"cluster {first.name!r} is stopped"):
        ip.run_cell_magic("mpirun", "-n 1", "print('where?')")
    assert magics.cluster is first  # no other cluster was started in its place
    with capture_output() as out:
        ip.run_line_magic("cluster", "stop")
        ip.run_cell_magic("mpirun", "-n 1", "print('here')")  # asked for: a local one
    assert "[0] here\n" in out.stdout
    assert magics.cluster is not first
    assert magics.cluster.state == "running"


def test_mpirun_does_not_run_the_cell_elsewhere_when_the_asked_cluster_did_not_start(
    ip, magics: ClusterMagics, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    config = tmp_path / "config"
    config.mkdir(mode=0o700)
    (config / "profiles.toml").write_text(  # nothing listens on port 1: start() fails
        '[profiles.far]\nkind = "ssh"\nhosts = ["127.0.0.1"]\nport = 1\nconnect_timeout = 1\n'
    )
    monkeypatch.setenv("CLUSTERBOOK_CONFIG", str(config))
    with pytest.raises(cb.ClusterError):
        ip.run_line_magic("cluster", "profile far")
    assert magics.cluster is None
    with pytest.raises(cb.ClusterStateError, match="the last %cluster command asked for did not"):
        ip.run_cell_magic("mpirun", "-n 1", "print('where?')")
    assert magics.cluster is None
