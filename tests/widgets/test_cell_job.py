"""A cell run as a job, its pure parts: the notebook values it is given, and what is said of
its end (the cell run for real on a cluster: test_magics.py)."""

from __future__ import annotations

import threading

import cloudpickle  # type: ignore[import-untyped]
import pytest

from clusterbook.launch.result import AttemptInfo, JobResult, KeptProcess, RankFailure
from clusterbook_widgets.cell_job import CellError, compiled, ending, failure, pushed


def result(**fields: object) -> JobResult:
    base: dict[str, object] = {
        "job_id": "job-0001",
        "returncode": 0,
        "rank_exit_codes": {0: 0, 1: 0},
        "failed": (),
        "duration": 2.5,
    }
    return JobResult(**{**base, **fields})  # type: ignore[arg-type]


def test_pushed_values_are_pickled_by_value_and_a_missing_one_is_named() -> None:
    def twice(x: int) -> int:  # defined here: plain pickle would send it by name
        return 2 * x

    data = pushed({"a": 1, "f": twice, "other": 3}, ["a", "f"])
    assert data is not None
    values = cloudpickle.loads(data)
    assert (sorted(values), values["a"], values["f"](4)) == (["a", "f"], 1, 8)
    assert pushed({"a": 1}, []) is None
    with pytest.raises(CellError, match=r"--push: b, c not defined in the notebook"):
        pushed({"a": 1}, ["a", "b", "c"])


def test_a_value_that_cannot_be_pushed_is_named_with_its_type() -> None:
    with pytest.raises(CellError, match=r"--push lock: lock objects cannot be sent"):
        pushed({"lock": threading.Lock()}, ["lock"])


def test_a_job_that_succeeded_says_nothing_more() -> None:
    assert ending(result(), {}, None) == []


def test_a_stopped_job_says_what_stopped_it() -> None:
    (timed_out,) = ending(result(returncode=1, timed_out=True), {}, 5.0)
    assert timed_out.startswith("%%mpirun: timed out after 5 s; the job was stopped.")
    (deadline,) = ending(result(returncode=1, deadline_exceeded=True, duration=7.25), {}, None)
    assert deadline.startswith("%%mpirun: the deadline passed after 7.2 s;")


def test_a_failure_no_rank_explains_is_told_by_its_summary() -> None:
    failed = result(returncode=1, error="mpirun could not start")
    assert ending(failed, {}, None) == [failed.summary()]


def test_processes_kept_for_inspection_are_listed_by_rank() -> None:
    kept = (KeptProcess(101, "h", "python", 0), KeptProcess(102, "h", "prted"))
    *_, said = ending(result(returncode=1, rank_exit_codes={0: 1}, kept=kept), {}, None)
    assert said.startswith("%%mpirun: kept stopped for inspection (--clean none): rank 0 pid 101")
    assert "with 2 process(es) in all" in said


def test_a_cell_that_is_not_python_is_told_where() -> None:
    compiled("x = 1\n")
    with pytest.raises(CellError, match=r"(?s)not valid Python.*line 2\n    y = \)"):
        compiled("x = 1\ny = )\n")


# -- the error a failed cell raises --------------------------------------------------------

TB = ("Traceback (most recent call last):", '  File "<mpirun cell 3>", line 1, in <module>',
      "ValueError: no")  # fmt: skip


def test_a_failed_cell_says_its_ranks_hosts_and_error_once() -> None:
    failed = (RankFailure(1, "node1", 1, TB), RankFailure(3, "node2", 1, TB))
    res = result(returncode=1, rank_exit_codes={0: 0, 1: 1, 2: 0, 3: 1}, failed=failed)
    said = failure(res, {1: [TB], 3: [TB]}, None)
    assert said.split("\n") == [
        "job-0001 failed: ranks 1, 3 exited with code 1 on node1, node2.",
        "Error on ranks 1, 3:",
        *TB,
    ]
    # The traceback in a rank's last lines stands in for one not seen as it came.
    assert failure(res, {}, None) == said


