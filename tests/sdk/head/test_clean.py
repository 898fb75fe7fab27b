"""The clean policy (``clean=``): its checks, what the ranks are told, the rank wrapper that
stops itself after a failure, a result that lists the processes kept, and a job's series
that ends what an attempt kept. Real jobs that keep their ranks: tests/integration/test_clean.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from clusterbook.cluster.options import ClusterOptions
from clusterbook.launch.command import LaunchPlan, rank_env
from clusterbook.launch.flavour import Launcher, MPIFlavour
from clusterbook.launch.job import Job
from clusterbook.launch.keep import CLEAN, check_clean, hold_far
from clusterbook.launch.prepare import JobRequest
from clusterbook.launch.rankwrap import wrap_argv
from clusterbook.launch.recovery import Recovery
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import JobResult, KeptProcess, RankFailure
from clusterbook.nodes.tasks.procs import hold, kill, tagged
from clusterbook.testing import FakeProvider
from clusterbook.wording import speaking
from tests.sdk.launch.test_recovery import FAILED, FakeAttempt, _result

STAND_IN = """\
#!/bin/sh
if [ "$1" = "--version" ]; then echo "mpirun (Open MPI) 5.0.11"; exit 0; fi
exec sleep 0
"""


# -- the policy's checks --------------------------------------------------------------------


@pytest.mark.parametrize("value", CLEAN)
def test_each_policy_is_accepted(value: str) -> None:
    assert check_clean(value) == value
    request = JobRequest.make(["true"], 1, slots=2, clean=value)
    assert request.clean == value


def test_the_default_is_all() -> None:
    assert JobRequest.make(["true"], 1, slots=2).clean == "all"


@pytest.mark.parametrize("value", ["some", "None", "ALL", "", None, 0, True, ["none"]])
def test_a_bad_policy_names_the_value_and_the_policies(value: object) -> None:
    with pytest.raises(cb.ConfigError) as info:
        JobRequest.make(["true"], 1, slots=2, clean=value)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"Clean {value!r} is not a clean policy" in message
    assert "choose among 'all', 'running', 'none'" in message
    assert "clean='none' keeps a failed job's processes stopped" in message


def test_the_magics_name_their_own_option() -> None:
    with speaking("magics"), pytest.raises(cb.ConfigError, match="--clean none keeps"):
        check_clean("nothing")


# -- on a cluster -------------------------------------------------------------------------------


class FarProvider(FakeProvider):
    """Fake nodes that the launcher reaches over ssh (another machine)."""

    def remote(self) -> RemoteLaunch | None:
        return RemoteLaunch(ssh_args=(), ssh_wrapper="/bin/false", head_addr="10.0.0.1")


@pytest.fixture
def make(tmp_path: Path) -> Iterator:
    launcher = tmp_path / "bin" / "mpirun"
    launcher.parent.mkdir()
    launcher.write_text(STAND_IN)
    launcher.chmod(0o755)
    made: list[cb.Cluster] = []

    def cluster(provider: FakeProvider) -> cb.Cluster:
        options = ClusterOptions.make(
            provider.kind, launcher=str(launcher), run_dir=tmp_path / f"run{len(made)}"
        )
        made.append(cb.Cluster(provider, options))
        return made[-1].start()

    yield cluster
    for c in made:
        c.stop()


def test_mpirun_refuses_a_bad_policy_and_starts_nothing(make) -> None:
    cluster = make(FakeProvider())
    with pytest.raises(cb.ConfigError, match=r"Clean 'keep' is not a clean policy"):
        cluster.mpirun(["true"], np=1, clean="keep")
    assert cluster.jobs == []


def test_a_job_on_nodes_of_other_machines_keeps_there_too(make) -> None:
    cluster = make(FarProvider())
    job = cluster.mpirun(["true"], np=1, clean="none")
    job.wait(30)  # (the stand-in launcher runs no rank)
    assert job.plan.clean == "none"  # its ranks stop themselves after a failure, on any node
    assert rank_env(job.plan)["CLUSTERBOOK_CLEAN"] == "none"


# -- keeping on a node (the node task) and through a provider ----------------------------------


@pytest.fixture
def tagged_sleepers() -> Iterator[tuple[str, list[subprocess.Popen[bytes]]]]:
    """Two processes of one job (tagged as the launcher tags them), killed at teardown."""
    token = f"cb-test-{os.getpid()}-{time.monotonic_ns()}"
    env = {**os.environ, "CLUSTERBOOK_JOB": token}
    procs = [subprocess.Popen(["sleep", "60"], env=env) for _ in range(2)]
    for _ in range(500):  # until both have exec'd: only then do they carry the tag
        if len(tagged([token])) == 2:
            break
        time.sleep(0.01)
    yield token, procs
    for proc in procs:
        proc.kill()
        proc.wait()


def _state(pid: int) -> str:
    return psutil.Process(pid).status()


def test_the_hold_task_stops_a_jobs_processes_and_kill_ends_them_at_once(
    tagged_sleepers,
) -> None:
    token, procs = tagged_sleepers
    pids = {p.pid for p in procs}
    reply = hold({"token": token, "settle": procs[0].pid})
    assert {pid for pid, _ in reply["held"]} == pids
    assert {name for _, name in reply["held"]} == {"sleep"}
    assert {_state(pid) for pid in pids} == {psutil.STATUS_STOPPED}
    # Ending them does not wait out the grace a running process gets: stopped, they take
    # their SIGTERM at once (it comes with a SIGCONT), so they have ended of it when kill
    # returns, and none is left for the SIGKILL that would end the grace.
    assert set(kill({"token": token, "grace": 30})["killed"]) == pids
    assert [p.poll() for p in procs] == [-signal.SIGTERM, -signal.SIGTERM]


def test_the_hold_task_waits_for_the_failing_rank_to_stop_itself(tagged_sleepers) -> None:
    token, procs = tagged_sleepers
    failing = procs[0].pid
    stopping = threading.Event()

    def stop_itself() -> None:  # as a failing rank does, a moment after the hold is asked
        stopping.set()
        os.kill(failing, signal.SIGSTOP)

    timer = threading.Timer(0.3, stop_itself)
    timer.start()
    hold({"token": token, "settle": failing})
    assert stopping.is_set()  # it went on only once the rank had stopped itself
    assert _state(procs[1].pid) == psutil.STATUS_STOPPED
    timer.join(5)


def test_hold_far_asks_every_node_and_names_what_each_kept() -> None:
    asked: list[tuple[str, str, dict]] = []

    def caller(name: str, held: list[list]) -> object:
        def call(task: str, args: dict, timeout: float) -> dict:
            asked.append((name, task, dict(args)))
            if name == "node3":
                raise OSError("connection reset")  # keeps nothing; stop_job ends it later
            return {"held": held}

        return call

    callers = {
        "node1": caller("node1", [[40, "prted"], [41, "python"]]),
        "node2": caller("node2", [[40, "prted"]]),
        "node3": caller("node3", []),
    }
    kept = hold_far(callers, "c-tok", {"node2": 77})
    assert sorted(asked, key=lambda a: a[0]) == [
        ("node1", "hold", {"token": "c-tok", "settle": None}),
        ("node2", "hold", {"token": "c-tok", "settle": 77}),
        ("node3", "hold", {"token": "c-tok", "settle": None}),
    ]
    assert kept == (
        KeptProcess(40, "node1", "prted"),
        KeptProcess(41, "node1", "python"),
        KeptProcess(40, "node2", "prted"),
    )


def test_a_provider_of_this_machines_nodes_holds_nothing_itself() -> None:
    assert FakeProvider().hold_job("tok", {"n": 1}) == ()


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


# -- a job's series of attempts -----------------------------------------------------------------


def test_a_retry_ends_what_the_attempt_before_it_kept(tmp_path: Path) -> None:
    made: list[FakeAttempt] = []

    def start(number: int, directory: Path, restarts: int, restart: bool) -> FakeAttempt:
        directory.mkdir(exist_ok=True)
        made.append(FakeAttempt(number, directory, [FAILED, _result()][number - 1]))
        return made[-1]

    recovery = Recovery.make(retries=1, backoff=0)
    job = Job("job-0001", tmp_path, start, recovery, argv=["p"], timeout=None)  # type: ignore[arg-type]
    assert job.wait(timeout=30).ok
    assert [m.cleanups for m in made] == [1, 0]
    job.cleanup()
    assert [m.cleanups for m in made] == [2, 1]


def test_cancel_ends_what_the_job_kept(tmp_path: Path) -> None:
    made: list[FakeAttempt] = []

    def start(number: int, directory: Path, restarts: int, restart: bool) -> FakeAttempt:
        made.append(FakeAttempt(number, directory, FAILED))
        return made[-1]

    job = Job("job-0001", tmp_path, start, argv=["p"], timeout=None)  # type: ignore[arg-type]
    job.wait(timeout=30)
    assert made[0].cleanups == 0
    job.cancel()
    assert made[0].cleanups == 1
