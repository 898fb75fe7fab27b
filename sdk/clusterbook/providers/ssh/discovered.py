"""What a host discovery command says (pure): its output read as a host list, and how that
list differs from the cluster's hosts.

A discovery command (``Cluster.ssh(discover="./hosts.sh", every="10s")``) prints the hosts
the cluster should have now, one a line, as a hostfile does: ``host``, ``host:slots`` or
``host slots=N``, with comments (``#``) and blank lines. :func:`parse_discovered` reads it
(an empty list is refused: a command that lost its source must not empty the cluster);
:func:`changes` says which hosts to add and which to remove.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from clusterbook.durations import optional_duration
from clusterbook.errors import ConfigError
from clusterbook.gpus import Slots
from clusterbook.providers.ssh.hosts import parse_host_list
from clusterbook.spec import parse_hostfile
from clusterbook.wording import spell

__all__ = ["MOST_HOSTS", "Changes", "Discovery", "changes", "discovery_of", "parse_discovered"]

#: How long a discovery command may run at most, when its interval is longer.
LONGEST_RUN = 30.0
#: The most hosts a cluster of discovered hosts takes (its rendezvous' bound).
MOST_HOSTS = 4096


@dataclass(frozen=True, slots=True)
class Discovery:
    """A discovery command (``command``, run by ``/bin/sh -c`` in ``cwd``), run every ``every``
    seconds, each run given ``timeout`` seconds."""

    command: str
    every: float
    timeout: float
    cwd: str

    @classmethod
    def make(cls, command: object, every: object, cwd: str) -> Discovery:
        """Check ``discover=`` and ``every=`` (default 10 s; each run may take as long, up to
        30 s)."""
        if not isinstance(command, str) or not command.strip():
            raise ConfigError(
                f"{spell('discover', command)} is not a command: give the command that "
                "prints the cluster's hosts, one 'host[:slots]' a line, like "
                f"{spell('discover', './hosts.sh')}."
            )
        seconds = optional_duration(every, "every")
        interval = 10.0 if seconds is None else seconds
        return cls(command, interval, min(interval, LONGEST_RUN), cwd)


def discovery_of(discover: object, every: object) -> Discovery | None:
    """The discovery ``discover=`` and ``every=`` ask for (None: none), run in the current
    directory (where a relative command was written for)."""
    if discover is None:
        if every is not None:
            raise ConfigError(
                f"{spell('every', every)} is how often a discovery command runs; give the "
                f"command too, like {spell('discover', './hosts.sh')}."
            )
        return None
    return Discovery.make(discover, every, os.getcwd())


def parse_discovered(text: str, command: str) -> tuple[tuple[str, Slots], ...]:
    """The ``(host, slots)`` pairs of a discovery command's output (slots 1 where not
    given); a :class:`ConfigError` naming the command and the line for anything else, and
    for a list of no host."""
    source = f"the output of discovery command {command!r}"
    entries = parse_hostfile(text, source)
    return parse_host_list(entries)


@dataclass(frozen=True, slots=True)
class Changes:
    """Hosts to add (with their slots, in the order listed) and to remove (in the cluster's
    order)."""

    add: tuple[tuple[str, Slots], ...] = ()
    remove: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.add or self.remove)


def changes(hosts: Sequence[str], found: Sequence[tuple[str, Slots]]) -> Changes:
    """How the cluster's ``hosts`` become the ``found`` ones: those found that it lacks are
    added, those it has that were not found are removed. A host it has keeps its slots (a
    new count applies when it leaves and comes back)."""
    have: Collection[str] = set(hosts)
    listed = {host for host, _ in found}
    return Changes(
        add=tuple((host, slots) for host, slots in found if host not in have),
        remove=tuple(host for host in hosts if host not in listed),
    )
