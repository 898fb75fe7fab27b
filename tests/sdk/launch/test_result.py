"""Which ranks failed, the excerpt of their output, and how a JobResult reports itself."""

from __future__ import annotations

import json

import pytest

from clusterbook.errors import ClusterError, JobError, JobFailedError
from clusterbook.launch.result import JobResult, RankFailure, excerpt, failed_ranks

TB = "Traceback (most recent call last):"


def traceback_lines(exc: str = "ValueError: bad input", frames: int = 2) -> list[str]:
    lines = [TB]
    for i in range(frames):
        lines += [f'  File "/work/train.py", line {10 + i}, in step{i}', f"    step{i + 1}()"]
    return [*lines, exc]


# -- failed_ranks --------------------------------------------------------------------------


def test_no_failure_when_all_exit_zero() -> None:
    assert failed_ranks([2, 0, 1], {0: 0, 1: 0, 2: 0}, stopped_by_us=set()) == []


def test_first_failure_kept_and_later_kills_dropped() -> None:
    order = [2, 0, 1, 3]
    codes = {2: 1, 0: 143, 1: 137, 3: 0}
    assert failed_ranks(order, codes, stopped_by_us=set()) == [2]


def test_later_real_failures_kept_in_exit_order() -> None:
    order = [3, 1, 0, 2]
    codes = {3: 2, 1: 143, 0: 1, 2: 139}  # 139 (SIGSEGV) is a failure of its own
    assert failed_ranks(order, codes, stopped_by_us=set()) == [3, 0, 2]


@pytest.mark.parametrize("first_code", [137, 143])
def test_kill_that_comes_first_is_a_failure(first_code: int) -> None:
    # Nobody failed before: the rank was killed from outside (OOM killer, kill -9).
    order = [1, 0, 2]
    codes = {1: first_code, 0: 143, 2: 137}
    assert failed_ranks(order, codes, stopped_by_us=set()) == [1]


def test_ranks_stopped_by_us_are_not_failures() -> None:
    order = [0, 1, 2]
    codes = {0: 143, 1: 137, 2: 1}
    assert failed_ranks(order, codes, stopped_by_us={0, 1, 2}) == []
    # Rank 0 stopped by us does not count as the "earlier failure" either.
    assert failed_ranks(order, codes, stopped_by_us={0}) == [1, 2]


def test_failure_before_we_stopped_is_kept() -> None:
    order = [2, 0, 1]
    codes = {2: 1, 0: 143, 1: 143}
    assert failed_ranks(order, codes, stopped_by_us={0, 1}) == [2]


# -- excerpt -------------------------------------------------------------------------------


def test_excerpt_without_traceback_is_last_lines() -> None:
    lines = [f"line {i}" for i in range(20)]
    assert excerpt(lines) == lines[-12:]
    assert excerpt(lines, limit=3) == ["line 17", "line 18", "line 19"]
    assert excerpt(lines[:2]) == ["line 0", "line 1"]
    assert excerpt(()) == []


def test_excerpt_accepts_tuple() -> None:
    lines = ("a", "b", "c")
    assert excerpt(lines, limit=2) == ["b", "c"]


def test_excerpt_picks_traceback_through_exception_line() -> None:
    tb = traceback_lines()
    lines = ["epoch 1 loss 0.5", "epoch 2 loss 0.4", *tb, "cleanup: closing files", "bye"]
    assert excerpt(lines) == tb


def test_excerpt_keeps_caret_and_blank_lines_inside_traceback() -> None:
    tb = [
        TB,
        '  File "/work/train.py", line 3, in <module>',
        "    x = 1 / zero",
        "        ~~^~~~~~",
        "",
        "ZeroDivisionError: division by zero",
    ]
    assert excerpt(["before", *tb, "after"]) == tb


def test_excerpt_picks_the_last_of_chained_tracebacks() -> None:
    first = traceback_lines("KeyError: 'lr'")
    last = traceback_lines("RuntimeError: config broken")
    lines = [
        *first,
        "",
        "During handling of the above exception, another exception occurred:",
        "",
        *last,
        "rank 0 exiting",
    ]
    assert excerpt(lines) == last


def test_excerpt_traceback_cut_off_at_end() -> None:
    tb = traceback_lines()[:-1]  # output ends before the exception line arrived
    assert excerpt(["noise", *tb]) == tb


def test_excerpt_shortens_long_traceback() -> None:
    tb = traceback_lines("MemoryError", frames=20)  # 42 lines
    out = excerpt(["noise", *tb], limit=12)
    assert len(out) == 12
    assert out[0] == TB
    assert out[1] == "    ..."
    assert out[2:] == tb[-10:]
    assert out[-1] == "MemoryError"


@pytest.mark.parametrize("limit", [1, 2])
def test_excerpt_small_limit_is_respected(limit: int) -> None:
    assert len(excerpt(traceback_lines(frames=5), limit=limit)) <= limit


# -- JobResult -----------------------------------------------------------------------------


def make(**changes: object) -> JobResult:
    fields: dict[str, object] = {
        "job_id": "job-7",
        "returncode": 0,
        "rank_exit_codes": {0: 0, 1: 0, 2: 0, 3: 0},
        "failed": (),
        "duration": 1.234,
    }
    fields.update(changes)
    return JobResult(**fields)  # type: ignore[arg-type]


FAILURE = RankFailure(
    rank=1,
    host="node7",
    exit_code=3,
    last_lines=("epoch 1", "epoch 2 loss nan", *traceback_lines(), "exit hook ran"),
)


