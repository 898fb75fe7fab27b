"""The heartbeat thread of a handler: beats while on, and is not woken for nothing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from clusterbook.rendezvous.beats import Heartbeats


def woken(thread: threading.Thread) -> int:
    """How many times ``thread`` went to sleep and woke (its voluntary context switches)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status")
    if not status.exists():
        pytest.skip("needs Linux's per-thread /proc status")
    for line in status.read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError("no voluntary_ctxt_switches line")


def settled(thread: threading.Thread) -> int:
    """``woken(thread)`` once it has stayed the same for a moment (the thread is asleep)."""
    last = woken(thread)
    while True:
        time.sleep(0.05)
        now = woken(thread)
        if now == last:
            return now
        last = now


def test_switching_on_and_off_between_beats_does_not_wake_the_thread() -> None:
    beats: list[float] = []
    # As a handler with a 30 s keep-alive interval.
    hb = Heartbeats("test-beats", lambda: 30.0, lambda: beats.append(0.0) or 30.0, idle=30.0)
    try:
        before = settled(hb._thread)
        for _ in range(50):  # a rendezvous: off while joining, on once the round is complete
            hb.pause(1.0)
            hb.start()
        after = settled(hb._thread)
    finally:
        hb.close(5.0)
    assert after - before <= 2, (before, after)  # not once or twice a switch
    assert beats == []


def test_a_first_beat_due_before_the_sleep_ends_wakes_the_thread() -> None:
    beat = threading.Event()
    hb = Heartbeats("test-beats", lambda: 0.05, lambda: beat.set() or 30.0, idle=60.0)
    try:
        settled(hb._thread)  # asleep for a minute while off
        hb.start()
        assert beat.wait(30.0)  # well before the minute is up
        hb.pause(5.0)
        beat.clear()
        assert not beat.wait(0.3)  # off: no more beats
    finally:
        hb.close(5.0)
    assert not hb._thread.is_alive()


def test_beats_come_every_interval_while_on_and_close_ends_the_thread() -> None:
    times: list[float] = []
    hb = Heartbeats("test-beats", lambda: 0.02, lambda: times.append(time.monotonic()) or 0.02)
    hb.start()
    deadline = time.monotonic() + 10
    while len(times) < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    hb.close(5.0)
    assert len(times) >= 5
    assert not hb._thread.is_alive()
    # Started again after close: a new thread.
    hb.start()
    try:
        assert hb._thread.is_alive()
    finally:
        hb.close(5.0)
