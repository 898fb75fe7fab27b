"""The Throttle: at most one call an interval, the newest value delivered, on a clock injected
(:class:`~tests.widgets.fakes.ManualScheduler`) or real threads."""

from __future__ import annotations

import datetime
import itertools
import threading
import time

import pytest

from clusterbook_widgets.throttle import ThreadScheduler, Throttle
from tests.widgets.fakes import ManualScheduler


def make_throttle(interval: float = 0.1):
    clock = ManualScheduler()
    calls: list[tuple[float, object]] = []
    throttle = Throttle(interval, lambda v: calls.append((clock.now(), v)), scheduler=clock)
    return throttle, clock, calls


def test_first_value_goes_out_at_once():
    throttle, clock, calls = make_throttle()
    throttle.push("a")
    assert calls == []  # never on the pushing thread
    clock.advance(0)
    assert calls == [(0.0, "a")]


def test_a_burst_of_1000_pushes_is_coalesced_and_the_last_value_delivered():
    throttle, clock, calls = make_throttle(0.1)
    for i in range(1000):
        throttle.push(i)
        clock.advance(0.001)  # 1,000 values over one second
    clock.advance(1.0)
    values = [v for _, v in calls]
    assert values[-1] == 999
    assert len(calls) <= 11  # leading call plus one per 0.1 s
    assert len(calls) >= 10  # a steady stream is shown steadily, not only at the end
    times = [t for t, _ in calls]
    assert all(b - a >= 0.1 - 1e-9 for a, b in itertools.pairwise(times))
    assert values == sorted(values)


def test_a_burst_at_one_instant_is_a_single_call_with_the_latest_value():
    throttle, clock, calls = make_throttle()
    for i in range(1000):
        throttle.push(i)
    clock.advance(5.0)
    assert calls == [(0.0, 999)]
    assert clock.pending == 0


def test_trailing_call_delivers_what_came_during_the_interval():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push("a")
    clock.advance(0)
    clock.advance(0.03)
    throttle.push("b")
    throttle.push("c")
    clock.advance(0.05)
    assert [v for _, v in calls] == ["a"]
    clock.advance(0.02)
    assert calls[-1] == (pytest.approx(0.1), "c")
    assert len(calls) == 2


def test_push_after_a_quiet_interval_is_a_leading_call_again():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push(1)
    clock.advance(0)
    clock.advance(0.5)
    throttle.push(2)
    clock.advance(0)
    assert calls == [(0.0, 1), (0.5, 2)]


def test_flush_delivers_now_and_the_next_call_keeps_the_interval():
    throttle, clock, calls = make_throttle(0.1)
    throttle.push(1)
    throttle.flush()
    assert calls == [(0.0, 1)]
    clock.advance(0)  # the call scheduled by push finds nothing left to deliver
    assert len(calls) == 1
    throttle.push(2)
    clock.advance(0.05)
    assert len(calls) == 1
    clock.advance(0.05)
    assert calls[-1] == (pytest.approx(0.1), 2)


def test_close_drops_the_pending_value_and_ignores_later_pushes():
    throttle, clock, calls = make_throttle()
    throttle.push(1)
    throttle.close()
    throttle.push(2)
    clock.advance(1.0)
    assert calls == []
    assert throttle.closed


def test_a_failing_call_does_not_stop_later_ones(caplog: pytest.LogCaptureFixture):
    clock = ManualScheduler()
    seen: list[int] = []

    def call(value: int) -> None:
        seen.append(value)
        if value == 1:
            raise RuntimeError("boom")

    throttle = Throttle(0.1, call, scheduler=clock)
    throttle.push(1)
    clock.advance(0)
    throttle.push(2)
    clock.advance(0.1)
    assert seen == [1, 2]
    assert "throttled clusterbook update failed" in caplog.text


@pytest.mark.parametrize("interval", [0.25, datetime.timedelta(milliseconds=250), "250ms"])
def test_the_interval_is_a_duration_in_any_form(interval: object) -> None:
    assert Throttle(interval, print).interval == 0.25  # type: ignore[arg-type]


def test_throttle_validates_its_arguments():
    with pytest.raises(ValueError, match="interval"):
        Throttle(-1, print)
    with pytest.raises(TypeError, match="callable"):
        Throttle(0.1, None)


def test_real_threads_pushing_1000_values_are_throttled():
    calls: list[tuple[float, object]] = []
    done = threading.Event()

    def call(value: object) -> None:
        calls.append((time.monotonic(), value))
        if value == "last":
            done.set()

    throttle = Throttle(0.05, call, scheduler=ThreadScheduler())
    start = time.monotonic()

    def pusher(k: int) -> None:
        for i in range(250):
            throttle.push((k, i))
            time.sleep(0.0004)

    threads = [threading.Thread(target=pusher, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    throttle.push("last")
    assert done.wait(5.0)
    elapsed = time.monotonic() - start
    throttle.close()
    assert calls[-1][1] == "last"
    assert len(calls) <= elapsed / 0.05 + 2
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(calls)]
    assert min(gaps) >= 0.05 - 0.005