def test_ok_result() -> None:
    result = make()
    assert result.ok
    assert result.failed_ranks == []
    assert result.check() is result
    assert result.summary() == "Job job-7 succeeded: 4 ranks in 1.23 s."


@pytest.mark.parametrize(
    "changes",
    [
        {"returncode": 1},
        {"returncode": -9},
        {"timed_out": True},
        {"cancelled": True},
        {"failed": (FAILURE,)},
    ],
)
def test_not_ok(changes: dict[str, object]) -> None:
    result = make(**changes)
    assert not result.ok
    with pytest.raises(JobFailedError) as excinfo:
        result.check()
    assert excinfo.value.result is result
    assert str(excinfo.value) == result.summary()
    assert isinstance(excinfo.value, JobError)
    assert isinstance(excinfo.value, ClusterError)


def test_summary_names_rank_host_code_and_exception() -> None:
    result = make(returncode=3, rank_exit_codes={0: 143, 1: 3}, failed=(FAILURE,))
    summary = result.summary()
    assert summary.startswith("Job job-7 failed (launcher exit code 3).")
    assert "Rank 1 on node7 exited with code 3:" in summary
    assert "    ValueError: bad input" in summary
    assert f"    {TB}" in summary
    # The excerpt, not the noise around it.
    assert "epoch 2 loss nan" not in summary
    assert "exit hook ran" not in summary
    assert result.failed_ranks == [1]


def test_summary_lists_every_failed_rank_in_order() -> None:
    other = RankFailure(rank=0, host="node3", exit_code=139, last_lines=("Segmentation fault",))
    summary = make(returncode=1, failed=(FAILURE, other)).summary()
    assert summary.index("Rank 1 on node7") < summary.index("Rank 0 on node3 exited with code 139")
    assert "    Segmentation fault" in summary


def test_summary_timed_out() -> None:
    summary = make(returncode=-15, timed_out=True, duration=30.04).summary()
    assert summary.startswith("Job job-7 timed out after 30.0 s and was stopped.")
    assert "cancelled" not in summary


def test_summary_cancelled() -> None:
    summary = make(returncode=-15, cancelled=True, duration=2.5).summary()
    assert summary.startswith("Job job-7 was cancelled after 2.5 s.")
    assert "timed out" not in summary


def test_summary_timed_out_with_failure_still_names_it() -> None:
    summary = make(returncode=-15, timed_out=True, failed=(FAILURE,)).summary()
    assert "timed out" in summary
    assert "Rank 1 on node7 exited with code 3:" in summary


def test_summary_shows_launcher_tail_when_no_rank_failed() -> None:
    tail = tuple(f"mpirun line {i}" for i in range(10))
    summary = make(returncode=1, launcher_tail=tail).summary()
    head, said = summary.split("\nThe launcher said:\n")
    assert head == "Job job-7 failed (launcher exit code 1)."
    assert said.splitlines() == [f"    mpirun line {i}" for i in range(2, 10)]  # the last 8


@pytest.mark.parametrize(
    "changes", [{"failed": (FAILURE,)}, {"timed_out": True}, {"cancelled": True}]
)
def test_summary_hides_launcher_tail_when_it_is_not_the_story(changes: dict) -> None:
    summary = make(returncode=1, launcher_tail=("mpirun noise",), **changes).summary()
    assert "The launcher said:" not in summary
    assert "mpirun noise" not in summary


def test_to_dict_is_json_ready() -> None:
    result = make(returncode=1, rank_exit_codes={0: 1, 1: None}, failed=(FAILURE,))
    data = result.to_dict()
    assert data["rank_exit_codes"] == {"0": 1, "1": None}
    assert data["failed"][0]["host"] == "node7"  # type: ignore[index]
    assert json.loads(json.dumps(data))["job_id"] == "job-7"


def test_the_timeline_has_a_row_per_rank_with_its_times_host_and_code() -> None:
    from clusterbook.views.html import render_timeline

    result = JobResult(
        job_id="job-0007",
        returncode=1,
        rank_exit_codes={0: 0, 1: 3, 2: None},
        failed=(),
        duration=2.0,
        rank_hosts={0: "node1", 1: "node2", 2: "node2"},
        rank_times={0: (100.0, 101.5), 1: (100.25, 100.75), 2: (100.5, None)},
    )
    frame = result.timeline()
    assert list(frame.columns) == ["rank", "host", "start", "end", "exit_code", "attempt"]
    assert frame["host"].tolist() == ["node1", "node2", "node2"]
    assert frame["exit_code"].tolist()[:2] == [0, 3]
    assert frame["exit_code"].isna().tolist() == [False, False, True]
    assert frame["end"].isna().tolist() == [False, False, True]  # killed before it said
    assert (frame["end"][0] - frame["start"][0]).total_seconds() == 1.5
    assert str(frame["start"].dtype) == "datetime64[us, UTC]"
    assert result.to_dict()["rank_times"] == {
        "0": [100.0, 101.5],
        "1": [100.25, 100.75],
        "2": [100.5, None],
    }
    svg = render_timeline(result.rank_times, result.rank_exit_codes)
    assert svg.startswith('<svg class="cb-timeline"')
    assert svg.count("<rect") == 3
    assert "#2f855a" in svg  # exit 0: green
    assert "#c53030" in svg  # exit 3: red
    assert "rank 1: 0.50 s, exit 3" in svg
    assert render_timeline({}, {0: None}) == ""  # no rank ever started: nothing to draw
    assert "cb-timeline" in result._repr_html_()
