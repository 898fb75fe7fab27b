"""Nodes reached over SSH: the host list is checked when the cluster is made, the nodes are
bootstrapped at start and released at stop.

:class:`SSHProvider` composes the parts of the folder: :mod:`~clusterbook.providers.ssh.hosts`
(the host list and where each host is), :mod:`~clusterbook.providers.ssh.start` (one start's
steps), :mod:`~clusterbook.providers.ssh.sessions` (the connections and node sessions kept
until the stop), :mod:`~clusterbook.providers.ssh.reach` with
:mod:`~clusterbook.providers.ssh.files` (jobs, commands and files on the nodes) and
:mod:`~clusterbook.providers.ssh.release` (the stop). Its nodes run agents that join its
rendezvous head, which watches them (:class:`~clusterbook.providers.watch.AgentWatch`).
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from clusterbook.durations import Duration
from clusterbook.errors import CleanupWarning, ConfigError
from clusterbook.gpus import GPUS, Slots
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.nodes.fanout import parallel
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import Provider, StartContext
from clusterbook.providers.reach import NodeReach
from clusterbook.providers.ssh.discovered import MOST_HOSTS, Changes, discovery_of
from clusterbook.providers.ssh.discovery import DiscoveryLoop, first_hosts
from clusterbook.providers.ssh.grow import Growth, LeftWatch, wait_joined
from clusterbook.providers.ssh.hosts import HEAD, host_node, parse_host_list, targets
from clusterbook.providers.ssh.masters import LAUNCHES, ControlMasters, launch_agent, warn_cold
from clusterbook.providers.ssh.reach import SSHReach
from clusterbook.providers.ssh.release import release
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.providers.ssh.start import Bootstrap
from clusterbook.providers.watch import AgentWatch, NodeWatch
from clusterbook.rendezvous.agent import HEAD_LEASE
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import NodeSpec, validate_timeout
from clusterbook.ssh.credentials import Credentials, prompt_where_asked
from clusterbook.ssh.envlink import validate_node_python
from clusterbook.ssh.hostkeys import HostKeyPolicy, make_policy
from clusterbook.ssh.launcher_ssh import ssh_wrapper
from clusterbook.ssh.node_session import NodeSession
from clusterbook.ssh.paramiko_transport import Tunnels
from clusterbook.ssh.target import Target

__all__ = ["SSHProvider"]

_log = logging.getLogger("clusterbook.providers.ssh")


class SSHProvider(Provider):
    """Bootstraps SSH hosts: one connection each, a per-cluster key, checks, clean-up."""

    kind = "ssh"

    def __init__(
        self,
        hosts: Sequence[str] | None = None,
        *,
        user: str | None = None,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        host_keys: str | HostKeyPolicy | dict[str, str] | None = None,
        port: int | None = None,
        connect_timeout: Duration = 30.0,
        node_python: Mapping[str, str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        passphrase: str | None = None,
        launch: str = "warm",
        discover: str | None = None,
        every: Duration | None = None,
    ) -> None:
        if launch not in LAUNCHES:
            raise ConfigError(
                f"launch={launch!r} is not a way to launch jobs: it is 'warm' (MPI's daemons "
                "start over the ssh connection the cluster keeps to each node) or 'cold' (a "
                "new ssh login per node per job)."
            )
        self._launch = launch
        self._discovery = discovery_of(discover, every)
        entries = parse_host_list(hosts) if hosts is not None else first_hosts(self._discovery)
        self._asked = dict(entries)  # "gpus" slots are counted at start()
        self._nodes = tuple(host_node(host, slots) for host, slots in entries)
        self.node_python = validate_node_python(node_python, [n.host for n in self._nodes])
        if passphrase is not None and not isinstance(passphrase, str):
            raise ConfigError("passphrase must be a string (or None: ask where someone can).")
        self._ssh_config, self._user, self._port = ssh_config, user, port
        self._identity = identity
        found = self._targets([n.host for n in self._nodes])
        self._passphrase = passphrase  # dropped once the keys are open, at start()
        self._known_hosts = known_hosts
        self._host_keys = host_keys
        timeout = validate_timeout(connect_timeout, "connect_timeout") or 30.0
        policy = make_policy(host_keys, known_hosts)  # validated now, not at start
        self.sessions = Sessions(found, policy, timeout, self._python)
        self._ctx: StartContext | None = None
        self._unprobed: set[str] = set()  # nodes the probe failed on: nothing was put there
        self.timings: dict[str, float] = {}
        self.stop_problems: dict[str, Exception] = {}
        # Every node's agent joins the rendezvous: min = max, the round completes at once.
        # With discovery, hosts come and go: the round takes what it has, and grows.
        size = len(self._nodes)
        least, most = (1, MOST_HOSTS) if self._discovery else (size, size)
        settings = RendezvousSettings(
            "pending", least, most, timeout=RendezvousTimeout(last_call=0.1)
        )
        self.head = RendezvousHead(settings, lease=HEAD_LEASE)  # listens where nodes reach it
        agents = AgentWatch(self.head, planned=lambda: self._nodes, give_up=self.lost_for_good)
        self._left: dict[str, str] = {}  # hosts discovery removed: why, for their jobs
        self._loop: DiscoveryLoop | None = None
        self._growth: Growth | None = None
        self._watch = LeftWatch(agents, lambda: self._left, self._discovery_problem)
        self._reach = SSHReach(self.sessions, lambda: self._nodes, self._watch)
        self._agents = agents

    @property
    def connect_timeout(self) -> float:
        return self.sessions.connect_timeout

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._nodes

    @property
    def planned(self) -> tuple[NodeSpec, ...] | None:
        # A "gpus" host's slots are counted at start(): until then its 1 is a stand-in.
        return None if GPUS in self._asked.values() else self._nodes

    @property
    def watch(self) -> NodeWatch:
        return self._watch

    @property
    def reach(self) -> NodeReach:
        return self._reach

    def _targets(self, hosts: list[str]) -> dict[str, Target]:
        """Where each of ``hosts`` is, as the options given say (read now)."""
        return targets(
            hosts,
            ssh_config=self._ssh_config,
            user=self._user,
            port=self._port,
            identity=self._identity,
        )

    def _python(self, host: str) -> str:
        """The interpreter on ``host`` (the head's path unless node_python says otherwise)."""
        assert self._ctx is not None
        return self.node_python.get(host, self._ctx.python)

    def start(self, ctx: StartContext) -> None:
        self._ctx = ctx
        head_dir = cluster_dir(ctx.cluster_id)
        head_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.sessions.policy = make_policy(self._host_keys, self._known_hosts)
        asked, node_python, timings = self._asked, self.node_python, self.timings
        boot = Bootstrap(ctx, self.sessions, self._nodes, asked, node_python, timings)
        boot.warm = self._launch == "warm"
        count = len(self._nodes)
        t0 = time.monotonic()
        probing: dict[str, NodeSession] = {}
        try:
            self._open_keys()
            ctx.progress(f"connecting to {count} hosts")
            try:
                boot.connect_and_probe(probing, t0, self.sessions.dial)
            finally:
                self._unprobed, self._nodes = boot.unprobed, boot.nodes
            self.timings["preflight"] = time.monotonic() - t0
            self.head.start(ctx.cluster_id, ctx.changed, listen=boot.head_addr())
            ctx.progress("installing the cluster's files")
            assert self.head.token_file is not None
            token = self.head.token_file.read_bytes()
            installs, ready = boot.install(head_dir, token, list(probing))
            self.timings["install"] = time.monotonic() - t0
            ctx.progress(f"starting {count} agents")
            hosts = [n.host for n in self._nodes]
            everyone = (lambda t: wait_joined(self.head, hosts, t)) if self._discovery else None
            boot.start_agents(self.head, probing, installs, ready, joined=everyone)
            self.timings["agents"] = time.monotonic() - t0
        except BaseException:
            parallel(list(probing), lambda key: probing[key].close())
            self.stop()
            raise
        # The nodes' sessions stay for the cluster's later steps (files, kills, clean-up):
        # each is then a round trip, not a login shell and a Python start.
        head = probing.pop(HEAD, None)
        if head is not None:
            head.close()
        self.sessions.keep(probing)
        assert boot.remote is not None
        remote = boot.remote
        if self._launch == "warm" and remote.srun is None:
            remote = self._warm(head_dir, remote, boot.daemon_sockets)
        self._reach.open(ctx.cluster_id, remote)
        if self._discovery is not None:
            self._growth = Growth(ctx, self.sessions, self.head, boot, head_dir, self._targets)
            self._loop = DiscoveryLoop(
                self._discovery, lambda: [n.host for n in self._nodes], self._apply,
                changed=ctx.changed,
            )  # fmt: skip
            self._loop.start()

    def _warm(
        self, head_dir: Path, remote: RemoteLaunch, daemon_sockets: Mapping[str, str]
    ) -> RemoteLaunch:
        """The launcher's way to the nodes over a master connection to each (kept until the
        stop): its ssh options and MPICH's wrapper use them, and the launch agent starts the
        daemons through the nodes' agents over the sockets the masters forward. A master that
        does not come up is a warning; jobs log in to that node anew."""
        hosts = [n.host for n in self._nodes]
        masters = ControlMasters(remote.ssh_args, hosts, daemon_sockets)
        self._reach.masters = masters
        failed = masters.start(self.connect_timeout)
        if failed:
            warn_cold(failed, stacklevel=4)
        # A host whose sshd does not forward to its agent's socket (a restricted key, a
        # worker's sshd without forwarding) launches over its master from the start: said
        # once in the log, never warned at each job as a path that stopped working is.
        for host, why in masters.unanswered(skip=failed).items():
            masters.daemon_sockets.pop(host, None)
            _log.info("MPI's daemons on %s start over its master connection: %s", host, why)
        args = (*masters.options(), *remote.ssh_args)
        wrapper = head_dir / "ssh-warm"
        fd = os.open(wrapper, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
        with os.fdopen(fd, "w") as f:
            f.write(ssh_wrapper(args))
        self._reach.cold_wrapper = remote.ssh_wrapper
        agent = None
        if daemon_sockets:
            agent = str(head_dir / "launch-agent")
            fd = os.open(agent, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o700)
            with os.fdopen(fd, "w") as f:
                f.write(launch_agent(masters.directory, wrapper))
        return replace(remote, ssh_args=args, ssh_wrapper=str(wrapper), launch_agent=agent)

    def _open_keys(self) -> None:
        """Open the keys here, in the caller's thread: a passphrase is asked once."""
        found = self.sessions.targets
        hops = [hop for t in found.values() for hop in (*t.jumps, t.node)]
        credentials = self.sessions.credentials = Credentials.gather(
            hops,
            explicit=self._identity,
            passphrase=self._passphrase,
            prompt=prompt_where_asked(),
        )
        self._passphrase = None
        if any(t.jumps for t in found.values()):
            self.sessions.tunnels = Tunnels(credentials, self.sessions.policy)

    def lost_for_good(self) -> str | None:
        """The nodes gone for longer than their agents wait for the head: those agents have
        cleaned up and exited, and only a new cluster bootstraps the nodes again."""
        here = {n.name for n in self._nodes}  # not those discovery removed
        gone = sorted(set(self.head.given_up()) & here) if self._ctx is not None else []
        if not gone:
            return None
        hosts = {s.name: s.host for s in self._agents.node_statuses()}
        named = ", ".join(f"{n} ({hosts.get(n) or '?'})" for n in gone)
        one = len(gone) == 1
        return (
            f"{'Node' if one else 'Nodes'} {named} {'was' if one else 'were'} lost for good: "
            f"not heard from for longer than {'its agent waits' if one else 'their agents wait'} "
            f"for the head (a {HEAD_LEASE:g} s lease), after which an agent stops the "
            "cluster's processes on its node, removes the cluster's key and files there, and "
            "exits. Stop the cluster and start a new one."
        )

    def stop(self) -> None:
        """Remove the cluster's processes, key and files from every node; close connections."""
        ctx = self._ctx
        if ctx is None:
            return
        loop, self._loop = self._loop, None
        if loop is not None:
            loop.stop()  # first: no host joins or leaves from now on
        # After stop() the nodes show as they ended: lost if they were, else left.
        self._agents.end()
        try:
            self.head.close()  # closed: the agents leave and exit
        except Exception as exc:  # the nodes are cleaned all the same (their agents too)
            warnings.warn(
                CleanupWarning(f"Closing the rendezvous of {ctx.cluster_id!r} failed: {exc}"),
                stacklevel=3,
            )
        put_used = self._reach.put_used
        self._reach.close()  # and the master connections of warm launches
        self.stop_problems = release(ctx, self.sessions, put_used=put_used, unprobed=self._unprobed)
        self._ctx = None

    # -- host discovery ---------------------------------------------------------------------

    def _discovery_problem(self) -> str | None:
        loop = self._loop
        return None if loop is None else loop.problem

    def _apply(self, changes: Changes) -> dict[str, str]:
        """Make the cluster's hosts those discovery found: those gone are drained (their jobs
        relaunch without them, as on a lost node) and cleaned, those new bootstrapped and
        joined, one at a time. Returns the hosts it could not add or clean, with why."""
        failed: dict[str, str] = {}
        for host in changes.remove:
            try:
                self._remove(host)
            except Exception as exc:
                failed[host] = f"could not be cleaned: {exc}"
        for host, slots in changes.add:
            try:
                self._add(host, slots)
            except Exception as exc:  # a ClusterError, or what a connection raised
                failed[host] = f"could not join: {exc}"
        return failed

    def _remove(self, host: str) -> None:
        assert self._ctx is not None
        assert self._growth is not None
        self._nodes = tuple(n for n in self._nodes if n.host != host)
        self._left[host] = (
            f"Host {host} left the cluster (its discovery command no longer lists it)"
        )
        self._ctx.changed()  # no new ranks there; the jobs there stop (or relaunch) now
        if self._reach.masters is not None:
            self._reach.masters.drop(host)
        self._growth.remove(host, put_used=self._reach.put_used)

    def _add(self, host: str, slots: Slots) -> None:
        assert self._ctx is not None
        assert self._growth is not None
        self._ctx.progress(f"adding {host}")
        boot = self._growth.add(host, slots, self.node_python)
        remote = self._reach.remote()
        if remote is not None and boot.remote is not None:
            hostnames = boot.remote.hostnames
            self._reach.open(self._ctx.cluster_id, replace(remote, hostnames=hostnames))
        if self._reach.masters is not None:
            self._reach.masters.daemon_sockets.update(boot.daemon_sockets)
            self._reach.masters.start(self.connect_timeout, [host])
        self._asked[host] = slots
        self._left.pop(host, None)
        self._nodes = (*self._nodes, *boot.nodes)
        self._ctx.changed()  # jobs that asked (restart_on_join) relaunch onto it
