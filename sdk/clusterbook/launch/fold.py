"""What to show of a job's output as it arrives, and what to say about its errors after it:
Open MPI's abort banners dropped (they repeat what the traceback and exit codes say), each
rank's Python tracebacks held so that one every rank hit is told once, with its ranks.

Pure decisions on lines; ``%%mpirun`` and ``clusterbook run`` print what they return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from clusterbook.launch.logs import LogRecord
from clusterbook.launch.result import RankFailure

__all__ = [
    "ErrorGroup",
    "OutputFilter",
    "failure_report",
    "fold_live",
    "group_errors",
    "last_traceback",
    "rank_list",
]

_CHAIN = (
    "During handling of the above exception, another exception occurred:",
    "The above exception was the direct cause of the following exception:",
)
# Open MPI's banners after an abort repeat what the traceback and exit codes already say.
_ABORT_BANNER = ("MPI_ABORT was invoked", 'calling\n"abort"', 'calling "abort"')


_RULE = "-" * 74  # Open MPI's banners start and end with it
_BANNER_MAX = 40  # lines; a longer "banner" is someone's output, shown as it is


def _is_rule(line: str) -> bool:
    return line.rstrip() == _RULE


def _starts_traceback(line: str) -> bool:
    return line.startswith("Traceback (most recent call last):")


@dataclass
class _State:
    block: list[str] | None = None  # a traceback being read
    complete: bool = False  # the block has its exception line; a chained one may follow
    pending: list[str] = field(default_factory=list)  # blank lines after a complete block
    banner: list[str] | None = None  # lines of a ----- banner being read


Emit = Callable[[int, str, str, bool], None]  # rank, stream, text, partial


def fold_live(
    records: Iterable[LogRecord],
    emit: Emit,
    *,
    continues: Callable[[LogRecord], bool],
    runner: str | None = None,
    on_attempt: Callable[[int], None] | None = None,
) -> dict[int, list[tuple[str, ...]]]:
    """Feed a job's ``records``, as they come, through an :class:`OutputFilter` and
    ``emit`` what to show: the pieces of an over-long line (``continues``: a later piece of
    one begun) as they are; at a retry, what the last attempt held, then ``on_attempt(N)``.
    Returns the tracebacks of the last attempt, to be told once."""
    shown, attempt = OutputFilter(runner), 1

    def flush() -> None:
        for (rank, stream), lines in shown.finish().items():
            for text in lines:
                emit(rank, stream, text, False)

    for record in records:
        if record.attempt != attempt:
            flush()
            attempt, shown = record.attempt, OutputFilter(runner)
            if on_attempt is not None:
                on_attempt(attempt)
        if record.partial or continues(record):
            emit(record.rank, record.stream, record.line, record.partial)
            continue
        for text in shown.feed(record.rank, record.stream, record.line):
            emit(record.rank, record.stream, text, False)
    flush()
    return shown.tracebacks


class OutputFilter:
    """Decides which output lines to show as they arrive.

    Everything is shown at once except Python tracebacks on a rank's stderr, which are
    collected in :attr:`tracebacks` (rank -> blocks) so that an error every rank hit can be
    shown once (:func:`group_errors`); Open MPI's abort banners, which are dropped; and the
    frames of the ``runner`` script in stack dumps (only the cell's frames are of interest).
    """

    def __init__(self, runner: str | None = None) -> None:
        self.tracebacks: dict[int, list[tuple[str, ...]]] = {}
        self._states: dict[tuple[int, str], _State] = {}
        self._runner_frame = None if runner is None else f'  File "{runner}", line '

    def feed(self, rank: int, stream: str, line: str) -> list[str]:
        """The lines to show now, for ``line`` that ``rank`` wrote on ``stream``."""
        if stream != "stderr":
            return [line]
        state = self._states.setdefault((rank, stream), _State())
        if state.banner is not None:
            return self._banner_line(state, line)
        if _is_rule(line):
            # Open MPI sends its banners by another path than the rank's stderr: one can
            # land in the middle of a traceback, which goes on after it.
            state.banner = [line]
            return []
        if state.block is not None and rank >= 0:
            out = self._traceback_line(rank, state, line)
            if out is not None:
                return out
        if rank >= 0 and _starts_traceback(line):
            state.block, state.complete = [line], False
            return []
        if self._runner_frame is not None and line.startswith(self._runner_frame):
            return []
        return [line]

    def finish(self) -> dict[tuple[int, str], list[str]]:
        """At the end of the job: record unfinished tracebacks, return the lines still held."""
        left: dict[tuple[int, str], list[str]] = {}
        for (rank, stream), state in self._states.items():
            if state.block is not None:
                self._close(rank, state)
                if state.pending:
                    left.setdefault((rank, stream), []).extend(state.pending)
            if state.banner is not None:
                left.setdefault((rank, stream), []).extend(state.banner)
            state.pending, state.banner = [], None
        return left

    def _traceback_line(self, rank: int, state: _State, line: str) -> list[str] | None:
        assert state.block is not None
        if not state.complete:
            state.block.append(line)
            if line and not line.startswith(" "):
                state.complete = True  # the exception line
            return []
        if not line:
            state.pending.append(line)
            return []
        if line in _CHAIN or (_starts_traceback(line) and state.block[-1] in _CHAIN):
            state.block.extend([*state.pending, line])
            state.pending = []
            state.complete = line in _CHAIN
            return []
        # Not part of the traceback: it ends here, and this line is read afresh.
        pending = state.pending
        self._close(rank, state)
        state.pending = []
        return None if not pending else [*pending, *(self.feed(rank, "stderr", line))]

    def _close(self, rank: int, state: _State) -> None:
        assert state.block is not None
        self.tracebacks.setdefault(rank, []).append(tuple(state.block))
        state.block, state.complete = None, False

    @staticmethod
    def _banner_line(state: _State, line: str) -> list[str]:
        assert state.banner is not None
        state.banner.append(line)
        if not _is_rule(line):
            if len(state.banner) < _BANNER_MAX:
                return []
            banner, state.banner = state.banner, None
            return banner
        banner, state.banner = state.banner, None
        text = "\n".join(banner)
        if any(mark in text for mark in _ABORT_BANNER):
            return []
        return banner


def last_traceback(lines: Sequence[str]) -> tuple[str, ...] | None:
    """The last Python traceback in ``lines`` (up to its exception line), or None."""
    start = max((i for i, line in enumerate(lines) if _starts_traceback(line)), default=-1)
    if start < 0:
        return None
    end = start + 1
    while end < len(lines) and (lines[end].startswith(" ") or not lines[end]):
        end += 1
    return tuple(lines[start : end + 1])


def rank_list(ranks: Iterable[int]) -> str:
    """``"rank 3"``, ``"ranks 0, 1"``, ``"ranks 0-3, 7"`` (runs of three or more shortened)."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{ordered[i]}-{ordered[j]}")
        else:
            parts.extend(str(r) for r in ordered[i : j + 1])
        i = j + 1
    return ("rank " if len(ordered) == 1 else "ranks ") + ", ".join(parts)


