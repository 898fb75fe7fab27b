"""Slurm clusters that grow and shrink on a real Slurm (tests/slurm_testbed.sh: snode1 and
snode2, 2 CPUs each): ``scale()`` with a job resized onto the new node and off it again, a
batch job that cannot start shown with Slurm's reason, sbatch refusing another node,
``adapt()`` growing for a job whose ranks outnumber the slots and shrinking once idle, and
the time-limit warning reaching a rank that checkpoints, then the requeued batch job resuming
it."""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import psutil
import pytest

import clusterbook as cb
from clusterbook.paths import cluster_dir
from tests.slurmbed import SlurmBed
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture

HELD = """\
import os, socket, time
from mpi4py import MPI
comm = MPI.COMM_WORLD
restart = os.environ["CLUSTERBOOK_RESTART"]
print(f"rank {comm.rank} of {comm.size} restart {restart} on {socket.gethostname()}", flush=True)
comm.Barrier()
print("started", flush=True)
while not os.path.exists(os.environ["RELEASE"]):  # held until the test looked
    time.sleep(0.05)
"""


def eventually(check: Callable[[], bool], timeout: float, said: Callable[[], object]) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, said()
        time.sleep(0.1)


def told(cluster: cb.Cluster, job: cb.Job) -> Callable[[], str]:
    """What a failed wait on ``job`` shows: the cluster's nodes, the job's attempt, its logs,
    and what its launchers and the cluster's batch jobs said."""

    def said() -> str:
        run = Path(cluster.run_dir)
        files = sorted({*run.rglob("launcher.log"), *run.rglob("*.out"), *run.rglob("*agent*.log")})
        try:
            launcher = psutil.Process(job.pid)
            tree = [launcher, *launcher.children(recursive=True)]
            ran = "; ".join(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:150]}" for p in tree)
        except psutil.Error as exc:
            ran = f"gone ({type(exc).__name__})"
        return (
            f"\n{cluster.status().to_string()}\nattempt {job.attempt} ({job.last_reason}), "
            f"{job.ranks_started} started, {job.ranks_ended} ended\nlauncher: {ran}\n"
            f"{job.logs().to_string()}\n"
            + "".join(f"--- {f}\n{f.read_text(errors='replace')[-3000:]}" for f in files)
            + f"--- this process's threads\n{threads()}"
        )

    return said


def threads() -> str:
    """Where each thread of this process is (the head's: what a job waits on)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return "".join(
        f"{names.get(ident, ident)}:\n{''.join(traceback.format_stack(frame)[-6:])}"
        for ident, frame in sys._current_frames().items()
    )


def started(job: cb.Job, attempt: int) -> int:
    """How many ranks of ``job``'s attempt ``attempt`` have started."""
    return int((job.logs().query(f"attempt == {attempt}").line == "started").sum())


def pending(cluster: cb.Cluster) -> pd.DataFrame:
    return cluster.status().query("state == 'pending'")


def joined(cluster: cb.Cluster) -> list[str]:
    frame = cluster.status()
    return sorted(frame[frame["state"].isin(["joined", "running"])]["node"])


@pytest.fixture
def slurm_cluster(slurm: SlurmBed, openmpi_python, tmp_path) -> Iterator[Callable[..., cb.Cluster]]:
    made: list[cb.Cluster] = []

    def make(**kw: object) -> cb.Cluster:
        run_dir = tmp_path / f"r{len(made)}"
        cluster = cb.Cluster.slurm(python=openmpi_python, run_dir=run_dir, **kw)  # type: ignore[arg-type]
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.stop()


