"""Cluster.from_environment inside a real Slurm allocation (tests/slurm_testbed.sh): jobs start
as steps of the allocation through srun, with Slurm's PMI plugin for each MPI (pmix for Open
MPI, pmi2 for MPICH), no ssh; each rank on the node mpirun would give it; a failing rank fails
the job, and nothing is left on the nodes; a plugin that does not fit the MPI is an error, not
a job of singletons."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.integration.test_slurm import _left_on_nodes
from tests.slurmbed import SlurmBed
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture

RANK = """\
import json, os, socket
from mpi4py import MPI
w = MPI.COMM_WORLD
names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK")
print(json.dumps({"rank": w.rank, "size": w.size, "host": socket.gethostname(),
                  "sum": w.allreduce(w.rank), **{n: os.environ.get(n) for n in names}}))
"""

RAISES = """\
import sys, time
from mpi4py import MPI
if MPI.COMM_WORLD.rank == 2:
    raise ValueError("rank two gives up")
time.sleep(60)
"""

# Run inside the allocation: build the cluster from what Slurm says, run the job, report.
HEAD = """\
import json, sys
import clusterbook as cb

python, program, np, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 60
report = {}
try:
    with cb.Cluster.from_environment(python=python, run_dir=out + ".run") as cluster:
        report["kind"] = cluster._provider.kind
        report["head_addr"] = cluster._provider.reach.remote().head_addr
        report["slots"] = [n.slots for n in cluster.nodes]
        job = cluster.mpirun([python, program], np=np, timeout=timeout)
        result = job.wait()
        report["state"] = result.state
        logs = job.logs()
        report["lines"] = [
            [int(r), h, s, t] for r, h, s, t in
            zip(logs["rank"], logs["host"], logs["stream"], logs["line"])
        ]
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
with open(out, "w") as f:
    json.dump(report, f)
