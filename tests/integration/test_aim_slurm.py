"""Aiming at some nodes of a real Slurm allocation (tests/slurm_testbed.sh):
``run_on_nodes(nodes=)`` runs as a step on the nodes named only, and ``write()`` and
``put(dest=)`` reach a path of the user's choice (the allocation's nodes share this machine's
files, so it is written here, once)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import clusterbook as cb
from tests.integration.test_slurm import _left_on_nodes
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture

pytestmark = [pytest.mark.slurm, pytest.mark.root, pytest.mark.mpi]
slurm, slurmbed = slurm_fixture, slurmbed_fixture

# Run inside the allocation: build the cluster from what Slurm says, aim, report.
HEAD = """\
import json, os, sys
import clusterbook as cb

python, work, out = sys.argv[1:4]
os.chdir(work)
report = {}
try:
    with cb.Cluster.from_environment(python=python, run_dir=out + ".run") as cluster:
        report["kind"] = cluster.kind
        names = [n.name for n in cluster.nodes]
        report["names"] = names
        runs = cluster.run_on_nodes(["hostname"], nodes=[names[1]])
        report["ran"] = [runs.node.tolist(), runs.stdout.str.strip().tolist()]
        cluster.write("conf/settings.txt", "x = 1\\n", nodes=names[1:], mode=0o600)
        cluster.put("source.txt", dest="placed/")
        try:
            cluster.run_on_nodes(["hostname"], nodes=["nope"])
        except cb.ConfigError as exc:
            report["refused"] = str(exc)
except Exception as exc:
    report["error"] = f"{type(exc).__name__}: {exc}"
with open(out, "w") as f:
    json.dump(report, f)
"""


def test_run_on_nodes_write_and_put_dest_in_an_allocation(slurm, tmp_path, openmpi_python):
    work = tmp_path / "work"
    work.mkdir()
    (work / "source.txt").write_text("from the head\n")
    head, out = tmp_path / "head.py", tmp_path / "report.json"
    head.write_text(HEAD)
    env = {**os.environ, "SLURM_CONF": str(slurm.conf)}
    argv = [sys.executable, str(head), openmpi_python, str(work), str(out)]
    done = subprocess.run(
        ["salloc", "-N2", "-n2", *argv], env=env, capture_output=True, text=True, timeout=150
    )
    assert out.exists(), f"salloc ran no head: {done.stdout}{done.stderr}"
    report = json.loads(out.read_text())
    assert "error" not in report, report
    assert report["kind"] == "srun"
    second = report["names"][1]
    assert report["ran"] == [[second], [slurm.hosts[1]]]
    written = work / "conf" / "settings.txt"
    assert written.read_text() == "x = 1\n"
    assert written.stat().st_mode & 0o777 == 0o600
    assert (work / "placed" / "source.txt").read_text() == "from the head\n"
    assert "'nope' is not a node of the cluster" in report["refused"]
    assert ", ".join(report["names"]) in report["refused"]
    assert _left_on_nodes(slurm) == {}


def test_run_on_nodes_write_and_put_dest_on_a_slurm_clusters_agents(
    slurm, tmp_path, openmpi_python, monkeypatch
):
    work = tmp_path / "work"
    work.mkdir()
    (work / "source.txt").write_text("from the head\n")
    monkeypatch.chdir(work)
    with cb.Cluster.slurm(nodes=2, python=openmpi_python, run_dir=tmp_path / "r") as cluster:
        cluster.wait_ready(timeout=60)
        first, second = (n.name for n in cluster.nodes)
        runs = cluster.run_on_nodes(["hostname"], nodes=[second])
        assert runs.node.tolist() == [second]
        every = cluster.run_on_nodes(["hostname"]).set_index("node").stdout.str.strip()
        assert sorted(every) == list(slurm.hosts)
        assert runs.stdout.str.strip().tolist() == [every[second]]
        cluster.write("conf/settings.txt", b"x = 1\n", nodes=second, mode=0o600)
        written = work / "conf" / "settings.txt"
        assert written.read_bytes() == b"x = 1\n"
        assert written.stat().st_mode & 0o777 == 0o600
        cluster.put("source.txt", dest="placed/")
        assert (work / "placed" / "source.txt").read_text() == "from the head\n"
        with pytest.raises(cb.ConfigError, match=f"'nope' is not a node.*{first}, {second}"):
            cluster.run_on_nodes(["hostname"], nodes="nope")
    # What put and write made on the agents' nodes went with the cluster.
    assert sorted(os.listdir(work)) == ["source.txt"]
    assert _left_on_nodes(slurm) == {}
