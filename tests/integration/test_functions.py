"""Functions as jobs (``cluster.submit``), jobs as futures and the executor, with real MPI on
local clusters, on fake SSH hosts that share no files with the head, on the Slurm test bed and
through a detached cluster's supervisor."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import sys
import threading
import traceback

import cloudpickle
import pytest

import clusterbook as cb
from clusterbook.functions.values import RemoteTraceback
from tests.integration.test_elastic import agents as agents_fixture
from tests.integration.test_elastic import elastic as elastic_fixture
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture
from tests.testbed import Testbed, unshared
from tests.testbed import testbed as fake_hosts

pytestmark = pytest.mark.mpi
# The functions below travel by value, as a notebook's do: the ranks' Python (MPICH's venv)
# has no pytest to import this module with.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
testbed, slurm, slurmbed = fake_hosts, slurm_fixture, slurmbed_fixture
elastic, agents = elastic_fixture, agents_fixture


def allreduce(offset: int) -> tuple[int, int, int]:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    return comm.rank, comm.size, comm.allreduce(comm.rank + offset)


def fails_on_rank_one(word: str) -> str:
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise ValueError(f"rank one says {word}")
    return word


def test_a_function_runs_on_every_rank_and_its_values_come_back_by_rank(mpi_python, make_cluster):
    cluster = make_cluster(mpi_python, workers=2, slots=2)
    job = cluster.submit(allreduce, 10, np=4, oversubscribe=True)  # 4 ranks, 2 cores
    assert job.result(timeout=120) == [(r, 4, 46) for r in range(4)]
    assert job.done()
    assert job.exception() is None
    # The values came back as files in the job's directory, never through the logs.
    kept = sorted(p.name for p in (job.directory / "values").iterdir())
    assert kept == [f"rank-{r}.value" for r in range(4)]
    assert job.logs().empty or "46" not in " ".join(job.logs()["line"])


def test_values_are_read_after_the_cluster_stopped(openmpi_python, make_cluster):
    cluster = make_cluster(openmpi_python)
    job = cluster.submit(lambda: "kept", np=2)
    job.wait(timeout=120)
    cluster.stop()  # its nodes share this machine's files: the values are here
    assert job.result() == ["kept", "kept"]


def test_lambdas_and_closures_travel_by_value(mpi_python, make_cluster):
    cluster = make_cluster(mpi_python)
    scale = 3
    numbers = [1, 2, 3]

    def closure(extra: int) -> int:
        return sum(n * scale for n in numbers) + extra

    assert cluster.submit(closure, 1, np=2).result(timeout=120) == [19, 19]
    assert cluster.submit(lambda: os.environ["RANK"]).result(timeout=120) == ["0", "1"]


def test_a_raising_rank_fails_the_job_with_its_traceback_as_the_cause(mpi_python, make_cluster):
    cluster = make_cluster(mpi_python)
    job = cluster.submit(fails_on_rank_one, "no", np=2)
    with pytest.raises(
        cb.JobFailedError, match=r"rank 1 on \S+ raised ValueError: rank one"
    ) as info:
        job.result(timeout=120)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert cause.rank == 1
    assert "in fails_on_rank_one" in cause.text
    assert 'raise ValueError(f"rank one says {word}")' in cause.text
    shown = "".join(traceback.format_exception(info.value))
    assert "rank one says no" in shown  # printed as a traceback above the error
    assert "The above exception was the direct cause" in shown
    assert isinstance(job.exception(), cb.JobFailedError)
    assert info.value.result is job.outcome
    assert job.outcome is not None
    assert job.outcome.failed_ranks == [1]


def test_what_cannot_be_pickled_is_named_before_any_rank_starts(openmpi_python, make_cluster):
    cluster = make_cluster(openmpi_python)
    lock = threading.Lock()
    with pytest.raises(cb.SerializationError, match=r"argument 1 \(lock\) cannot be pickled"):
        cluster.submit(fails_on_rank_one, "fine", lock)
    with pytest.raises(cb.SerializationError, match=r"the function .*<lambda> cannot be pickled"):
        cluster.submit(lambda: lock)
    assert cluster.jobs == []
    assert not (cluster.run_dir / "functions").exists()  # nothing was written


def test_a_return_value_that_cannot_be_pickled_names_the_rank_and_its_type(
    openmpi_python, make_cluster
):
    cluster = make_cluster(openmpi_python)
    job = cluster.submit(lambda: threading.Lock() if os.environ["RANK"] == "1" else 1, np=2)
    with pytest.raises(cb.JobFailedError, match=r"rank 1 on \S+ returned a _thread.lock, which"):
        job.result(timeout=120)


def test_job_options_apply_to_function_jobs(openmpi_python, make_cluster, tmp_path):
    cluster = make_cluster(openmpi_python)
    env = cluster.submit(lambda: os.environ["GREETING"], env={"GREETING": "hi"}, np=1)
    assert env.result(timeout=120) == ["hi"]

    marker = tmp_path / "tried"

    def fails_once() -> int:
        if not marker.exists():
            marker.write_text("once")
            raise RuntimeError("the first attempt fails")
        return 7

    retried = cluster.submit(fails_once, np=1, retries=1, backoff=0)
    assert retried.result(timeout=120) == [7]
    assert retried.outcome is not None
    assert [a.outcome for a in retried.outcome.attempts] == ["failure", "ok"]

    slow = cluster.submit(lambda: __import__("time").sleep(60), np=1, timeout=1)
    with pytest.raises(cb.JobFailedError, match="timed out"):
        slow.result(timeout=120)
    assert slow.outcome is not None
    assert slow.outcome.timed_out


def test_await_and_callbacks_of_a_function_job(openmpi_python, make_cluster):
    cluster = make_cluster(openmpi_python)

    async def main() -> list[object]:
        return await cluster.submit(lambda: 42, np=2)

    assert asyncio.run(main()) == [42, 42]
    job = cluster.submit(lambda: 5, np=1)
    seen = concurrent.futures.Future[object]()
    job.add_done_callback(lambda j: seen.set_result(j.result()))
    assert seen.result(timeout=120) == [5]


def test_the_executors_futures_are_real_futures(openmpi_python, make_cluster):
    cluster = make_cluster(openmpi_python)
    with cluster.executor() as pool:
        assert pool.max_running == 2  # two slots, a rank each
        futures = [pool.submit(pow, 2, n) for n in range(4)]
        done, pending = concurrent.futures.wait(futures, timeout=120)
        assert (len(done), pending) == (4, set())
        assert sorted(f.result() for f in concurrent.futures.as_completed(futures)) == [1, 2, 4, 8]
        assert list(pool.map(lambda x: x * x, range(3))) == [0, 1, 4]

        async def wrapped() -> object:
            return await asyncio.wrap_future(pool.submit(lambda: "async"))

        assert asyncio.run(wrapped()) == "async"
        failing = pool.submit(fails_on_rank_one, "x")  # np=1: rank 0 only, which returns
        assert failing.result(timeout=120) == "x"
    assert all(j.done() for j in pool.jobs)
    with pytest.raises(cb.ClusterStateError, match="shut down"):
        pool.submit(pow, 2, 2)


def test_shutdown_cancels_the_futures_that_wait(openmpi_python, make_cluster, tmp_path):
    cluster = make_cluster(openmpi_python)
    gate = tmp_path / "gate"

    def waits() -> str:
        import time

        while not gate.exists():
            time.sleep(0.05)
        return "ran"

    pool = cluster.executor(max_running=1)
    first = pool.submit(waits)
    rest = [pool.submit(waits) for _ in range(3)]
    assert rest[0].cancel()  # not started: it can be cancelled
    pool.shutdown(wait=False, cancel_futures=True)
    assert all(f.cancelled() for f in rest)
    gate.write_text("open")
    assert first.result(timeout=120) == "ran"
    assert len(pool.jobs) == 1


NOTEBOOK_MAIN = """\
import sys
import clusterbook as cb

