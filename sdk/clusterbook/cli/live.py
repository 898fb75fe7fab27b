"""A job in the terminal: its output printed as it comes, each line behind its rank and folded
as ``%%mpirun`` folds it, and, when it failed, each distinct error once with its ranks."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterbook.launch.job import Job
    from clusterbook.launch.result import JobResult
    from clusterbook.launch.saved import SavedJob

__all__ = ["print_failure", "print_live"]


def print_live(job: Job | SavedJob) -> dict[int, list[tuple[str, ...]]]:
    """Print the job's output as it comes, each line behind its rank, folded as ``%%mpirun``
    folds it (no abort banners; tracebacks held, to be told once); return the tracebacks."""
    from clusterbook.launch.fold import fold_live
    from clusterbook.launch.logs import LAUNCHER_RANK, LiveText, LogRecord

    live = LiveText()

    def emit(rank: int, stream: str, text: str, partial: bool) -> None:
        prefix = "[launcher]" if rank == LAUNCHER_RANK else f"[{rank}]"
        record = LogRecord(0.0, rank, "", stream, text, partial)
        out = sys.stdout if stream == "stdout" else sys.stderr
        print(live.render(record, prefix), file=out, end="", flush=True)

    def announce(attempt: int) -> None:
        print(f"clusterbook: attempt {attempt}", file=sys.stderr, flush=True)

    try:
        return fold_live(job.stream(), emit, continues=live.continues, on_attempt=announce)
    except KeyboardInterrupt:
        job.cancel()
        raise


def print_failure(result: JobResult, tracebacks: dict[int, list[tuple[str, ...]]]) -> None:
    """Each distinct error once with its ranks, then how the job ended (in full when no
    rank's error said it already)."""
    from clusterbook.launch.fold import failure_report

    report = failure_report(tracebacks, result.failed)
    for text in report:
        print(text, file=sys.stderr)
    summary = result.summary()
    print(f"clusterbook: {summary.splitlines()[0] if report else summary}", file=sys.stderr)
