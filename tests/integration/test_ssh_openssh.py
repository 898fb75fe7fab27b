"""SSH the way OpenSSH does it, on fake hosts: an ssh config with aliases, users and ports;
keys from a real ssh-agent; a passphrase-protected key; and nodes the head can reach only
through a bastion host (``ProxyJump``, one or a chain), for its own connections and for the
MPI launcher's."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import clusterbook as cb
from tests.conftest import processes_mentioning, require, wait_gone
from tests.testbed import FakeHost, Testbed
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
print(comm.rank, socket.gethostname(), total)
"""


def _known_hosts(path: Path, entries: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{name} {key}\n" for name, key in entries))
    return path


def _hostnames(cluster: cb.Cluster) -> list[str]:
    ran = cluster.run_on_nodes(["hostname"], timeout=30)
    assert ran["returncode"].tolist() == [0] * len(ran), ran
    return [line.strip() for line in ran["stdout"]]


def _run_where(cluster: cb.Cluster, tmp_path: Path, np: int) -> list[str]:
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    cluster.put(script)  # the nodes do not see this machine's /tmp
    job = cluster.mpirun(["python", str(script)], np=np, timeout=60)
    job.wait(timeout=90).check()
    lines = job.logs().query("rank >= 0").sort_values("rank")["line"]
    return list(lines)


# -- ssh config: aliases, users, ports ------------------------------------------------------


@pytest.fixture
def second_port(testbed: Testbed) -> Iterator[tuple[FakeHost, int, str]]:
    host, port = testbed.hosts[1], 2222
    sshd = host.extra_sshd(port)
    try:
        yield host, port, sshd.host_public_key
    finally:
        sshd.stop()


def test_aliases_users_and_ports_come_from_the_ssh_config(
    testbed: Testbed, second_port: tuple[FakeHost, int, str], openmpi_python: str, tmp_path: Path
) -> None:
    node1 = testbed.hosts[0]
    node2, port, key2 = second_port
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host alpha\n  HostName {node1.addr}\n"
        f"Host beta\n  HostName {node2.addr}\n  Port {port}\n"
        f"Host *\n  User root\n  IdentityFile {testbed.identity}\n"
    )
    known = _known_hosts(
        tmp_path / "known_hosts",
        [(node1.addr, node1.host_public_key), (f"[{node2.addr}]:{port}", key2)],
    )
    cluster = cb.Cluster.ssh(
        ["alpha:1", "beta:1"],
        ssh_config=config,
        known_hosts=known,
        python=openmpi_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    with cluster:
        assert _hostnames(cluster) == ["node1", "node2"]
        # The launcher's own ssh reaches beta on its port too: ranks run on both.
        assert _run_where(cluster, tmp_path, 2) == ["0 node1 3", "1 node2 3"]


# -- keys: an ssh-agent, a passphrase -------------------------------------------------------


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real ssh-agent, its socket in SSH_AUTH_SOCK; killed at teardown."""
    require(shutil.which("ssh-agent") is not None, "ssh-agent is not installed (openssh-client)")
    sock = tmp_path / "agent.sock"
    proc = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        monkeypatch.setenv("SSH_AUTH_SOCK", str(sock))
        yield str(sock)
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _keygen(path: Path, passphrase: str) -> Path:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "", "-f", str(path)],
        check=True,
    )
    return path


def test_the_only_key_that_works_is_in_the_agent(
    testbed: Testbed, agent: str, openmpi_python: str, tmp_path: Path
) -> None:
    node1 = testbed.hosts[0]
    # The agent gets the key from a copy that is then deleted: no file of it is left to read.
    copy = tmp_path / "agent-only"
    shutil.copy(testbed.identity, copy)
    copy.chmod(0o600)
    subprocess.run(
        ["ssh-add", "-q", str(copy)], check=True, env={**os.environ}, capture_output=True
    )
    copy.unlink()
    cluster = cb.Cluster.ssh(
        [f"{node1.addr}:1"],
        ssh_config="none",
        user="root",
        known_hosts=testbed.write_known_hosts(),
        python=openmpi_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    with cluster:
        assert _hostnames(cluster) == ["node1"]


def test_a_passphrase_protected_key(
    testbed: Testbed, openmpi_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    node1 = testbed.hosts[0]
    secret = "correct horse"  # noqa: S105 - the test key's
    key = _keygen(tmp_path / "locked", secret)
    before = node1.authorized_keys.read_text()
    node1.authorized_keys.write_text(before + key.with_suffix(".pub").read_text())
    try:

        def cluster(**kw: object) -> cb.Cluster:
            return cb.Cluster.ssh(
                [f"{node1.addr}:1"],
                ssh_config="none",
                user="root",
                identity=key,
                known_hosts=testbed.write_known_hosts(),
                python=openmpi_python,
                run_dir=tmp_path / f"run{len(kw)}",
                connect_timeout=10,
                **kw,  # type: ignore[arg-type]
            )

        with cluster(passphrase=secret) as opened:
            assert _hostnames(opened) == ["node1"]
        # Nobody to ask here (no terminal, no notebook): the error says how to open it.
        with pytest.raises(cb.BootstrapError) as info:
            cluster().start()
        said = str(info.value)
        assert f"{key} is passphrase-protected: give passphrase='...'" in said
        assert f"ssh-add {key}" in said
        with pytest.raises(cb.ConfigError, match="The passphrase given does not open"):
            cluster(passphrase=secret.upper()).start()
    finally:
        node1.authorized_keys.write_text(before)


# -- jump hosts -----------------------------------------------------------------------------


@pytest.fixture
def behind_bastion(testbed: Testbed) -> Iterator[tuple[FakeHost, list[FakeHost]]]:
    """node1 is the bastion; node2 and node3 refuse connections the head opens (they still
    reach the head, as the agents and MPI daemons need)."""
    require(shutil.which("nft") is not None, "nft is not installed (apt-get install nftables)")
    bastion, inner = testbed.hosts[0], testbed.hosts[1:]
    try:
        for host in inner:
            host.refuse_from(testbed.head_addr)
        yield bastion, inner
    finally:
        for host in inner:
            host.accept_all()


def _jump_config(testbed: Testbed, bastion: FakeHost, inner: list[FakeHost], path: Path) -> Path:
    lines = [f"Host bastion\n  HostName {bastion.addr}\n"]
    for host in inner:
        lines.append(f"Host {host.name}\n  HostName {host.addr}\n  ProxyJump bastion\n")
    # A chain: node3 through the bastion, then node2.
    lines.append(
        f"Host chained3\n  HostName {inner[1].addr}\n  ProxyJump bastion,{inner[0].name}\n"
    )
    lines.append(f"Host *\n  User root\n  IdentityFile {testbed.identity}\n")
    path.write_text("".join(lines))
    return path


def test_nodes_behind_a_bastion_run_mpi(
    testbed: Testbed,
    behind_bastion: tuple[FakeHost, list[FakeHost]],
    mpi_python: str,
    tmp_path: Path,
) -> None:
    bastion, inner = behind_bastion
    for host in inner:  # the head cannot reach them itself
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((host.addr, 22), timeout=3).close()
    config = _jump_config(testbed, bastion, inner, tmp_path / "ssh_config")
    cluster = cb.Cluster.ssh(
        [f"{h.name}:1" for h in inner],
        ssh_config=config,
        known_hosts=testbed.write_known_hosts(),  # every host's key: the bastion's too
        python=mpi_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    with cluster:
        assert _hostnames(cluster) == ["node2", "node3"]
        # The launcher's ssh goes through the bastion too (over the head's connection).
        assert _run_where(cluster, tmp_path, 2) == ["0 node2 3", "1 node3 3"]
    # The relays of this test's hosts only: another test (or worker) may be running its own.
    addrs = {host.addr for host in inner}
    assert [p for p in processes_mentioning("_relay.py") if addrs & set(_cmdline(p))] == []


def _cmdline(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.Error:  # it ended since it was listed
        return []


def test_a_chain_of_jump_hosts_and_every_hops_key_checked(
    testbed: Testbed,
    behind_bastion: tuple[FakeHost, list[FakeHost]],
    openmpi_python: str,
    tmp_path: Path,
) -> None:
    bastion, inner = behind_bastion
    config = _jump_config(testbed, bastion, inner, tmp_path / "ssh_config")
    known = testbed.write_known_hosts()

    def cluster(known_hosts: Path) -> cb.Cluster:
        return cb.Cluster.ssh(
            ["chained3:1"],
            ssh_config=config,
            known_hosts=known_hosts,
            python=openmpi_python,
            run_dir=tmp_path / f"run-{known_hosts.name}",
            connect_timeout=10,
        )

    with cluster(known) as chained:
        assert _hostnames(chained) == ["node3"]
    # A jump host whose key is not known is refused, and named: the chain stops there.
    for unknown in (bastion, inner[0]):
        partial = tmp_path / f"known-without-{unknown.name}"
        lines = [
            ln for ln in known.read_text().splitlines(True) if not ln.startswith(unknown.addr + " ")
        ]
        partial.write_text("".join(lines))
        with pytest.raises(cb.BootstrapError, match=f"Host {unknown.addr} is not known"):
            cluster(partial).start()


def test_a_proxy_command_in_the_ssh_config_reaches_the_nodes_for_the_head_and_mpi(
    testbed: Testbed,
    behind_bastion: tuple[FakeHost, list[FakeHost]],
    mpi_python: str,
    tmp_path: Path,
) -> None:
    bastion, inner = behind_bastion
    known = testbed.write_known_hosts()
    # As users write it: OpenSSH's own client forwarding through the bastion (ssh -W).
    proxy = " ".join(["ssh", *testbed.ssh_options(), "-l", "root", "-W", "%h:%p", bastion.addr])
    config = tmp_path / "ssh_config"
    config.write_text(
        "".join(f"Host {h.name}\n  HostName {h.addr}\n  ProxyCommand {proxy}\n" for h in inner)
        + f"Host *\n  User root\n  IdentityFile {testbed.identity}\n"
    )
    cluster = cb.Cluster.ssh(
        [f"{h.name}:1" for h in inner],
        ssh_config=config,
        known_hosts=known,
        python=mpi_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    with cluster:
        assert _hostnames(cluster) == ["node2", "node3"]
        # The launcher's ssh runs the same command (the head cannot reach the nodes itself).
        assert _run_where(cluster, tmp_path, 2) == ["0 node2 3", "1 node3 3"]
    # Every proxy command ended with its connection.
    assert wait_gone(f"{bastion.addr}", 5) == []


def test_a_failing_proxy_command_is_named_by_host_with_what_it_said(
    testbed: Testbed, behind_bastion: tuple[FakeHost, list[FakeHost]], tmp_path: Path
) -> None:
    _bastion, inner = behind_bastion
    config = tmp_path / "ssh_config"
    # The bastion's name is wrong: ssh says so, and exits.
    proxy = " ".join(["ssh", *testbed.ssh_options(), "-W", "%h:%p", "no-such-bastion.invalid"])
    config.write_text(f"Host {inner[0].name}\n  HostName {inner[0].addr}\n  ProxyCommand {proxy}\n")
    cluster = cb.Cluster.ssh(
        [f"{inner[0].name}:1"],
        ssh_config=config,
        known_hosts=testbed.write_known_hosts(),
        identity=testbed.identity,
        user="root",
        run_dir=tmp_path / "run",
        connect_timeout=5,
    )
    with pytest.raises(cb.BootstrapError) as info:
        cluster.start()
    said = str(info.value)
    assert inner[0].name in said
    assert "through its ProxyCommand 'ssh " in said
    assert "which exited 255: ssh: Could not resolve hostname no-such-bastion.invalid" in said
    assert wait_gone("no-such-bastion.invalid", 5) == []


def test_proxied_hosts_whose_names_do_not_resolve_here_leave_the_head_address_unknown(
    testbed: Testbed, behind_bastion: tuple[FakeHost, list[FakeHost]], tmp_path: Path
) -> None:
    bastion, inner = behind_bastion
    node, name = inner[0], "node2.invalid"  # a name only the bastion would know
    proxy = " ".join(["ssh", *testbed.ssh_options(), "-W", f"{node.addr}:%p", bastion.addr])
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {node.name}\n  HostName {name}\n  ProxyCommand {proxy}\n")
    known = tmp_path / "known_hosts"
    known.write_text(f"{name} {node.host_public_key}\n{testbed.write_known_hosts().read_text()}")
    before = node.authorized_keys.read_text()
    cluster = cb.Cluster.ssh(
        [f"{node.name}:1"],
        ssh_config=config,
        known_hosts=known,
        identity=testbed.identity,
        user="root",
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    # The node is reached (its key checked under the name), but which address of this
    # machine it reaches the head at, nothing says: refused before anything is put there.
    with pytest.raises(cb.ConfigError, match="none of their names resolves here"):
        cluster.start()
    assert node.authorized_keys.read_text() == before
    assert wait_gone(bastion.addr, 5) == []


def test_the_command_line_reads_the_users_ssh_config(
    testbed: Testbed,
    behind_bastion: tuple[FakeHost, list[FakeHost]],
    openmpi_python: str,
    tmp_path: Path,
) -> None:
    bastion, inner = behind_bastion
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    _jump_config(testbed, bastion, inner, home / ".ssh" / "config")
    env = {**os.environ, "HOME": str(home), "CLUSTERBOOK_RUN_ROOT": str(tmp_path / "runs")}
    env.pop("SSH_AUTH_SOCK", None)
    code = "import socket; print(socket.gethostname())"
    done = subprocess.run(
        [sys.executable, "-m", "clusterbook", "run", "-n", "2", "--hosts",
         ",".join(f"{h.name}:1" for h in inner), "--known-hosts", str(testbed.write_known_hosts()),
         "--", "python", "-c", code],
        env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.splitlines()) == ["[0] node2", "[1] node3"]
