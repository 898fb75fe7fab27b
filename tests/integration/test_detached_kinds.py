"""Detached clusters of the kinds whose nodes are other machines: an SSH cluster of fake hosts
(real sshd) and a Slurm cluster (the real Slurm test bed) outlive the SIGKILL of the process
that started them, are attached from another process, run a job across their nodes, and stop
leaving nothing on the nodes, on this machine or in Slurm's queue."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

import clusterbook as cb
from clusterbook.paths import cluster_dir
from tests.conftest import processes_mentioning
from tests.integration.test_slurm import _left_on_nodes
from tests.slurmbed import slurm as slurm_fixture
from tests.slurmbed import slurmbed as slurmbed_fixture
from tests.testbed import Testbed
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.mpi]
testbed, slurm, slurmbed = fake_hosts, slurm_fixture, slurmbed_fixture
CLI = [sys.executable, "-m", "clusterbook"]

# Starts the detached cluster of the spec in argv[1], says its id, and waits to be killed.
STARTER = """\
import json, sys, time
import clusterbook as cb
cluster = cb.Cluster.from_spec({**json.loads(sys.argv[1]), "detached": True}).start()
print(cluster.id, flush=True)
time.sleep(600)
"""

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()}", flush=True)
"""


@pytest.fixture
def stop_left() -> Iterator[list[str]]:
    """Clusters to stop at teardown, whatever the test did (a detached one outlives it)."""
    ids: list[str] = []
    yield ids
    for cluster_id in ids:
        subprocess.run([*CLI, "stop", cluster_id], capture_output=True, timeout=60, check=False)


def start_and_kill(spec: dict[str, Any], stop_left: list[str]) -> str:
    """Start a detached cluster of ``spec`` from a process of its own, SIGKILL that process
    once the cluster runs, and return the cluster's id."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, json.dumps(spec)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert starter.stdout is not None
        cluster_id = starter.stdout.readline().strip()
        assert cluster_id.startswith(spec["name"]), "the starter printed no cluster id"
        stop_left.append(cluster_id)
        os.kill(starter.pid, signal.SIGKILL)
        starter.wait(timeout=10)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(10)
        if starter.stdout is not None:
            starter.stdout.close()
    return cluster_id


def run_attached(cluster_id: str, script: Path, nodes: int, hosts: list[str]) -> None:
    """Attach to the cluster from this process, wait for its ``nodes``, run ``script`` (put
    there first) with ranks on ``hosts`` (by rank), then stop the cluster and its head."""
    attached = cb.Cluster.attach(cluster_id)
    assert attached.state == "running"
    assert attached.record.detached
    attached.wait_ready(60)
    # Once wait_ready() returned, the record shows the nodes up (not their pending rows).
    status = attached.status()
    assert status["state"].astype(str).tolist() == ["joined"] * nodes, status
    attached.put(script)
    job = attached.mpirun(["python", str(script)], np=len(hosts), timeout=60)
    result = job.wait(90)
    assert result.ok, result.summary()
    lines = job.logs().query("rank >= 0").sort_values("rank")["line"].tolist()
    assert lines == [f"rank {r} of {len(hosts)} on {h}" for r, h in enumerate(hosts)]
    with pytest.raises(cb.ClusterStateError) as refused:
        attached.engines()
    said = str(refused.value)
    assert said.count(". ") == 0  # one sentence: why, and what to do instead
    assert "runs in another process" in said
    assert "mpirun() or %%mpirun instead" in said
    head = psutil.Process(attached.record.head_pid)
    attached.stop()
    assert attached.state == "stopped"
    assert psutil.wait_procs([head], timeout=10)[1] == []


def left_on_fake_hosts(bed: Testbed, name: str, wait: float = 10.0) -> dict[str, list[str]]:
    """What each fake host still has of cluster ``name``: processes but its sshd, the
    cluster's directory, a cluster key in authorized_keys (closing sessions get ``wait`` s)."""
    deadline = time.monotonic() + wait
    while True:
        left: dict[str, list[str]] = {}
        for host in bed.hosts:
            found = []
            for pid in host.processes():
                if pid != host.sshd.pid:
                    try:
                        found.append(" ".join(psutil.Process(pid).cmdline()))
                    except psutil.Error:
                        continue
            if (host.home / ".clusterbook" / "clusters" / name).exists():
                found.append(f"~/.clusterbook/clusters/{name}")
            if "clusterbook:" in host.authorized_keys.read_text():
                found.append("a cluster key in ~/.ssh/authorized_keys")
            if found:
                left[host.name] = found
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_a_detached_ssh_cluster_survives_its_starter_runs_jobs_and_stops_clean(
    testbed: Testbed, openmpi_python: str, tmp_path: Path, stop_left: list[str]
) -> None:
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    name = f"dssh-{os.getpid()}"
    spec = {
        "kind": "ssh",
        "hosts": [f"{h.addr}:1" for h in testbed.hosts[:2]],
        "identity": str(testbed.identity),
        "known_hosts": str(testbed.write_known_hosts()),
        "connect_timeout": 10,
        "python": openmpi_python,
        "name": name,
    }
    cluster_id = start_and_kill(spec, stop_left)
    run_attached(cluster_id, script, 2, ["node1", "node2"])
    assert left_on_fake_hosts(testbed, name) == {}
    assert processes_mentioning(cluster_id) == []
    assert not cluster_dir(name).exists()


def test_a_detached_slurm_cluster_survives_its_starter_runs_jobs_and_stops_clean(
    slurm: Any, openmpi_python: str, tmp_path: Path, stop_left: list[str]
) -> None:
    script = tmp_path / "where.py"  # the Slurm nodes share this machine's files
    script.write_text(WHERE)
    name = f"dslurm-{os.getpid()}"
    spec = {"kind": "slurm", "nodes": 2, "time": "10m", "python": openmpi_python, "name": name}
    cluster_id = start_and_kill(spec, stop_left)
    record = cb.Cluster.attach(cluster_id).record
    assert record.life_span == 600  # the batch job's time limit
    run_attached(cluster_id, script, 2, ["snode1", "snode1", "snode2", "snode2"])
    assert slurm.active_jobs() == []
    assert _left_on_nodes(slurm) == {}
    assert processes_mentioning(name) == []
    assert not cluster_dir(name).exists()
