"""Stopping a launcher's process tree: its descendants and its tagged processes, and never a
process that took the pid of one already reaped."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterbook.launch.guard import ENV
from clusterbook.launch.proc import kill_tree, spawn

SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_launcher_and_its_children_are_stopped() -> None:
    launcher = spawn(
        ["/bin/sh", "-c", f"{SLEEP[0]} -c 'import time; time.sleep(60)' & wait"],
        env=dict(os.environ),
        cwd=None,
    )
    try:
        kill_tree(launcher, 1.0)
        assert launcher.wait(timeout=10) != 0
    finally:
        launcher.kill()
        launcher.wait()


def test_a_reaped_launchers_pid_in_other_hands_is_left_alone() -> None:
    # The launcher has ended and been reaped; its pid is now another process's (pids wrap).
    other = subprocess.Popen(SLEEP)
    launcher = spawn(["true"], env=dict(os.environ), cwd=None)
    try:
        assert launcher.wait(timeout=10) == 0
        launcher.pid = other.pid  # what the kernel may do once the pid is free
        kill_tree(launcher, 0.2)
        with pytest.raises(subprocess.TimeoutExpired):  # not stopped, not killed
            other.wait(timeout=0.5)
    finally:
        other.kill()
        other.wait()


def test_a_reaped_launchers_tagged_processes_still_go() -> None:
    # A rank that outlived its launcher (reparented, found by the job's tag) is stopped.
    tagged = subprocess.Popen(SLEEP, env={**os.environ, ENV: "test-proc:orphan"})
    launcher = spawn(["true"], env=dict(os.environ), cwd=None)
    try:
        assert launcher.wait(timeout=10) == 0
        kill_tree(launcher, 0.2, "test-proc:orphan")
        assert tagged.wait(timeout=10) != 0
    finally:
        tagged.kill()
        tagged.wait()