def test_scale_from_one_node_to_two_and_back_resizes_a_job_that_asked(
    slurm, slurm_cluster, program, tmp_path
):
    cluster = slurm_cluster(nodes=1, max_nodes=2, time="10m")
    cluster.wait_ready(timeout=60)
    [first] = joined(cluster)
    release = tmp_path / "release"
    job = cluster.mpirun(
        ["python", program("held.py", HELD)],
        restarts=2,
        restart_on_join=True,
        timeout=240,
        env={"RELEASE": str(release)},
    )
    eventually(lambda: started(job, 1) == 2, 60, told(cluster, job))

    cluster.scale(2)  # a second batch job of one node, whose agent joins the running cluster
    ids = [a.id for a in cluster._provider.allocations()]
    assert len(ids) == 2
    cluster.wait_ready(timeout=60)
    [second] = [n for n in joined(cluster) if n != first]
    assert second.endswith(f"-{ids[1]}")
    eventually(lambda: job.attempt == 2 and started(job, 2) == 4, 60, told(cluster, job))
    # Checked as it joined from what its agent probed, and its ranks started through the
    # channel its agent dialled to the head: no login to its sshd at all.
    log = Path.home() / ".clusterbook" / f"sshd-{second}" / "sshd.log"
    assert log.read_text().count("Accepted publickey") == 0, log.read_text()

    cluster.scale(1)  # the newest batch job goes, and the job runs on, on the node left
    eventually(lambda: job.attempt == 3, 60, told(cluster, job))
    assert [a.id for a in cluster._provider.allocations()] == ids[:1]
    # Slurm's own end of the cancelled job (COMPLETING while its node cleans up) may lag.
    eventually(lambda: slurm.active_jobs() == [f"{ids[0]} RUNNING"], 30, slurm.active_jobs)
    eventually(lambda: joined(cluster) == [first], 30, cluster.status)  # the round left
    release.touch()
    result = job.wait(timeout=120)
    assert result.ok, result.summary()
    assert [a.outcome for a in result.attempts] == ["node-joined", "node-lost", "ok"]
    logs = job.logs()
    said = {a: sorted(logs.query(f"attempt == {a} and rank >= 0").line) for a in (1, 2, 3)}
    assert {a: [x for x in lines if x.startswith("rank")] for a, lines in said.items()} == {
        1: [f"rank {r} of 2 restart 0 on snode1" for r in range(2)],
        2: [f"rank {r} of 4 restart 1 on snode{r // 2 + 1}" for r in range(4)],
        3: [f"rank {r} of 2 restart 2 on snode1" for r in range(2)],
    }, logs
    assert job.np == 2


def test_a_node_slurm_cannot_give_shows_pending_with_slurms_reason_and_scale_cancels_it(
    slurm, slurm_cluster
):
    cluster = slurm_cluster(nodes=2, max_nodes=3, time="10m")
    cluster.wait_ready(timeout=60)
    cluster.scale(3)  # the test bed has 2 nodes, both the cluster's
    added = cluster._provider.allocations()[-1].id
    eventually(
        lambda: any(
            r.endswith(")") for r in cluster.status().query("state == 'pending'").last_reason
        ),
        20,
        cluster.status,
    )
    [row] = pending(cluster).itertuples()
    assert row.node == f"slurm-{added}-0"
    assert row.last_reason == f"Slurm job {added} is PENDING (Resources)"
    with pytest.raises(
        cb.ReadyTimeoutError, match=rf"waiting for the nodes of Slurm job {added} is PENDING"
    ):
        cluster.wait_ready(timeout=1)
    cluster.scale(2)
    assert pending(cluster).empty
    eventually(lambda: f"{added} PENDING" not in slurm.active_jobs(), 10, slurm.active_jobs)
    assert len(joined(cluster)) == 2


def test_sbatch_refusing_another_node_is_a_config_error_and_the_cluster_keeps_its_nodes(
    slurm, slurm_cluster
):
    cluster = slurm_cluster(nodes=1, max_nodes=2, time="10m")
    cluster.wait_ready(timeout=60)
    before = joined(cluster)
    slurm.run("scontrol", "update", "PartitionName=debug", "State=INACTIVE")
    try:
        with pytest.raises(
            cb.ConfigError, match=r"Slurm refused the cluster's job: .*keeps the 1 node"
        ):
            cluster.scale(2)
    finally:
        slurm.run("scontrol", "update", "PartitionName=debug", "State=UP")
    assert len(cluster._provider.allocations()) == 1
    assert joined(cluster) == before
    assert len(slurm.active_jobs()) == 1
    result = cluster.mpirun(["hostname"], np=1, timeout=60).wait()
    assert result.ok, result.summary()


