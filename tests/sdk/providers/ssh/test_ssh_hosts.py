"""Host lists of SSH clusters: bad entries are refused before anything connects."""

from __future__ import annotations

import pytest

import clusterbook as cb
from clusterbook.providers.ssh.hosts import parse_hosts


def test_parse_hosts():
    nodes = parse_hosts(["node1:4", "node2", "10.0.0.7:2"])
    assert [(n.host, n.slots) for n in nodes] == [("node1", 4), ("node2", 1), ("10.0.0.7", 2)]


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        (["-oProxyCommand=touch /tmp/x"], "starts with '-'"),
        (["'; touch /tmp/x"], "not allowed in a host name"),
        (["$(touch /tmp/x)"], "not allowed in a host name"),
        (["node1\nnode2"], "not allowed in a host name"),
        ([""], "no host name"),
        (["node1:0"], "must be >= 1"),
        (["node1:-2"], "must be >= 1"),
        (["node1:four"], "is not a number"),
        (["node1:4", "node1:2"], "'node1' is listed twice"),
        ([], "hosts is empty"),
        ("node1:4,node2:4", "must be a list"),
    ],
)
def test_bad_hosts_are_refused(hosts, message):
    with pytest.raises(cb.ConfigError, match=message):
        cb.Cluster.ssh(hosts)


def test_bad_ssh_options_are_refused():
    with pytest.raises(cb.ConfigError, match="no policy that accepts any key"):
        cb.Cluster.ssh(["node1"], host_keys="auto-add")
    with pytest.raises(cb.ConfigError, match="port must be >= 1"):
        cb.Cluster.ssh(["node1"], port=0)
    with pytest.raises(cb.ConfigError, match="port must be at most 65535"):
        cb.Cluster.ssh(["node1"], port=70000)
    with pytest.raises(cb.ConfigError, match="connect_timeout must be"):
        cb.Cluster.ssh(["node1"], connect_timeout=0)
    with pytest.raises(cb.ConfigError, match="Cluster name"):
        cb.Cluster.ssh(["node1"], name="../etc")
    with pytest.raises(cb.ConfigError, match="launch='hot' is not a way to launch jobs"):
        cb.Cluster.ssh(["node1"], launch="hot")  # type: ignore[arg-type]


def test_ssh_cluster_repr_and_status_before_start():
    cluster = cb.Cluster.ssh(["node1:4", "node2:2"], name="c1")
    assert repr(cluster) == "<Cluster 'c1' ssh created: 2 nodes, 6 slots>"
    assert cluster.status().state.tolist() == ["pending", "pending"]
