"""Fake hosts for integration tests: a network namespace, hostname and sshd per host (root only).

Testbed number ``N`` (1-254, picked so that parallel test sessions never share one) looks like::

    head (this machine, root namespace) 10.77.N.1 on bridge br-cbN
      ├── vcbN-h1 ── eth0 10.77.N.11 in netns cbN-h1: hostname node1, sshd on port 22
      ├── vcbN-h2 ── eth0 10.77.N.12 in netns cbN-h2: hostname node2, sshd on port 22
      └── ...

All hosts share one L2 bridge, so the head reaches every host and the hosts reach each other
without routing or firewall changes.

The hosts share the head's filesystem, except for what a cluster bootstrap writes into the home
of the login user (root): each sshd runs in a private mount namespace where ``~/.ssh`` and
``~/.clusterbook`` are bind mounts of the host's own ``DIR/nodeI/home/.ssh`` and
``.clusterbook`` (``FakeHost.home``), so every session on ``nodeI`` sees those and nothing else
does; the rest of ``~`` (Python installs, venvs) is the head's. The mounts propagate nowhere
and vanish with the host's processes. Each sshd reads the standard ``.ssh/authorized_keys`` of
the home, where the testbed puts the public key of ``Testbed.identity``; ``Testbed.known_hosts``
holds every host key.

``/run/clusterbook-testbed/N.json`` names the owner (pid, start time, directory), and the owner
holds a lock on ``N.owner`` while the testbed lives: :func:`cleanup_stale` removes the testbeds
whose lock nobody holds (their owner is gone, whatever PID namespace it ran in: a pid means
nothing across namespaces, a lock does), and any ``cbN-h*`` namespace or ``br-cbN``/``vcbN-h*``
link without such a file.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

import clusterbook as cb
from clusterbook.ssh.sshd import Sshd, start_sshd
from tests.conftest import require

STATE_DIR = Path("/run/clusterbook-testbed")
SSH_PORT = 22
MAX_HOSTS = 200
TOOLS = ("ip", "unshare", "mount", "ssh", "ssh-keygen")
# What each host keeps for itself in the login user's home; everything else there is shared.
HOME_DIRS = (".ssh", ".clusterbook")
_NETNS_RE = re.compile(r"cb(\d+)-h\d+")
_LINK_RE = re.compile(r"br-cb(\d+)|vcb(\d+)-h\d+")


class TestbedError(RuntimeError):
    """Setting up or tearing down fake hosts failed; the message holds the command's stderr."""

    __test__ = False  # not a test class, whatever pytest thinks of the name


