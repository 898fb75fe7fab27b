"""Where a host name leads, as OpenSSH reads ~/.ssh/config; what the launcher's ssh is told."""

from __future__ import annotations

from pathlib import Path

import paramiko
import pytest

import clusterbook as cb
from clusterbook.ssh.launcher_ssh import launcher_ssh_config, plain_login
from clusterbook.ssh.target import Hop, Target, read_ssh_config, resolve

CONFIG = """\
Host alpha
  HostName 10.0.0.5
  User bob
  Port 2222
  IdentityFile ~/.ssh/alpha_key
Host inner
  HostName 10.1.0.7
  ProxyJump bastion
Host deep
  HostName 10.2.0.9
  ProxyJump bastion,carol@inner:2200
Host bastion
  HostName 192.0.2.1
  User jump
  IdentitiesOnly yes
Host loop1
  ProxyJump loop2
Host loop2
  ProxyJump loop1
Host badjump
  ProxyJump a:b:c
Host badport
  Port twenty
Host *
  User alice
"""


def config() -> paramiko.SSHConfig:
    return paramiko.SSHConfig.from_text(CONFIG)


def test_an_alias_leads_to_its_hostname_user_port_and_keys() -> None:
    target = resolve("alpha", config(), local_user="me")
    assert target == Target(
        Hop("alpha", "10.0.0.5", 2222, "bob", (Path("~/.ssh/alpha_key").expanduser(),))
    )
    assert target.node.where == "alpha (bob@10.0.0.5:2222)"
    # A host the config does not name: itself, with the config's defaults (Host *).
    assert resolve("10.9.9.9", config(), local_user="me").node == Hop(
        "10.9.9.9", "10.9.9.9", 22, "alice"
    )
    assert resolve("10.9.9.9", None, local_user="me").node.user == "me"


def test_given_arguments_win_over_the_config_for_the_host_not_its_jumps() -> None:
    target = resolve("inner", config(), local_user="me", user="root", port=2022, identity="/k")
    assert (target.node.user, target.node.port, target.node.identities) == (
        "root",
        2022,
        (Path("/k"),),
    )
    (bastion,) = target.jumps
    assert (bastion.hostname, bastion.user, bastion.port) == ("192.0.2.1", "jump", 22)
    assert bastion.identities_only


def test_a_chain_of_jumps_is_resolved_hop_by_hop_outermost_first() -> None:
    target = resolve("deep", config(), local_user="me")
    assert [(h.alias, h.hostname, h.user, h.port) for h in target.jumps] == [
        ("bastion", "192.0.2.1", "jump", 22),
        # inner is itself behind bastion: the chain goes through bastion first, once more
        ("bastion", "192.0.2.1", "jump", 22),
        ("inner", "10.1.0.7", "carol", 2200),  # user and port of the ProxyJump entry win
    ]


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        ("loop1", r"ProxyJump lines of the ssh config loop \(loop1 -> loop2 -> loop1\)"),
        ("badjump", r"ProxyJump 'a:b:c' of 'badjump' .* is not \[user@\]host\[:port\]"),
        ("badport", r"Port 'twenty' of 'badport' in the ssh config is not a number"),
    ],
)
def test_a_bad_config_line_is_named(alias: str, message: str) -> None:
    with pytest.raises(cb.ConfigError, match=message):
        resolve(alias, config(), local_user="me")


def test_the_config_file_is_read_or_its_absence_named(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "config"
    path.write_text(CONFIG)
    assert resolve("alpha", read_ssh_config(path), local_user="me").node.port == 2222
    assert read_ssh_config("none") is None
    with pytest.raises(cb.ConfigError, match=r"ssh_config '.*/nope' does not exist"):
        read_ssh_config(tmp_path / "nope")
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config: none, no error
    assert read_ssh_config(None) is None


def test_a_cluster_refuses_a_bad_config_before_it_starts(tmp_path: Path) -> None:
    path = tmp_path / "config"
    path.write_text(CONFIG)
    with pytest.raises(cb.ConfigError, match="loop"):
        cb.Cluster.ssh(["loop1:1"], ssh_config=path)
    with pytest.raises(cb.ConfigError, match="passphrase must be a string"):
        cb.Cluster.ssh(["alpha:1"], ssh_config=path, passphrase=b"x")  # type: ignore[typeddict-item]


def test_the_launcher_needs_a_config_of_hosts_only_when_they_differ() -> None:
    plain = {h: resolve(h, None, local_user="me") for h in ("10.0.0.1", "10.0.0.2")}
    assert plain_login(plain) == ("me", 22)
    aliased = {"alpha": resolve("alpha", config(), local_user="me"), **plain}
    assert plain_login(aliased) is None  # an alias, another user and port
    jumped = {"inner": resolve("inner", config(), local_user="me")}
    assert plain_login(jumped) is None
    text = launcher_ssh_config("/h/c1", {**aliased, **jumped}, "relay %h %p")
    assert "Host alpha\n  HostName 10.0.0.5\n  Port 2222\n  User bob\n" in text
    assert (
        "Host inner\n  HostName 10.1.0.7\n  Port 22\n  User alice\n  ProxyCommand relay %h %p\n"
        in text
    )
    for line in (
        "IdentityFile /h/c1/id_ed25519",
        "StrictHostKeyChecking yes",
        "UserKnownHostsFile /h/c1/known_hosts",
        "BatchMode yes",
    ):
        assert f"  {line}\n" in text
    with pytest.raises(ValueError, match="inner is behind jump hosts"):
        launcher_ssh_config("/h/c1", jumped, None)
