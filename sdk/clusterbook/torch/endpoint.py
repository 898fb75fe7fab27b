"""Where ``torchrun --rdzv-endpoint`` leads: a cluster's join URL, or a cluster on this machine
by its name or id, and the token file that holds its secret.

A join URL is the one the head printed (``tcp://HOST:PORT/ID?...``; ``cluster.join_command``
shows it); its token file is the cluster's (``~/.clusterbook/clusters/ID/token``, which nodes
that share the head's home see) unless ``--rdzv-conf token_file=F`` says where else. A name
or an id is looked up as ``clusterbook ls`` lists clusters; the URL and token file are those of
the command its nodes join with.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ConfigError
from clusterbook.head.catalog import find
from clusterbook.paths import cluster_dir
from clusterbook.rendezvous.registry import parse_join_url

__all__ = ["Endpoint", "resolve"]


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A cluster's join URL and the file with its secret."""

    join_url: str
    token_file: Path


def resolve(endpoint: str, token_file: str | None = None, *, root: Path | None = None) -> Endpoint:
    """The join URL and token file ``endpoint`` names (``token_file``: the one given, if any;
    ``root``: where clusters are found by name, the run root by default)."""
    if not endpoint:
        raise ConfigError(
            "torchrun --rdzv-backend=clusterbook needs --rdzv-endpoint: a cluster's join URL "
            "(cluster.join_command shows it), or the name or id of a cluster on this machine."
        )
    if "://" in endpoint:
        _, settings = parse_join_url(endpoint)  # refuses what is not a join URL
        token = Path(token_file) if token_file else cluster_dir(settings.run_id) / "token"
        return Endpoint(endpoint, token)
    found = find(endpoint, root)
    record = found.record
    command = record.extra.get("join_command") if record is not None else None
    if not isinstance(command, str):
        kind = record.kind if record is not None else "unknown"
        raise ConfigError(
            f"Cluster {endpoint!r} ({kind}) takes no nodes that join by themselves, so torchrun "
            "cannot join it; make one with cb.Cluster.elastic(min_nodes, max_nodes, ...)."
        )
    url, recorded = _join_parts(command)
    return Endpoint(url, Path(token_file) if token_file else recorded)


def _join_parts(command: str) -> tuple[str, Path]:
    """The URL and token file of a join command (``... worker join URL --token-file F``)."""
    argv = shlex.split(command)
    try:
        url = argv[argv.index("join") + 1]
        token = argv[argv.index("--token-file") + 1]
    except (ValueError, IndexError):
        raise ConfigError(
            f"The cluster's join command {command!r} has no join URL and token file; "
            "give --rdzv-endpoint its join URL."
        ) from None
    return url, Path(token)
