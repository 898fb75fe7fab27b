"""The resource history of a real local cluster, from what its agents report with each
heartbeat: CPU and memory of the machine, and the GPUs of each node through a stand-in
``nvidia-smi`` first on the PATH (this machine has none); asked of the cluster and of a handle
attached through its directory (the head's control server)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

import clusterbook as cb
from clusterbook.testing import fake_nvidia_smi
from tests.integration.test_elastic import agents, elastic
from tests.testbed import testbed as fake_hosts

testbed = fake_hosts
__all__ = ["agents", "elastic"]  # the elastic clusters' fixtures, shared


@pytest.fixture
def four_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    where = fake_nvidia_smi(tmp_path / "smi", 4, utilization=[10, 20, 30, 70])
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def history_of(
    cluster: cb.Cluster, samples: int, *, gpus: bool = True, timeout: float = 30.0
) -> dict[str, Any]:
    """The cluster's history once every node has ``samples`` samples with its CPU (and GPU)
    use known (the first report of an agent knows neither: nothing was measured yet)."""
    deadline = time.monotonic() + timeout
    while True:
        answer = cluster.resource_history()
        nodes = answer["nodes"]
        known = [
            sum(
                c is not None and (g is not None or not gpus)
                for c, g in zip(s["cpu"], s["gpu"], strict=True)
            )
            for s in nodes.values()
        ]
        if len(nodes) == len(cluster.nodes) and min(known) >= samples:
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)


def test_a_local_clusters_agents_fill_its_history_with_cpu_memory_and_gpus(
    openmpi_python, make_cluster, four_gpus
):
    cluster = make_cluster(openmpi_python, workers=2, slots="gpus")
    answer = history_of(cluster, samples=2)
    assert answer["interval"] == 1.0  # the agents' heartbeat
    total = psutil.virtual_memory().total / 2**30
    gpus = {}
    for node, series in answer["nodes"].items():
        assert series["t"] == sorted(series["t"])
        assert series["t"][-1] <= time.time()
        assert series["memory_gib"] == pytest.approx(total, abs=0.01)
        assert all(0 < used <= total for used in series["memory_used_gib"])
        assert all(0 <= c <= 100 for c in series["cpu"] if c is not None)
        gpus[node] = series["gpu"][-1]
    # Nodes that share a machine report the machine, its GPUs as its CPU and memory: the
    # mean of the 4.
    assert list(gpus.values()) == [32.5, 32.5]
    with cb.Cluster.attach(cluster.run_dir) as handle:
        theirs = handle.resource_history()
        assert set(theirs["nodes"]) == set(answer["nodes"])
        frame = handle.resources(window=60)
        assert set(frame["node"]) == set(answer["nodes"])
        assert frame["memory_gib"].min() == pytest.approx(total, abs=0.01)


@pytest.mark.root
@pytest.mark.sshd
def test_an_ssh_clusters_agents_fill_its_history_from_every_host(testbed, openmpi_python, tmp_path):
    with testbed.cluster(openmpi_python, tmp_path / "run", slots=1) as cluster:
        answer = history_of(cluster, samples=2, gpus=False)
        assert set(answer["nodes"]) == {n.name for n in cluster.nodes}
        for series in answer["nodes"].values():
            assert series["memory_gib"] > 0
            assert series["gpu"] == [None] * len(series["t"])  # no nvidia-smi on the hosts
        assert len(answer["cluster"]["t"]) >= 2
        assert answer["cluster"]["memory_gib"] == pytest.approx(
            sum(s["memory_gib"] for s in answer["nodes"].values()), abs=0.01
        )


@pytest.mark.mpi
def test_an_elastic_clusters_joining_agents_fill_its_history(elastic, agents):
    cluster = elastic(2, 2, last_call=0.5)
    for i in range(2):
        agents(cluster.join_command, f"n{i}")
    cluster.wait_ready(timeout=60)
    answer = history_of(cluster, samples=2, gpus=False)
    assert set(answer["nodes"]) == {"n0", "n1"}  # in the order they first reported
    frame = cluster.resources()
    assert set(frame["node"]) == {"n0", "n1"}
    assert frame["cpu_percent"].notna().sum() >= 4
