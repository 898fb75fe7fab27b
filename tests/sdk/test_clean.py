"""The clean policy (``clean=``): what the ranks are told, the rank wrapper that stops itself
after a failure, and a result that lists the processes a failed job kept."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import replace

import psutil
import pytest

import clusterbook as cb
from clusterbook.launch.command import LaunchPlan, rank_env
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.rankwrap import wrap_argv
from clusterbook.launch.result import JobResult, KeptProcess, RankFailure

# -- what the ranks are told --------------------------------------------------------------------


def _plan(**changes: object) -> LaunchPlan:
    base = LaunchPlan(
        launcher=Launcher("/opt/mpi/bin/mpirun", MPIFlavour.OPENMPI, "5.0.11"),
        nodes=(cb.NodeSpec("local-0", "localhost", 2, cores=2),),
        np=2,
        argv=("python", "x.py"),
        env={},
        hostfile="/tmp/h",
        output_dir="/tmp/o",
    )
    return replace(base, **changes)


def test_only_a_job_that_keeps_tells_its_ranks() -> None:
    assert rank_env(_plan(clean="none"))["CLUSTERBOOK_CLEAN"] == "none"
    assert "CLUSTERBOOK_CLEAN" not in rank_env(_plan())
    assert "CLUSTERBOOK_CLEAN" not in rank_env(_plan(clean="running"))
    # A job's own env cannot ask for it: the head would not stop the rest.
    assert "CLUSTERBOOK_CLEAN" not in rank_env(_plan(env={"CLUSTERBOOK_CLEAN": "none"}))


# -- the rank wrapper -----------------------------------------------------------------------


def _wrapped(script: str, *, clean: str | None) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k != "CLUSTERBOOK_CLEAN"}
    if clean is not None:
        env["CLUSTERBOOK_CLEAN"] = clean
    return subprocess.Popen(
        wrap_argv(["/bin/sh", "-c", script]),
        env=env,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own group, as a launcher's ranks have
    )


def _state_soon(proc: subprocess.Popen[bytes], within: float = 10.0) -> str:
    """``stopped`` once the process stops itself, ``exited`` once it ends."""
    give_up = time.monotonic() + within
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            return "exited"
        try:
            if psutil.Process(proc.pid).status() == psutil.STATUS_STOPPED:
                return "stopped"
        except psutil.Error:
            pass
        time.sleep(0.01)
    return "running"


@pytest.mark.parametrize(
    ("script", "clean", "state"),
    [
        ("exit 3", "none", "stopped"),  # a failure on its own: the wrapper holds
        ("kill -SEGV $$", "none", "stopped"),
        ("exit 0", "none", "exited"),
        ("exit 3", None, "exited"),  # not a job that keeps
        ("kill -TERM $$", "none", "exited"),  # a teardown from outside
        ("kill -KILL $$", "none", "exited"),
        ("kill -HUP $$", "none", "exited"),
    ],
)
def test_the_wrapper_holds_after_a_failure_of_its_own(script: str, clean: str, state: str) -> None:
    proc = _wrapped(script, clean=clean)
    try:
        assert _state_soon(proc) == state
        assert proc.stderr is not None
        if state == "stopped":  # its exit marker came first, for the head
            os.set_blocking(proc.stderr.fileno(), False)
            assert b"\x1eCB exit " in (proc.stderr.read() or b"")
    finally:
        proc.kill()
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


def test_the_wrapper_does_not_hold_once_the_launcher_tore_the_job_down() -> None:
    proc = _wrapped("trap 'exit 5' TERM; sleep 30 & wait", clean="none")
    try:
        time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGTERM)  # as a launcher's teardown reaches them
        assert _state_soon(proc) == "exited"
    finally:
        proc.kill()
        proc.wait()
        assert proc.stderr is not None
        proc.stderr.close()


# -- the result -------------------------------------------------------------------------------


KEPT = (
    KeptProcess(101, "vm", "python", 0),
    KeptProcess(100, "vm", "prterun", None),
    KeptProcess(102, "vm", "sh", None),
)


def test_a_result_lists_the_processes_kept_and_survives_its_file() -> None:
    result = JobResult(
        "job-0001",
        -19,
        {0: None, 1: 1},
        (RankFailure(1, "vm", 1, ("RuntimeError: boom",)),),
        1.5,
        kept=KEPT,
    )
    summary = result.summary()
    assert (
        "Kept stopped for inspection (clean='none'): rank 0 pid 101 on vm; 2 other process(es) "
        "of the job; job.cleanup() or the cluster's stop() ends them." in summary
    )
    back = JobResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back == result
    assert JobResult.from_dict({**result.to_dict(), "kept": []}).kept == ()
    assert "Kept" not in replace(result, kept=()).summary()
