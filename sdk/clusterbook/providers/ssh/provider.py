"""Nodes reached over SSH: parse the host list, bootstrap the nodes, release them."""

from __future__ import annotations

import getpass
import os
import shutil
import sys
import threading
import time
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from clusterbook.errors import (
    BootstrapError,
    CleanupWarning,
    ClusterError,
    ConfigError,
)
from clusterbook.gpus import GPUS, Slots
from clusterbook.launch.keep import end_far, hold_far
from clusterbook.launch.rankwrap import HOOK_DIR
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes import tasks
from clusterbook.nodes.call import Call
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.transfer import Outgoing, fetch_all, gather_ask, send_all, uncounted
from clusterbook.paths import cluster_dir, node_cluster_dir
from clusterbook.providers.base import Provider, StartContext
from clusterbook.rendezvous.agent import AGENT_IMPORTS, HEAD_LEASE, agent_argv
from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import NodeSpec, parse_host_slots, validate_port, validate_timeout
from clusterbook.ssh.bootstrap import (
    Connection,
    KeptSession,
    NodeSession,
    cluster_files,
    connect,
    encode_files,
    launcher_ssh_config,
    node_ssh_args,
    plain_login,
    run_task,
    unreached,
)
from clusterbook.ssh.credentials import Credentials, prompt_where_asked
from clusterbook.ssh.envlink import (
    ENV_LINK,
    HOOK_SUBDIR,
    env_prefix,
    link_problems,
    linked_paths,
    validate_node_python,
)
from clusterbook.ssh.hostkeys import HostKeyPolicy, host_entry_name, make_policy
from clusterbook.ssh.keys import authorized_keys_line, generate_keypair, key_tag
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.openssh import OpenSSHShell
from clusterbook.ssh.paramiko_shell import ParamikoShell, Tunnels, connect_hop
from clusterbook.ssh.preflight import NodeFacts, all_problems, resolve_slots
from clusterbook.ssh.relay import Relay
from clusterbook.ssh.target import read_ssh_config, resolve
from clusterbook.status import NodeStatus

__all__ = ["BULK", "SSHProvider", "parse_host_list", "parse_hosts"]

_HEAD = "(head)"  # key of the head among hosts (never a valid host name)
#: Bytes (of a put, or of what one node hands over at a gather) from which the files go
#: through OpenSSH's client rather than paramiko (see :meth:`SSHProvider._bulk_callers`).
BULK = 32 << 20
_BULK_TASKS = frozenset({"put_files", "gather_files"})
_AGENT_LOG = "agent.log"  # each node's agent's output, in the cluster's directory there
_AGENT_NAME = "cb-agent"  # its process name (comm): a fork of the session keeps its command line


def _agents_env(cluster_id: str) -> dict[str, str]:
    """The tag of the cluster's agents (and of the node sessions that fork them)."""
    return {tasks.JOB_ENV: f"{cluster_id}-{tasks.AGENTS}"}


def parse_host_list(
    hosts: Sequence[str] | str, default_slots: Slots = 1
) -> tuple[tuple[str, Slots], ...]:
    """``["node1:4", "node2:gpus", "node3"]`` into ``(host, slots)`` pairs (``"gpus"``: one
    slot per GPU, counted once the node is probed); empty lists and duplicate hosts are
    refused."""
    if isinstance(hosts, str):
        raise ConfigError(
            f"hosts must be a list like ['node1:4', 'node2:4'], not the string {hosts!r}."
        )
    entries: dict[str, Slots] = {}
    for entry in hosts:
        host, slots = parse_host_slots(entry, default_slots)
        if host in entries:
            raise ConfigError(
                f"Host {host!r} is listed twice; list each host once and give it all its slots "
                f"('{host}:N')."
            )
        entries[host] = slots
    if not entries:
        raise ConfigError("hosts is empty; give at least one host, like ['node1:4'].")
    return tuple(entries.items())


