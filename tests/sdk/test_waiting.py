"""Waits that let a notebook's buttons act while they block (:mod:`clusterbook.waiting`),
with a fake pump in place of the Jupyter layer's."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest

from clusterbook.waiting import each, pause, wait_until


class Clock:
    """A clock that moves only when told (by a fake wait)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_a_pump_a_wait_is_the_plain_wait() -> None:
    asked: list[float | None] = []

    def ready(seconds: float | None) -> bool:
        asked.append(seconds)
        return True

    assert wait_until(ready, 7.5, pump=None)
    assert asked == [7.5]


def test_outside_a_notebook_there_is_no_pump_and_the_wait_is_asked_once() -> None:
    # This process runs no notebook kernel: the Jupyter layer gives no pump.
    asked: list[float | None] = []

    def ready(seconds: float | None) -> bool:
        asked.append(seconds)
        return False

    assert not wait_until(ready, 0.0)
    assert asked == [0.0]


def test_the_pump_runs_between_steps_until_what_it_waits_for_comes() -> None:
    done = threading.Event()
    pumped: list[int] = []
    asked: list[float | None] = []

    def pump() -> None:
        pumped.append(len(pumped))
        if len(pumped) == 3:
            done.set()  # as a Stop button's click would end the job

    def ready(seconds: float | None) -> bool:
        asked.append(seconds)
        return done.wait(0)

    assert wait_until(ready, None, pump=pump, interval=0.25)
    assert pumped == [0, 1, 2]
    assert asked == [0.25, 0.25, 0.25, 0.25]


def test_what_it_waits_for_ends_the_wait_at_once_not_at_the_next_pump() -> None:
    # Each step waits on the thing itself: an event set meanwhile ends the step, with no pump
    # after it. (A sleep between looks would pump at least once before seeing it.)
    done = threading.Event()
    pumped: list[None] = []
    threading.Timer(0.05, done.set).start()
    assert wait_until(done.wait, None, pump=lambda: pumped.append(None), interval=60)
    assert pumped == []


def test_a_timeout_ends_the_wait_with_false_and_steps_never_pass_it() -> None:
    clock = Clock()
    asked: list[float | None] = []
    pumped: list[None] = []

    def ready(seconds: float | None) -> bool:
        assert seconds is not None
        asked.append(seconds)
        clock.now += seconds
        return False

    found = wait_until(ready, 1.0, pump=lambda: pumped.append(None), interval=0.4, clock=clock)
    assert not found
    assert asked == pytest.approx([0.4, 0.4, 0.2])
    assert len(pumped) == 2


def test_a_pump_that_fails_is_logged_and_the_wait_goes_on_without_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done = threading.Event()
    calls: list[float | None] = []

    def pump() -> None:
        raise RuntimeError("the kernel moved")

    def ready(seconds: float | None) -> bool:
        calls.append(seconds)
        if len(calls) == 2:
            done.set()
        return done.is_set()

    with caplog.at_level(logging.ERROR, logger="clusterbook"):
        assert wait_until(ready, None, pump=pump, interval=0.01)
    # One step with the pump, then the rest of the wait in one plain wait.
    assert calls == [0.01, None]
    assert "could not handle the notebook's clicks" in caplog.text
    assert "the kernel moved" in caplog.text


def test_an_interrupt_in_the_pump_goes_through() -> None:
    def pump() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        wait_until(lambda _: False, None, pump=pump, interval=0.001)


def test_pause_sleeps_its_time_and_pumps_meanwhile() -> None:
    pumped: list[None] = []
    pause(0.05, pump=lambda: pumped.append(None), interval=0.01)
    assert pumped  # a 0.05 s pause in 0.01 s steps pumps in between
    pause(0.01, pump=None)


def _slow(items: list[str], gate: threading.Event) -> Iterator[str]:
    """``items``, the second one only once ``gate`` is set (as a job's stream waits for its
    next line)."""
    for i, item in enumerate(items):
        if i == 1:
            assert gate.wait(10)
        yield item


def test_each_yields_every_item_in_order_and_pumps_while_the_next_is_awaited() -> None:
    gate = threading.Event()
    pumped: list[None] = []

    def pump() -> None:
        pumped.append(None)
        gate.set()  # a click that lets the stream go on

    got = list(each(_slow(["a", "b", "c"], gate), pump=pump, interval=0.01))
    assert got == ["a", "b", "c"]
    assert pumped


def test_each_without_a_pump_is_the_items_themselves() -> None:
    assert list(each(iter(["a", "b"]), pump=None)) == ["a", "b"]


def test_each_raises_the_error_of_its_items_here() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise OSError("the log file went away")

    items = each(broken(), pump=lambda: None, interval=0.01)
    assert next(items) == 1
    with pytest.raises(OSError, match="went away"):
        next(items)


def test_each_closed_early_stops_taking_items() -> None:
    taken: list[int] = []
    more = threading.Event()

    def counting() -> Iterator[int]:
        for i in range(1000):
            taken.append(i)
            yield i
            if i == 1:
                more.wait(10)

    before = set(threading.enumerate())
    items = each(counting(), pump=lambda: None, interval=0.01)
    assert next(items) == 0
    (taker,) = [t for t in threading.enumerate() if t not in before and "each" in t.name]
    items.close()
    more.set()
    taker.join(10)
    assert not taker.is_alive()
    # It stopped at the next item after it was told: not the thousand.
    assert len(taken) <= 3
