"""A ``%%mpirun`` cell run as a job of the notebook's cluster: the notebook's values it is
given, its private directory (the script, the values, the key its ranks sign theirs with),
its output followed as it comes, what is said of its end, and the values it sends back.

The magic (:mod:`clusterbook_widgets.magics`) parses, calls these in turn and prints what
they say; the script is :mod:`clusterbook_widgets.mpirun_cell`'s, the check of pulled values
:mod:`clusterbook_widgets.pulled`'s.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import clusterbook as cb
from clusterbook.cluster.handle import ClusterHandle, JobHandle
from clusterbook.errors import ClusterError
from clusterbook.launch import LiveText, LogRecord, failure_report, fold_live
from clusterbook_widgets.arguments import MpirunArgs
from clusterbook_widgets.mpirun_cell import build_script
from clusterbook_widgets.pulled import check_private_dirs, read_pulled

__all__ = ["CellError", "ending", "follow", "launch", "pickled", "pulled", "pushed"]


class CellError(Exception):
    """A problem with the cell's inputs, told to the user as a message."""


def pushed(namespace: Mapping[str, Any], names: Sequence[str]) -> bytes | None:
    """The values of ``names`` in the notebook's ``namespace``, pickled: before anything
    starts, a missing or unpicklable one is named."""
    missing = [name for name in names if name not in namespace]
    if missing:
        raise CellError(f"--push: {', '.join(missing)} not defined in the notebook.")
    return pickled({name: namespace[name] for name in names}) if names else None


def launch(
    cluster: ClusterHandle,
    args: MpirunArgs,
    cell: str,
    values: bytes | None,
) -> tuple[JobHandle, Path, tuple[Path, bytes] | None]:
    """Start the cell's job; return it, its script, and where its values are pulled
    from with the key they are signed with."""
    cells = cluster.run_dir / "cells"
    cells.mkdir(mode=0o700, exist_ok=True)
    # The cell's program, values and results go there: nobody else may change them.
    check_private_dirs(cells)
    number = len(list(cells.iterdir())) + 1
    while True:
        directory = cells / f"cell-{number:04d}"
        try:
            directory.mkdir(mode=0o700)
            break
        except FileExistsError:
            number += 1
    push_file = None
    if values is not None:
        push_file = directory / "push.pkl"
        _write_private(push_file, values)
    pull_dir = key = None
    if args.pull is not None:
        pull_dir = directory / "pull"
        pull_dir.mkdir(mode=0o700)
        key = secrets.token_bytes(32)  # the ranks sign their values with it
    script = directory / "cell.py"
    text = build_script(
        cell,
        filename=f"<mpirun cell {number}>",
        push_file=None if push_file is None else str(push_file),
        pull=args.pull,
        pull_dir=None if pull_dir is None else str(pull_dir),
        pull_key=key,
    )
    # UTF-8: what Python reads source as, whatever the locale. Private: it holds the key.
    _write_private(script, text.encode("utf-8"))
    cluster.put(directory)  # nodes that do not share this filesystem get it too
    job = cluster.mpirun(
        ["python", str(script)],
        np=args.np,
        env={"PYTHONUNBUFFERED": "1"},  # output as it is printed, not when a buffer fills
        timeout=args.timeout,
        oversubscribe=args.oversubscribe,
        retries=args.retries,
        backoff=1.0 if args.backoff is None else args.backoff,
        retry_on=args.retry_on,
        deadline=args.deadline,
        restarts=args.restarts,
        clean=args.clean,
    )
    return job, script, None if pull_dir is None or key is None else (pull_dir, key)


def follow(
    job: JobHandle, script: str, on_attempt: Callable[[int], None]
) -> tuple[cb.JobResult, dict[int, list[tuple[str, ...]]]]:
    """Print the job's output as it comes (``on_attempt`` hears of each retry as it starts);
    its result once it has ended (an interrupt is the caller's to handle: it cancels the
    job)."""
    launcher = Path(job.launcher).name
    live = LiveText()

    def emit(rank: int, stream: str, text: str, partial: bool) -> None:
        prefix = f"[{launcher}]" if rank < 0 else f"[{rank}]"
        out = sys.stderr if stream == "stderr" else sys.stdout
        record = LogRecord(0.0, rank, "", stream, text, partial)
        print(live.render(record, prefix), file=out, end="", flush=True)

    tracebacks = fold_live(
        job.stream(), emit, continues=live.continues, runner=script, on_attempt=on_attempt
    )
    return job.wait(), tracebacks


def ending(
    result: cb.JobResult, tracebacks: dict[int, list[tuple[str, ...]]], timeout: float | None
) -> list[str]:
    """What is said of a cell's job once it has ended (pure): each error the ranks raised,
    once with its ranks; a deadline or time limit that stopped it; its summary when nothing
    else says why it failed; the processes kept stopped for inspection."""
    said = list(failure_report(tracebacks, result.failed))
    if result.deadline_exceeded:
        said.append(
            f"%%mpirun: the deadline passed after {result.duration:.1f} s; the job was "
            "stopped. Where each rank was is in its stack above (most recent call first)."
        )
    elif result.timed_out:
        said.append(
            f"%%mpirun: timed out after {timeout:g} s; the job was stopped. Where each "
            "rank was is in its stack above (most recent call first)."
        )
    elif not result.ok and not result.failed and not tracebacks:
        said.append(result.summary())
    if result.kept:
        ranks = ", ".join(f"rank {k.rank} pid {k.pid}" for k in result.kept if k.rank is not None)
        said.append(
            f"%%mpirun: kept stopped for inspection (--clean none): {ranks or 'no rank'}, "
            f"with {len(result.kept)} process(es) in all; %cluster stop ends them (or "
            "cluster.jobs[-1].cleanup())."
        )
    return said


def pulled(
    cluster: ClusterHandle,
    name: str,
    result: cb.JobResult,
    pull: tuple[Path, bytes],
    np: int,
) -> list[Any]:
    """The ranks' values of ``name``: plain data only, each signed by its rank of this cell,
    from the cell's own directory (:mod:`clusterbook_widgets.pulled`); a :class:`CellError`
    saying why ``name`` is not set otherwise."""
    if not result.ok:
        raise CellError(f"--pull {name}: not set, the job did not succeed.")
    pull_dir, key = pull
    try:
        cluster.gather(pull_dir)  # from nodes that do not share this filesystem
        return read_pulled(pull_dir, np, key)
    except ClusterError as exc:
        raise CellError(f"--pull {name}: {exc}; {name} not set.") from None


def pickled(values: dict[str, Any]) -> bytes:
    """The notebook's ``values`` for the ranks, by value where plain pickle goes by name
    (cloudpickle): a function, lambda or class defined in the notebook works on every rank.
    A value that cannot be pickled is named."""
    import cloudpickle  # type: ignore[import-untyped]  # (no type information)

    for name, value in values.items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise CellError(
                f"--push {name}: {type(value).__name__} objects cannot be sent to the ranks "
                f"({type(exc).__name__}: {exc}); push what it holds instead, or make it on "
                "every rank in the cell."
            ) from None
    data: bytes = cloudpickle.dumps(values)
    return data


def _write_private(path: Path, data: bytes) -> None:
    # Notebook values may be secret: 0600 from the start, never readable by others.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
