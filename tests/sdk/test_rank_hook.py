"""The rank hook (``sitecustomize`` on every Python rank's path), run in a plain Python with a
stand-in for ``mpi4py.MPI``: the failure marker comes before anything else the rank says."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterbook.launch.rankwrap import HOOK_DIR, MARK

FAKE_MPI = """\
import os, sys, types
mpi = types.ModuleType("mpi4py.MPI")
mpi.Is_initialized = lambda: True
mpi.Is_finalized = lambda: False
mpi.COMM_WORLD = types.SimpleNamespace(Abort=lambda code: os._exit(100 + code))
sys.modules["mpi4py.MPI"] = mpi
"""


def _rank(body: str, hook: str = "1") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": HOOK_DIR, "CLUSTERBOOK_RANK_HOOK": hook}
    return subprocess.run(
        [sys.executable, "-c", FAKE_MPI + body],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_an_uncaught_exception_is_marked_before_its_traceback_then_aborts() -> None:
    # Two ranks that fail at once: the first to abort makes the launcher kill the other one,
    # maybe half-way through its traceback. Its marker, written first, still counts it.
    out = _rank("raise ValueError('boom')")
    lines = out.stderr.rstrip("\n").split("\n")
    assert lines[0] == f"{MARK} exit 1"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: boom"
    assert out.returncode == 101  # MPI_Abort(1)


@pytest.mark.parametrize(
    ("call", "marker", "said", "code"),
    [("sys.exit(3)", "exit 3", [], 103), ("sys.exit('no data')", "exit 1", ["no data"], 101)],
)
def test_sys_exit_with_an_error_is_marked_first(call, marker, said, code) -> None:  # type: ignore[no-untyped-def]
    out = _rank(call)
    assert out.stderr.rstrip("\n").split("\n") == [f"{MARK} {marker}", *said]
    assert out.returncode == code


def test_without_abort_nothing_is_marked() -> None:
    out = _rank("raise ValueError('boom')", hook="stacks")
    assert MARK not in out.stderr
    assert out.returncode == 1
