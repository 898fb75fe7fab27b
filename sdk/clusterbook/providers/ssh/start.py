"""The start of an SSH cluster's nodes: :class:`Bootstrap`, one start's steps.

Every host is connected to and probed at once (a host's probe does not wait for the others'
handshakes), and checked against the head (:mod:`clusterbook.ssh.preflight`); then each node
gets the cluster's key pair, known_hosts and files, and starts one agent that joins the head's
rendezvous, by the node's bootstrap session (no second login), in one round trip; last comes
the status file that a worker serving a node waits on. The sessions stay open for the
cluster's later steps (:class:`~clusterbook.providers.ssh.sessions.Sessions`).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from clusterbook.errors import BootstrapError, ClusterError, ConfigError
from clusterbook.gpus import Slots
from clusterbook.launch.daemons import SOCKET_PATH_MAX, forward_name
from clusterbook.launch.rankwrap import HOOK_DIR
from clusterbook.launch.remote import RemoteLaunch
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.tasks.common import AGENTS, JOB_ENV, process_tag
from clusterbook.paths import node_cluster_dir
from clusterbook.providers.base import StartContext
from clusterbook.providers.ssh.hosts import HEAD
from clusterbook.providers.ssh.sessions import Sessions
from clusterbook.rendezvous.agent import AGENT_IMPORTS, HEAD_LEASE, agent_argv
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import NodeSpec
from clusterbook.ssh.bootstrap import Connection, cluster_files, connect, encode_files, unreached
from clusterbook.ssh.envlink import ENV_LINK, HOOK_SUBDIR, env_prefix, link_problems, linked_paths
from clusterbook.ssh.hostkeys import host_entry_name
from clusterbook.ssh.keys import KeyPair, authorized_keys_line, generate_keypair
from clusterbook.ssh.launcher_ssh import launcher_ssh_config, node_ssh_args, plain_login
from clusterbook.ssh.local_shell import LocalShell
from clusterbook.ssh.node_session import NodeSession
from clusterbook.ssh.paramiko_shell import ParamikoShell
from clusterbook.ssh.preflight import NodeFacts, all_problems, resolve_slots
from clusterbook.ssh.relay import Relay

__all__ = ["AGENT_LOG", "AGENT_NAME", "Bootstrap", "Dial", "agents_env"]

AGENT_LOG = "agent.log"  # each node's agent's output, in the cluster's directory there
AGENT_NAME = "cb-agent"  # its process name (comm): a fork of the session keeps its command line

#: Opens a new connection to a host within a timeout (:meth:`Sessions.dial
#: <clusterbook.providers.ssh.sessions.Sessions.dial>`, or a test's).
Dial = Callable[[str, float], ParamikoShell]


def agents_env(cluster_id: str) -> dict[str, str]:
    """The tag of the cluster's agents (and of the node sessions that fork them)."""
    return {JOB_ENV: process_tag(cluster_id, AGENTS)}


