"""Cluster.local without slots shares the cores this process may use among its workers."""

from __future__ import annotations

import pytest

from clusterbook.gpus import NO_GPUS
from clusterbook.providers.local import local_nodes, share_cores


@pytest.mark.parametrize(
    ("cores", "workers", "shares"),
    [
        (8, 1, [8]),
        (8, 4, [2, 2, 2, 2]),
        (8, 3, [3, 3, 2]),  # the remainder to the first workers
        (7, 4, [2, 2, 2, 1]),
        (2, 4, [1, 1, 1, 1]),  # more workers than cores: one slot each all the same
        (1, 1, [1]),
    ],
)
def test_cores_are_shared_out_among_the_workers(cores, workers, shares) -> None:
    assert share_cores(cores, workers) == shares


def test_local_nodes_take_their_share_of_the_usable_cores_unless_slots_are_given() -> None:
    nodes = local_nodes(3, None, NO_GPUS, cores=lambda: 8)
    assert [(n.name, n.slots, n.cores) for n in nodes] == [
        ("local-0", 3, 8),
        ("local-1", 3, 8),
        ("local-2", 2, 8),
    ]
    assert [n.slots for n in local_nodes(2, 5, NO_GPUS, cores=lambda: 8)] == [5, 5]
