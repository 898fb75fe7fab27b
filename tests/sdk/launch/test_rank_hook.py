"""The rank hook (``sitecustomize`` on every Python rank's path), run in a plain Python with a
stand-in for ``mpi4py.MPI``: the failure marker comes before anything else the rank says."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from clusterbook.launch.rankwrap import HOOK_DIR, MARK

FAKE_MPI = """\
import os, sys, types
mpi = types.ModuleType("mpi4py.MPI")
mpi.Is_initialized = lambda: True
mpi.Is_finalized = lambda: False
def _abort(code):
    # MPICH's proxy kills every rank on an abort, unread output or not: exit 99 if the
    # launcher (here, the test) had not read all this rank wrote when it aborted.
    import fcntl, termios
    unread = bytearray(4)
    for fd in (1, 2):
        fcntl.ioctl(fd, termios.FIONREAD, unread)
        if int.from_bytes(unread, sys.byteorder):
            os._exit(99)
    os._exit(100 + code)
mpi.COMM_WORLD = types.SimpleNamespace(Abort=_abort)
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


def test_a_failing_rank_aborts_only_once_the_launcher_has_read_its_traceback() -> None:
    # The launcher reads late (as MPICH's proxy may: the abort message arrives on another
    # channel and is acted on first). The rank waits for its output to be read, then aborts.
    env = {**os.environ, "PYTHONPATH": HOOK_DIR, "CLUSTERBOOK_RANK_HOOK": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", FAKE_MPI + "print('partial result'); raise ValueError('boom')"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as rank:
        time.sleep(0.5)  # not read yet: a rank that does not wait has aborted by now
        out, err = rank.communicate(timeout=60)
    assert rank.returncode == 101, err  # 99: aborted with its output still unread
    assert out == "partial result\n"
    assert err.rstrip("\n").split("\n")[-1] == "ValueError: boom"


def test_a_rank_whose_launcher_never_reads_still_aborts() -> None:
    # Nothing hangs: the wait for the reader is bounded.
    env = {**os.environ, "PYTHONPATH": HOOK_DIR, "CLUSTERBOOK_RANK_HOOK": "1"}
    with subprocess.Popen(
        [sys.executable, "-c", FAKE_MPI + "raise ValueError('boom')"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as rank:
        assert rank.wait(timeout=60) == 99  # aborted, its traceback still in the pipe
        assert rank.stderr is not None
        assert rank.stderr.read().endswith(b"ValueError: boom\n")


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


def test_the_hook_stays_light_and_still_runs_another_sitecustomize(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Every rank pays for what the hook imports: never importlib.util (with contextlib and
    # functools, ~7 ms), not even to run another sitecustomize (Ubuntu's Python has one), and
    # no search of the whole path by the import system where there is none.
    light = _rank(
        "import sys; print(*(m in sys.modules for m in ('importlib.util', 'importlib.machinery')))"
    )
    assert light.stdout.split() == ["False", "False"], light.stderr
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nprint('the other one ran', __name__, __file__ == sys.argv[-1])\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{HOOK_DIR}:{tmp_path}", "CLUSTERBOOK_RANK_HOOK": "1"}
    program = "import sys; print('importlib.util' in sys.modules)"
    chained = subprocess.run(
        [sys.executable, "-c", program, str(tmp_path / "sitecustomize.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert chained.stdout == "the other one ran sitecustomize True\nFalse\n", chained.stderr


EARLY_WARNING = """\
import os, signal
if {early}:  # Slurm's warning, while the program still starts
    os.kill(os.getpid(), signal.SIGUSR1)
print("started", flush=True)
import clusterbook

@clusterbook.on_preempt
def save():
    print("checkpoint written", flush=True)

print("went on", flush=True)
"""


@pytest.mark.parametrize("hook", ["1", "stacks"])
def test_a_warning_before_on_preempt_dumps_the_stacks_and_runs_its_function_once_set(hook) -> None:  # type: ignore[no-untyped-def]
    out = _rank(EARLY_WARNING.format(early=True), hook=hook)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "started\ncheckpoint written\nwent on\n"
    assert "most recent call first" in out.stderr  # the stacks, as the warning came
    quiet = _rank(EARLY_WARNING.format(early=False), hook=hook)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stdout == "started\nwent on\n"  # no warning: no checkpoint
    assert quiet.stderr == ""