@dataclass
class FakeHost:
    """One fake host: a network namespace with its own address, hostname, sshd and the
    ``~/.ssh`` and ``~/.clusterbook`` of its sessions (kept in ``home`` on the head)."""

    name: str
    addr: str
    netns: str
    veth: str
    sshd: Sshd
    home: Path
    host_public_key: str

    @property
    def agent_id(self) -> str:
        """The node id of an agent started inside this host (:func:`agent_argv`): one of its
        own on the machine, as its ``~/.clusterbook/sshd-ID`` must be (every bed has a node1)."""
        return f"far-{self.netns}"

    @property
    def authorized_keys(self) -> Path:
        """The host's ``~/.ssh/authorized_keys`` as the head sees it."""
        return self.home / ".ssh" / "authorized_keys"

    def run(self, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        """Run ``argv`` in this host's network namespace only: its hostname and home are the
        head's (ssh in to see ``node1`` and its ``~/.ssh``). Output is captured as text unless
        ``kw`` says otherwise."""
        if "stdout" not in kw and "stderr" not in kw:
            kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        return subprocess.run(["ip", "netns", "exec", self.netns, *argv], check=False, **kw)

    def link_down(self) -> None:
        """Unplug the host: its veth on the bridge goes down, packets to and from it are lost."""
        _run(["ip", "link", "set", self.veth, "down"])

    def link_up(self) -> None:
        """Plug the host back in."""
        _run(["ip", "link", "set", self.veth, "up"])

    def drop_traffic(self) -> None:
        """Drop every packet to and from the host without a word (no RST, no ICMP): a queue
        of length 0 on both ends of its link. (This kernel has no netem; this is its 100%
        loss.)"""
        _run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "add", "dev", "eth0", "root",
              "pfifo", "limit", "0"])  # fmt: skip
        _run(["tc", "qdisc", "add", "dev", self.veth, "root", "pfifo", "limit", "0"])

    def pass_traffic(self) -> None:
        """Undo :meth:`drop_traffic`."""
        _run(["ip", "netns", "exec", self.netns, "tc", "qdisc", "del", "dev", "eth0", "root"])
        _run(["tc", "qdisc", "del", "dev", self.veth, "root"])

    def pause_sshd(self) -> None:
        """Freeze sshd (SIGSTOP): connections are accepted by the kernel but never answered."""
        os.kill(self.sshd.pid, signal.SIGSTOP)

    def resume_sshd(self) -> None:
        """Let a paused sshd run again (SIGCONT)."""
        os.kill(self.sshd.pid, signal.SIGCONT)

    def swap_host_key(self, *, keep_sessions: bool = False) -> None:
        """Restart sshd with a newly made host key, as a reinstalled (or spoofed) host would:
        its sessions end, unless ``keep_sessions`` (a key rotated by a restart of sshd)."""
        self.sshd.stop(keep_sessions=keep_sessions)
        for path in (self.sshd.host_key_path, self.sshd.host_key_path.with_suffix(".pub")):
            path.unlink(missing_ok=True)
        self.sshd = _start_host_sshd(
            self.sshd.directory, self.name, self.addr, self.netns, self.home
        )
        self.host_public_key = self.sshd.host_public_key

    def rebind(self, extra: Sequence[tuple[Path, Path]] = ()) -> None:
        """Restart sshd with ``extra`` ``(source, target)`` binds seen by its sessions only
        (none: as built). ``[(env, elsewhere), (empty_dir, env)]`` makes a host whose
        environment is installed at another path than the head's."""
        self.sshd.stop()
        self.sshd = _start_host_sshd(
            self.sshd.directory, self.name, self.addr, self.netns, self.home, extra
        )

    def processes(self) -> list[int]:
        """Pids of the processes running in this host's network namespace."""
        return _netns_pids(self.netns)

    def die(self) -> None:
        """SIGKILL every process of this host but its sshd daemon, as the machine dying would.
        All are frozen (SIGSTOP) first, so that none forks or answers in between; sessions
        the daemon opens later are left be. Returns once they are gone."""
        spare = {self.sshd.pid}
        frozen: set[int] = set()
        until = time.monotonic() + 2.0
        while (found := set(self.processes()) - spare - frozen) and time.monotonic() < until:
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= found
        if not frozen:
            raise TestbedError(f"nothing runs on {self.name} to kill")
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while left := [p for p in frozen if _running(p)]:
            if time.monotonic() > deadline:
                raise TestbedError(f"processes on {self.name} outlived SIGKILL: {left}")
            time.sleep(0.01)

    def refuse_from(self, addr: str) -> None:
        """Refuse every connection ``addr`` opens to this host (answers to the connections
        this host opens still pass): a host ``addr`` can reach only through another."""
        rules = (
            "table inet cb_refuse {\n"
            "  chain input {\n"
            "    type filter hook input priority 0; policy accept;\n"
            f"    ip saddr {addr} ct state new reject\n"
            "  }\n"
            "}\n"
        )
        done = self.run(["nft", "-f", "-"], input=rules)
        if done.returncode != 0:
            raise TestbedError(f"nft on {self.name}: {done.stderr.strip()}")

    def accept_all(self) -> None:
        """Undo :meth:`refuse_from`."""
        self.run(["nft", "delete", "table", "inet", "cb_refuse"])

    def extra_sshd(self, port: int) -> Sshd:
        """Another sshd of this host (own host key) on ``port``; the caller stops it."""
        directory = self.sshd.directory.with_name(f"sshd-{port}")
        return _start_host_sshd(directory, self.name, self.addr, self.netns, self.home, port=port)


