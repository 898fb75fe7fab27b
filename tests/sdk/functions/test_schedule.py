"""The sweep's pure decisions: what a free rank gets next, what a failed run leads to, when the
sweep is over, and when an idle pool stops; then what ``cluster.map`` gives back."""

from __future__ import annotations

import itertools

import pytest

from clusterbook.errors import ItemFailedError, SweepFailedError
from clusterbook.functions.results import result_of
from clusterbook.functions.schedule import Failure, Schedule, idle_expired

RAISED = Failure("raised", "ValueError", "bad", "Traceback ...\nValueError: bad\n", 1, "node1")
LOST = Failure("lost", "RankLost", "rank 1 on node1 went", rank=1, host="node1")


def test_items_are_taken_lazily_one_per_free_rank() -> None:
    counter = itertools.count()
    taken: list[int] = []

    def items():  # type: ignore[no-untyped-def]
        for i in counter:
            taken.append(i)
            yield i

    schedule = Schedule(items(), retries=0)
    first, second = schedule.take(), schedule.take()
    assert (first and first.index, second and second.index) == (0, 1)
    assert taken == [0, 1]  # an endless input: only what ranks hold has been read


def test_has_more_reads_one_item_ahead_and_take_hands_it_out_first() -> None:
    schedule = Schedule(iter("ab"), retries=0)
    assert schedule.has_more()
    first = schedule.take()
    assert first is not None
    assert (first.index, first.item) == (0, "a")
    empty = Schedule(iter(()), retries=0)
    assert not empty.has_more()
    assert empty.finished


def test_a_raising_item_runs_again_up_to_retries_then_fails_the_others_kept() -> None:
    schedule = Schedule(["a", "b"], retries=1)
    a, b = schedule.take(), schedule.take()
    assert a is not None
    assert b is not None
    schedule.succeeded(b, "B")
    assert schedule.failed(a, RAISED) is True
    again = schedule.take()
    assert again is not None
    assert (again.index, again.attempt, again.item) == (0, 1, "a")
    assert schedule.failed(again, RAISED) is False
    assert schedule.take() is None
    assert schedule.finished
    assert schedule.values == {1: "B"}
    assert schedule.failures == {0: ("a", RAISED, 2)}


def test_a_lost_item_runs_again_even_without_retries_but_not_forever() -> None:
    schedule = Schedule(["x"], retries=0)
    task = schedule.take()
    assert task is not None
    assert schedule.failed(task, LOST) is True
    task = schedule.take()
    assert task is not None
    assert schedule.failed(task, LOST) is False
    assert schedule.take() is None
    assert schedule.finished
    assert schedule.failures[0][1] is LOST


def test_an_unpicklable_item_is_not_run_again() -> None:
    schedule = Schedule(["x"], retries=5)
    task = schedule.take()
    assert task is not None
    assert schedule.failed(task, Failure("unpicklable", "TypeError", "no")) is False


def test_not_finished_while_an_item_is_out() -> None:
    schedule = Schedule([1], retries=0)
    task = schedule.take()
    assert schedule.take() is None
    assert not schedule.finished
    assert schedule.out == 1
    assert task is not None
    schedule.succeeded(task, 2)
    assert schedule.finished
    assert schedule.out == 0


def test_giving_up_ends_every_item_not_done_with_the_reason() -> None:
    schedule = Schedule(range(4), retries=0)
    done, out = schedule.take(), schedule.take()
    assert done is not None
    assert out is not None
    schedule.succeeded(done, 0)
    schedule.give_up(LOST)
    assert schedule.finished
    assert sorted(schedule.failures) == [1, 2, 3]
    assert schedule.count == 4


def test_an_idle_pool_stops_only_once_unused_for_its_time() -> None:
    assert not idle_expired(100.0, 159.0, 60.0, busy=False)
    assert idle_expired(100.0, 160.0, 60.0, busy=False)
    assert not idle_expired(100.0, 1000.0, 60.0, busy=True)


def _finished(order: list[int], fail: int | None) -> Schedule:
    schedule = Schedule(range(3), retries=0)
    tasks = {t.index: t for t in (schedule.take(), schedule.take(), schedule.take()) if t}
    for index in order:
        if index == fail:
            schedule.failed(tasks[index], RAISED)
        else:
            schedule.succeeded(tasks[index], index * 10)
    return schedule


def test_results_in_input_order_or_as_they_finished() -> None:
    schedule = _finished([2, 0, 1], None)
    assert list(result_of(schedule, ordered=True)) == [0, 10, 20]
    unordered = result_of(schedule, ordered=False)
    assert list(unordered) == [20, 0, 10]
    assert unordered.indices == (2, 0, 1)
    assert result_of(schedule, ordered=True).check().ok


def test_a_failed_item_keeps_its_place_and_names_its_input_and_traceback() -> None:
    result = result_of(_finished([0, 1, 2], 1), ordered=True)
    assert not result.ok
    assert len(result) == 3
    assert result[0] == 0
    assert result[2] == 20
    assert result.values(default="-") == [0, "-", 20]
    with pytest.raises(ItemFailedError) as raised:
        result[1]
    error = raised.value
    assert (error.index, error.input, error.rank, error.host) == (1, 1, 1, "node1")
    assert "Item 1 (1) raised ValueError: bad on rank 1 (node1)" in str(error)
    assert "Remote traceback:" in str(error)
    assert error.remote_traceback == RAISED.traceback
    with pytest.raises(ItemFailedError):
        list(result)
    with pytest.raises(SweepFailedError) as failed:
        result.check()
    assert set(failed.value.failed) == {1}
    assert "1 of 3 items failed" in str(failed.value)
    assert "1 failed" in repr(result)
