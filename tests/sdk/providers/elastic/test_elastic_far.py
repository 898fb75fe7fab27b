"""How the head reaches far elastic nodes: pure choices and the files it writes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from clusterbook.gpus import gpu_info
from clusterbook.providers.elastic.far import (
    FarNode,
    far_nodes,
    known_hosts_text,
    pick_address,
    reported_facts,
    ssh_config,
)
from clusterbook.rendezvous.report import NodeReport
from clusterbook.spec import NodeSpec
from clusterbook.ssh.hostkeys import HostKey
from clusterbook.ssh.keys import derive_keypair, derived_public_line, generate_keypair
from clusterbook.ssh.preflight import NodeFacts

A100 = "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5fd4a3e1)\n"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOGmQbYwQ2HQXZ8m5d0o4lEm0Ff1wqYdJtX1hP3mVq3Q"
#: The key derived from the secret bytes 0..31 for cluster c1, as clusterbook 0.1.0 made it.
DERIVED_FROM_0_TO_31 = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDceTbTC/RkjSb3nb7ZkMfby7X6iH5ku+OYtCOpdNVfx "
    "clusterbook:c1"
)


def test_pick_address_prefers_a_network_the_head_is_on() -> None:
    addresses = ["172.17.0.5", "10.77.3.12", "192.168.1.9"]
    assert pick_address(addresses, ["10.77.3.1/255.255.255.0"]) == "10.77.3.12"
    assert pick_address(addresses, ["192.168.1.1/24", "10.99.0.1/16"]) == "192.168.1.9"
    assert pick_address(addresses, ["10.99.0.1/24"]) == "172.17.0.5"  # else the first
    assert pick_address(["not-an-ip", "10.0.0.7"], ["10.0.0.1/8"]) == "10.0.0.7"


def reported(reports: dict[str, dict[str, object]]) -> dict[str, NodeReport]:
    """Reports as the agents send them (JSON), as the head reads them."""
    return {node: NodeReport.from_json(r) for node, r in reports.items()}


def test_far_nodes_skip_local_ones_and_name_those_without_an_sshd() -> None:
    nodes = (
        NodeSpec("here", "localhost", 2),
        NodeSpec("a", "10.0.0.11", 2),
        NodeSpec("b", "10.0.0.12", 1),
    )
    reports = {
        "a": {"sshd_port": 2222, "sshd_host_key": KEY, "user": "ann", "hostname": "node-a"},
        "b": {"hostname": "node-b"},
    }
    far, found = far_nodes(nodes, reported(reports), "me")
    assert far == [
        FarNode("a", "10.0.0.11", 2222, "ann", HostKey(*KEY.split()), "node-a", 2),
    ]
    assert list(found) == ["b"]
    assert "--start-sshd PORT" in found["b"][0]
    assert "10.0.0.12" in found["b"][0]


def test_far_node_user_defaults_to_the_heads() -> None:
    nodes = (NodeSpec("a", "10.0.0.11", 1),)
    far, _ = far_nodes(nodes, reported({"a": {"sshd_port": 22, "sshd_host_key": KEY}}), "me")
    assert far[0].user == "me"
    assert far[0].hostname == "10.0.0.11"


def test_known_hosts_pin_each_reported_key_at_address_and_port() -> None:
    key = HostKey(*KEY.split())
    nodes = [
        FarNode("a", "10.0.0.11", 2222, "me", key, "a", 1),
        FarNode("b", "10.0.0.12", 22, "me", key, "b", 1),
    ]
    assert known_hosts_text(nodes).splitlines() == [
        f"[10.0.0.11]:2222 {KEY}",
        f"10.0.0.12 {KEY}",
    ]


def test_ssh_config_is_strict_and_names_each_nodes_port_and_user(tmp_path: Path) -> None:
    key = HostKey(*KEY.split())
    nodes = [FarNode("a", "10.0.0.11", 2222, "ann", key, "a", 1)]
    text = ssh_config(nodes, identity=tmp_path / "my keys" / "id", known_hosts=tmp_path / "kh")
    assert "Host 10.0.0.11\n  Port 2222\n  User ann\n" in text
    assert f'IdentityFile "{tmp_path}/my keys/id"' in text
    assert "StrictHostKeyChecking yes" in text
    assert "BatchMode yes" in text
    assert "/dev/null" not in text
    assert "StrictHostKeyChecking no" not in text


def test_a_derived_key_pair_is_the_same_from_the_same_secret_only(tmp_path: Path) -> None:
    secret = bytes(range(32))
    pair = derive_keypair(tmp_path / "k1", "c1", secret)
    assert pair.public_line == derived_public_line(secret, "c1")
    assert pair.public_line.endswith(" clusterbook:c1")
    again = derive_keypair(tmp_path / "k2", "c1", secret)
    assert _public_of(again.private_path) == _public_of(pair.private_path)
    assert _public_of(pair.private_path) == pair.public_line.split()[1]
    assert derived_public_line(bytes(range(1, 33)), "c1") != pair.public_line
    # The same key from every version of clusterbook: a head and its agents may differ.
    assert pair.public_line == DERIVED_FROM_0_TO_31
    assert pair.private_path.stat().st_mode & 0o777 == 0o600
    assert secret.hex() not in repr(pair)
    # Generated (not derived) keys differ every time.
    one, two = generate_keypair(tmp_path / "g1", "c1"), generate_keypair(tmp_path / "g2", "c1")
    assert one.public_line != two.public_line


def test_a_short_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 16 bytes"):
        derived_public_line(b"short", "c1")


def _public_of(private_path: Path) -> str:
    """The base64 public key of an OpenSSH private key file."""

    from cryptography.hazmat.primitives import serialization

    key = serialization.load_ssh_private_key(private_path.read_bytes(), password=None)
    blob = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return blob.decode().split()[1]


def probe_text(flavour: str = "openmpi", prefix: str = "/opt/venv", **facts: object) -> str:
    """A report's ``probe``, as an agent started with ``--probe-mpi`` sends it."""
    found = {
        "hostname": "node-a",
        "home": "/home/ann",
        "python": "/opt/venv/bin/python",
        "python_version": "3.11.7",
        "cores": 8,
        "mpi4py": "4.1.2",
        "mpi_library": "openmpi 5.0.11",
        "clusterbook": "0.1.0",
        "launcher_found": True,
        **facts,
    }
    return json.dumps({"flavour": flavour, "prefix": prefix, "facts": found})