@dataclass(frozen=True)
class ErrorGroup:
    """One traceback and the ranks that printed it."""

    ranks: tuple[int, ...]
    lines: tuple[str, ...]

    def render(self) -> list[str]:
        return [f"Error on {rank_list(self.ranks)}:", *self.lines]


def group_errors(tracebacks: Mapping[int, Sequence[Sequence[str]]]) -> list[ErrorGroup]:
    """Identical tracebacks as one group each, with their ranks; groups in rank order of first
    appearance."""
    groups: dict[tuple[str, ...], list[int]] = {}
    for rank in sorted(tracebacks):
        for block in tracebacks[rank]:
            ranks = groups.setdefault(tuple(block), [])
            if rank not in ranks:
                ranks.append(rank)
    return [ErrorGroup(tuple(ranks), lines) for lines, ranks in groups.items()]


def failure_report(
    tracebacks: Mapping[int, Sequence[Sequence[str]]], failed: Sequence[RankFailure]
) -> list[str]:
    """What to say about errors after a job: each distinct traceback once with its ranks
    (a failed rank's last lines stand in when its traceback was not seen live), then the
    failed ranks that left no traceback, by exit code."""
    blocks = {rank: list(b) for rank, b in tracebacks.items()}
    for f in failed:
        if f.rank not in blocks and (tb := last_traceback(f.last_lines)) is not None:
            blocks[f.rank] = [tb]
    out: list[str] = []
    for group in group_errors(blocks):
        out.extend(group.render())
    by_code: dict[int, list[int]] = {}
    for f in failed:
        if f.rank not in blocks:
            by_code.setdefault(f.exit_code, []).append(f.rank)
    for code, ranks in by_code.items():
        what = rank_list(ranks)
        out.append(f"{what[0].upper()}{what[1:]} exited with code {code}.")
    return out
