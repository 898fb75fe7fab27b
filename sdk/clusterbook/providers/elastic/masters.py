"""The head's master connections to the far nodes of an elastic or Slurm cluster (OpenSSH's
ControlMaster, :class:`~clusterbook.providers.ssh.masters.ControlMasters`), by node address,
to those whose agent holds no channel to the head (:mod:`clusterbook.rendezvous.channels`):
the launcher's ssh reuses them (no login per job), and each forwards the node's agent socket
where the agent reported one, so that MPI's daemons start through the agent (no ssh session,
no shell: :mod:`clusterbook.launch.daemons`). A node whose agent does not answer there when
its master starts starts them over its master (said once in the log); one whose master ended
or whose agent stopped answering since is said before the next job in a ColdLaunchWarning,
as on SSH clusters; a node with no master is logged in to anew.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.errors import ColdLaunchWarning
from clusterbook.launch.daemons import CHANNELS
from clusterbook.providers.elastic.far import FarNode
from clusterbook.providers.ssh.masters import (
    LEFT,
    ControlMasters,
    launch_agent,
    warn_agents,
    warn_cold,
)
from clusterbook.rendezvous.channels import TAKE_WITHIN

if TYPE_CHECKING:
    from clusterbook.rendezvous.channels import ChannelServer

__all__ = ["FarMasters"]

_log = logging.getLogger("clusterbook.elastic")


class FarMasters:
    """Master connections made with ``ssh_args`` (the cluster's ssh config) to the far nodes
    :meth:`update` is given."""

    def __init__(self, ssh_args: Sequence[str], channels: ChannelServer | None = None) -> None:
        self._masters = ControlMasters(ssh_args, [])
        self._channels = channels
        self._dialled: set[str] = set()  # the nodes whose agent held a channel at update()
        self._up: dict[str, FarNode] = {}  # the nodes whose master is up, by address

    @property
    def directory(self) -> Path:
        """The masters' private directory, where the launcher's helper finds its sockets."""
        return self._masters.directory

    def options(self) -> list[str]:
        """The launcher's ssh options that use the masters."""
        return self._masters.options()

    def launch_agent(self, cold: str | Path, far: Sequence[FarNode]) -> str | None:
        """The program the launcher runs instead of ssh to reach ``far`` (``cold``: its ssh,
        where a node's agent is not reached); None where no agent of theirs starts daemons.
        With channels, they are told which node each host is, and serve the helper."""
        channels = self._channels
        if channels is not None:
            channels.route({n.addr: n.name for n in far})
            channels.listen_at(self._masters.directory / CHANNELS)
        elif not any(n.daemon_socket for n in far):
            return None
        return launch_agent(self._masters.directory, cold)

    def update(self, far: Sequence[FarNode], timeout: float = 10.0) -> None:
        """A master to each of ``far`` that has none up (one that fails: jobs log in to that
        node anew, as before), but those whose agent holds a channel (they need none); those
        of nodes gone, or back with another sshd (or a channel now), end."""
        channels = self._channels
        self._dialled = {n.name for n in far if channels is not None and channels.has(n.name)}
        self._start(far, timeout)

    def _start(self, far: Sequence[FarNode], timeout: float) -> None:
        masters = self._masters
        now = {n.addr: n for n in far if n.name not in self._dialled}
        for addr, node in list(self._up.items()):
            if now.get(addr) != node:  # gone, or back with another sshd (port, host key)
                masters.drop(addr)
                del self._up[addr]
        dead = set(masters.dead())
        wanted = sorted(a for a in now if a not in self._up or a in dead)
        for addr in wanted:
            there = now[addr].daemon_socket
            if there is None:
                masters.daemon_sockets.pop(addr, None)
            else:
                masters.daemon_sockets[addr] = there
        failed = masters.start(timeout, wanted) if wanted else {}
        for addr, why in failed.items():
            _log.info("No master connection to %s (its jobs log in anew): %s", addr, why)
            self._up.pop(addr, None)
        others = [a for a in masters.daemon_sockets if a not in wanted or a in failed]
        for addr, why in masters.unanswered(skip=others).items():
            masters.daemon_sockets.pop(addr, None)  # its daemons start over its master
            _log.info("MPI's daemons on %s start over its master connection: %s", addr, why)
        self._up.update((a, now[a]) for a in wanted if a not in failed)

    def before_job(self, far: Sequence[FarNode], timeout: float = 5.0) -> None:
        """Before a job on ``far``: a master of theirs that ended is started again
        (``timeout`` seconds at most), and an agent that does not answer through its master
        is left to ssh, each said in a :class:`~clusterbook.ColdLaunchWarning` (the job
        starts all the same). The master of a node that has left, ended with its sshd, is
        none of the job's (the next :meth:`update` drops it). A node whose agent's channel is
        gone gets a master (so said) and keeps it; one whose channel came after
        :meth:`update` (a loaded node dials late) has its master end."""
        late = {n.name for n in far if n.name not in self._dialled}
        if self._channels is not None and late:
            late -= self._channels.without(late, 0.0)
            if late:
                self._dialled |= late
                self._start(far, timeout)
        if self._channels is not None and self._dialled:
            names = {n.name for n in far} & self._dialled
            gone = self._channels.without(names, TAKE_WITHIN)
            if gone:
                self._dialled -= gone
                self._start(far, timeout)
                where = ", ".join(sorted(n.addr for n in far if n.name in gone))
                warnings.warn(
                    ColdLaunchWarning(
                        f"The channel that the agent of {where} dialled to the head for warm "
                        "launches is gone. The head keeps an ssh connection to it from now "
                        "on, through which jobs start MPI's daemons there (the same job)."
                    ),
                    stacklevel=4,
                )
        masters = self._masters
        job = {n.addr for n in far}
        ended = {a: how for a, how in masters.dead().items() if a in self._up and a in job}
        if ended:
            again = masters.start(timeout, list(ended))
            said = {
                a: f"{how}; started again: {again.get(a, 'up')}"
                for a, how in ended.items()
                if again.get(a) != LEFT  # a node gone meanwhile is none of the job's
            }
            if said:
                warn_cold(said, stacklevel=5)
        skip = [a for a in masters.daemon_sockets if a not in self._up or a not in job]
        silent = masters.unanswered(skip=skip)
        if silent:
            warn_agents(silent, stacklevel=5)

    def stop(self) -> None:
        """End every master."""
        self._up = {}
        self._masters.stop()
