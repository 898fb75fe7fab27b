"""Nodes on this machine."""

from __future__ import annotations

import os

from clusterbook.spec import NodeSpec, validate_positive_int

__all__ = ["local_nodes"]


def local_nodes(workers: int, slots: int | None) -> tuple[NodeSpec, ...]:
    """``workers`` nodes on this machine with ``slots`` slots each (default: one per core)."""
    validate_positive_int(workers, "workers")
    cores = os.cpu_count() or 1
    slots = cores if slots is None else validate_positive_int(slots, "slots")
    return tuple(NodeSpec(f"local-{i}", "localhost", slots, cores=cores) for i in range(workers))
