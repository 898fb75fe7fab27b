"""Unit tests of telling whether a record's head runs: its pid, start time and program, with
real processes (a pid that is another process's now is one the test starts)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from clusterbook.head.liveness import head_state, own_mark, process_mark

HOST = socket.gethostname()


@pytest.fixture
def other() -> Iterator[subprocess.Popen[bytes]]:
    """A live process that is not the head (the head's pid, given to another process)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_head_is_alive_by_its_pid_start_and_program() -> None:
    started, program = own_mark()
    assert started is not None
    assert program == os.path.realpath(sys.executable)
    assert head_state(os.getpid(), HOST, started, program) == "alive"


def test_a_pid_that_another_process_has_now_is_a_head_gone(other) -> None:
    started, program = own_mark()
    assert head_state(other.pid, HOST, started, program) == "gone"  # it started later
    mark = process_mark(other.pid)
    assert mark is not None
    assert head_state(other.pid, HOST, mark[1], "/usr/bin/other-program") == "gone"
    assert head_state(other.pid, HOST, mark[1], mark[2]) == "alive"


def test_what_cannot_be_verified_is_unknown_and_what_ended_is_gone(other) -> None:
    assert head_state(other.pid, HOST, None, None) == "unknown"  # an older record: pid only
    assert head_state(other.pid, "elsewhere", 1, None) == "unknown"
    assert head_state(0, HOST, 1, None) == "unknown"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while (mark := process_mark(zombie.pid)) is not None and mark[0] != "Z":
            assert time.monotonic() < deadline, "the child did not end"
            time.sleep(0.01)
        assert head_state(zombie.pid, HOST, None, None) == "gone"  # not waited for yet
    finally:
        zombie.wait()
    assert head_state(zombie.pid, HOST, None, None) == "gone"
