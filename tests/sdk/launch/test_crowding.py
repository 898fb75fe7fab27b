"""More ranks on a host than its cores: counted by host as the launcher places them, said in
an OversubscriptionWarning with the numbers and the fixes, silent when the job asks for it."""

from __future__ import annotations

import warnings

import pytest

import clusterbook as cb
from clusterbook.launch.command import binding
from clusterbook.launch.crowding import Crowded, crowded, warn_crowded
from clusterbook.spec import NodeSpec
from clusterbook.wording import speaking


def _local(*slots: int, cores: int) -> tuple[NodeSpec, ...]:
    return tuple(NodeSpec(f"local-{i}", "localhost", n, cores=cores) for i, n in enumerate(slots))


def test_nodes_of_one_host_share_its_cores() -> None:
    nodes = _local(2, 2, cores=2)
    assert crowded(nodes, 2) == []
    assert crowded(nodes, 3) == [Crowded("localhost", ("local-0", "local-1"), 3, 2)]
    assert binding(nodes, 2) == "core"
    assert binding(nodes, 3) == "none"


def test_hosts_are_counted_apart_and_unknown_cores_never_crowd() -> None:
    nodes = (
        NodeSpec("node1", "node1", 4, cores=2),
        NodeSpec("node2", "node2", 2, cores=2),
        NodeSpec("node3", "node3", 8),
    )
    assert crowded(nodes, 2) == []
    assert crowded(nodes, 3) == [Crowded("node1", ("node1",), 3, 2)]
    assert crowded(nodes, 14) == [Crowded("node1", ("node1",), 4, 2)]


def test_more_ranks_than_cores_warn_with_the_numbers_and_the_fixes() -> None:
    nodes = _local(1, 1, 1, 1, cores=2)  # four workers sharing two cores, a slot each
    with pytest.warns(cb.OversubscriptionWarning) as caught:
        warn_crowded(nodes, 4, oversubscribe=False)
    message = str(caught[0].message)
    assert message.startswith("np=4 puts more ranks on a host than it has cores: 4 ranks on ")
    assert "localhost (nodes local-0, local-1, local-2, local-3), which may use 2 cores" in message
    assert "ask for at most 2 ranks (np=2)" in message
    assert "give each host no more slots than its cores (fewer slots, or fewer nodes" in message
    assert message.endswith("or pass oversubscribe=True to run them anyway.")


def test_the_fix_is_spelt_as_the_interface_has_it() -> None:
    with speaking("cli"), pytest.warns(cb.OversubscriptionWarning) as caught:
        warn_crowded(_local(3, cores=2), 3, oversubscribe=False)
    message = str(caught[0].message)
    assert message.startswith("-n 3 puts more ranks")
    assert "(-n 2)" in message
    assert "pass --oversubscribe to" in message


def test_asking_for_it_or_fitting_says_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_crowded(_local(4, cores=2), 4, oversubscribe=True)
        warn_crowded(_local(1, 1, cores=2), 2, oversubscribe=False)
        warn_crowded((NodeSpec("n", "n", 64),), 64, oversubscribe=False)  # cores unknown