class Point:
    def __init__(self, x):
        self.x = x

    def doubled(self):
        return Point(self.x * 2)

def move(p):
    import os
    return p.doubled().x + int(os.environ["RANK"])

with cb.Cluster.local(1, 2, python=sys.argv[1], run_dir=sys.argv[2]) as cluster:
    print(cluster.submit(move, Point(20), np=2).result(timeout=120))
    print(cluster.submit(lambda: Point(1)).result(timeout=120)[1].x)
"""


def test_functions_and_classes_of_main_run_as_a_notebooks_do(openmpi_python, tmp_path):
    script = tmp_path / "notebook.py"
    script.write_text(NOTEBOOK_MAIN)
    run = subprocess.run(
        [sys.executable, str(script), openmpi_python, str(tmp_path / "run")],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["[40, 41]", "1"]


def test_a_detached_cluster_runs_functions_through_its_supervisor(openmpi_python, tmp_path):
    cluster = cb.Cluster.local(1, 2, python=openmpi_python, detached=True, run_dir=tmp_path / "d")
    with cluster:
        job = cluster.submit(allreduce, 1, np=2)
        assert isinstance(job, cb.Job.load(job.directory).__class__)  # read from its directory
        assert job.result(timeout=120) == [(0, 2, 3), (1, 2, 3)]
        with pytest.raises(cb.JobFailedError, match="raised ValueError"):
            cluster.submit(fails_on_rank_one, "x", np=2).result(timeout=120)
        with cluster.executor() as pool:
            assert list(pool.map(abs, [-1, -2])) == [1, 2]

        async def main() -> object:
            return await cluster.submit(lambda: "awaited", np=1)

        assert asyncio.run(main()) == ["awaited"]  # a job read from its directory awaits too
        with cb.Cluster.attach(cluster.id) as handle:  # as another kernel would
            assert handle.submit(lambda: "there", np=2).result(timeout=120) == ["there"] * 2
            with handle.executor() as pool:
                assert pool.submit(abs, -3).result(timeout=120) == 3


@pytest.mark.root
@pytest.mark.sshd
def test_functions_on_ssh_hosts_that_share_no_files_with_the_head(
    testbed: Testbed, mpi_python, tmp_path
):
    run_dir = tmp_path / "run"
    hosts = testbed.hosts[:2]
    with (
        unshared(hosts, run_dir, tmp_path) as seen,
        testbed.cluster(mpi_python, run_dir, hosts=2) as cluster,
    ):
        job = cluster.submit(lambda: __import__("socket").gethostname(), np=2, timeout=120)
        assert sorted(job.result(timeout=120)) == ["node1", "node2"]
        # Each node ran in a directory of its own: the call went there, the values came back.
        assert all(list((seen[h.name] / "functions").iterdir()) for h in hosts)
        with pytest.raises(cb.JobFailedError) as info:
            cluster.submit(fails_on_rank_one, "far", np=2).result(timeout=120)
        assert isinstance(info.value.__cause__, RemoteTraceback)
        assert info.value.__cause__.host in ("node1", "node2")


@pytest.mark.slurm
def test_functions_on_a_slurm_cluster(slurm, openmpi_python, tmp_path):
    with cb.Cluster.slurm(
        nodes=2, time="10m", python=openmpi_python, run_dir=tmp_path / "r"
    ) as cluster:
        cluster.wait_ready(timeout=60)
        job = cluster.submit(allreduce, 0, np=2, timeout=120)
        assert job.result(timeout=180) == [(0, 2, 1), (1, 2, 1)]
        with pytest.raises(cb.JobFailedError, match="raised ValueError"):
            cluster.submit(fails_on_rank_one, "x", np=2).result(timeout=180)


def test_functions_on_an_elastic_cluster(elastic, agents):
    cluster = elastic(2, 2, last_call=0.5)
    for i in range(2):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    job = cluster.submit(allreduce, 0, np=2, timeout=120)
    assert job.result(timeout=180) == [(0, 2, 1), (1, 2, 1)]


# Run inside a Slurm allocation: the cluster is the allocation, its jobs steps through srun.
IN_ALLOCATION = """\
import json, socket, sys
import clusterbook as cb

python, out = sys.argv[1], sys.argv[2]
report = {}
try:
    with cb.Cluster.from_environment(python=python, run_dir=out + ".run") as cluster:
        report["kind"] = cluster.kind
        job = cluster.submit(lambda: socket.gethostname(), np=2, timeout=120)
        report["hosts"] = job.result(timeout=180)
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
with open(out, "w") as f:
    json.dump(report, f)
"""


@pytest.mark.slurm
def test_functions_as_steps_of_a_slurm_allocation(slurm, openmpi_python, tmp_path):
    import json

    head, out = tmp_path / "head.py", tmp_path / "report.json"
    head.write_text(IN_ALLOCATION)
    env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
    argv = ["salloc", "-N2", "-n2", sys.executable, str(head), openmpi_python, str(out)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert out.exists(), done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report == {"kind": "srun", "hosts": list(slurm.hosts)}
