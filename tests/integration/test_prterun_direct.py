"""A job of a local Open MPI cluster starts the prterun its mpirun would exec, with the
arguments and variables mpirun gives it, and its ranks see what they see under mpirun."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import clusterbook as cb

pytestmark = pytest.mark.mpi

# What Open MPI 5's mpirun sets that reaches the ranks (prterun takes PRTE_* for itself).
SEEN = (
    "OPAL_PREFIX",
    "PMIX_PREFIX",
    "OMPI_VERSION",
    "OMPI_TOOL_NAME",
    "OMPI_LIBDIR_LOC",
    "OMPI_MCA_PREFIXES",
)
PROGRAM = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {SEEN!r}}}))"


def test_ranks_started_through_prterun_see_what_mpiruns_ranks_see(tmp_path: Path) -> None:
    mpirun = Path(sys.executable).with_name("mpirun")
    bare = subprocess.run(
        [str(mpirun), "--allow-run-as-root", "-n", "1", sys.executable, "-c", PROGRAM],
        env={**os.environ, "OMPI_MCA_btl": "^ofi", "OMPI_MCA_mtl": "^ofi"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    expected = json.loads(bare.stdout.strip().splitlines()[-1])
    assert expected["OMPI_TOOL_NAME"] == "mpirun"  # what the comparison is worth
    with cb.Cluster.local(1, 2, run_dir=tmp_path / "c") as cluster:
        job = cluster.mpirun(["python", "-c", PROGRAM], np=2, timeout=60)
        job.wait().check()
        started = json.loads((job.directory / "job.json").read_text())["launcher_argv"]
        lines = [json.loads(text) for text in job.logs()["line"]]
    assert started[0] == str(mpirun.with_name("prterun"))
    assert lines == [expected, expected]


def test_a_job_that_sets_opal_prefix_itself_starts_mpirun(tmp_path: Path) -> None:
    prefix = str(Path(sys.executable).parent.parent)
    with cb.Cluster.local(1, 1, run_dir=tmp_path / "c") as cluster:
        job = cluster.mpirun(["python", "-c", PROGRAM], env={"OPAL_PREFIX": prefix}, timeout=60)
        job.wait().check()
        started = json.loads((job.directory / "job.json").read_text())["launcher_argv"]
        line = json.loads(job.logs()["line"].iloc[0])
    assert Path(started[0]).name == "mpirun"
    assert line["OPAL_PREFIX"] == prefix
    assert line["OMPI_TOOL_NAME"] == "mpirun"
