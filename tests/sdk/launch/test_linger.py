"""When a launcher whose ranks all ended well is stopped (``clusterbook.launch.linger``)."""

from __future__ import annotations

import threading
import time

from clusterbook.launch.linger import LINGER, QUIET, linger, stop_at


def test_a_silent_launcher_is_stopped_quiet_seconds_after_its_last_rank():
    assert stop_at(100.0, 90.0) == 100.0 + QUIET  # its output came before the rank's end
    assert stop_at(100.0, 100.0) == 100.0 + QUIET


def test_output_after_the_last_rank_puts_the_stop_off_up_to_the_most():
    assert stop_at(100.0, 102.0) == 102.0 + QUIET  # a process in the background still writes
    assert stop_at(100.0, 100.0 + LINGER) == 100.0 + LINGER  # but not past the most
    assert stop_at(0.0, 0.5, quiet=0.2, most=3.0) == 0.7


def run(last_output, *, quiet=0.1, most=1.0, gone=None):
    """linger() started on a thread for a rank that ended now: the event its stop() sets, the
    one that says the launcher ended, the thread, and now."""
    stopped = threading.Event()
    gone = gone or threading.Event()
    began = time.monotonic()
    args = (began, last_output, gone, stopped.set)
    thread = threading.Thread(target=linger, args=args, kwargs={"quiet": quiet, "most": most})
    thread.start()
    return stopped, gone, thread, began


def test_linger_stops_a_silent_launcher_after_quiet():
    stopped, _, thread, began = run(lambda: 0.0)
    assert stopped.wait(5.0)
    thread.join(5.0)
    assert time.monotonic() - began >= 0.1


def test_linger_waits_while_output_comes_and_stops_at_the_most():
    stopped, _, thread, began = run(time.monotonic, quiet=0.2, most=0.6)  # always "just now"
    assert not stopped.wait(0.4)  # past quiet: output keeps coming
    assert stopped.wait(5.0)
    thread.join(5.0)
    assert time.monotonic() - began >= 0.6


def test_linger_returns_without_a_stop_when_the_launcher_ends():
    stopped, gone, thread, _ = run(lambda: 0.0, quiet=0.5, most=1.0)
    gone.set()
    thread.join(5.0)
    assert not thread.is_alive()
    assert not stopped.is_set()
