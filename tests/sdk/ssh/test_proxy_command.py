"""A ProxyCommand in the ssh config: read with its tokens filled in, refused where OpenSSH would
not run it, written into the MPI launcher's ssh config, and run (with real processes) as the
way to a host; a command that fails or hangs is named, and leaves no process behind."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.ssh.credentials import Credentials
from clusterbook.ssh.hostkeys import KnownHosts
from clusterbook.ssh.launcher_ssh import launcher_ssh_config, plain_login
from clusterbook.ssh.paramiko_shell import connect_hop
from clusterbook.ssh.target import Hop, SSHConfigLike, Target, read_ssh_config, resolve
from tests.conftest import processes_mentioning, wait_gone

CONFIG = """\
Host proxied
  HostName 10.0.0.5
  User bob
  Port 2200
  ProxyCommand ssh -W %h:%p -l %r bastion -o 'SetEnv=X=100%%'
Host straight
  HostName 10.0.0.6
  ProxyCommand none
Host both
  HostName 10.0.0.7
  ProxyCommand nc %h %p
  ProxyJump bastion
Host behind
  HostName 10.0.0.8
  ProxyJump proxied
Host named
  ProxyCommand connect %n %%
Host odd
  ProxyCommand nc %h %d
Host *
  User alice
"""


@pytest.fixture
def config(tmp_path: Path) -> SSHConfigLike:
    path = tmp_path / "ssh_config"
    path.write_text(CONFIG)
    read = read_ssh_config(path)
    assert read is not None
    return read


def test_a_proxy_command_is_read_with_its_tokens_filled_in(config: SSHConfigLike) -> None:
    target = resolve("proxied", config, local_user="me")
    assert target.node.proxy_command == "ssh -W 10.0.0.5:2200 -l bob bastion -o 'SetEnv=X=100%'"
    # The user and port given win over the config's, in the command too (as ssh -l -p).
    given = resolve("proxied", config, local_user="me", user="root", port=22)
    assert given.node.proxy_command == "ssh -W 10.0.0.5:22 -l root bastion -o 'SetEnv=X=100%'"
    assert resolve("straight", config, local_user="me").node.proxy_command is None
    # A jump host reached first hand runs its own ProxyCommand, as OpenSSH's ssh -J does.
    (jump,) = resolve("behind", config, local_user="me").jumps
    assert jump.proxy_command == "ssh -W 10.0.0.5:2200 -l bob bastion -o 'SetEnv=X=100%'"
    assert resolve("named", config, local_user="me").node.proxy_command == "connect named %"


def test_a_token_openssh_does_not_fill_in_is_refused(config: SSHConfigLike) -> None:
    with pytest.raises(cb.ConfigError) as info:
        resolve("odd", config, local_user="me")
    said = str(info.value)
    assert "ProxyCommand 'nc %h %d' of 'odd' in the ssh config has the token '%d'" in said
    assert "(it knows %h, %n, %p, %r and %%); fix that line" in said


def test_a_proxy_command_and_a_jump_host_on_one_way_are_refused(config: SSHConfigLike) -> None:
    with pytest.raises(cb.ConfigError) as info:
        resolve("both", config, local_user="me")
    said = str(info.value)
    assert "gives 'both' both a ProxyCommand ('nc 10.0.0.7 22')" in said
    assert "a jump host on the way ('bastion', from a ProxyJump line)" in said
    assert "keep one of them" in said


def test_the_launchers_ssh_runs_the_same_command(config: SSHConfigLike) -> None:
    targets = {"proxied": resolve("proxied", config, local_user="me")}
    assert plain_login(targets) is None  # a config of hosts, every daemon from the head
    # Proxied at its own name, as addresses are, it still needs its ProxyCommand.
    at_address = Target(Hop("10.0.0.5", "10.0.0.5", 22, "me", proxy_command="nc %h"))
    assert plain_login({"10.0.0.5": at_address}) is None
    text = launcher_ssh_config("/h/c1", targets, None)
    # ssh fills in tokens again: a % that was filled in already goes as %%.
    assert (
        "Host proxied\n  HostName 10.0.0.5\n  Port 2200\n  User bob\n"
        "  ProxyCommand ssh -W 10.0.0.5:2200 -l bob bastion -o 'SetEnv=X=100%%'\n" in text
    )


def _connect(command: str, tmp_path: Path, timeout: float) -> None:
    hop = Hop("node9", "192.0.2.9", 22, "me", proxy_command=command)
    credentials = Credentials.gather([hop], use_agent=False)
    connect_hop(
        Target(hop),
        credentials=credentials,
        policy=KnownHosts(tmp_path / "known_hosts"),
        timeout=timeout,
    )


def test_a_proxy_command_that_fails_is_named_with_what_it_said(tmp_path: Path) -> None:
    command = "sh -c 'echo bastion: no route to node9 >&2; exit 3'"
    with pytest.raises(cb.SSHConnectError) as info:
        _connect(command, tmp_path, timeout=10)
    said = str(info.value)
    assert said.startswith("ssh handshake with 192.0.2.9 failed")
    assert f"through its ProxyCommand {command!r}, which exited 3: bastion: no route" in said
    assert info.value.host == "node9"


def test_a_proxy_command_that_hangs_times_out_and_leaves_nothing(tmp_path: Path) -> None:
    # A proxy that never connects, with a child of its own: both go with the connection.
    proxy = tmp_path / "proxy.py"
    proxy.write_text(
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]])\n"
        "print('trying', file=sys.stderr, flush=True)\n"
        "time.sleep(300)\n"
    )
    command = f"{sys.executable} {proxy} {tmp_path}"
    with pytest.raises(cb.SSHTimeoutError) as info:
        _connect(command, tmp_path, timeout=1)
    said = str(info.value)
    assert "did not complete the ssh handshake within 1 s" in said
    assert f"through its ProxyCommand {command!r}, which" in said
    assert "trying" in said
    left = wait_gone(str(tmp_path), timeout=5)
    assert left == [], [p.cmdline() for p in left]
    assert processes_mentioning(str(proxy)) == []
