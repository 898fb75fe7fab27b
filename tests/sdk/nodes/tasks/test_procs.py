"""A node's processes by their tag."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from clusterbook.nodes.tasks.procs import kill_tagged, tagged
from clusterbook.nodes.tasks.program import ENTRY


def test_tagged_matches_whole_tokens_unless_asked_for_a_prefix():
    env = {**os.environ, "CLUSTERBOOK_JOB": "c1:abcdef"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        time.sleep(0.2)
        assert proc.pid in tagged(["c1:abcdef"])
        assert proc.pid not in tagged(["c1:abc"])  # a job token is matched whole
        assert proc.pid in tagged(["c1:"], prefix=True)  # a cluster's clean-up
        assert proc.pid not in tagged(["c10:"], prefix=True)
        assert kill_tagged(["c1:abcdef"], 1.0) == [proc.pid]
        assert proc.wait(timeout=5) != 0
    finally:
        proc.kill()
        proc.wait()


# A stand-in for an MPI daemon that the node's agent started (tagged with the job): named
# prted, it takes its time over a SIGTERM, and says so in a file if it ever finishes one.
_SLOW_DAEMON = """
import ctypes, signal, sys, time
ctypes.CDLL(None).prctl(15, b"prted", 0, 0, 0)  # PR_SET_NAME: the name ps and /proc show

def term(*_):
    time.sleep(20)
    open(sys.argv[1], "w").write("done")
    sys.exit(0)

signal.signal(signal.SIGTERM, term)
print("ready", flush=True)
time.sleep(600)
"""


def test_a_tagged_mpi_daemon_gets_its_sigkill_once_the_programs_are_gone(tmp_path):
    # The grace is for the programs: a daemon slow to end on SIGTERM (Open MPI's prted once
    # its launcher is gone) must not hold up the job's end, and a relaunch after it.
    env = {**os.environ, "CLUSTERBOOK_JOB": "c1:daemon"}
    finished = tmp_path / "finished"
    daemon = subprocess.Popen(
        [sys.executable, "-c", _SLOW_DAEMON, str(finished)], env=env, stdout=subprocess.PIPE
    )
    program = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert daemon.stdout is not None
        assert daemon.stdout.readline() == b"ready\n"
        assert Path(f"/proc/{daemon.pid}/comm").read_text().strip() == "prted"
        killed = kill_tagged(["c1:daemon"], 60.0)
        assert sorted(killed) == sorted([daemon.pid, program.pid])
        assert daemon.wait(timeout=5) == -9  # killed in its SIGTERM handler, not waited for
        assert not finished.exists()
        assert program.wait(timeout=5) == -15
    finally:
        for proc in (daemon, program):
            proc.kill()
            proc.wait()
        if daemon.stdout is not None:
            daemon.stdout.close()


def test_the_guard_removes_what_a_dead_head_kept_and_nothing_else(tmp_path):
    # Three heads' directories: one whose process died running it, one that also holds a
    # job's output, one whose cluster stopped (released) before the process died.
    dirs = {name: tmp_path / name for name in ("dead", "output", "stopped")}
    for directory in dirs.values():
        (directory / "keys").mkdir(parents=True)
        (directory / "keys" / "agent").write_text("key")
        for name in ("token", "id_ed25519", "id_ed25519.pub", "known_hosts", "launch-agent"):
            (directory / name).write_text(name)
    (dirs["output"] / "slurm-7.out").write_text("the job's output")
    guard = subprocess.Popen(
        [sys.executable, "-S", ENTRY, "reap"], stdin=subprocess.PIPE, text=True
    )
    assert guard.stdin is not None
    for directory in dirs.values():
        guard.stdin.write(f"+dir {directory}\n")
    guard.stdin.write(f"-dir {dirs['stopped']}\n")
    guard.stdin.close()  # what the kernel does when the process dies
    assert guard.wait(timeout=30) == 0
    assert not dirs["dead"].exists()
    assert [p.name for p in dirs["output"].iterdir()] == ["slurm-7.out"]
    assert sorted(p.name for p in dirs["stopped"].iterdir()) == [
        "id_ed25519",
        "id_ed25519.pub",
        "keys",
        "known_hosts",
        "launch-agent",
        "token",
    ]