"""


def _inside(
    bed: SlurmBed, tmp_path: Path, how: str, python: str, program: str, np: int, *more: str
) -> dict[str, object]:
    """Run :data:`HEAD` inside a new 2-node, 4-task allocation (``salloc`` or ``sbatch``);
    its report."""
    head, rank = tmp_path / "head.py", tmp_path / "rank.py"
    head.write_text(HEAD)
    rank.write_text(program)
    out = tmp_path / "report.json"
    argv = [sys.executable, str(head), python, str(rank), str(np), str(out), *more]
    env = {**os.environ, "SLURM_CONF": str(bed.conf)}
    if how == "salloc":
        cmd = ["salloc", "-N2", "-n4", *argv]
    else:
        script = tmp_path / "batch.sh"
        script.write_text("#!/bin/sh\nexec " + " ".join(map(str, argv)) + "\n")
        script.chmod(0o755)
        cmd = ["sbatch", "--wait", "-N2", "-n4", f"--output={tmp_path / 'batch.out'}", str(script)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150, check=False)
    assert out.exists(), f"{how} ran no head: {done.stdout}{done.stderr}" + (
        (tmp_path / "batch.out").read_text() if (tmp_path / "batch.out").exists() else ""
    )
    report: dict[str, object] = json.loads(out.read_text())
    return report


@pytest.mark.parametrize(
    ("how", "mpi"),
    [("salloc", "openmpi"), ("sbatch", "mpich")],
    ids=["salloc-openmpi", "sbatch-mpich"],
)
def test_from_environment_runs_mpi_as_steps_of_the_allocation(
    slurm, tmp_path, how, mpi, openmpi_python, mpich_python
):
    python = openmpi_python if mpi == "openmpi" else mpich_python
    report = _inside(slurm, tmp_path, how, python, RANK, np=3)
    assert "error" not in report, report
    assert report["kind"] == "srun"
    # Where processes on the nodes reach the head: salloc runs it here (the test bed's
    # bridge), sbatch on the allocation's first node.
    assert report["head_addr"] == {"salloc": "10.79.0.1", "sbatch": "10.79.0.11"}[how]
    assert report["slots"] == [2, 2]  # -n4 over 2 nodes: Slurm's tasks per node
    assert report["state"] == "succeeded"
    ranks = [json.loads(t) for r, _, s, t in report["lines"] if r >= 0 and s == "stdout"]  # type: ignore[union-attr]
    assert len(ranks) == 3
    by_rank = {r["rank"]: r for r in ranks}
    # One world of 3 (not singletons), each rank where mpirun would put it: snode1's two
    # slots, then snode2; torch's variables from Slurm's.
    hosts = slurm.hosts
    for r in range(3):
        got = by_rank[r]
        assert (got["size"], got["sum"], got["host"]) == (3, 3, hosts[r // 2])
        assert (got["RANK"], got["WORLD_SIZE"]) == (str(r), "3")
        assert got["LOCAL_RANK"] == str(r % 2)
        assert got["LOCAL_WORLD_SIZE"] == ("2" if r < 2 else "1")
        assert got["NODE_RANK"] == str(r // 2)
    # The host column of the logs is the rank's node, from the rank wrapper.
    assert {r: h for r, h, _, _ in report["lines"] if r >= 0} == {  # type: ignore[misc]
        r: hosts[r // 2] for r in range(3)
    }
    assert _left_on_nodes(slurm) == {}


def test_a_failing_rank_fails_the_step_and_leaves_nothing(slurm, tmp_path, openmpi_python):
    report = _inside(slurm, tmp_path, "salloc", openmpi_python, RAISES, np=4)
    assert "error" not in report, report
    assert report["state"] == "failed"
    rank2 = [t for r, _, s, t in report["lines"] if r == 2 and s == "stderr"]  # type: ignore[misc]
    assert any("ValueError: rank two gives up" in t for t in rank2), report["lines"]
    assert _left_on_nodes(slurm) == {}


def test_a_pmi_plugin_that_does_not_fit_the_mpi_is_an_error_not_singletons(
    slurm, tmp_path, openmpi_python, mpich_python
):
    # Open MPI's mpi4py with MPICH's launcher: srun --mpi=pmi2, which Open MPI takes for no
    # world at all (each rank alone, exit code 0).
    head = tmp_path / "head.py"
    head.write_text(
        textwrap.dedent(
            f"""\
            import clusterbook as cb
            try:
                cb.Cluster.from_environment(
                    python={openmpi_python!r},
                    launcher={str(Path(mpich_python).parent / "mpiexec")!r},
                    run_dir={str(tmp_path / "run")!r},
                ).start()
            except cb.ConfigError as exc:
                print("ConfigError:", exc)
            """
        )
    )
    done = subprocess.run(
        ["salloc", "-N2", "-n2", sys.executable, str(head)],
        env={**os.environ, "SLURM_CONF": str(slurm.conf)},
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert "ConfigError: srun --mpi=pmi2 started every rank alone (a world of 1, not 2)" in (
        done.stdout
    ), done.stdout + done.stderr
    assert "via='ssh'" in done.stdout
    assert _left_on_nodes(slurm) == {}


SLEEPS = """\
import time
from mpi4py import MPI
MPI.COMM_WORLD.barrier()
print("ready", flush=True)
time.sleep(120)
"""


def test_a_step_over_its_timeout_dumps_stacks_and_leaves_nothing(slurm, tmp_path, openmpi_python):
    report = _inside(slurm, tmp_path, "salloc", openmpi_python, SLEEPS, 3, "4")
    assert "error" not in report, report
    assert report["state"] == "timed out"
    lines = report["lines"]
    assert sorted(r for r, _, s, t in lines if t == "ready") == [0, 1, 2]  # type: ignore[union-attr]
    # srun passes SIGUSR1 on: each Python rank dumps its stack before it is stopped.
    dumped = {r for r, _, s, t in lines if s == "stderr" and 'rank.py", line 5 in' in t}  # type: ignore[union-attr]
    assert dumped == {0, 1, 2}, lines
    assert _left_on_nodes(slurm) == {}


def test_clusterbook_run_inside_an_allocation_starts_steps(slurm, tmp_path, openmpi_python):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK)
    done = subprocess.run(
        ["salloc", "-N2", "-n2", sys.executable, "-m", "clusterbook", "run",
         "--run-dir", str(tmp_path / "run"), "-n", "2", "--", openmpi_python, str(rank)],
        env={**os.environ, "SLURM_CONF": str(slurm.conf)},
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(jobs as steps of the allocation, through srun)" in done.stderr
    hosts = sorted(json.loads(t[t.index("{") :])["host"] for t in done.stdout.splitlines())
    assert hosts == list(slurm.hosts)
    assert _left_on_nodes(slurm) == {}


KEEP = """\
import json, sys
import psutil
import clusterbook as cb

python, program, out = sys.argv[1], sys.argv[2], sys.argv[3]
report = {}
with cb.Cluster.from_environment(python=python, run_dir=out + ".run") as cluster:
    job = cluster.mpirun([python, program], np=4, clean="none", timeout=60)
    result = job.wait()
    report["state"] = result.state
    report["kept"] = [[k.pid, k.host, k.name] for k in result.kept]
    report["states"] = sorted({psutil.Process(k.pid).status() for k in result.kept})
    job.cleanup()
    report["left"] = [k.pid for k in result.kept if psutil.pid_exists(k.pid)
                      and psutil.Process(k.pid).status() != psutil.STATUS_ZOMBIE]
with open(out, "w") as f:
    json.dump(report, f)
"""


def test_clean_none_keeps_the_failed_steps_ranks_stopped_on_the_nodes_until_cleanup(
    slurm, tmp_path, openmpi_python
):
    head, rank, out = tmp_path / "head.py", tmp_path / "rank.py", tmp_path / "report.json"
    head.write_text(KEEP)
    rank.write_text(RAISES)
    done = subprocess.run(
        ["salloc", "-N2", "-n4", sys.executable, str(head), openmpi_python, str(rank), str(out)],
        env={**os.environ, "SLURM_CONF": str(slurm.conf)},
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert out.exists(), done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["state"] == "failed"
    # Every rank's program, on both nodes (asked through srun there), was stopped where it
    # was (and srun, here), then ended by cleanup().
    assert {h for _, h, name in report["kept"] if name == "python"} == set(slurm.hosts), report
    assert {name for _, h, name in report["kept"] if h not in slurm.hosts} == {"srun"}, report
    assert report["states"] == ["stopped"], report
    assert report["left"] == []
    assert _left_on_nodes(slurm) == {}