def test_adapt_grows_for_a_job_whose_ranks_outnumber_the_slots_and_shrinks_once_idle(
    slurm, slurm_cluster, program, tmp_path
):
    cluster = slurm_cluster(nodes=1, max_nodes=2, time="10m")
    cluster.wait_ready(timeout=60)
    cluster.adapt(1, 2, interval="0.5s", grace="2s")
    release = tmp_path / "release"
    job = cluster.mpirun(  # 4 ranks on 2 slots: half of them wait for slots
        ["python", program("held.py", HELD)],
        np=4,
        oversubscribe=True,
        restarts=1,
        restart_on_join=True,
        timeout=240,
        env={"RELEASE": str(release)},
    )
    eventually(lambda: job.attempt == 2 and started(job, 2) == 4, 90, job.logs)
    assert len(cluster._provider.allocations()) == 2
    assert sorted(job.logs().query("attempt == 2 and line.str.startswith('rank')").line) == [
        f"rank {r} of 4 restart 1 on snode{r // 2 + 1}" for r in range(4)
    ]
    release.touch()
    result = job.wait(timeout=120)
    assert result.ok, result.summary()
    # Idle for the grace period: the batch job adapt added goes, the cluster's own stays.
    eventually(lambda: len(slurm.active_jobs()) == 1, 30, slurm.active_jobs)
    [first] = cluster._provider.allocations()
    assert first.first
    eventually(lambda: joined(cluster) == [f"snode1-{first.id}"], 30, cluster.status)
    assert cluster.snapshot().problem is None


CHECKPOINT = """\
import os, signal, time
if os.environ["CLUSTERBOOK_RESTART"] != "0":
    # The requeued job is warned too, maybe at once (Slurm may send the signal up to a
    # minute early, and its time limit is a minute): resuming takes no checkpoint.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
import clusterbook
from mpi4py import MPI
comm = MPI.COMM_WORLD
path = os.path.join(os.environ["CHECKPOINTS"], f"rank{comm.rank}")
restart = os.environ["CLUSTERBOOK_RESTART"]
if restart == "0":
    step = 0

    @clusterbook.on_preempt
    def save():
        with open(path, "w") as f:
            f.write(str(step))
        print(f"checkpoint at step {step}", flush=True)

    print("started", flush=True)
    while True:
        step += 1
        time.sleep(0.1)
with open(path) as f:
    print(f"resumed at step {f.read()} restart {restart}", flush=True)
"""


def test_the_time_limit_warning_reaches_a_rank_that_checkpoints_and_the_requeue_resumes_it(
    slurm, slurm_cluster, program, tmp_path
):
    """A 1-minute batch job warned 50 s before its end (Slurm looks about every 30 s): the
    ranks write their checkpoints, the head requeues the job 25 s later, Slurm starts it again
    (the test bed's cred_expire=10 shortens the wait), its agent joins again, and the job
    resumes from the checkpoints."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    cluster = slurm_cluster(nodes=1, time="1", signal_before=50, requeue=True)
    assert cluster.time_left is None  # the cluster outlives its batch job's time limit
    script = (cluster.run_dir / "slurm-job.sh").read_text()
    assert "trap 'touch " in script
    cluster.wait_ready(timeout=60)
    job = cluster.mpirun(
        ["python", program("checkpoint.py", CHECKPOINT)],
        restarts=1,
        timeout=280,
        env={"CHECKPOINTS": str(checkpoints)},
    )
    result = job.wait(timeout=280)
    assert result.ok, (result.summary(), job.logs())
    assert [a.outcome for a in result.attempts] == ["node-lost", "ok"]
    logs = job.logs().query("rank >= 0")
    saved = {r: (checkpoints / f"rank{r}").read_text() for r in range(2)}
    first = logs.query("attempt == 1 and line.str.startswith('checkpoint')")
    assert sorted(first.line) == sorted(f"checkpoint at step {saved[r]}" for r in range(2))
    # The requeued job is warned too, and a warning that comes before the program ignores it
    # shows the rank hook's stack dump (Python still starting): the program's lines are these.
    dump = (" ", "Thread 0x", "Current thread 0x")  # faulthandler's lines
    said = [line for line in logs.query("attempt == 2").line if line and not line.startswith(dump)]
    assert sorted(said) == sorted(f"resumed at step {saved[r]} restart 1" for r in range(2))
    [allocation] = cluster._provider.allocations()
    assert allocation.first


def test_a_detached_slurm_cluster_scales_from_an_attached_handle_and_from_the_cli(
    slurm, openmpi_python, tmp_path, capsys
):
    from clusterbook.cli.main import main

    cluster = cb.Cluster.slurm(
        python=openmpi_python,
        run_dir=tmp_path / "r",
        nodes=1,
        max_nodes=2,
        time="10m",
        detached=True,
    )
    try:
        cluster.start()
        cluster.wait_ready(timeout=60)
        attached = cb.Cluster.attach(cluster.id)
        with pytest.raises(cb.ConfigError, match=r"scale\(3\) asks for 3 node\(s\), more than"):
            attached.scale(3)
        attached.scale(2)  # the supervisor submits the second batch job
        eventually(lambda: len(slurm.active_jobs()) == 2, 30, slurm.active_jobs)
        cluster.wait_ready(timeout=60)
        eventually(lambda: len(joined(cluster)) == 2, 60, cluster.status)
        assert main(["scale", cluster.id, "1"]) == 0
        assert f"Cluster {cluster.id} scales to 1 node(s)." in capsys.readouterr().out
        eventually(lambda: len(slurm.active_jobs()) == 1, 30, slurm.active_jobs)
        eventually(lambda: len(joined(cluster)) == 1, 60, cluster.status)
        assert main(["adapt", cluster.id, "2", "1"]) != 0
        assert "minimum must be at most maximum" in capsys.readouterr().err
    finally:
        cluster.stop()


def masters_of(cluster: cb.Cluster) -> list[str]:
    """The addresses the head keeps an ssh master connection to for ``cluster``'s nodes."""
    config = str(cluster_dir(cluster.id) / "ssh_config")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        argv = proc.info["cmdline"] or []
        if argv[:2] == ["ssh", "-M"] and config in argv and proc.status() != "zombie":
            found.append(argv[-1])
    return sorted(found)