@contextlib.contextmanager
def unshared(hosts: Sequence[FakeHost], path: Path, scratch: Path) -> Iterator[dict[str, Path]]:
    """Hosts that do not share ``path`` with the head: each sees an empty directory of its
    own there, kept on the head as ``scratch/seen-NAME`` (yielded by host name), until the
    block ends; ``path`` is made on the head if missing."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    seen = {}
    try:
        for host in hosts:
            seen[host.name] = scratch / f"seen-{host.name}"
            seen[host.name].mkdir(mode=0o700)
            host.rebind([(seen[host.name], path)])
        yield seen
    finally:
        for host in hosts:
            if host.name in seen:
                host.rebind()


class Testbed:
    """Fake hosts made by :func:`make_testbed`; :meth:`close` removes every trace of them."""

    __test__ = False

    def __init__(self, index: int, directory: Path) -> None:
        self.index = index
        self.bridge = f"br-cb{index}"
        self.head_addr = f"10.77.{index}.1"
        self.directory = directory
        self.identity = directory / "id_ed25519"
        self.known_hosts = directory / "known_hosts"
        self.hosts: list[FakeHost] = []
        self._owner: int | None = None  # the descriptor of N.owner, locked while this lives
        self._closed = False

    def ssh_options(self) -> list[str]:
        """OpenSSH client options that log in as root with the testbed's key, strictly."""
        return [
            "-F", "none",
            "-i", str(self.identity),
            "-o", "IdentitiesOnly=yes",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "ConnectTimeout=5",
        ]  # fmt: skip

    def ssh(
        self,
        host: FakeHost,
        argv: Sequence[str],
        *,
        via: FakeHost | None = None,
        options: Sequence[str] = (),
        timeout: float = 30,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` over ssh as root, from the head or from host ``via``.

        ``argv`` is quoted for the remote shell, so each item arrives as one argument.
        """
        # ssh keeps the first value it sees for an option: ``options`` must come first.
        remote = shlex.join(argv)
        cmd = ["ssh", *options, *self.ssh_options(), f"root@{host.addr}", "--", remote]
        if via is not None:
            return via.run(cmd, timeout=timeout)
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)

    def write_known_hosts(self) -> Path:
        """(Re)write ``known_hosts`` with every host's current key; return its path."""
        lines = "".join(f"{h.addr} {h.host_public_key}\n" for h in self.hosts)
        self.known_hosts.write_text(lines)
        return self.known_hosts

    def cluster(
        self, python: str, run_dir: Path, *, hosts: int | None = None, slots: int = 1, **kw: Any
    ) -> cb.Cluster:
        """An SSH cluster of the first ``hosts`` hosts (default all), ``slots`` each, that
        logs in with the testbed's key and trusts exactly the hosts' keys."""
        kw.setdefault("known_hosts", self.write_known_hosts())
        kw.setdefault("connect_timeout", 10)
        chosen = self.hosts[:hosts] if hosts is not None else self.hosts
        return cb.Cluster.ssh(
            [f"{h.addr}:{slots}" for h in chosen],
            identity=self.identity,
            python=python,
            run_dir=run_dir,
            **kw,
        )

    def close(self) -> None:
        """Stop every sshd and kill every process of the hosts, then delete the namespaces,
        links and bridge. Safe to call twice, and after a half-finished setup."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.sshd.stop(timeout=2)
        with _locked():
            _destroy(self.index)
            (STATE_DIR / f"{self.index}.json").unlink(missing_ok=True)
            (STATE_DIR / f"{self.index}.owner").unlink(missing_ok=True)
        if self._owner is not None:
            os.close(self._owner)
            self._owner = None
        left = leftovers(self.index)
        if left:
            raise TestbedError(f"testbed {self.index} left behind: {left}")

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Testbed {self.index} {self.bridge} hosts={[h.name for h in self.hosts]}>"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


#: The process name (comm) of a node's agent that is a fork of its bootstrap session: its
#: command line is the session's (``python -c SOURCE session``), not ``... worker join ...``.
AGENT_NAME = "cb-agent"


def is_agent(proc: psutil.Process) -> bool:
    """Whether ``proc`` is a cluster's agent on a node: forked (by its name) or started."""
    return proc.name() == AGENT_NAME or "worker" in proc.cmdline()


def agent_argv(
    host: FakeHost,
    cluster: cb.Cluster,
    scratch: Path,
    *extra: str,
    bind: tuple[Path, Path] | None = None,
) -> list[str]:
    """The command that runs an agent of ``cluster`` inside fake host ``host`` (its network and
    hostname), joining as a user would: the cluster's join command, with its token file copied
    into ``scratch`` as a user copies it to the node; ``extra``: more agent options. With
    ``bind``, the node (its agent, sshd and ranks) sees its own directory there."""
    token = scratch / f"token-{host.name}"
    shutil.copy(cluster._provider.token_file, token)
    argv = shlex.split(cluster.join_command)[1:]
    argv = [a if a != str(cluster._provider.token_file) else str(token) for a in argv]
    agent = [sys.executable, "-m", "clusterbook", *argv, "--node-id", host.agent_id, *extra]
    mount = "" if bind is None else f"mount --bind {shlex.join(map(str, bind))} && "
    return ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
            "--propagation", "private", "sh", "-c",
            f"hostname {host.name} && {mount}exec {shlex.join(agent)}"]  # fmt: skip


def make_testbed(n: int, directory: Path) -> Testbed:
    """Make ``n`` fake hosts node1..nodeN, each answering ssh on 10.77.N.(10+i) port 22.

    Leftovers of crashed earlier runs are removed first; if setup fails half-way, whatever
    was made is removed before the error propagates.
    """
    if os.geteuid() != 0:
        raise PermissionError("fake hosts need root (network namespaces, bridges, veths)")
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"a testbed has 1-{MAX_HOSTS} hosts, got {n}")
    directory = Path(directory).absolute()
    directory.mkdir(parents=True, exist_ok=True)
    cleanup_stale()
    with _locked():
        index = _allocate()
        owner = os.open(STATE_DIR / f"{index}.owner", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody owns the number
        me = psutil.Process()
        state = {"owner": me.pid, "started": me.create_time(), "directory": str(directory)}
        (STATE_DIR / f"{index}.json").write_text(json.dumps(state))
    bed = Testbed(index, directory)
    bed._owner = owner
    atexit.register(_close_quietly, bed)
    try:
        _build(bed, n)
    except BaseException:
        _close_quietly(bed)
        raise
    return bed


def cleanup_stale() -> list[int]:
    """Remove testbeds whose owner process is gone, and unowned ``cb`` namespaces and links.

    Returns the testbed numbers that were removed.
    """
    removed = []
    with _locked():
        owned = set()
        for state_file in STATE_DIR.glob("*.json"):
            index = int(state_file.stem)
            if _owner_alive(state_file):
                owned.add(index)
                continue
            _destroy(index)
            state_file.unlink(missing_ok=True)
            state_file.with_suffix(".owner").unlink(missing_ok=True)
            removed.append(index)
        for index in sorted(_indices_in_use() - owned):
            _destroy(index)
            removed.append(index)
    return sorted(set(removed))


@pytest.fixture(scope="module")
def testbed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    """Three fake hosts (node1..node3) for the tests of one module, removed afterwards."""
    require_testbed()
    bed = make_testbed(3, tmp_path_factory.mktemp("testbed"))
    try:
        yield bed
    finally:
        bed.close()


def require_testbed() -> None:
    """Skip (or, under CLUSTERBOOK_REQUIRE_TESTBED=1, fail) unless fake hosts can be made."""
    require(os.geteuid() == 0, "fake hosts need root (network namespaces)")
    missing = [t for t in TOOLS if shutil.which(t) is None]
    require(not missing, f"fake hosts need {missing} (apt-get install openssh-client iproute2)")
    require(
        Path("/usr/sbin/sshd").exists() or shutil.which("sshd") is not None,
        "fake hosts need sshd (apt-get install openssh-server)",
    )


def _build(bed: Testbed, n: int) -> None:
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(bed.identity)])
    client_key = bed.identity.with_suffix(".pub").read_text()
    # forward_delay 0: a port (re)plugged into the bridge forwards at once.
    _run(["ip", "link", "add", bed.bridge, "type", "bridge", "forward_delay", "0"])
    _run(["ip", "addr", "add", f"{bed.head_addr}/24", "dev", bed.bridge])
    _run(["ip", "link", "set", bed.bridge, "up"])
    for i in range(1, n + 1):
        netns, veth = f"cb{bed.index}-h{i}", f"vcb{bed.index}-h{i}"
        addr = f"10.77.{bed.index}.{10 + i}"
        _run(["ip", "netns", "add", netns])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", netns])
        _run(["ip", "link", "set", veth, "master", bed.bridge, "up"])
        _run(["ip", "-n", netns, "addr", "add", f"{addr}/24", "dev", "eth0"])
        _run(["ip", "-n", netns, "link", "set", "eth0", "up"])
        _run(["ip", "-n", netns, "link", "set", "lo", "up"])
        host_dir = bed.directory / f"node{i}"
        home = host_dir / "home"
        for path in (host_dir, home, *(home / d for d in HOME_DIRS)):
            path.mkdir(mode=0o700, exist_ok=True)
        keys = home / ".ssh" / "authorized_keys"
        keys.write_text(client_key)
        keys.chmod(0o600)
        sshd = _start_host_sshd(host_dir / "sshd", f"node{i}", addr, netns, home)
        host = FakeHost(f"node{i}", addr, netns, veth, sshd, home, sshd.host_public_key)
        bed.hosts.append(host)
    bed.write_known_hosts()


_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,62}")


def start_host_sshd(
    directory: Path,
    port: int,
    listen: str,
    *,
    netns: str,
    hostname: str | None = None,
    binds: Sequence[tuple[Path, Path]] = (),
    authorized_keys: Path | None = None,
) -> Sshd:
    """A real sshd as a fake host's (root only): in network namespace ``netns``, in new UTS
    and mount namespaces with ``hostname`` and ``binds`` (``(source, target)`` pairs
    bind-mounted, seen by sshd and its sessions only; missing targets are made first: an empty
    0700 directory, or an empty 0600 file when the source is a file)."""
    for name, value in {"netns": netns, "hostname": hostname}.items():
        if value is not None and not _NAME_RE.fullmatch(value):
            raise cb.ConfigError(
                f"{name} {value!r} must be letters, digits, '.', '-' or '_', not starting with '-'."
            )
    if os.geteuid() != 0:
        raise cb.ConfigError(f"netns={netns!r} needs root; leave it out to run sshd as a user.")
    if port == 0:
        raise cb.ConfigError(f"sshd in netns={netns!r} needs an explicit port, like port=22.")
    mounts = [(Path(s).absolute(), Path(t).absolute()) for s, t in binds]
    for source, target in mounts:
        if not target.exists():  # a mount point: a directory, or a file to bind a file on
            if source.is_dir():
                target.mkdir(mode=0o700, parents=True)
            else:
                target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                target.touch(mode=0o600)

    def launch(argv: list[str]) -> list[str]:
        # A mount namespace of its own whose mounts propagate nowhere: the binds are seen by
        # sshd and its sessions only, and vanish with the last of them. ip, unshare and sh
        # all exec: the pid is sshd's.
        steps = [f"hostname {shlex.quote(hostname)}"] if hostname else []
        steps += [f"mount --bind {shlex.quote(str(s))} {shlex.quote(str(t))}" for s, t in mounts]
        script = " && ".join([*steps, f"exec {shlex.join(argv)}"])
        unshare = ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script]
        return ["ip", "netns", "exec", netns, *unshare]

    # Like a stock OpenSSH server, a fake host can be a jump host (ProxyJump through it).
    return start_sshd(
        directory,
        port,
        listen,
        authorized_keys=authorized_keys,
        launch=launch,
        forwarding=True,
        socket_forwarding=True,  # as a system sshd's defaults do
    )


def _start_host_sshd(
    directory: Path,
    name: str,
    addr: str,
    netns: str,
    home: Path,
    extra: Sequence[tuple[Path, Path]] = (),
    *,
    port: int = SSH_PORT,
) -> Sshd:
    """sshd in ``netns``, in new UTS and mount namespaces: hostname ``name`` and the login
    user's ``~/.ssh`` and ``~/.clusterbook`` bound to those in ``home`` (then the ``extra``
    binds). Missing targets are made (empty, 0700) on the head as mount points; their contents
    there are never touched."""
    login_home = Path(pwd.getpwuid(os.geteuid()).pw_dir)
    return start_host_sshd(
        directory,
        port,
        addr,
        netns=netns,
        hostname=name,
        binds=[*((home / d, login_home / d) for d in HOME_DIRS), *extra],
        # In the home of whoever logs in: in sshd's mount namespace, the host's (bound) one.
        authorized_keys=Path(".ssh") / "authorized_keys",
    )


def _destroy(index: int) -> None:
    """Kill every process in testbed ``index``'s namespaces, then delete them and its links."""
    namespaces = [ns for ns in _netns_list() if _index_of(_NETNS_RE, ns) == index]
    for ns in namespaces:
        _kill_netns(ns)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
    for link in _links():
        if _index_of(_LINK_RE, link) == index:
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


def _kill_netns(netns: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while (pids := _netns_pids(netns)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)


def leftovers(index: int) -> list[str]:
    """Namespaces and links of testbed ``index`` that still exist (empty once it is gone)."""
    left = [f"netns {ns}" for ns in _netns_list() if _index_of(_NETNS_RE, ns) == index]
    left += [f"link {link}" for link in _links() if _index_of(_LINK_RE, link) == index]
    return left


def _allocate() -> int:
    """A testbed number nobody uses; called with the lock held."""
    taken = _indices_in_use() | {int(p.stem) for p in STATE_DIR.glob("*.json")}
    addrs = _run(["ip", "-o", "-4", "addr", "show"]) + _run(["ip", "-4", "route", "show"])
    start = os.getpid() % 254
    for k in range(254):
        index = (start + k) % 254 + 1
        if index not in taken and f"10.77.{index}." not in addrs:
            return index
    raise TestbedError("all 254 testbed numbers (10.77.1-254.0/24) are in use")


def _indices_in_use() -> set[int]:
    found = {_index_of(_NETNS_RE, ns) for ns in _netns_list()}
    found |= {_index_of(_LINK_RE, link) for link in _links()}
    return {i for i in found if i is not None}


def _owner_alive(state_file: Path) -> bool:
    """Whether the testbed's owner still holds the lock on its ``N.owner``."""
    try:
        fd = os.open(state_file.with_suffix(".owner"), os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False  # none: an owner that predates the lock, or one half made
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _index_of(pattern: re.Pattern[str], name: str) -> int | None:
    match = pattern.fullmatch(name)
    if match is None:
        return None
    return int(next(g for g in match.groups() if g is not None))


def _netns_list() -> list[str]:
    out = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _links() -> list[str]:
    out = _run(["ip", "-o", "link", "show"])
    return [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]


def _netns_pids(netns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    STATE_DIR.mkdir(mode=0o700, exist_ok=True)
    with open(STATE_DIR / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _run(argv: Sequence[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    if done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def _close_quietly(bed: Testbed) -> None:
    with contextlib.suppress(Exception):
        bed.close()
