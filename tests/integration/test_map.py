"""``cluster.map`` on local clusters with the real Open MPI and the real MPICH: a sweep goes past
a failing item, a rank killed under an item, the pool's life (stopped with the cluster, or when
idle), and another local user against the pool's channel."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from clusterbook.errors import ItemFailedError
from clusterbook.functions.sweep import pool_for
from tests.users import LocalUser

pytestmark = pytest.mark.mpi


def _wait(condition, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_sweep_of_50_items_goes_past_a_failing_one(make_cluster, mpi_python) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(mpi_python, workers=2, slots=1)
    scale = 3

    class Point:  # a class of the caller's, as a notebook defines them: sent by value
        def __init__(self, x: int) -> None:
            self.x = x

    def f(p: Point) -> tuple[int, int]:
        if p.x == 13:
            raise ValueError(f"thirteen is unlucky ({p.x})")
        return p.x * scale, os.getpid()

    result = cluster.map(f, [Point(i) for i in range(50)], progress=False)
    assert len(result) == 50
    assert set(result.failed) == {13}
    values = result.values()
    assert [v[0] for i, v in enumerate(values) if i != 13] == [3 * i for i in range(50) if i != 13]
    assert len({v[1] for v in values if v}) > 1  # the items ran on several ranks
    error = result.failed[13]
    assert error.input.x == 13
    assert "raised ValueError: thirteen is unlucky (13)" in str(error)
    assert f'{__file__}", line ' in error.remote_traceback  # placed back here, with its line
    assert 'in f\n    raise ValueError(f"thirteen is unlucky ({p.x})")\n' in error.remote_traceback
    assert error.remote_traceback.endswith("ValueError: thirteen is unlucky (13)\n")
    assert isinstance(error.exception, ValueError)
    with pytest.raises(ItemFailedError):
        result[13]
    # the pool stays up: the next sweep is not a new job, and may finish in any order
    again = cluster.map(lambda x: -x, range(20), ordered=False, progress=False)
    assert sorted(again) == sorted(-x for x in range(20))
    assert set(again.indices) == set(range(20))
    assert len(cluster.jobs) == 1


def test_a_rank_killed_mid_sweep_gives_its_item_to_a_new_pool(
    make_cluster, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    marks = tmp_path / "marks"
    marks.mkdir()

    def f(x: int) -> int:
        (marks / f"{x}-{os.getpid()}").touch()
        time.sleep(0.3 if x == 5 else 0.01)
        return x + 1

    def kill_the_rank_of_item_5() -> None:
        assert _wait(lambda: any(marks.glob("5-*")), 60)
        os.kill(int(next(marks.glob("5-*")).name.split("-")[1]), signal.SIGKILL)

    killer = threading.Thread(target=kill_the_rank_of_item_5)
    killer.start()
    result = cluster.map(f, range(12), progress=False)
    killer.join()
    assert list(result) == [x + 1 for x in range(12)]
    assert len(list(marks.glob("5-*"))) == 2  # item 5 ran again, on a rank of a new pool
    assert len(cluster.jobs) == 2


def test_an_item_that_kills_its_rank_fails_naming_the_rank_and_host(
    make_cluster, openmpi_python
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)

    def f(x: int) -> int:
        if x == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return x

    result = cluster.map(f, range(8), progress=False)
    assert set(result.failed) == {3}
    assert [result[i] for i in range(8) if i != 3] == [0, 1, 2, 4, 5, 6, 7]
    error = result.failed[3]
    assert error.attempts == 2  # run again once: a rank's death may be another rank's doing
    assert error.rank in (0, 1)
    assert error.host == os.uname().nodename
    assert f"lost its rank: rank {error.rank} on {error.host}" in str(error)


def test_the_pool_stops_with_the_cluster(make_cluster, openmpi_python) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    pids = set(cluster.map(lambda _: os.getpid(), range(10), progress=False))
    pool = pool_for(cluster, 2)
    assert {r.pid for r in pool.ranks} == pids
    cluster.stop()
    assert pool.stopped
    assert _wait(lambda: not any(psutil.pid_exists(p) for p in pids), 10)
    assert cluster.jobs[0].done()


def test_an_idle_pool_stops_and_a_later_sweep_starts_another(make_cluster, openmpi_python) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    pool = pool_for(cluster, 2, idle_timeout=0.5)
    pids = {r.pid for r in pool.ranks}
    assert _wait(lambda: pool.stopped, 30)
    assert _wait(lambda: not any(psutil.pid_exists(p) for p in pids), 10)
    assert list(cluster.map(abs, [-1, -2], progress=False)) == [1, 2]
    assert len(cluster.jobs) == 2


# As another user: dial the pool, show a proof made with a guessed secret, and read what comes
# back; then try to read a rank's environment, where its secret is.
INTRUDER = """\
import json, socket, ssl, struct, sys
port, pid = int(sys.argv[1]), sys.argv[2]
said = {}
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
sock = ctx.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10))
size, = struct.unpack("!I", sock.recv(4))
nonce = sock.recv(size)
said["nonce"] = len(nonce)
hello = json.dumps({"rank": 0, "host": "intruder", "pid": 1}).encode()
sock.sendall(struct.pack("!I", 32 + len(hello)) + b"x" * 32 + hello)
try:
    said["after"] = sock.recv(100).hex()
