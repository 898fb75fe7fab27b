"""How the head reaches the nodes of a rendezvous round: :class:`FarReach`, the
:class:`~clusterbook.providers.reach.NodeReach` of providers whose nodes join by themselves.

Nodes on this machine need no way there. Those on other machines run ranks and node tasks
through the sshd their agent started (``--start-sshd``), which lets in only the cluster's key
(derived from the rendezvous secret); the head pins their reported host keys in a per-cluster
ssh config (:mod:`~clusterbook.providers.elastic.far`) and checks each node once the round has
it (:meth:`FarReach.prepare_soon`): from what its agent probed (``--probe-mpi``), else over a
login. Open MPI's daemons (no tree spawn) and a job's free port on rank 0's node go through
the channel the node's agent dialled (:mod:`clusterbook.rendezvous.channels`: no login at
all), else over the head's master connection (:mod:`.masters`) and its session for node tasks.
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import logging
import shutil
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.errors import BootstrapError, ClusterError
from clusterbook.launch.keep import end_far, hold_far
from clusterbook.launch.remote import RemoteLaunch, SrunStep
from clusterbook.launch.result import KeptProcess
from clusterbook.nodes.call import Call
from clusterbook.nodes.commands import NodeRun, run_everywhere
from clusterbook.nodes.fanout import parallel
from clusterbook.nodes.outgoing import Outgoing
from clusterbook.nodes.tasks.files import CLEANUP_PARTS
from clusterbook.nodes.transfer import fetch_all, send_all, uncounted
from clusterbook.paths import cluster_dir
from clusterbook.providers.base import StartContext
from clusterbook.providers.elastic.far import (
    FarNode,
    far_nodes,
    head_address_towards,
    known_hosts_text,
    reported_facts,
    ssh_config,
)
from clusterbook.providers.elastic.masters import FarMasters
from clusterbook.providers.reach import here_for
from clusterbook.rendezvous.head import RendezvousHead
from clusterbook.spec import NodeSpec
from clusterbook.ssh.hostkeys import Fingerprints

if TYPE_CHECKING:
    from clusterbook.ssh.node_session import KeptSession, NodeSession
    from clusterbook.ssh.paramiko_shell import ParamikoShell
    from clusterbook.ssh.preflight import NodeFacts

__all__ = ["FarReach", "Steps"]

_log = logging.getLogger("clusterbook.elastic")

#: Where jobs start instead of with mpirun over ssh: a step of a Slurm job for the nodes given,
#: or None (see :mod:`clusterbook.providers.slurm.steps`).
Steps = Callable[[tuple[NodeSpec, ...]], SrunStep | None]
Far = tuple[FarNode, ...]  # the far nodes of a round
_FILES = ("known_hosts", "ssh_config", "ssh", "launch-agent")  # the ssh path's (cluster dir)


class FarReach:
    """The reach of a round's nodes (``nodes()``, whose agents joined ``head``): see the
    module. ``steps``: how jobs start instead, where the nodes allow it (a Slurm job's)."""

    def __init__(
        self,
        head: RendezvousHead,
        nodes: Callable[[], tuple[NodeSpec, ...]],
        steps: Steps | None = None,
    ) -> None:
        self._head = head
        self._nodes = nodes
        self._steps = steps
        self._ctx: StartContext | None = None
        self._identity: Path | None = None
        self._checked: Far = ()
        self._probed: set[FarNode] = set()  # far nodes whose preflight passed, as they were
        self._head_facts: NodeFacts | None = None
        self._launch: RemoteLaunch | None = None
        self._sessions: dict[str, KeptSession] = {}
        self._held: set[str] = set()  # jobs kept stopped on far nodes (clean="none")
        self._lock = threading.Lock()
        self._preparing = threading.Lock()  # one check of the round at a time
        self._prepared: tuple[str, ...] = ()  # the round prepare_soon() last looked at
        self._masters: FarMasters | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, ctx: StartContext) -> None:
        """Derive the cluster's key from the rendezvous secret (the head has started)."""
        assert self._head.secret is not None
        from clusterbook.ssh.keys import derive_keypair  # cryptography: only when started

        keys = cluster_dir(ctx.cluster_id) / "keys"
        shutil.rmtree(keys, ignore_errors=True)
        self._identity = derive_keypair(keys, ctx.cluster_id, self._head.secret).private_path
        self._ctx = ctx

    def stop(self) -> dict[str, Exception]:
        """Remove what ``put`` left on the nodes reached so far (while their agents, and their
        sshd, are still there), close their sessions and remove the key and ssh files; return
        the nodes that could not be cleaned, with why. Safe to call again."""
        ctx, self._ctx = self._ctx, None
        if ctx is None:
            return {}
        with self._lock:
            sessions, self._sessions = self._sessions, {}
        with self._preparing:  # a check under way ends first
            masters, self._masters = self._masters, None
        if masters is not None:
            masters.stop()

        def clean(part: str, name: str) -> None:
            args = {"cluster_id": ctx.cluster_id, "part": part}
            try:
                sessions[name].call("put_cleanup", args, timeout=15)
            finally:
                if part == CLEANUP_PARTS[-1]:  # the node's last call
                    sessions[name].close()

        try:
            # Every node's files before any node's directories: nodes sharing a filesystem
            # may each have made part of one tree (nodes.tasks.files.put_cleanup).
            failed: dict[str, Exception] = {}
            for part in CLEANUP_PARTS:
                reached = [n for n in sessions if n not in failed]
                failed |= parallel(reached, functools.partial(clean, part))[1]
            return failed
        except Exception as exc:  # clean-up goes on: the agents leave all the same
            return {"(all nodes)": exc}
        finally:
            for session in sessions.values():  # those a pass left out, or all on an error
                session.close()
            directory = cluster_dir(ctx.cluster_id)
            shutil.rmtree(directory / "keys", ignore_errors=True)
            for name in _FILES:
                (directory / name).unlink(missing_ok=True)

    def leave(self, names: Collection[str]) -> dict[str, Exception]:
        """The nodes ``names`` leave the cluster (their batch job is cancelled): remove what
        ``put`` left there while their sshd still runs, and close their sessions; return the
        nodes that could not be cleaned, with why."""
        ctx = self._ctx
        with self._lock:
            sessions = {n: self._sessions.pop(n) for n in names if n in self._sessions}
        if ctx is None or not sessions:
            return {}

        def clean(name: str) -> None:
            try:
                sessions[name].call("put_cleanup", {"cluster_id": ctx.cluster_id}, timeout=15)
            finally:
                sessions[name].close()

        return parallel(list(sessions), clean)[1]

    # -- how the launcher reaches the nodes -------------------------------------------------

    def remote(self) -> RemoteLaunch | None:
        """None when every node is on this machine; else the checked ssh path to them, with
        the step that starts jobs instead where there is one."""
        nodes = self._nodes()
        if all(n.here for n in nodes):
            return None
        launch, far = self._checked_path(nodes)
        if self._masters is not None:
            self._masters.before_job(far)
        step = self._steps(nodes) if self._steps is not None else None
        return launch if step is None else replace(launch, srun=step)

    def prepare_soon(self) -> None:
        """The round may have changed: check the nodes that joined it and start their master
        connections on a thread of its own, so that the next job finds them ready (a job
        that comes first waits for that check instead of doing it again). What fails is left
        to that job's :meth:`remote`, which says it."""
        if self._ctx is None:
            return
        nodes = self._nodes()
        key = tuple(n.name for n in nodes)
        with self._lock:
            if key == self._prepared or all(n.here for n in nodes):
                return
            self._prepared = key
        threading.Thread(
            target=self._prepare, args=(nodes,), name="clusterbook-prepare", daemon=True
        ).start()

    def on_change(self, changed: Callable[[], None]) -> Callable[[], None]:
        """What the head calls when the nodes change: ``changed`` (the cluster is told), then
        :meth:`prepare_soon`."""

        def both() -> None:
            changed()
            self.prepare_soon()

        return both

    def _prepare(self, nodes: tuple[NodeSpec, ...]) -> None:
        try:
            self._checked_path(nodes)
        except ClusterError as exc:
            _log.debug("Checking the nodes that joined failed (the next job says so): %s", exc)

    def _checked_path(self, nodes: tuple[NodeSpec, ...]) -> tuple[RemoteLaunch, Far]:
        """The ssh path to the far nodes of ``nodes`` (written, each checked once, its master
        started meanwhile) and those nodes, as checked with it (not as a later check saw them)."""
        ctx = self._started()
        far, found = far_nodes(nodes, self._head.reports(), getpass.getuser())
        if found:
            raise BootstrapError(found)
        key = tuple(far)
        with self._preparing:
            if self._ctx is None:  # stopped meanwhile: no master may outlive the stop
                raise ClusterError("The cluster stopped while its nodes were being checked.")
            if key != self._checked or self._launch is None:
                launch = self._write(ctx, far)
                assert self._masters is not None  # _write made them; stop() waits for this
                warming = threading.Thread(target=self._masters.update, args=(far,), daemon=True)
                warming.start()
                try:
                    self._preflight(ctx, far)
                finally:
                    warming.join()
                self._checked, self._launch = key, launch
            return self._launch, self._checked

    def _write(self, ctx: StartContext, far: Sequence[FarNode]) -> RemoteLaunch:
        from clusterbook.ssh.launcher_ssh import ssh_wrapper

        assert self._identity is not None
        directory = cluster_dir(ctx.cluster_id)
        known = directory / "known_hosts"
        known.write_text(known_hosts_text(far))
        config = directory / "ssh_config"
        config.write_text(ssh_config(far, identity=self._identity, known_hosts=known))
        if self._masters is None:
            self._masters = FarMasters(("-F", str(config)), self._head.channels)
        ssh_args = (*self._masters.options(), "-F", str(config))
        wrapper = directory / "ssh"
        wrapper.write_text(ssh_wrapper(ssh_args))
        wrapper.chmod(0o755)
        agent, helper = None, self._masters.launch_agent(wrapper, far)
        if helper is not None:  # the daemons start through the nodes' agents
            agent = directory / "launch-agent"
            agent.write_text(helper)
            agent.chmod(0o700)
        return RemoteLaunch(
            ssh_args=ssh_args,
            ssh_wrapper=str(wrapper),
            head_addr=head_address_towards(far[0].addr),
            hostnames={n.addr: n.hostname for n in far},
            tree_spawn=False,
            launch_agent=None if agent is None else str(agent),
        )

    def _preflight(self, ctx: StartContext, far: Sequence[FarNode]) -> None:
        """Check each far node's environment: as its agent probed it, or over a login."""
        from clusterbook.ssh.local_shell import LocalShell
        from clusterbook.ssh.node_session import run_task
        from clusterbook.ssh.preflight import NodeFacts, all_problems

        args = {"prefix": ctx.launcher.prefix, "flavour": ctx.launcher.flavour.value}
        # Only the nodes not checked before (joined since, or back with another sshd): a
        # cluster that grows by a node pays for that node's check, not every node's.
        by_name = {n.name: n for n in far if n not in self._probed}
        if not by_name:
            return
        reported = reported_facts(by_name.values(), self._head.reports(), **args, python=ctx.python)

        def probe(name: str) -> NodeFacts:
            if name == "":
                return NodeFacts.from_json(run_task(LocalShell(), ctx.python, "probe", args))
            shell = self._connect(by_name[name])
            try:
                return NodeFacts.from_json(run_task(shell, ctx.python, "probe", args, timeout=30))
            finally:
                shell.close()

        here = [""] if self._head_facts is None else []  # this machine's, once
        facts, failed = parallel([*here, *(n for n in by_name if n not in reported)], probe)
        if "" in failed:
            raise failed[""]
        head = self._head_facts = facts.pop("", None) or self._head_facts
        facts |= reported
        assert head is not None
        nodes = {n.name: (n.addr, n.slots, ctx.launcher.prefix) for n in by_name.values()}
        found = all_problems(head, facts, failed, nodes, ctx.launcher.flavour.value)
        if found:
            raise BootstrapError(found)
        self._probed.update(by_name.values())

    # -- jobs --------------------------------------------------------------------------------

    def stop_job(self, token: str) -> None:
        """Ask every agent to stop the processes of job ``token`` on its node; those of a
        job kept for inspection, through the nodes' sshd, before returning."""
        if token in self._held:  # first: the agents' own clean-up gives a grace
            self._held.discard(token)
            end_far(self._callers()[0] if self._ctx is not None else {}, token)
        self._head.stop_job(token)

    def hold_job(self, token: str, failing: Mapping[str, int]) -> tuple[KeptProcess, ...]:
        """Asked of each node on another machine through its sshd (this machine's are the
        job's own)."""
        if self._ctx is None:
            return ()
        self._held.add(token)
        return hold_far(self._callers()[0], token, failing)

    def free_port(self, node: NodeSpec) -> int | None:
        """Asked of a node on another machine through its agent's channel, else its sshd
        (None for this machine's): a job needs no login to a node that dialled the head."""
        if (channels := self._head.channels) is not None and channels.has(node.name):
            with contextlib.suppress(OSError, ValueError):  # (an older agent's: the sshd)
                return channels.free_port(node.name)
        call = self._callers()[0].get(node.name)
        return None if call is None else int(call("free_port", {}, 10.0)["port"])

    # -- files and commands ------------------------------------------------------------------

    def put(
        self,
        sent: Outgoing,
        sending: Callable[[int], None] = uncounted,
        nodes: Collection[str] | None = None,
    ) -> dict[str, Exception]:
        """Send ``sent`` to every node (``nodes``: those of these names) on another machine,
        and what goes to another path than its own here for those on this machine; return
        the nodes it failed on."""
        callers, unreachable = self._callers()
        ctx = self._started()
        here = [
            n.name for n in self._nodes() if n.name not in callers and n.name not in unreachable
        ]
        if nodes is not None:
            callers = {n: c for n, c in callers.items() if n in nodes}
            unreachable = {n: e for n, e in unreachable.items() if n in nodes}
        failed = here_for(sent, sending, here, nodes)
        return {**unreachable, **failed, **send_all(callers, ctx.cluster_id, sent, sending)}

    def gather(
        self, directory: Path, skip: Sequence[str], receiving: Callable[[int], None] = uncounted
    ) -> tuple[list[Path], dict[str, Exception]]:
        """Move the files ranks wrote in ``directory`` on nodes on other machines here."""
        callers, unreachable = self._callers()
        stored, failed = fetch_all(callers, directory, skip, receiving)
        return stored, {**unreachable, **failed}

    def run_on_nodes(
        self, argv: Sequence[str], timeout: float, nodes: Collection[str] | None = None
    ) -> list[NodeRun]:
        """Run ``argv`` on every node of the round: over the sshd of those on other machines
        (a node without one says why in its stderr), here for those on this machine."""
        callers, unreachable = self._callers()
        return run_everywhere(self._nodes(), callers, argv, timeout, unreachable, only=nodes)

    # -- sessions ----------------------------------------------------------------------------

    def _started(self) -> StartContext:
        if self._ctx is None:
            raise ClusterError("The elastic cluster is not started; call start() first.")
        return self._ctx

    def _callers(self) -> tuple[dict[str, Call], dict[str, Exception]]:
        """Node tasks on each node of the round on another machine; those the head cannot
        reach, with why."""
        ctx = self._started()
        far, found = far_nodes(self._nodes(), self._head.reports(), getpass.getuser())
        callers = {n.name: self._caller(ctx.python, n) for n in far}
        return callers, {name: ClusterError(" ".join(why)) for name, why in found.items()}

    def _caller(self, python: str, node: FarNode) -> Call:
        """Runs node tasks on ``node`` in a session kept for the cluster's lifetime, over the
        node's sshd with its host key pinned."""
        from clusterbook.ssh.node_session import KeptSession, NodeSession

        def start() -> NodeSession:
            return NodeSession(self._connect(node), python, owns_shell=True)

        with self._lock:
            return self._sessions.setdefault(node.name, KeptSession(start)).call

    def _connect(self, node: FarNode) -> ParamikoShell:
        from clusterbook.ssh.paramiko_shell import connect

        assert self._identity is not None
        pins = Fingerprints({f"{node.addr}:{node.port}": node.host_key.fingerprint})
        return connect(
            node.addr, user=node.user, identity=self._identity, policy=pins, port=node.port
        )