class Bootstrap:
    """One start of the nodes ``nodes`` (``asked``: the slots each host was given, ``"gpus"``
    counted at the probe; ``node_python``: interpreters elsewhere than the head's path) over
    ``sessions``; ``timings`` is told when each phase ended. What the start found is left in
    :attr:`nodes` (slots, cores and GPUs counted), :attr:`facts`, :attr:`head_facts`,
    :attr:`unprobed` (the nodes nothing was put on) and :attr:`remote` (how the launcher
    reaches the nodes)."""

    def __init__(
        self,
        ctx: StartContext,
        sessions: Sessions,
        nodes: tuple[NodeSpec, ...],
        asked: Mapping[str, Slots],
        node_python: Mapping[str, str],
        timings: dict[str, float],
    ) -> None:
        self.ctx = ctx
        self.sessions = sessions
        self.nodes = nodes
        self._asked = asked
        self._node_python = node_python
        self._timings = timings
        self.facts: dict[str, NodeFacts] = {}
        self.keys: KeyPair | None = None  # the cluster's key pair, once made
        self.head_facts: NodeFacts | None = None
        self.unprobed: set[str] = set()
        self.remote: RemoteLaunch | None = None
        #: Whether each agent serves a socket that starts MPI's daemons (warm launches), and
        #: where each does, by host (see :mod:`clusterbook.launch.daemons`).
        self.warm = False
        self.daemon_sockets: dict[str, str] = {}

    def python(self, host: str) -> str:
        """The interpreter on ``host`` (the head's path unless node_python says otherwise)."""
        return self._node_python.get(host, self.ctx.python)

    def prefix(self, host: str) -> str:
        """Where ``host``'s MPI launcher is installed."""
        if host in self._node_python:
            return env_prefix(self._node_python[host])
        return self.ctx.launcher.prefix

    def connect_and_probe(self, sessions: dict[str, NodeSession], t0: float, dial: Dial) -> None:
        """Connect to every host and probe each as soon as it is connected: a host's probe
        (its login shell, its Python) does not wait for the other hosts' handshakes. The head
        is probed alongside: its facts are what the nodes are checked against."""
        ctx = self.ctx
        flavour = ctx.launcher.flavour.value
        agents = agents_env(ctx.cluster_id)
        hosts = [n.host for n in self.nodes]
        deadline = time.monotonic() + self.sessions.connect_timeout
        conns: dict[str, Connection] = {}
        unconnected: dict[str, Exception] = {}
        lock = threading.Lock()

        def probe(key: str) -> NodeFacts:
            args = {"prefix": self.prefix(key), "flavour": flavour}
            if key == HEAD:
                session = sessions[key] = NodeSession(LocalShell(), self.python(key))
                return NodeFacts.from_json(session.call("probe", args))
            try:
                conn = connect(key, dial, deadline)
            except Exception as exc:
                unconnected[key] = exc
                raise
            with lock:
                conns[key] = conn
                if len(conns) + len(unconnected) == len(hosts):
                    self._timings["connect"] = time.monotonic() - t0
                    ctx.progress(f"checking {len(hosts)} nodes")
            # Tagged as the agents are: the agent will be a fork of it, and starts with what
            # it imports while the head waits for the other nodes and installs.
            session = sessions[key] = NodeSession(conn.shell, self.python(key), env=agents)
            return NodeFacts.from_json(session.call("probe", args, then_import=AGENT_IMPORTS))

        facts, failed = parallel([HEAD, *hosts], probe)
        if unconnected:  # nothing was put anywhere: close what opened, name what did not
            parallel(list(sessions), lambda key: sessions.pop(key).close())
            for conn in conns.values():
                conn.shell.close()
            raise unreached(unconnected)
        self.sessions.conns.update({h: conns[h] for h in hosts})  # beside a running cluster's
        if HEAD in failed:
            raise failed[HEAD]
        head = self.head_facts = facts.pop(HEAD)
        self.unprobed = set(failed)
        slots = resolve_slots({h: self._asked[h] for h in facts}, facts)
        nodes = {
            n.host: (n.host, slots.get(n.host, n.slots), self.prefix(n.host)) for n in self.nodes
        }
        found = all_problems(head, facts, failed, nodes, flavour)
        if self._node_python:
            homes = {h: (self.python(h), f.home) for h, f in facts.items()}
            for host, issues in link_problems(
                ctx.python, head.home, ctx.launcher.path, homes
            ).items():
                found.setdefault(host, []).extend(issues)
        if found:
            raise BootstrapError(found)
        self.facts = facts
        self.nodes = tuple(
            NodeSpec(
                n.name,
                n.host,
                slots[n.host],
                cores=facts[n.host].cores,
                gpus=facts[n.host].gpus,
                place=facts[n.host].place,
            )
            for n in self.nodes
        )

    def launcher_ssh(self, head_dir: Path) -> tuple[list[str], bool]:
        """The MPI launcher's ssh options, and whether the nodes may start each other's
        daemons. Nodes at their own names with one user and port: options only. Else an ssh
        config of the hosts on the head (and, behind jump hosts, the relay over the head's
        connections), and every daemon started from the head."""
        ctx, targets = self.ctx, self.sessions.targets
        plain = plain_login(targets)
        if plain is not None:
            user, port = plain
            return node_ssh_args(ctx.cluster_id, user=user, port=port), True
        proxy = None
        routes = {(t.node.hostname, t.node.port): t.jumps for t in targets.values() if t.jumps}
        if routes:
            assert self.sessions.tunnels is not None
            relay = self.sessions.relay = Relay(routes, self.sessions.tunnels)
            proxy = relay.proxy_command()
        config = head_dir / "ssh_config"
        text = launcher_ssh_config(head_dir, targets, proxy)
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return ["-F", str(config)], False

    def head_addr(self) -> str:
        """This machine's address as the nodes see it, from their connections (one through a
        ProxyCommand to a host whose name does not resolve here has none)."""
        for conn in self.sessions.conns.values():
            if conn.local_addr:
                return conn.local_addr
        raise ConfigError(
            "Every host is reached through a ProxyCommand and none of their names resolves "
            "here, so nothing says which address of this machine the nodes can reach it at; "
            "give at least one host a HostName this machine has a route to."
        )

    def install(
        self, head_dir: Path, token: bytes, sessions: Sequence[str], keys: KeyPair | None = None
    ) -> tuple[dict[str, dict[str, object]], dict[str, object]]:
        """The cluster's files: the install of each of ``sessions`` (the nodes' and the
        head's), and the install of the status file, which goes once every node has them.
        ``keys``: the cluster's key pair, when it has one (hosts added to it)."""
        ctx = self.ctx
        keys_dir = head_dir / "keys"
        if keys is None:
            if keys_dir.exists():
                shutil.rmtree(keys_dir)
            keys = generate_keypair(keys_dir, ctx.cluster_id)
        self.keys = keys
        ssh_args, tree_spawn = self.launcher_ssh(head_dir)
        hostnames = {h: f.hostname for h, f in self.facts.items()}
        names = {}
        for host, target in self.sessions.targets.items():
            node = target.node
            seen_as = (node.hostname, host, hostnames.get(host, host))
            names[host] = [host_entry_name(name, node.port) for name in seen_as]
        files = cluster_files(ctx.cluster_id, keys, self.sessions.conns, names, ssh_args=ssh_args)
        files = {**files, "token": ("600", token)}
        if self._node_python:
            hook = (Path(HOOK_DIR) / "sitecustomize.py").read_bytes()
            files[f"{HOOK_SUBDIR}/sitecustomize.py"] = ("644", hook)
        payload: dict[str, object] = {
            "cluster_id": ctx.cluster_id,
            "files": encode_files(files),
            "authorized_key": authorized_keys_line(keys),
        }

        def install(key: str) -> dict[str, object]:
            # The head gets the same files but no authorized_keys line: its mpirun uses them.
            args = payload if key != HEAD else {**payload, "authorized_key": None}
            if self._node_python:
                args = {**args, "links": {ENV_LINK: self.prefix(key)}}
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
        head_addr = self.head_addr()
        self.remote = RemoteLaunch(
            ssh_args=tuple(ssh_args),
            ssh_wrapper=str(head_dir / "ssh"),
            head_addr=head_addr,
            hostnames=hostnames,
            tree_spawn=tree_spawn,
        )
        if self._node_python:
            assert self.head_facts is not None
            paths = linked_paths(
                node_cluster_dir(self.head_facts.home, ctx.cluster_id),
                ctx.python,
                ctx.launcher.path,
            )
            self.remote = replace(
                self.remote,
                python=paths.python,
                launcher=replace(ctx.launcher, path=paths.launcher),
                hook_dir=paths.hook_dir,
            )
        return {key: install(key) for key in sessions}, ready

    @staticmethod
    def check(failed: dict[str, Exception]) -> None:
        if HEAD in failed:
            raise failed[HEAD]
        if failed:
            raise BootstrapError({h: [str(e)] for h, e in failed.items()})

    def start_agents(
        self,
        head: RendezvousHead,
        sessions: dict[str, NodeSession],
        installs: Mapping[str, Mapping[str, object]],
        ready: Mapping[str, object],
        joined: Callable[[float], None] | None = None,
    ) -> None:
        """Install each session's files (``installs``) and start one agent per node, by the
        node's bootstrap session (no second login), in one round trip; then the ``ready``
        install (the status file) everywhere; wait until all joined. The agents outlive the
        sessions: they leave when the rendezvous closes, and exit by themselves when they
        lose the head. ``joined(timeout)`` returns once they joined (by default, once the
        rendezvous is ready)."""
        ctx, rendezvous = self.ctx, head
        url = rendezvous.join_url
        assert url is not None
        # The agent needs clusterbook: the ranks' Python if it has it, else ours (same path).
        has_it = self.head_facts is not None and self.head_facts.clusterbook
        spawns: dict[str, dict[str, object]] = {}
        for node in self.nodes:
            python = ctx.python if has_it else sys.executable
            if node.host in self._node_python and self.facts[node.host].clusterbook:
                python = self._node_python[node.host]
            node_dir = node_cluster_dir(self.facts[node.host].home, ctx.cluster_id)
            token = f"{node_dir}/token"
            socket = f"{node_dir}/{forward_name(node.host)}"
            if self.warm and len(socket.encode()) < SOCKET_PATH_MAX:
                self.daemon_sockets[node.host] = socket
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
                daemon_socket=self.daemon_sockets.get(node.host),
            )
            # Tagged like a job: the clean-up at stop() finds it whatever happened. A fork of
            # the node's session (tagged so too) when it runs the same Python: then the
            # node starts one interpreter in all.
            spawns[node.host] = {
                "cluster_id": ctx.cluster_id,
                "argv": argv,
                "env": agents_env(ctx.cluster_id),
                "log": AGENT_LOG,
                "name": AGENT_NAME,
            }

        # All at once: each waits for its node's fork (one round trip, and a process start
        # where the node's Python differs), which one after the other added up. The files
        # go in the same round trip, just before: a node whose install fails starts no agent.
        def start(key: str) -> object:
            calls: list[tuple[str, Mapping[str, object]]] = [("install", installs[key])]
            if key in spawns:
                calls.append(("spawn", spawns[key]))
            return sessions[key].call_each(calls)

        self.check(parallel(list(sessions), start)[1])
        # Last, once every node has everything: the status file that workers can wait on
        # (while the agents join).
        self.check(parallel(list(sessions), lambda key: sessions[key].call("status", ready))[1])
        try:
            (joined or rendezvous.wait_ready)(min(60.0, self.sessions.connect_timeout * 2))
        except ClusterError as exc:
            in_round = {s.name for s in rendezvous.node_statuses() if s.state == "joined"}
            late = [n.host for n in self.nodes if n.host not in in_round]
            args = {"cluster_id": ctx.cluster_id, "name": AGENT_LOG, "lines": 5}
            logs, _ = parallel(late, lambda h: sessions[h].call("tail", args)["text"])
            raise BootstrapError(
                {
                    h: [f"its agent did not join ({exc}); its log ends: {logs.get(h) or '-'}"]
                    for h in late
                }
            ) from None
