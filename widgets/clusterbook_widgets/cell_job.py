"""A ``%%mpirun`` cell run as a job of the notebook's cluster: the notebook's values it is
given, its private directory (the script, the values, the key its ranks sign theirs with),
its output followed as it comes, what is said of its end, and the values it sends back.

The magic (:mod:`clusterbook_widgets.magics`) parses, calls these in turn and raises (or,
with ``--no-raise``, prints) what they say; the script is
:mod:`clusterbook_widgets.mpirun_cell`'s, the check of pulled values
:mod:`clusterbook_widgets.pulled`'s.
"""

from __future__ import annotations

import os
import secrets
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import clusterbook as cb
from clusterbook.cluster.handle import ClusterHandle, JobHandle
from clusterbook.errors import ClusterError
from clusterbook.launch import LiveText, LogRecord, failure_report, fold_live
from clusterbook.launch.fold import group_errors, last_traceback, rank_list
from clusterbook.launch.result import RankFailure
from clusterbook.waiting import each
from clusterbook_widgets.arguments import MpirunArgs
from clusterbook_widgets.mpirun_cell import build_script
from clusterbook_widgets.pulled import check_private_dirs, read_pulled

__all__ = [
    "CellError",
    "compiled",
    "ending",
    "failure",
    "follow",
    "launch",
    "pickled",
    "pulled",
    "pushed",
]

_LAST_LINES = 6  # of a failed rank that raised no Python error, in the cell's error
_SILENT_SHOWN = 2  # ranks whose last lines the cell's error shows; the rest are named
_ERRORS_SHOWN = 3  # distinct errors the ranks raised (ranks told apart in a message differ)
_LOGS = "cluster.jobs[-1].logs()"
_STACKS = "Where each rank was is in its stack above (most recent call first)."


class CellError(ClusterError):
    """A cell cannot run, or its values cannot go or come back: it is not valid Python, a
    ``--push`` name is not defined in the notebook or cannot be sent, a ``--pull`` value was
    not set; the message says which and why."""