def test_ranks_failing_alike_on_many_hosts_are_counted_and_each_exit_code_told() -> None:
    failed = tuple(RankFailure(r, f"n{r}", 1, ("x",)) for r in range(5))
    failed += (RankFailure(7, "n1", 9, ()),)
    res = result(returncode=1, rank_exit_codes={r: 1 for r in range(8)}, failed=failed)
    head, *rest = failure(res, {}, None).split("\n")
    assert head == (
        "job-0001 failed: ranks 0-4 exited with code 1 on 5 hosts; rank 7 exited with code 9 on n1."
    )
    # The last lines of the first two that raised nothing; the others named, not shown.
    assert rest == [
        "Rank 0's last lines:",
        "    x",
        "Rank 1's last lines:",
        "    x",
        "The output of ranks 2-4, 7 is in the job's logs (cluster.jobs[-1].logs()).",
    ]


def test_a_rank_that_said_nothing_and_the_last_lines_kept_short() -> None:
    many = tuple(f"line {i}" for i in range(20))
    failed = (RankFailure(0, "h", 2, many), RankFailure(1, "h", 2, ()))
    said = failure(result(returncode=1, rank_exit_codes={0: 2, 1: 2}, failed=failed), {}, None)
    assert said.split("\n")[1:] == [
        "Rank 0's last lines:",
        *(f"    line {i}" for i in range(14, 20)),
        "Rank 1 wrote nothing.",
    ]


def test_a_stopped_cell_says_what_stopped_it_and_where_the_stacks_are() -> None:
    said = failure(result(returncode=1, timed_out=True), {}, 5.0)
    assert said == (
        "job-0001: timed out after 5 s; the job was stopped.\n"
        "Where each rank was is in its stack above (most recent call first)."
    )
    said = failure(result(returncode=1, deadline_exceeded=True, duration=7.25), {}, None)
    assert said.startswith("job-0001: the deadline passed after 7.2 s; the job was stopped.\n")


def test_a_failure_no_rank_explains_raises_its_summary_and_the_name_not_pulled() -> None:
    failed = result(returncode=1, error="mpirun could not start")
    assert failure(failed, {}, None) == failed.summary()
    said = failure(failed, {}, None, pull="y")
    assert said == failed.summary() + "\n--pull y: not set, the job did not succeed."


def test_retries_notes_and_kept_processes_are_in_the_error() -> None:
    attempts = tuple(AttemptInfo(n, "failure", "rank 0 exited 1", 0.0, 1.0) for n in (1, 2))
    kept = (KeptProcess(101, "h", "python", 0),)
    res = result(
        returncode=1,
        rank_exit_codes={0: 1},
        failed=(RankFailure(0, "h", 1, TB),),
        attempts=attempts,
        notes=("A note.",),
        kept=kept,
    )
    said = failure(res, {}, None).split("\n")
    assert said[:2] == ["job-0001 failed (2 attempts): rank 0 exited with code 1 on h.", "A note."]
    assert said[-1].startswith("Kept stopped for inspection (--clean none): rank 0 pid 101")


def test_errors_that_differ_from_rank_to_rank_are_shown_three_at_most() -> None:
    blocks = {
        r: [("Traceback (most recent call last):", f"ValueError: rank {r}")] for r in range(6)
    }
    failed = tuple(RankFailure(r, "h", 1, blocks[r][0]) for r in range(6))
    res = result(returncode=1, rank_exit_codes={r: 1 for r in range(6)}, failed=failed)
    said = failure(res, blocks, None).split("\n")
    assert said[1:] == [
        *(line for r in range(3) for line in (f"Error on rank {r}:", *blocks[r][0])),
        "3 other error(s), on ranks 3-5: in the job's logs (cluster.jobs[-1].logs()).",
    ]
