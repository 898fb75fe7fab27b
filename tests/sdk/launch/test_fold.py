"""What is shown of a job's output as it arrives, and what is said of its errors after it
(the same for ``%%mpirun`` and ``clusterbook run``)."""

from __future__ import annotations

import pytest

from clusterbook.launch.fold import (
    OutputFilter,
    failure_report,
    group_errors,
    last_traceback,
    rank_list,
)
from clusterbook.launch.result import RankFailure

RULE = "-" * 74
TB = (
    "Traceback (most recent call last):",
    '  File "<mpirun cell 1>", line 2, in <module>',
    "    raise ValueError('boom')",
    "ValueError: boom",
)


def feed_all(f: OutputFilter, rank: int, lines: list[str], stream: str = "stderr") -> list[str]:
    return [out for line in lines for out in f.feed(rank, stream, line)]


def test_filter_holds_tracebacks_and_passes_the_rest() -> None:
    f = OutputFilter()
    assert feed_all(f, 0, ["hello", *TB]) == ["hello"]
    assert f.tracebacks == {}  # a chained exception may still follow
    assert f.feed(0, "stderr", "after") == ["after"]
    assert f.tracebacks == {0: [TB]}
    # stdout is never held, whatever it looks like
    assert feed_all(f, 1, list(TB), stream="stdout") == list(TB)


def test_filter_keeps_chained_exceptions_in_one_block() -> None:
    chained = [
        *TB,
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        "Traceback (most recent call last):",
        '  File "<mpirun cell 1>", line 4, in <module>',
        "KeyError: 'k'",
    ]
    f = OutputFilter()
    assert feed_all(f, 2, chained) == []
    assert f.finish() == {}
    assert f.tracebacks == {2: [tuple(chained)]}


def test_filter_releases_blank_lines_after_a_traceback() -> None:
    f = OutputFilter()
    assert feed_all(f, 0, [*TB, "", "next"]) == ["", "next"]
    assert f.tracebacks == {0: [TB]}


def test_filter_drops_abort_banners_but_not_others() -> None:
    f = OutputFilter()
    abort = [RULE, "MPI_ABORT was invoked on rank 1 in communicator MPI_COMM_WORLD", RULE]
    assert feed_all(f, 1, abort) == []
    launcher = [RULE, "prterun has exited due to process rank 1 with PID 0 on node vm calling"]
    assert feed_all(f, -1, [*launcher, '"abort". This may have caused other processes', RULE]) == []
    other = [RULE, "prterun noticed that process rank 0 exited on signal 9 (Killed).", RULE]
    assert feed_all(f, -1, other) == other
    assert feed_all(f, -1, [RULE, "cut short"]) == []
    assert f.finish() == {(-1, "stderr"): [RULE, "cut short"]}


def test_filter_reads_a_traceback_around_a_banner_inside_it() -> None:
    # Open MPI's abort banner travels apart from the rank's stderr and may arrive mid-way.
    abort = [RULE, "MPI_ABORT was invoked on rank 0 in communicator MPI_COMM_WORLD", RULE]
    f = OutputFilter()
    assert feed_all(f, 0, [TB[0], *abort, *TB[1:], "Terminated"]) == ["Terminated"]
    assert f.tracebacks == {0: [TB]}


def test_filter_records_an_unfinished_traceback_at_the_end() -> None:
    f = OutputFilter()
    assert feed_all(f, 3, list(TB[:2])) == []
    f.finish()
    assert f.tracebacks == {3: [TB[:2]]}


def test_filter_hides_the_runner_frames_of_stack_dumps() -> None:
    f = OutputFilter(runner="/run/cell.py")
    dump = [
        "Current thread 0x00007f (most recent call first):",
        '  File "<mpirun cell 3>", line 3 in <module>',
        '  File "/run/cell.py", line 21 in _clusterbook_cell',
    ]
    assert feed_all(f, 0, dump) == dump[:2]


def test_identical_tracebacks_are_grouped_by_rank() -> None:
    other = (*TB[:3], "ValueError: other")
    groups = group_errors({1: [TB], 0: [TB], 3: [other], 2: [TB, TB]})
    assert [(g.ranks, g.lines) for g in groups] == [((0, 1, 2), TB), ((3,), other)]
    assert groups[0].render() == ["Error on ranks 0-2:", *TB]


@pytest.mark.parametrize(
    ("ranks", "text"),
    [([3], "rank 3"), ([1, 0], "ranks 0, 1"), ([0, 1, 2, 3, 7, 9, 10], "ranks 0-3, 7, 9, 10")],
)
def test_rank_list(ranks: list[int], text: str) -> None:
    assert rank_list(ranks) == text


def test_last_traceback_of_last_lines() -> None:
    assert last_traceback(["x", *TB, "Terminated"]) == TB
    assert last_traceback(["x", "y"]) is None


def test_failure_report_shows_each_error_once() -> None:
    failed = [
        RankFailure(0, "vm", 1, ("out", *TB, RULE)),  # its traceback only in its last lines
        RankFailure(2, "vm", 3, ("bye",)),
        RankFailure(3, "vm", 3, ()),
    ]
    report = failure_report({1: [TB]}, failed)
    assert report == ["Error on ranks 0, 1:", *TB, "Ranks 2, 3 exited with code 3."]
    assert failure_report({}, []) == []
