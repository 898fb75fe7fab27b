"""A cell run as a job, its pure parts: the notebook values it is given, and what is said of
its end (the cell run for real on a cluster: test_magics.py)."""

from __future__ import annotations

import threading

import cloudpickle  # type: ignore[import-untyped]
import pytest

from clusterbook.launch.result import JobResult, KeptProcess
from clusterbook_widgets.cell_job import CellError, ending, pushed


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
