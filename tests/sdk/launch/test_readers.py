"""How a launcher's output reaches a job's log store: real pipes, real files, a real process."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import pytest

from clusterbook.launch.command import LaunchPlan
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.logs import LAUNCHER_RANK
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.parse import LabelParser, OmpiChunkParser
from clusterbook.launch.readers import read_batches, read_launcher, start_readers, tail_files
from clusterbook.spec import NodeSpec

OMPI = Launcher(path="/opt/mpi/bin/mpirun", flavour=MPIFlavour.OPENMPI, version="5.0.11")
MPICH = Launcher(path="/opt/mpich/bin/mpiexec", flavour=MPIFlavour.MPICH, version="4.2.3")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LogStore]:
    made = LogStore(tmp_path, {0: "n0", 1: "n1"}, launcher_host="head")
    yield made
    made.close()


def lines(store: LogStore) -> list[tuple[int, str, str, bool]]:
    return [(r.rank, r.stream, r.line, r.partial) for r in store.records()]


def piped(data: bytes) -> IO[bytes]:
    """A pipe's reading end that gives ``data``, then its end."""
    read, write = os.pipe()
    os.write(write, data)
    os.close(write)
    return os.fdopen(read, "rb", buffering=0)


def test_open_mpis_tagged_output_is_each_ranks(store: LogStore) -> None:
    data = b"[1,0]<stdout>: hello\n[1,1]<stderr>: oops\n[1,0]<stdout>: no newline"
    read_batches(OmpiChunkParser(), piped(data), store)
    assert lines(store) == [
        (0, "stdout", "hello", False),
        (1, "stderr", "oops", False),
        (0, "stdout", "no newline", False),
    ]


def test_open_mpis_chunks_written_line_by_line_reach_the_files_whole_and_in_order(
    tmp_path: Path, store: LogStore
) -> None:
    # Two ranks printing line by line, as mpirun passes them on: a small write per chunk,
    # chunks cut mid-line, a line longer than a read (64 KiB), rank 1 ending mid-line.
    long = "y" * 100_000
    expected = {
        0: [f"rank 0 line {i}" for i in range(3000)],
        1: [*(f"rank 1 line {i}" for i in range(2999)), long, "rank 1 ends mid-line"],
    }
    read, write = os.pipe()

    def writer() -> None:
        with os.fdopen(write, "wb") as pipe:
            for i in range(3000):
                for rank in (0, 1):
                    line = (expected[rank][i] + "\n").encode()
                    if rank == 1 and i == 2999:
                        line = long.encode() + b"\nrank 1 ends mid-line"
                    for cut in range(0, len(line), 9):
                        pipe.write(b"[1,%d]<stdout>: " % rank + line[cut : cut + 9])
                    pipe.flush()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    read_batches(OmpiChunkParser(), os.fdopen(read, "rb", buffering=0), store)
    thread.join(timeout=30)
    store.close()
    for rank in (0, 1):
        with open(tmp_path / f"rank-{rank}.log", encoding="utf-8") as f:
            assert [raw.rstrip("\n").split(" ", 2)[2] for raw in f] == expected[rank]
        assert [r.line for r in store.records() if r.rank == rank] == expected[rank]


def test_sruns_labelled_lines_are_each_ranks_and_its_own_the_launchers(store: LogStore) -> None:
    data = b"0: a\n1: b\nsrun: error: task 1 failed\n"
    read_batches(LabelParser("stderr"), piped(data), store)
    assert lines(store) == [
        (0, "stderr", "a", False),
        (1, "stderr", "b", False),
        (LAUNCHER_RANK, "stderr", "srun: error: task 1 failed", False),
    ]


def test_the_launchers_own_lines_and_its_last_without_newline(store: LogStore) -> None:
    read_launcher(piped(b"one\ntwo"), "stdout", store)
    assert lines(store) == [
        (LAUNCHER_RANK, "stdout", "one", False),
        (LAUNCHER_RANK, "stdout", "two", False),
    ]


def test_mpichs_files_are_followed_until_the_launcher_has_exited(
    tmp_path: Path, store: LogStore
) -> None:
    out = tmp_path / "raw"
    out.mkdir()
    (out / "rank-0.stdout").write_bytes(b"first\n")
    (out / "not-a-rank.txt").write_bytes(b"ignored\n")
    exited = threading.Event()
    reader = threading.Thread(target=tail_files, args=(out, store, exited))
    reader.start()
    try:
        with open(out / "rank-1.stderr", "ab") as f:
            f.write(b"late")
        with open(out / "rank-0.stdout", "ab") as f:
            f.write(b"second\n")
    finally:
        exited.set()
        reader.join(timeout=10)
    assert not reader.is_alive()
    got = lines(store)
    assert [x for x in got if x[0] == 0] == [
        (0, "stdout", "first", False),
        (0, "stdout", "second", False),
    ]
    assert [x for x in got if x[0] == 1] == [(1, "stderr", "late", False)]  # flushed at the end


def _plan(launcher: Launcher, out: Path) -> LaunchPlan:
    return LaunchPlan(
        launcher=launcher,
        nodes=(NodeSpec("local-0", "localhost", 2),),
        np=2,
        argv=("prog",),
        env={},
        hostfile="hostfile",
        output_dir=str(out),
    )


def _unguarded(target: Callable[..., None]) -> Callable[..., None]:
    return target


@pytest.mark.parametrize("launcher", [OMPI, MPICH], ids=["openmpi", "mpich"])
def test_each_launcher_has_its_output_read_where_it_writes_it(
    tmp_path: Path, store: LogStore, launcher: Launcher
) -> None:
    out = tmp_path / "raw"
    out.mkdir()
    (out / "rank-1.stdout").write_bytes(b"from a file\n")
    script = "printf '[1,0]<stdout>: tagged\\n'; echo own >&2"
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    exited = threading.Event()
    threads = start_readers(
        proc, _plan(launcher, out), store, exited, guarded=_unguarded, name="test-io"
    )
    proc.wait(timeout=30)
    exited.set()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads)
    got = sorted(lines(store))
    if launcher is OMPI:  # ranks tagged on stdout, its own on stderr; no files read
        assert got == [(LAUNCHER_RANK, "stderr", "own", False), (0, "stdout", "tagged", False)]
    else:  # its pipes are its own; the ranks' output is in their files
        assert got == [
            (LAUNCHER_RANK, "stderr", "own", False),
            (LAUNCHER_RANK, "stdout", "[1,0]<stdout>: tagged", False),
            (1, "stdout", "from a file", False),
        ]
