"""Slurm clusters that grow, shrink and are warned of their time limit, without a Slurm:
what sbatch is given, what the batch script does with Slurm's warning, and how scale() and
the watch answer (Slurm's commands answered by FakeSlurm)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import clusterbook as cb
from clusterbook.cluster.resize import Resizer
from clusterbook.providers.slurm.batch import (
    GONE,
    BatchJob,
    JobState,
    parse_squeue_jobs,
    render_script,
    sbatch_argv,
)
from clusterbook.providers.slurm.provider import SlurmProvider
from clusterbook.rendezvous.backends.tcp import TcpBackend
from clusterbook.rendezvous.registry import parse_join_url
from clusterbook.rendezvous.step import Operation, Step
from clusterbook.scaling import Adapt
from clusterbook.testing import FakeSlurm
from clusterbook.views.html import render_nodes


def _argv(job: BatchJob, tmp_path: Path) -> list[str]:
    return sbatch_argv(job, name="c1", script=tmp_path / "s.sh", output=tmp_path / "o")


def test_the_warning_and_the_requeue_go_to_sbatch(tmp_path):
    argv = _argv(BatchJob.make(1, time="1h", signal_before="2m", requeue=True), tmp_path)
    assert argv[-3:] == ["--signal=B:USR1@120", "--requeue", str(tmp_path / "s.sh")]
    assert BatchJob.make(1, time="1h", requeue=True).signal == 120  # requeue warns by default
    assert BatchJob.make(1, time="3m", requeue=True).signal == 90  # within a short limit
    plain = _argv(BatchJob.make(1), tmp_path)
    assert not [a for a in plain if a.startswith(("--signal", "--requeue"))]
    assert BatchJob.make(1).more() == BatchJob.make(1)
    assert BatchJob.make(3, min_nodes=2, slots=2).more() == BatchJob.make(1, slots=2)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ({"time": "10m", "signal_before": "10m"}, "is not shorter than the time limit"),
        ({"time": None, "signal_before": 70000}, "out of Slurm's range for --signal"),
        ({"signal_before": "soon"}, "signal_before"),
        ({"requeue": "yes"}, "requeue must be True or False, got 'yes'"),
        ({"max_nodes": 1, "nodes": 2}, r"max_nodes \(1\) must be at least nodes \(2\)"),
    ],
)
def test_bad_warning_requeue_and_max_nodes_are_config_errors(args, match):
    with pytest.raises(cb.ConfigError, match=match):
        cb.Cluster.slurm(**{"nodes": 1, **args})


def test_one_squeue_tells_the_states_of_several_jobs():
    said = "3 RUNNING None\n4 PENDING Resources\n"
    assert parse_squeue_jobs(said, [3, 4, 5]) == {
        3: JobState("RUNNING"),
        4: JobState("PENDING", "Resources"),
        5: GONE,
    }


def test_the_batch_script_leaves_a_marker_for_slurms_warning_and_waits_for_its_step(tmp_path):
    """sh runs the script with a stand-in srun (the step): USR1 to the script's shell leaves
    slurm-JOBID.warned where the head looks, and the shell still ends with the step's code."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\necho step >> "$OUT"; sleep 1; exit 3\n')
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(render_script(["agent"], cluster="c1", slots=None, warned=tmp_path))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "7", "OUT": str(tmp_path / "out")}
    shell = subprocess.Popen(["sh", str(script)], env=env)
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "out").exists():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        shell.send_signal(signal.SIGUSR1)
        assert shell.wait(timeout=10) == 3
    finally:
        shell.kill()
    assert (tmp_path / "slurm-7.warned").exists()
    assert (tmp_path / "out").read_text() == "step\n"  # one step, waited for again
    assert "\nexec srun " in render_script(["agent"], cluster="c1", slots=None)


def _cluster(fake: FakeSlurm, tmp_path: Path, **args) -> cb.Cluster:
    return cb.Cluster.slurm(runner=fake, run_dir=tmp_path / "run", poll_interval=0.05, **args)


def _pending(cluster: cb.Cluster) -> list[tuple[str, str]]:
    frame = cluster.status()
    return list(zip(frame.node, frame.last_reason, strict=True))


