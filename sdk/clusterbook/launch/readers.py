"""How a launcher's output reaches a job's log store: which pipes and files are read for each
launcher, and how each is read, as it comes.

Open MPI's ``mpirun`` writes every rank's output tagged on its stdout and its own on its
stderr; ``srun`` writes every rank's lines behind its label on its stdout and stderr; MPICH's
Hydra writes each rank's streams to their own files (``-outfile-pattern``), followed here
until the launcher has exited, and its own output on its pipes. Each reader runs in a thread of
its own until its pipe closes (or, for the files, until the launcher has exited).
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from clusterbook.launch.command import LaunchPlan
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.parse import LabelParser, LineSplitter, OmpiChunkParser, as_lines

__all__ = ["read_batches", "read_launcher", "start_readers", "tail_files"]

_READ = 65536
#: How often the files of MPICH's ranks are looked at while the launcher runs (seconds).
_TAIL_EVERY = 0.02


def start_readers(
    proc: subprocess.Popen[bytes],
    plan: LaunchPlan,
    store: LogStore,
    exited: threading.Event,
    *,
    guarded: Callable[[Callable[..., None]], Callable[..., None]],
    name: str,
) -> list[threading.Thread]:
    """Start a thread named ``name`` for each source of ``proc``'s output (``plan`` says which
    launcher it is), each adding what it reads to ``store``; ``exited`` is set once the
    launcher has exited; ``guarded`` wraps each reader (an exception in it fails the job)."""
    out, err = proc.stdout, proc.stderr
    assert out is not None
    assert err is not None
    work: list[tuple[Callable[..., None], tuple[Any, ...]]]
    if plan.remote is not None and plan.remote.srun is not None:
        work = [
            (read_batches, (LabelParser("stdout"), out, store)),
            (read_batches, (LabelParser("stderr"), err, store)),
        ]
    elif plan.launcher.flavour is MPIFlavour.OPENMPI:
        work = [
            (read_batches, (OmpiChunkParser(), out, store)),
            (read_launcher, (err, "stderr", store)),
        ]
    else:
        work = [
            (read_launcher, (out, "stdout", store)),
            (read_launcher, (err, "stderr", store)),
            (tail_files, (Path(plan.output_dir), store, exited)),
        ]
    threads = []
    for target, args in work:
        t = threading.Thread(target=guarded(target), args=args, daemon=True, name=name)
        t.start()
        threads.append(t)
    return threads


def read_batches(parser: OmpiChunkParser | LabelParser, pipe: IO[bytes], store: LogStore) -> None:
    """Store each rank's lines as ``parser`` finds them in what ``pipe`` gives, until it
    closes."""
    fd = pipe.fileno()
    add = store.add_lines
    try:
        while chunk := os.read(fd, _READ):
            for rank, stream, lines in parser.feed_batches(chunk):
                add(rank, stream, *lines)
        for rank, stream, lines in parser.flush_batches():
            add(rank, stream, *lines)
    finally:
        pipe.close()


def read_launcher(pipe: IO[bytes], stream: str, store: LogStore) -> None:
    """Store the launcher's own lines on ``stream`` (its ``pipe``), until it closes."""
    splitter = LineSplitter()
    fd = pipe.fileno()
    try:
        while chunk := os.read(fd, _READ):
            store.add_lines(None, stream, *splitter.feed_lines(chunk))
        store.add_lines(None, stream, *as_lines(splitter.flush()))
    finally:
        pipe.close()


def tail_files(out: Path, store: LogStore, exited: threading.Event) -> None:
    """Follow the files MPICH writes each rank's streams to in ``out`` (``rank-N.stdout``,
    ``rank-N.stderr``) until the launcher has ``exited``, then read what is left."""
    tails: dict[str, tuple[IO[bytes], LineSplitter, int, str]] = {}
    try:
        while True:
            finished = exited.is_set()
            for path in out.iterdir():
                name = path.name
                if name not in tails:
                    rank_text, _, kind = name.removeprefix("rank-").partition(".")
                    if not rank_text.isdigit() or kind not in ("stdout", "stderr"):
                        continue
                    tails[name] = (open(path, "rb"), LineSplitter(), int(rank_text), kind)  # noqa: SIM115
                f, splitter, rank, kind = tails[name]
                while chunk := f.read(_READ):
                    store.add_lines(rank, kind, *splitter.feed_lines(chunk))
            if finished:
                break
            exited.wait(_TAIL_EVERY)
        for _, splitter, rank, kind in tails.values():
            for text, partial in splitter.flush():
                store.add(rank, kind, text, partial)
    finally:
        for f, *_ in tails.values():
            f.close()