def compiled(cell: str) -> None:
    """Nothing, if ``cell`` is valid Python; else a :class:`CellError` saying where it is not
    (the same error on every rank: told once, before anything starts)."""
    try:
        compile(cell, "<mpirun cell>", "exec")
    except SyntaxError as exc:
        told = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
        raise CellError(f"the cell is not valid Python, so no rank runs it:\n{told}") from exc


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
    job). The widgets' buttons act meanwhile (:func:`clusterbook.waiting.each`): their
    **Stop job** ends this job, and with it the cell."""
    launcher = Path(job.launcher).name
    live = LiveText()

    def emit(rank: int, stream: str, text: str, partial: bool) -> None:
        prefix = f"[{launcher}]" if rank < 0 else f"[{rank}]"
        out = sys.stderr if stream == "stderr" else sys.stdout
        record = LogRecord(0.0, rank, "", stream, text, partial)
        print(live.render(record, prefix), file=out, end="", flush=True)

    tracebacks = fold_live(
        each(job.stream()), emit, continues=live.continues, runner=script, on_attempt=on_attempt
    )
    return job.wait(), tracebacks


def ending(
    result: cb.JobResult, tracebacks: dict[int, list[tuple[str, ...]]], timeout: float | None
) -> list[str]:
    """What is said of a cell's job once it has ended (pure), where the cell does not raise
    it (``--no-raise``, or a job that succeeded): each error the ranks raised, once with its
    ranks; a deadline or time limit that stopped it; its summary when nothing else says why
    it failed; the processes kept stopped for inspection."""
    said = list(failure_report(tracebacks, result.failed))
    if (stopped := _stopped(result, timeout)) is not None:
        said.append(f"%%mpirun: {stopped}; the job was stopped. {_STACKS}")
    elif not result.ok and not result.failed and not tracebacks:
        said.append(result.summary())
    if result.kept:
        said.append(f"%%mpirun: {_kept(result)}")
    return said


def failure(
    result: cb.JobResult,
    tracebacks: dict[int, list[tuple[str, ...]]],
    timeout: float | None,
    *,
    pull: str | None = None,
) -> str:
    """The message of the error a failed cell raises (pure), short enough to read at once: a
    line of how its job ended (the ranks that failed with their exit codes and hosts, or what
    stopped it); each error the ranks raised, once with its ranks; the last lines of a failed
    rank that raised none; what stopped it, the processes kept, the ``pull`` name not set."""
    blocks = {rank: list(b) for rank, b in tracebacks.items()}
    for f in result.failed:
        if f.rank not in blocks and (tb := last_traceback(f.last_lines)) is not None:
            blocks[f.rank] = [tb]
    stopped = _stopped(result, timeout)
    if not result.failed and not blocks and stopped is None:
        said = [result.summary()]  # the launcher's or clusterbook's own words say why
    else:
        said = [_headline(result, stopped), *result.notes]
        groups = group_errors(blocks)
        for group in groups[:_ERRORS_SHOWN]:
            said.extend(group.render())
        if rest := groups[_ERRORS_SHOWN:]:
            ranks = rank_list(r for group in rest for r in group.ranks)
            said.append(f"{len(rest)} other error(s), on {ranks}: in the job's logs ({_LOGS}).")
        said.extend(_last_lines([f for f in result.failed if f.rank not in blocks]))
        if stopped is not None:
            said.append(_STACKS)
    if result.kept:
        kept = _kept(result)
        said.append(kept[:1].upper() + kept[1:])
    if pull is not None:
        said.append(f"--pull {pull}: not set, the job did not succeed.")
    return "\n".join(said)


def _headline(result: cb.JobResult, stopped: str | None) -> str:
    tries = f" ({len(result.attempts)} attempts)" if len(result.attempts) > 1 else ""
    if stopped is not None:
        return f"{result.job_id}{tries}: {stopped}; the job was stopped."
    if not result.failed:
        why = result.error or f"launcher exit code {result.returncode}"
        return f"{result.job_id} failed{tries}: {why}."
    by_code: dict[int, list[RankFailure]] = {}
    for f in result.failed:
        by_code.setdefault(f.exit_code, []).append(f)
    each = [
        f"{rank_list(f.rank for f in failed)} exited with code {code}{_on(failed)}"
        for code, failed in by_code.items()
    ]
    return f"{result.job_id} failed{tries}: {'; '.join(each)}."


def _on(failed: list[RankFailure]) -> str:
    hosts = sorted({f.host for f in failed if f.host})
    if not hosts:
        return ""
    return f" on {', '.join(hosts)}" if len(hosts) <= 3 else f" on {len(hosts)} hosts"


def _last_lines(silent: list[RankFailure]) -> list[str]:
    said: list[str] = []
    for f in silent[:_SILENT_SHOWN]:
        if not f.last_lines:
            said.append(f"Rank {f.rank} wrote nothing.")
            continue
        said.append(f"Rank {f.rank}'s last lines:")
        said.extend(f"    {line}" for line in f.last_lines[-_LAST_LINES:])
    if rest := [f.rank for f in silent[_SILENT_SHOWN:]]:
        said.append(f"The output of {rank_list(rest)} is in the job's logs ({_LOGS}).")
    return said


def _stopped(result: cb.JobResult, timeout: float | None) -> str | None:
    """What stopped the job, where its deadline or time limit did (its ranks then showed
    their stacks); None otherwise."""
    if result.deadline_exceeded:
        return f"the deadline passed after {result.duration:.1f} s"
    if result.timed_out:
        return f"timed out after {f'{timeout:g}' if timeout else f'{result.duration:.1f}'} s"
    return None


def _kept(result: cb.JobResult) -> str:
    ranks = ", ".join(f"rank {k.rank} pid {k.pid}" for k in result.kept if k.rank is not None)
    return (
        f"kept stopped for inspection (--clean none): {ranks or 'no rank'}, with "
        f"{len(result.kept)} process(es) in all; %cluster stop ends them (or "
        "cluster.jobs[-1].cleanup())."
    )


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