def test_scale_submits_one_node_jobs_of_the_same_script_and_cancels_the_newest(tmp_path):
    fake = FakeSlurm(reason="Priority")
    with _cluster(fake, tmp_path, nodes=1, max_nodes=3) as cluster:
        cluster.scale(3)
        first, *more = fake.commands("sbatch")
        assert [a for a in first if a.startswith("--nodes")] == ["--nodes=1"]
        assert [m[-1] for m in more] == [first[-1], first[-1]]  # the cluster's own script
        assert [[a for a in m if a.startswith("--nodes")] for m in more] == [["--nodes=1"]] * 2
        assert _pending(cluster) == [
            (f"slurm-{i}-0", f"Slurm job {i} is PENDING (Priority)") for i in (1, 2, 3)
        ]
        deadline = time.monotonic() + 10  # one squeue a look for all of them
        while ["squeue", "-h", "-t", "all", "-j", "1,2,3", "-o", "%i %T %r"] not in fake.calls:
            assert time.monotonic() < deadline, fake.commands("squeue")
            time.sleep(0.02)
        html = render_nodes(cluster.snapshot())  # the widget's node table
        assert html.count('class="cb-pending-reason"') == 3
        assert "Slurm job 3 is PENDING (Priority)" in html
        cluster.scale(1)
        assert fake.commands("scancel") == [["scancel", "3"], ["scancel", "2"]]
        assert _pending(cluster) == [("slurm-1-0", "Slurm job 1 is PENDING (Priority)")]
        with pytest.raises(cb.ConfigError, match=r"more than the cluster's max_nodes=3"):
            cluster.scale(4)
        with pytest.raises(cb.ConfigError, match=r"fewer than the cluster's min_nodes=1"):
            cluster.scale(0)
    assert fake.commands("scancel")[2:] == [["scancel", "1"]]  # stop() ends the cluster's own


def test_sbatch_refusing_more_nodes_is_a_config_error_and_the_cluster_keeps_what_it_has(tmp_path):
    fake = FakeSlurm(reason="Priority")
    with _cluster(fake, tmp_path, nodes=1, max_nodes=3) as cluster:
        fake.refuse = "sbatch: error: Batch job submission failed: Job violates accounting/QOS"
        with pytest.raises(cb.ConfigError, match=r"QOS\. The cluster keeps the 1 node"):
            cluster.scale(2)
        assert len(cluster.status()) == 1
        assert fake.commands("scancel") == []


def test_slurms_warning_is_seen_and_the_job_requeued_half_its_lead_later(tmp_path):
    fake = FakeSlurm(state="RUNNING", reason=None)
    with _cluster(fake, tmp_path, nodes=1, time="1h", signal_before=1, requeue=True) as cluster:
        assert cluster.time_left is None  # the cluster waits for the job to come back
        (cluster.run_dir / "slurm-1.warned").touch()  # what the batch script does
        deadline = time.monotonic() + 10
        while ["scontrol", "requeue", "1"] not in fake.calls:
            assert time.monotonic() < deadline, fake.calls
            time.sleep(0.02)
        assert not (cluster.run_dir / "slurm-1.warned").exists()  # for the next warning
        deadline = time.monotonic() + 10
        while "PENDING (BeginTime)" not in str(cluster.status().last_reason.tolist()):
            assert time.monotonic() < deadline, cluster.status()
            time.sleep(0.02)
        assert cluster.snapshot().problem is None  # a requeued job is not lost for good


def test_a_requeued_clusters_restarts_wait_for_its_nodes_as_long_as_they_may_join():
    requeued = SlurmProvider(nodes=1, requeue=True, join_timeout="15m", runner=FakeSlurm())
    assert requeued.restart_wait == 900
    assert SlurmProvider(nodes=1, runner=FakeSlurm()).restart_wait == 60


