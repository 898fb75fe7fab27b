"""The lines of a job's output as HTML: filtered, tagged, stderr in red, matches marked,
everything escaped."""

from __future__ import annotations

import re

import pytest

from clusterbook.launch.logs import LAUNCHER_RANK, LogRecord
from clusterbook.views.lines import filter_records, render_lines

EVIL = "<script>alert(1)</script>"


def rec(rank, line, stream="stdout", host=None, t=0.0) -> LogRecord:
    return LogRecord(t, rank, host or f"h{rank % 2}", stream, line)


LINES = [
    rec(0, "step 1"),
    rec(1, "step 1"),
    rec(1, "Warning: slow", "stderr"),
    rec(2, "step 2"),
    rec(LAUNCHER_RANK, "mpirun started", "stderr", host="head"),
]


def shown_lines(out: str) -> list[str]:
    bodies = re.findall(r'<div class="cb-line[^"]*"[^>]*>(.*?)</div>', out)
    return [re.sub(r"<[^>]+>", "", b) for b in bodies]


def test_lines_filtered_by_rank_host_and_search():
    assert shown_lines(render_lines(LINES, rank=1)) == [
        "[rank 1@h1] step 1",
        "[rank 1@h1] Warning: slow",
    ]
    assert shown_lines(render_lines(LINES, rank=[0, 2])) == [
        "[rank 0@h0] step 1",
        "[rank 2@h0] step 2",
    ]
    assert shown_lines(render_lines(LINES, host="h0")) == [
        "[rank 0@h0] step 1",
        "[rank 2@h0] step 2",
    ]
    assert shown_lines(render_lines(LINES, search="STEP 1")) == [
        "[rank 0@h0] step 1",
        "[rank 1@h1] step 1",
    ]
    assert shown_lines(render_lines(LINES, rank=LAUNCHER_RANK)) == [
        "[launcher@head] mpirun started"
    ]
    assert len(shown_lines(render_lines(LINES))) == len(LINES)


def test_filter_records_combines_filters():
    assert filter_records(LINES, rank=1, search="warn") == [LINES[2]]
    assert filter_records(LINES, host=["h1", "head"], search="start") == [LINES[4]]
    assert filter_records(LINES, rank=5) == []


def test_stderr_lines_are_styled_and_stdout_lines_are_not():
    out = render_lines(LINES[:3])
    divs = re.findall(r'<div class="cb-line ([^"]*)"([^>]*)>', out)
    assert [cls for cls, _ in divs] == ["cb-out", "cb-out", "cb-err"]
    assert "color:#c53030" in divs[2][1]
    assert "color" not in divs[0][1]


def test_search_matches_are_marked_and_escaped():
    out = render_lines([rec(0, f"got {EVIL} here")], search="<SCRIPT>")
    assert "<script>" not in out
    assert "<mark>&lt;script&gt;</mark>alert(1)&lt;/script&gt;" in out


def test_limit_keeps_the_newest_lines_and_says_how_many_are_hidden():
    records = [rec(0, f"line {i}") for i in range(10)]
    out = render_lines(records, limit=3)
    assert shown_lines(out) == ["[rank 0@h0] line 7", "[rank 0@h0] line 8", "[rank 0@h0] line 9"]
    assert "7 earlier lines not shown" in out
    with pytest.raises(ValueError, match="limit"):
        render_lines(records, limit=-1)


def test_no_lines_and_no_matching_lines_are_told_apart():
    assert "No output yet." in render_lines([])
    assert "No matching lines." in render_lines(LINES, search="nothing like this")