def parse_hosts(hosts: Sequence[str] | str, default_slots: Slots = 1) -> tuple[NodeSpec, ...]:
    """``["node1:4", "node2"]`` into nodes (:func:`parse_host_list`); a node whose slots are
    ``"gpus"`` has 1 until its GPUs are counted."""
    return tuple(_node(host, slots) for host, slots in parse_host_list(hosts, default_slots))


def _node(host: str, slots: Slots) -> NodeSpec:
    return NodeSpec(host, host, slots if isinstance(slots, int) else 1)


class SSHProvider(Provider):
    """Bootstraps SSH hosts: one connection each, a per-cluster key, checks, clean-up."""

    kind = "ssh"

    def __init__(
        self,
        hosts: Sequence[str],
        *,
        user: str | None = None,
        identity: str | os.PathLike[str] | None = None,
        known_hosts: str | os.PathLike[str] | None = None,
        host_keys: str | HostKeyPolicy | dict[str, str] | None = None,
        port: int | None = None,
        connect_timeout: float = 30.0,
        node_python: Mapping[str, str] | None = None,
        ssh_config: str | os.PathLike[str] | None = None,
        passphrase: str | None = None,
    ) -> None:
        entries = parse_host_list(hosts)
        self._asked = dict(entries)  # "gpus" slots are counted at start()
        self._nodes = tuple(_node(host, slots) for host, slots in entries)
        self.node_python = validate_node_python(node_python, [n.host for n in self.nodes])
        if passphrase is not None and not isinstance(passphrase, str):
            raise ConfigError("passphrase must be a string (or None: ask where someone can).")
        # Read now: a bad config or ProxyJump line is named before anything starts.
        config = read_ssh_config(ssh_config)
        local_user = getpass.getuser()
        given_port = validate_port(port) if port is not None else None
        self._targets = {
            n.host: resolve(
                n.host, config, local_user=local_user, user=user, port=given_port, identity=identity
            )
            for n in self.nodes
        }
        self._identity = identity
        self._passphrase = passphrase  # dropped once the keys are open, at start()
        self._credentials: Credentials | None = None
        self._tunnels: Tunnels | None = None
        self._relay: Relay | None = None
        self.connect_timeout = validate_timeout(connect_timeout, "connect_timeout") or 30.0
        self._known_hosts = known_hosts
        self._host_keys = host_keys
        self._policy = make_policy(host_keys, known_hosts)  # validated now, not at start
        self._conns: dict[str, Connection] = {}
        self._sessions: dict[str, KeptSession] = {}
        self._bulk: dict[str, KeptSession] = {}  # sessions through OpenSSH, for big files
        self._put_used = False  # then stop() first removes what put() made, on every node
        self._facts: dict[str, NodeFacts] = {}
        self._unprobed: set[str] = set()  # nodes the probe failed on: nothing was put there
        self._ctx: StartContext | None = None
        self._remote: RemoteLaunch | None = None
        self.timings: dict[str, float] = {}
        self._rendezvous: RendezvousHead | None = None
        self._stopped: list[NodeStatus] | None = None  # the nodes as stop() left them
        self._head_facts: NodeFacts | None = None
        self.stop_problems: dict[str, Exception] = {}
        self._held: set[str] = set()  # jobs kept stopped on the nodes (clean="none")

    @property
    def nodes(self) -> tuple[NodeSpec, ...]:
        return self._nodes

    @property
    def planned(self) -> tuple[NodeSpec, ...] | None:
        # A "gpus" host's slots are counted at start(): until then its 1 is a stand-in.
        return None if GPUS in self._asked.values() else self._nodes

    # -- start --------------------------------------------------------------------------

    def start(self, ctx: StartContext) -> None:
        self._ctx, self._stopped = ctx, None
        head_dir = cluster_dir(ctx.cluster_id)
        head_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        policy = self._policy = make_policy(self._host_keys, self._known_hosts)
        hosts = [n.host for n in self.nodes]
        t0 = time.monotonic()
        sessions: dict[str, NodeSession] = {}
        try:
            # The keys are opened here, in the caller's thread: a passphrase is asked once.
            hops = [hop for t in self._targets.values() for hop in (*t.jumps, t.node)]
            credentials = self._credentials = Credentials.gather(
                hops,
                explicit=self._identity,
                passphrase=self._passphrase,
                prompt=prompt_where_asked(),
            )
            self._passphrase = None
            if any(t.jumps for t in self._targets.values()):
                self._tunnels = Tunnels(credentials, policy)
            ctx.progress(f"connecting to {len(hosts)} hosts")
            self._connect_and_probe(ctx, sessions, t0)
            self.timings["preflight"] = time.monotonic() - t0
            self._start_rendezvous(ctx)
            ctx.progress("installing the cluster's files")
            installs, ready = self._install(ctx, head_dir, list(sessions))
            self.timings["install"] = time.monotonic() - t0
            ctx.progress(f"starting {len(hosts)} agents")
            self._start_agents(ctx, sessions, installs, ready)
            self.timings["agents"] = time.monotonic() - t0
        except BaseException:
            parallel(list(sessions), lambda key: sessions[key].close())
            self.stop()
            raise
        # The nodes' sessions stay for the cluster's later steps (files, kills, clean-up):
        # each is then a round trip, not a login shell and a Python start.
        head = sessions.pop(_HEAD, None)
        if head is not None:
            head.close()
        self._sessions = {h: KeptSession(self._session_starter(h), s) for h, s in sessions.items()}

    def _python(self, host: str) -> str:
        """The interpreter on ``host`` (the head's path unless node_python says otherwise)."""
        assert self._ctx is not None
        return self.node_python.get(host, self._ctx.python)

    def _prefix(self, host: str) -> str:
        """Where ``host``'s MPI launcher is installed."""
        assert self._ctx is not None
        if host in self.node_python:
            return env_prefix(self.node_python[host])
        return self._ctx.launcher.prefix

    def _connect_and_probe(
        self, ctx: StartContext, sessions: dict[str, NodeSession], t0: float
    ) -> None:
        """Connect to every host and probe each as soon as it is connected: a host's probe
        (its login shell, its Python) does not wait for the other hosts' handshakes. The head
        is probed alongside: its facts are what the nodes are checked against."""
        flavour = ctx.launcher.flavour.value
        agents = _agents_env(ctx.cluster_id)
        hosts = [n.host for n in self.nodes]
        deadline = time.monotonic() + self.connect_timeout
        conns: dict[str, Connection] = {}
        unconnected: dict[str, Exception] = {}
        lock = threading.Lock()

        def probe(key: str) -> NodeFacts:
            args = {"prefix": self._prefix(key), "flavour": flavour}
            if key == _HEAD:
                session = sessions[key] = NodeSession(LocalShell(), self._python(key))
                return NodeFacts.from_json(session.call("probe", args))
            try:
                conn = connect(key, self._dial, deadline)
            except Exception as exc:
                unconnected[key] = exc
                raise
            with lock:
                conns[key] = conn
                if len(conns) + len(unconnected) == len(hosts):
                    self.timings["connect"] = time.monotonic() - t0
                    ctx.progress(f"checking {len(hosts)} nodes")
            # Tagged as the agents are: the agent will be a fork of it, and starts with what
            # it imports while the head waits for the other nodes and installs.
            session = sessions[key] = NodeSession(conn.shell, self._python(key), env=agents)
            return NodeFacts.from_json(session.call("probe", args, then_import=AGENT_IMPORTS))

        facts, failed = parallel([_HEAD, *hosts], probe)
        if unconnected:  # nothing was put anywhere: close what opened, name what did not
            parallel(list(sessions), lambda key: sessions.pop(key).close())
            for conn in conns.values():
                conn.shell.close()
            raise unreached(unconnected)
        self._conns = {h: conns[h] for h in hosts}
        if _HEAD in failed:
            raise failed[_HEAD]
        head = self._head_facts = facts.pop(_HEAD)
        self._unprobed = set(failed)
        slots = resolve_slots({h: self._asked[h] for h in facts}, facts)
        nodes = {
            n.host: (n.host, slots.get(n.host, n.slots), self._prefix(n.host)) for n in self.nodes
        }
        found = all_problems(head, facts, failed, nodes, flavour)
        if self.node_python:
            homes = {h: (self._python(h), f.home) for h, f in facts.items()}
            for host, issues in link_problems(
                ctx.python, head.home, ctx.launcher.path, homes
            ).items():
                found.setdefault(host, []).extend(issues)
        if found:
            raise BootstrapError(found)
        self._facts = facts
        self._nodes = tuple(
            NodeSpec(
                n.name, n.host, slots[n.host], cores=facts[n.host].cores, gpus=facts[n.host].gpus
            )
            for n in self.nodes
        )

    def _launcher_ssh(self, ctx: StartContext, head_dir: Path) -> tuple[list[str], bool]:
        """The MPI launcher's ssh options, and whether the nodes may start each other's
        daemons. Nodes at their own names with one user and port: options only. Else an ssh
        config of the hosts on the head (and, behind jump hosts, the relay over the head's
        connections), and every daemon started from the head."""
        plain = plain_login(self._targets)
        if plain is not None:
            user, port = plain
            return node_ssh_args(ctx.cluster_id, user=user, port=port), True
        proxy = None
        routes = {
            (t.node.hostname, t.node.port): t.jumps for t in self._targets.values() if t.jumps
        }
        if routes:
            assert self._tunnels is not None
            self._relay = Relay(routes, self._tunnels)
            proxy = self._relay.proxy_command()
        config = head_dir / "ssh_config"
        text = launcher_ssh_config(head_dir, self._targets, proxy)
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return ["-F", str(config)], False

    def _head_addr(self) -> str:
        """This machine's address as the nodes see it, from their connections (one through a
        ProxyCommand to a host whose name does not resolve here has none)."""
        for conn in self._conns.values():
            if conn.local_addr:
                return conn.local_addr
        raise ConfigError(
            "Every host is reached through a ProxyCommand and none of their names resolves "
            "here, so nothing says which address of this machine the nodes can reach it at; "
            "give at least one host a HostName this machine has a route to."
        )

    def _start_rendezvous(self, ctx: StartContext) -> None:
        """Serve the rendezvous on the address the nodes reach us at; agents join it."""
        head_addr = self._head_addr()
        size = len(self.nodes)
        settings = RendezvousSettings(
            "pending", size, size, timeout=RendezvousTimeout(last_call=0.1)
        )
        self._rendezvous = RendezvousHead(settings, listen=head_addr, lease=HEAD_LEASE)
        self._rendezvous.start(ctx.cluster_id, ctx.changed)

    def _start_agents(
        self,
        ctx: StartContext,
        sessions: dict[str, NodeSession],
        installs: Mapping[str, Mapping[str, object]],
        ready: Mapping[str, object],
    ) -> None:
        """Install each session's files (``installs``) and start one agent per node, by the
        node's bootstrap session (no second login), in one round trip; then the ``ready``
        install (the status file) everywhere; wait until all joined. The agents outlive the
        sessions: they leave when the rendezvous closes, and exit by themselves when they
        lose the head."""
        rendezvous = self._rendezvous
        assert rendezvous is not None
        url = rendezvous.join_url
        assert url is not None
        # The agent needs clusterbook: the ranks' Python if it has it, else ours (same path).
        has_it = self._head_facts is not None and self._head_facts.clusterbook
        spawns: dict[str, dict[str, object]] = {}
        for node in self.nodes:
            python = ctx.python if has_it else sys.executable
            if node.host in self.node_python and self._facts[node.host].clusterbook:
                python = self.node_python[node.host]
            token = f"{node_cluster_dir(self._facts[node.host].home, ctx.cluster_id)}/token"
            # Lost for longer than its lease (this head killed, say), the agent stops the
            # cluster's processes on its node and removes the key and files put there.
            argv = agent_argv(
                python,
                url,
                token,
                node_id=node.host,
                slots=node.slots,
                lease=HEAD_LEASE,
                clean_on_lost=True,
            )
            # Tagged like a job: the clean-up at stop() finds it whatever happened. A fork of
            # the node's session (tagged so too) when it runs the same Python: then the
            # node starts one interpreter in all.
            spawns[node.host] = {
                "cluster_id": ctx.cluster_id,
                "argv": argv,
                "env": _agents_env(ctx.cluster_id),
                "log": _AGENT_LOG,
                "name": _AGENT_NAME,
            }

        # All at once: each waits for its node's fork (one round trip, and a process start
        # where the node's Python differs), which one after the other added up. The files
        # go in the same round trip, just before: a node whose install fails starts no agent.
        def start(key: str) -> object:
            calls: list[tuple[str, Mapping[str, object]]] = [("install", installs[key])]
            if key in spawns:
                calls.append(("spawn", spawns[key]))
            return sessions[key].call_each(calls)

        self._check(parallel(list(sessions), start)[1])
        # Last, once every node has everything: the status file that workers can wait on
        # (while the agents join).
        self._check(parallel(list(sessions), lambda key: sessions[key].call("status", ready))[1])
        try:
            rendezvous.wait_ready(min(60.0, self.connect_timeout * 2))
        except ClusterError as exc:
            joined = {s.name for s in rendezvous.node_statuses() if s.state == "joined"}
            late = [n.host for n in self.nodes if n.host not in joined]
            args = {"cluster_id": ctx.cluster_id, "name": _AGENT_LOG, "lines": 5}
            logs, _ = parallel(late, lambda h: sessions[h].call("tail", args)["text"])
            raise BootstrapError(
                {
                    h: [f"its agent did not join ({exc}); its log ends: {logs.get(h) or '-'}"]
                    for h in late
                }
            ) from None

    def problem(self) -> str | None:
        rendezvous = self._rendezvous
        return rendezvous.problem() if rendezvous is not None else None

    def wait_ready(self, timeout: float) -> None:
        """Return once every node's agent is in the round (an agent that lost the head for
        less than its lease joins again); raise at once when a node is lost for good."""
        rendezvous = self._rendezvous
        if rendezvous is not None:
            rendezvous.wait_ready(timeout, give_up=self.lost_for_good)

    def lost_for_good(self) -> str | None:
        """The nodes gone for longer than their agents wait for the head: those agents have
        cleaned up and exited, and only a new cluster bootstraps the nodes again."""
        rendezvous = self._rendezvous
        gone = sorted(rendezvous.given_up()) if rendezvous is not None else []
        if not gone:
            return None
        hosts = {s.name: s.host for s in self.node_statuses()}
        named = ", ".join(f"{n} ({hosts.get(n) or '?'})" for n in gone)
        one = len(gone) == 1
        return (
            f"{'Node' if one else 'Nodes'} {named} {'was' if one else 'were'} lost for good: "
            f"not heard from for longer than {'its agent waits' if one else 'their agents wait'} "
            f"for the head (a {HEAD_LEASE:g} s lease), after which an agent stops the "
            "cluster's processes on its node, removes the cluster's key and files there, and "
            "exits. Stop the cluster and start a new one."
        )

    def unreachable(self, names: Collection[str], *, lost_only: bool = False) -> dict[str, str]:
        rendezvous = self._rendezvous
        return rendezvous.unreachable(names, lost_only=lost_only) if rendezvous else {}

    def node_statuses(self) -> list[NodeStatus]:
        """The nodes as their agents report them (pending until they joined)."""
        rendezvous = self._rendezvous
        if rendezvous is None and self._stopped is not None:
            return list(self._stopped)
        seen = {s.name: s for s in rendezvous.node_statuses()} if rendezvous else {}
        return [
            seen.get(n.name) or NodeStatus(n.name, n.host, n.slots, "pending") for n in self.nodes
        ]

    def _install(
        self, ctx: StartContext, head_dir: Path, sessions: Sequence[str]
    ) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
        """The cluster's files: the install of each of ``sessions`` (the nodes' and the
        head's), and the install of the status file, which goes once every node has them."""
        keys_dir = head_dir / "keys"
        if keys_dir.exists():
            shutil.rmtree(keys_dir)
        keys = generate_keypair(keys_dir, ctx.cluster_id)
        ssh_args, tree_spawn = self._launcher_ssh(ctx, head_dir)
        hostnames = {h: f.hostname for h, f in self._facts.items()}
        assert self._rendezvous is not None
        assert self._rendezvous.token_file is not None
        token = ("600", self._rendezvous.token_file.read_bytes())
        names = {}
        for host, target in self._targets.items():
            node = target.node
            seen_as = (node.hostname, host, hostnames.get(host, host))
            names[host] = [host_entry_name(name, node.port) for name in seen_as]
        files = cluster_files(ctx.cluster_id, keys, self._conns, names, ssh_args=ssh_args)
        files = {**files, "token": token}
        if self.node_python:
            hook = (Path(HOOK_DIR) / "sitecustomize.py").read_bytes()
            files[f"{HOOK_SUBDIR}/sitecustomize.py"] = ("644", hook)
        payload: dict[str, object] = {
            "cluster_id": ctx.cluster_id,
            "files": encode_files(files),
            "authorized_key": authorized_keys_line(keys),
        }

        def install(key: str) -> dict[str, object]:
            # The head gets the same files but no authorized_keys line: its mpirun uses them.
            args = payload if key != _HEAD else {**payload, "authorized_key": None}
            if self.node_python:
                args = {**args, "links": {ENV_LINK: self._prefix(key)}}
            return args

        status = {
            "cluster": ctx.cluster_id,
            "state": "ready",
            "time": time.time(),
            "nodes": [
                {"host": n.host, "hostname": hostnames[n.host], "slots": n.slots}
                for n in self.nodes
            ],
        }
        # Last, once every node has everything: the status file that a worker serving a
        # node (clusterbook worker serve) waits on (see _start_agents).
        ready: dict[str, object] = {"cluster_id": ctx.cluster_id, "status": status}
        head_addr = self._head_addr()
        self._remote = RemoteLaunch(
            ssh_args=tuple(ssh_args),
            ssh_wrapper=str(head_dir / "ssh"),
            head_addr=head_addr,
            hostnames=hostnames,
            tree_spawn=tree_spawn,
        )
        if self.node_python:
            assert self._head_facts is not None
            paths = linked_paths(
                node_cluster_dir(self._head_facts.home, ctx.cluster_id),
                ctx.python,
                ctx.launcher.path,
            )
            self._remote = replace(
                self._remote,
                python=paths.python,
                launcher=replace(ctx.launcher, path=paths.launcher),
                hook_dir=paths.hook_dir,
            )
        return {key: install(key) for key in sessions}, ready

    @staticmethod
    def _check(failed: dict[str, Exception]) -> None:
        if _HEAD in failed:
            raise failed[_HEAD]
        if failed:
            raise BootstrapError({h: [str(e)] for h, e in failed.items()})

    # -- running ------------------------------------------------------------------------

    def remote(self) -> RemoteLaunch | None:
        return self._remote

    def stop_job(self, token: str) -> None:
        if self._ctx is None:
            return
        # A lost node is not waited for: its agent stops the job there when its lease ends.
        lost = self.unreachable(self._conns, lost_only=True)
        hosts = [h for h in self._conns if h not in lost]
        if token in self._held:  # kept stopped for inspection: no grace to give
            self._held.discard(token)
            end_far({h: c for h, c in self._callers().items() if h in hosts}, token)
            return
        parallel(hosts, lambda host: self._task(host, "kill", {"token": token}, 5))

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        if self._ctx is None:
            return ()
        lost = self.unreachable(self._conns, lost_only=True)
        callers = {h: call for h, call in self._callers().items() if h not in lost}
        self._held.add(token)
        return hold_far(callers, token, failing)

    def _task(
        self, host: str, task: str, args: Mapping[str, Any], timeout: float, **streams: Any
    ) -> Any:
        """Run a node task on ``host``, in the session kept for it (``streams``: the frames
        of a ``put_files`` or ``gather_files``, see ``NodeSession.call``)."""
        kept = self._sessions.get(host)
        if kept is None:  # a node the bootstrap did not get to
            kept = self._sessions[host] = KeptSession(self._session_starter(host))
        return kept.call(task, args, timeout, **streams)

    def _session_starter(self, host: str) -> Callable[[], NodeSession]:
        return lambda: NodeSession(self._shell(host), self._python(host))

    def _dial(self, host: str, timeout: float) -> ParamikoShell:
        """A new connection to ``host`` (through its jump hosts), its keys checked."""
        assert self._credentials is not None
        return connect_hop(
            self._targets[host],
            credentials=self._credentials,
            policy=self._policy,
            timeout=timeout,
            tunnels=self._tunnels,
        )

    def _shell(self, host: str) -> ParamikoShell:
        """The host's connection, opened again (same host key policy) if it was lost."""
        conn = self._conns[host]
        if not conn.shell.active:
            shell = self._dial(host, min(10.0, self.connect_timeout))
            conn = self._conns[host] = replace(conn, shell=shell)
        return conn.shell

    # -- files --------------------------------------------------------------------------

    def put(
        self, sent: Outgoing, sending: Callable[[int], None] = uncounted
    ) -> dict[str, Exception]:
        """Send ``sent`` to every node at once; return the nodes it failed on, with why.
        :data:`BULK` bytes and more go through OpenSSH's client (see :meth:`_bulk_callers`)."""
        assert self._ctx is not None
        self._put_used = True
        big = sum(f.size for f in sent.files) >= BULK
        callers = self._bulk_callers(self._conns) if big else self._callers()
        return send_all(callers, self._ctx.cluster_id, sent, sending)

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` on every node here; return what
        arrived, and the nodes it failed on, with why. From a node that has :data:`BULK`
        bytes or more of them, through OpenSSH's client (see :meth:`_bulk_callers`)."""
        ask = gather_ask(directory, skip)

        def size(host: str) -> int:
            return sum(self._task(host, "gather_list", ask, 60)["files"].values())

        sizes = parallel(list(self._conns), size)[0]  # a node that does not answer: the
        big = [h for h, n in sizes.items() if n >= BULK]  # gather says why, as it fails
        return fetch_all({**self._callers(), **self._bulk_callers(big)}, directory, skip, receiving)

    def _bulk_callers(self, hosts: Iterable[str]) -> dict[str, Call]:
        """Node tasks on each of ``hosts``, the file transfers (``put_files``,
        ``gather_files``) in a session of their own through the OpenSSH client (the MPI
        launcher's way, with the cluster's key and known_hosts), kept until :meth:`stop`:
        OpenSSH's encryption is C, paramiko's is Python on the head (see
        :mod:`clusterbook.ssh.openssh`)."""
        wanted = list(hosts)
        remote = self._remote
        if remote is None:  # not started: the kept sessions say so
            return {h: c for h, c in self._callers().items() if h in wanted}
        wrapper = remote.ssh_wrapper

        def caller(host: str) -> Call:
            def call(task: str, args: Mapping[str, Any], timeout: float, **streams: Any) -> Any:
                if task not in _BULK_TASKS:
                    return self._task(host, task, args, timeout, **streams)
                kept = self._bulk.get(host)
                if kept is None:
                    starter = lambda: NodeSession(  # noqa: E731
                        OpenSSHShell(host, wrapper), self._python(host), owns_shell=True
                    )
                    kept = self._bulk.setdefault(host, KeptSession(starter))
                return kept.call(task, args, timeout, **streams)

            return call

        return {host: caller(host) for host in wanted}

    def run_on_nodes(self, argv: Sequence[str], timeout: float) -> list[NodeRun]:
        """Run ``argv`` on every node, in the sessions kept for them."""
        return run_everywhere(self.nodes, self._callers(), argv, timeout)

    def free_port(self, node: NodeSpec) -> int | None:
        """Asked of the node, in its kept session."""
        if node.host not in self._conns:
            return None
        return int(self._task(node.host, "free_port", {}, 10.0)["port"])

    def _callers(self) -> dict[str, Call]:
        """Node tasks on each node, in its session (see :meth:`_task`)."""

        def caller(host: str) -> Call:
            return lambda task, args, timeout, **streams: self._task(
                host, task, args, timeout, **streams
            )

        return {host: caller(host) for host in self._conns}

    # -- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Remove the cluster's processes, key and files from every node; close connections."""
        ctx = self._ctx
        self._remote = None
        if ctx is None:
            return
        rendezvous = self._rendezvous
        if rendezvous is not None:
            # After stop() the nodes show as they ended: lost if they were, else left.
            # No heartbeat comes after this: an age kept would stand still, as if it were news.
            self._stopped = [
                replace(s, state=s.state if s.state == "lost" else "left", heartbeat_age=None)
                for s in self.node_statuses()
            ]
            self._rendezvous = None
            try:
                rendezvous.close()  # closed: the agents leave and exit
            except Exception as exc:  # the nodes are cleaned all the same (their agents too)
                warnings.warn(
                    CleanupWarning(f"Closing the rendezvous of {ctx.cluster_id!r} failed: {exc}"),
                    stacklevel=3,
                )
        bulk, self._bulk = self._bulk, {}
        for kept in bulk.values():  # first: their ssh processes end with them
            kept.close()
        args = {"cluster_id": ctx.cluster_id, "tag": key_tag(ctx.cluster_id), "grace": 2.0}
        put_done: dict[str, Exception] = {}
        if self._put_used:
            # On every node before any node removes the cluster's directory, which holds
            # the nodes' logs of what put() made (one directory when homes are shared).
            probed = [h for h in self._conns if h not in self._unprobed]
            clean_puts = {"cluster_id": ctx.cluster_id}
            put_done = parallel(probed, lambda h: self._task(h, "put_cleanup", clean_puts, 15))[1]

        # What a worker serving a node (clusterbook worker serve) waits for: then it exits.
        done = {"cluster": ctx.cluster_id, "state": "done", "time": time.time()}

        def clean(host: str) -> object:
            try:
                if host in self._unprobed:
                    return None
                result = self._task(host, "cleanup", {**args, "status": done}, 15)
                if host in put_done:  # the rest is clean; say what put() may have left
                    raise put_done[host]
                return result
            finally:
                kept = self._sessions.pop(host, None)
                if kept is not None:
                    kept.close()
                self._conns[host].shell.close()

        # Best effort: a node that cannot be reached (or whose host key changed) cannot be
        # cleaned; say which, and what is left there.
        def clean_any(key: str) -> object:
            if key == _HEAD:
                return run_task(LocalShell(), ctx.python, "cleanup", {**args, "tag": None})
            return clean(key)

        _, problems_found = parallel([_HEAD, *self._conns], clean_any)
        self.stop_problems = {k: e for k, e in problems_found.items() if k != _HEAD}
        self._ctx, self._conns = None, {}
        self._close_ways()
        if self.stop_problems:
            lines = [f"  {h}: {e}" for h, e in self.stop_problems.items()]
            warnings.warn(
                CleanupWarning(
                    f"Could not clean up {len(lines)} node(s) of cluster {ctx.cluster_id!r}; "
                    f"its key (tagged {key_tag(ctx.cluster_id)!r} in ~/.ssh/authorized_keys) "
                    "and ~/.clusterbook/clusters/"
                    + ctx.cluster_id
                    + " may remain there:\n"
                    + "\n".join(lines)
                ),
                stacklevel=3,
            )

    def _close_ways(self) -> None:
        """End the relay, the jump hosts' connections and the agent's (after the nodes')."""
        relay, self._relay = self._relay, None
        if relay is not None:
            relay.close()
        tunnels, self._tunnels = self._tunnels, None
        if tunnels is not None:
            tunnels.close()
        credentials, self._credentials = self._credentials, None
        if credentials is not None:
            credentials.close()