def test_a_node_that_joins_is_checked_and_reached_through_its_agents_channel_before_any_job(
    slurm, slurm_cluster
):
    """A node that scale() added is checked as it joins, from what its agent probed, and its
    agent dialled its channel to the head before it joined: the first job over both nodes
    starts MPI's daemons through the agents and finds its free port, with no login to either
    node and no master connection; the channel goes with its node, and the rest with the
    cluster."""
    cluster = slurm_cluster(nodes=1, max_nodes=2, time="10m")
    cluster.wait_ready(timeout=60)
    [first] = joined(cluster)
    channels = cluster._provider.head.channels
    cluster.scale(2)
    eventually(lambda: len(joined(cluster)) == 2, 60, cluster.status)
    added = cluster._provider.allocations()[-1].id
    [new] = [n for n in joined(cluster) if n.endswith(f"-{added}")]
    assert not channels.without(joined(cluster), 5.0)
    assert cluster.jobs == []
    job = cluster.mpirun(["hostname"], np=4, timeout=60)
    result = job.wait()
    assert result.ok, result.summary() + told(cluster, job)()
    assert sorted(set(cluster.jobs[-1].logs().query("rank >= 0").line)) == ["snode1", "snode2"]
    assert (launched := cluster._provider.far.remote()) is not None
    assert launched.launch_agent is not None  # the daemons start through the agents
    assert masters_of(cluster) == []
    # Nor did the job ask rank 0's node for torch's free port over a login: its agent said.
    for node in (first, new):
        log = Path.home() / ".clusterbook" / f"sshd-{node}" / "sshd.log"
        assert "Accepted publickey" not in log.read_text(), log.read_text()

    cluster.scale(1)
    # No job goes to the node cancelled, whether its agent has left the round yet or not (the
    # round may be forming again without it meanwhile).
    assert new not in [n.name for n in cluster.nodes]
    eventually(lambda: len(joined(cluster)) == 1, 30, cluster.status)
    eventually(lambda: not channels.has(new), 30, lambda: new)
    cluster.wait_ready(timeout=60)
    job = cluster.mpirun(["hostname"], timeout=60)
    result = job.wait()
    assert result.ok, result.summary() + told(cluster, job)()
    assert not channels.without([first], 5.0)  # dialled again after its launch
    cluster.stop()
    assert masters_of(cluster) == []
    assert not channels.has(first)
