"""A rank's log line: :class:`LogRecord`, its line in a job's files and back, as text to print,
and a DataFrame of records.

On disk, a job directory holds ``rank-N.log`` per rank and ``launcher.log`` for the launcher's
own output, one line per record: ``ISO-TIME out|err TEXT``; a piece of an over-long line that
goes on in the next record is written ``out+`` / ``err+``, so the file holds every byte.
:class:`~clusterbook.launch.logstore.LogStore` writes them as lines arrive
(:func:`format_log_lines`); :func:`read_log_file` reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "LAUNCHER_RANK",
    "LiveText",
    "LogRecord",
    "format_log_lines",
    "parse_log_line",
    "read_log_file",
    "records_frame",
]

#: Rank number of lines the launcher itself wrote (not any rank).
LAUNCHER_RANK = -1
COLUMNS = ("time", "rank", "host", "stream", "line", "partial", "attempt")
_SHORT = {"stdout": "out", "stderr": "err"}
_LONG = {v: k for k, v in _SHORT.items()}


class LogRecord(NamedTuple):
    """One line a rank wrote: when it arrived (epoch seconds), rank, host, stream, text.

    ``partial`` marks a piece of a line longer than :data:`~clusterbook.launch.parse.MAX_LINE`
    (1 MiB) that goes on in the next record of the same rank and stream. ``attempt``: which
    run of the job wrote it (1 unless the job was retried or restarted).

    Immutable, and a tuple (one is made per line: a tuple is the cheapest record to make).
    """

    time: float
    rank: int
    host: str
    stream: str
    line: str
    partial: bool = False
    attempt: int = 1


class LiveText:
    """Records as text to print as they come: a prefix before each line, and the pieces of an
    over-long line glued into one (no prefix or newline in between)."""

    def __init__(self) -> None:
        self._open: set[tuple[int, str]] = set()  # rank and stream whose line goes on

    def continues(self, record: LogRecord) -> bool:
        """Whether ``record`` is a later piece of a line already begun."""
        return (record.rank, record.stream) in self._open

    def render(self, record: LogRecord, prefix: str) -> str:
        """``prefix`` (unless the line goes on), the text, and a newline (unless partial)."""
        key = (record.rank, record.stream)
        head = "" if key in self._open else f"{prefix} "
        if record.partial:
            self._open.add(key)
        else:
            self._open.discard(key)
        return head + record.line + ("" if record.partial else "\n")


#: The dtype of every column of :func:`records_frame`, whatever the rows (none too).
DTYPES = {
    "time": "datetime64[us, UTC]",  # microseconds, as the files have them
    "rank": "int64",
    "host": "string",
    "stream": "category",  # stdout, stderr
    "line": "string",
    "partial": "bool",
    "attempt": "int64",
}


def records_frame(records: Iterable[LogRecord]) -> pd.DataFrame:
    """A DataFrame of records with columns time (UTC), rank, host, stream (categorical:
    stdout, stderr), line, partial, attempt; dtypes :data:`DTYPES`."""
    import pandas as pd

    frame: pd.DataFrame = pd.DataFrame(list(records), columns=list(COLUMNS))
    seconds = frame["time"].astype("float64")
    frame["time"] = pd.to_datetime(seconds, unit="s", utc=True).astype("datetime64[us, UTC]")
    frame = frame.astype(
        {"rank": "int64", "host": "string", "line": "string", "partial": "bool", "attempt": "int64"}
    )
    frame["stream"] = pd.Categorical(frame["stream"], categories=("stdout", "stderr"))
    return frame


def format_log_lines(now: float, stream: str, texts: list[str], partial: frozenset[int]) -> str:
    """The lines of a ``rank-N.log`` file for ``texts`` that arrived together at ``now`` on
    ``stream`` (``partial``: the indexes of pieces of longer lines), each ending in a newline."""
    stamp = datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="microseconds")
    code = _SHORT[stream]
    if partial:
        return "".join(
            f"{stamp} {code}{'+' if i in partial else ''} {t}\n" for i, t in enumerate(texts)
        )
    prefix = f"{stamp} {code} "
    return prefix + ("\n" + prefix).join(texts) + "\n"


def parse_log_line(raw: str, rank: int, host: str = "?", attempt: int = 1) -> LogRecord:
    """A record from a line of a ``rank-N.log`` file (without its newline)."""
    stamp, _, rest = raw.partition(" ")
    short, _, line = rest.partition(" ")
    try:
        when = datetime.fromisoformat(stamp).timestamp()
    except ValueError:  # not a line the store wrote: kept whole, undated
        return LogRecord(0.0, rank, host, "stdout", raw, False, attempt)
    stream = _LONG.get(short.rstrip("+"), "stdout")
    return LogRecord(when, rank, host, stream, line, short.endswith("+"), attempt)


def read_log_file(path: Path, rank: int, host: str = "?", attempt: int = 1) -> list[LogRecord]:
    """Read a ``rank-N.log`` file back into records (to page in lines the buffer dropped)."""
    # Lines end at "\n" only: a rank's "\r" (a progress bar) is part of its line.
    with open(path, encoding="utf-8", errors="replace", newline="\n") as f:
        return [parse_log_line(raw.removesuffix("\n"), rank, host, attempt) for raw in f]
