"""The lines of a job's output as HTML: filtered by rank, host and text, the newest first
kept, each tagged with its rank and host, standard error in red and search matches marked.

Pure, as every view: :class:`~clusterbook.launch.logs.LogRecord` values in, a string out
(what the log viewer widget assigns, and what a job shows in a saved notebook). Every line
is user data and passes through :func:`~clusterbook.views.style.escaped`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.launch.logs import LAUNCHER_RANK, LogRecord
from clusterbook.views.style import MUTED, STDERR_COLOUR, empty, escaped

__all__ = ["filter_records", "render_lines"]


def _as_set(value: Any) -> frozenset[Any] | None:
    if value is None:
        return None
    if isinstance(value, (str, int)):
        return frozenset([value])
    return frozenset(value)


def filter_records(
    records: Iterable[LogRecord],
    *,
    rank: int | Iterable[int] | None = None,
    host: str | Iterable[str] | None = None,
    search: str = "",
) -> list[LogRecord]:
    """The records of ``rank`` (one or several; None: all, -1: the launcher) on ``host``
    (one or several; None: all) whose line contains ``search`` (case-insensitive)."""
    ranks, hosts = _as_set(rank), _as_set(host)
    needle = search.casefold()
    return [
        r
        for r in records
        if (ranks is None or r.rank in ranks)
        and (hosts is None or r.host in hosts)
        and (not needle or needle in r.line.casefold())
    ]


def _highlight(text: str, pattern: re.Pattern[str] | None) -> str:
    if pattern is None:
        return escaped(text)
    out, pos = [], 0
    for m in pattern.finditer(text):
        out.append(escaped(text[pos : m.start()]))
        out.append(f"<mark>{escaped(m.group())}</mark>")
        pos = m.end()
    out.append(escaped(text[pos:]))
    return "".join(out)


def render_lines(
    records: Iterable[LogRecord],
    *,
    rank: int | Iterable[int] | None = None,
    host: str | Iterable[str] | None = None,
    search: str = "",
    limit: int = 2000,
) -> str:
    """The newest ``limit`` records that pass :func:`filter_records`, oldest first, each
    tagged with its rank and host; stderr lines are red (class ``cb-err``), search matches
    are marked."""
    if limit < 0:
        raise ConfigError(f"limit ({limit}) must be 0 or more.")
    records = list(records)
    if not records:
        return empty("cb-log", "No output yet.")
    matched = filter_records(records, rank=rank, host=host, search=search)
    if not matched:
        return empty("cb-log", "No matching lines.")
    shown = matched[-limit:] if limit else []
    pattern = re.compile(re.escape(search), re.IGNORECASE) if search else None
    lines = []
    if len(shown) < len(matched):
        hidden = len(matched) - len(shown)
        lines.append(f'<div class="cb-more" {MUTED}>… {hidden} earlier lines not shown</div>')
    for r in shown:
        who = "launcher" if r.rank == LAUNCHER_RANK else f"rank {r.rank}"
        tag = f'<span class="cb-tag" {MUTED}>[{escaped(who)}@{escaped(r.host)}]</span> '
        if r.stream == "stderr":
            lines.append(
                f'<div class="cb-line cb-err" style="color:{STDERR_COLOUR}">'
                f"{tag}{_highlight(r.line, pattern)}</div>"
            )
        else:
            lines.append(f'<div class="cb-line cb-out">{tag}{_highlight(r.line, pattern)}</div>')
    return (
        '<div class="cb-log" style="font-family:monospace;font-size:12px;white-space:pre-wrap;'
        'word-break:break-all">' + "".join(lines) + "</div>"
    )