except (OSError, ssl.SSLError) as exc:
    said["after"] = type(exc).__name__
try:
    open(f"/proc/{pid}/environ", "rb").read()
    said["environ"] = "read"
except OSError as exc:
    said["environ"] = type(exc).__name__
print(json.dumps(said))
"""


@pytest.mark.root
def test_another_user_can_neither_take_an_item_nor_learn_the_secret(
    make_cluster, openmpi_python, other_user: LocalUser
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    assert list(cluster.map(abs, [-1], progress=False)) == [1]
    pool = pool_for(cluster, 2)
    rank = pool.ranks[0]
    run = other_user.run_python(INTRUDER, str(pool.port), str(rank.pid), timeout=60)
    assert run.returncode == 0, run.stderr
    said = json.loads(run.stdout)
    assert said["nonce"] == 32  # it reached the listener...
    assert said["after"] in ("", "SSLEOFError", "ConnectionResetError")  # ...and was let go
    assert said["environ"] == "PermissionError"
    assert [r.pid for r in pool.ranks] == [r.pid for r in pool_for(cluster, 2).ranks]
    assert pool.alive == 2  # no rank of the intruder's was admitted
    assert list(cluster.map(abs, range(-5, 0), progress=False)) == [5, 4, 3, 2, 1]
    assert len(cluster.jobs) == 1


def test_nothing_of_an_item_goes_through_the_logs(make_cluster, openmpi_python) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=1, slots=2)
    secret = "item-7f3a9c"  # noqa: S105 (a marker to look for, no password)
    assert list(cluster.map(lambda s: s.upper(), [secret], progress=False)) == [secret.upper()]
    job = cluster.jobs[0]
    files = [p for p in Path(job.directory).rglob("*") if p.is_file()]
    assert files  # the pool's job has its files, like any job
    for path in files:
        text = path.read_bytes()
        assert secret.encode() not in text
        assert secret.upper().encode() not in text


def test_items_of_several_ranks_each_run_as_jobs_and_a_failing_one_is_named(
    make_cluster, openmpi_python
) -> None:  # type: ignore[no-untyped-def]
    cluster = make_cluster(openmpi_python, workers=2, slots=1)

    def world(x: int) -> tuple[int, int, int]:
        from mpi4py import MPI

        comm = MPI.COMM_WORLD
        if x == 3 and comm.rank == 1:
            raise RuntimeError(f"rank 1 refuses {x}")
        return x, comm.size, comm.allreduce(comm.rank)  # rank 0's value is the item's

    result = cluster.map(world, range(5), np=2, progress=False)
    assert set(result.failed) == {3}
    assert result.values() == [(0, 2, 1), (1, 2, 1), (2, 2, 1), None, (4, 2, 1)]
    error = result.failed[3]
    assert error.input == 3
    assert "rank 1 refuses 3" in str(error)
    assert "RuntimeError: rank 1 refuses 3" in error.remote_traceback
    assert len(cluster.jobs) == 5  # an MPI job an item, no pool


def test_a_function_the_ranks_cannot_import_fails_its_items_and_the_pool_stays(
    make_cluster, openmpi_python, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import importlib
    import sys

    (tmp_path / "only_here.py").write_text("def double(x):\n    return 2 * x\n")
    sys.path.insert(0, str(tmp_path))
    try:  # an importable module's function is pickled by reference; the ranks lack it
        only_here = importlib.import_module("only_here")
        cluster = make_cluster(openmpi_python, workers=1, slots=2)
        result = cluster.map(only_here.double, [1, 2, 3], progress=False)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_here", None)
    assert set(result.failed) == {0, 1, 2}
    assert "cannot be loaded on this rank" in str(result.failed[0])
    assert "No module named 'only_here'" in str(result.failed[0])
    (pool,) = [job for job in cluster.jobs if not job.done()]  # the pool's ranks stayed
    assert cluster.map(abs, [-1, -2], progress=False).values() == [1, 2]
    assert not pool.done()  # the same pool ran the next sweep