def test_nodes_whose_agent_probed_itself_for_the_launcher_are_checked_from_their_report() -> None:
    key = HostKey(*KEY.split())
    socket = "/home/ann/.clusterbook/sshd-a/daemons.sock"
    nodes = [
        FarNode(name, f"10.0.0.{i}", 22, "ann", key, name, 1, daemon_socket=socket)
        for i, name in enumerate(
            ["a", "other-launcher", "other-python", "garbled", "a-list", "silent", "cold"]
        )
    ]
    reports = {
        "a": NodeReport(hostname="node-a", probe=probe_text(), gpus=gpu_info({"stdout": A100})),
        "other-launcher": NodeReport(probe=probe_text(flavour="mpich")),
        # An agent run by the node's own clusterbook: its mpi4py is not the ranks' Python's.
        "other-python": NodeReport(probe=probe_text(python="/usr/bin/python3")),
        "garbled": NodeReport(probe="{not json"),
        "a-list": NodeReport(probe="[1, 2]"),
        "silent": NodeReport(),
        "cold": NodeReport(probe=probe_text()),
    }
    nodes[-1] = replace(nodes[-1], daemon_socket=None)  # its ranks start over ssh: not probed
    ours = {"prefix": "/opt/venv", "flavour": "openmpi", "python": "/opt/venv/bin/python"}
    found = reported_facts(nodes, reports, **ours)
    assert list(found) == ["a"]
    assert found["a"] == NodeFacts(
        "node-a", "/home/ann", "/opt/venv/bin/python", "3.11.7", 8, "4.1.2", "openmpi 5.0.11",
        "0.1.0", True, gpus=reports["a"].gpus,
    )  # fmt: skip
    assert found["a"].gpus.count == 1  # the report's own (the probe leaves nvidia-smi out)
    assert reported_facts(nodes, reports, **{**ours, "prefix": "/elsewhere"}) == {}


def test_ssh_config_puts_x25519_first_and_keeps_the_other_key_exchanges(tmp_path: Path) -> None:
    key = HostKey(*KEY.split())
    nodes = [FarNode("a", "10.0.0.11", 2222, "ann", key, "a", 1)]
    text = ssh_config(nodes, identity=tmp_path / "id", known_hosts=tmp_path / "kh")
    assert "  KexAlgorithms ^curve25519-sha256\n" in text  # '^': first, the rest still offered