def test_on_preempt_runs_the_function_at_sigusr1_and_still_dumps_the_stacks():
    code = (
        "import os, signal, clusterbook\n"
        "@clusterbook.on_preempt\n"
        "def save():\n"
        "    print('checkpoint written', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "print('went on', flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
        env={**os.environ}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "checkpoint written\nwent on\n"
    assert "most recent call first" in done.stderr


class StandIn:
    """What scale() and adapt() read of a job: whether it ended, its nodes, its ranks, its
    restarts."""

    def __init__(self, nodes: list[str], np: int = 2, restarts: int = 0) -> None:
        self.plan = SimpleNamespace(nodes=[SimpleNamespace(name=n) for n in nodes])
        self.id, self.np, self.restarts, self.ended = "job-0007", np, 0, False
        self.recovery = SimpleNamespace(restarts=restarts)

    def done(self) -> bool:
        return self.ended


def test_scale_never_cancels_nodes_running_ranks_of_a_job_that_cannot_be_resized(tmp_path):
    fake = FakeSlurm(state="RUNNING", reason=None)
    jobs: list[StandIn] = []
    with _cluster(fake, tmp_path, nodes=1, max_nodes=3) as cluster:
        resizer = Resizer(cluster._provider, lambda: jobs)  # type: ignore[arg-type]
        resizer.scale(3)
        jobs.append(StandIn(["snode1-1", "snode2-2"]))  # no restarts: it cannot lose one
        held = r"no restarts left \(Slurm job 2: job-0007\)\. Wait for them"
        with pytest.raises(cb.ClusterStateError, match=held):
            resizer.scale(1)
        assert fake.commands("scancel") == []  # nothing, not even the free job 3
        resizer.scale(2)  # job 3 is free
        assert fake.commands("scancel") == [["scancel", "3"]]
        jobs[0].recovery.restarts = 1  # now it runs on, on the node left
        resizer.scale(1)
        assert fake.commands("scancel") == [["scancel", "3"], ["scancel", "2"]]


def test_adapt_grows_for_ranks_beyond_the_slots_and_lets_idle_nodes_go_after_the_grace(tmp_path):
    fake = FakeSlurm(state="RUNNING", reason=None)
    job = StandIn(["snode1-1"], np=3)
    with _cluster(fake, tmp_path, nodes=1, max_nodes=3) as cluster:
        resizer = Resizer(cluster._provider, lambda: [job])  # type: ignore[arg-type]
        settings = Adapt(minimum=1, maximum=3, interval=1.0, grace=10.0)
        resizer.adapt_once(settings, now=100.0)  # 3 ranks, 1 slot coming: 2 more nodes
        assert len(fake.commands("sbatch")) == 3
        resizer.adapt_once(settings, now=101.0)  # they are on their way: nothing more
        assert len(fake.commands("sbatch")) == 3
        job.plan.nodes += [SimpleNamespace(name=n) for n in ("snode2-2", "snode3-3")]
        resizer.adapt_once(settings, now=101.5)  # the job grew onto them: busy
        job.ended = True
        resizer.adapt_once(settings, now=102.0)  # idle from now
        resizer.adapt_once(settings, now=111.0)
        assert fake.commands("scancel") == []
        resizer.adapt_once(settings, now=112.0)  # the grace has passed: the added ones go
        assert fake.commands("scancel") == [["scancel", "3"], ["scancel", "2"]]


def test_the_nodes_of_a_cancelled_allocation_get_no_job_before_their_agent_has_left(tmp_path):
    """scale() cancels an allocation: its node leaves the cluster's nodes (where jobs go) at
    once, though its agent is still in the round until Slurm's SIGTERM reaches it."""
    fake = FakeSlurm(state="RUNNING", reason=None)
    with _cluster(fake, tmp_path, nodes=1, max_nodes=2) as cluster:
        cluster.scale(2)
        head = cluster._provider.head  # type: ignore[attr-defined]
        assert head.join_url is not None
        assert head.secret is not None
        store_url, joined = parse_join_url(head.join_url)
        agents = []
        try:
            for name in ("snode1-1", "snode2-2"):  # (this machine's: nothing to reach)
                agent = TcpBackend(store_url, head.secret, node=name, timeout=30.0)
                agents.append(agent)
                now = time.time()
                report = {"hostname": socket.gethostname(), "slots": 2}
                agent.update(Step((Operation.JOIN,), name, joined, now, now + 60.0, report))
            deadline = time.monotonic() + 30
            while [n.name for n in cluster.nodes] != ["snode1-1", "snode2-2"]:
                assert time.monotonic() < deadline, cluster.nodes
                time.sleep(0.02)
            cluster.scale(1)
            assert fake.commands("scancel") == [["scancel", "2"]]
            assert [name for name, _ in head.participants()] == ["snode1-1", "snode2-2"]
            assert [n.name for n in cluster.nodes] == ["snode1-1"]
            assert cluster.total_slots == 2
            assert list(cluster.status().node) == ["snode1-1"]
        finally:
            for agent, name in zip(agents, ("snode1-1", "snode2-2"), strict=False):
                now = time.time()  # they leave (the cluster's stop waits for its agents)
                agent.update(Step((Operation.EXIT,), name, joined, now, now + 5.0))
                agent.close()
            fake.set_state(1, "COMPLETED")  # and their batch job ends with them
