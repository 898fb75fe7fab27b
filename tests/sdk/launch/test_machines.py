"""Hosts of one machine counted together: their ranks against the CPUs they may use in all,
and whether two of them would run ranks on the same CPUs."""

from __future__ import annotations

from clusterbook.launch.machines import MachineLoad, machine_loads
from clusterbook.spec import NodeSpec

BOX, OTHER = "b00t-1d", "0th3r-b00t"


def node(host: str, cores: int | None = 2, place: str | None = None) -> NodeSpec:
    return NodeSpec(host, host, 2, cores=cores, place=place)


def test_hosts_of_one_machine_on_the_same_cpus_share_them() -> None:
    # Two network namespaces of a 2-core machine: each host alone fits its 2 ranks.
    nodes = [node("10.0.0.11", place=f"{BOX}/0-1"), node("10.0.0.12", place=f"{BOX}/0-1")]
    (load,) = machine_loads(nodes, [2, 2])
    assert load == MachineLoad(("10.0.0.11", "10.0.0.12"), 4, 2, overlap=True)
    assert load.crowded


def test_hosts_of_one_machine_on_cpus_of_their_own_add_them_up() -> None:
    nodes = [node("a", place=f"{BOX}/0-1"), node("b", place=f"{BOX}/2-3")]
    (load,) = machine_loads(nodes, [2, 2])
    assert (load.cores, load.overlap, load.crowded) == (4, False, False)


def test_a_cpu_quota_caps_what_hosts_of_one_machine_may_use_together() -> None:
    # Two containers limited to 2 CPUs each of the machine's 8: 4 between them.
    nodes = [node("a", 2, f"{BOX}/0-7"), node("b", 2, f"{BOX}/0-7")]
    assert machine_loads(nodes, [2, 3])[0].cores == 4
    # A host whose quota is not known leaves the CPUs as the count.
    unknown = [node("a", 2, f"{BOX}/0-7"), node("b", None, f"{BOX}/0-7")]
    assert machine_loads(unknown, [2, 3])[0].cores == 8


def test_only_hosts_that_get_ranks_can_overlap() -> None:
    nodes = [node("a", place=f"{BOX}/0-1"), node("b", place=f"{BOX}/0-1")]
    (load,) = machine_loads(nodes, [2, 0])
    assert (load.ranks, load.overlap, load.crowded) == (2, False, False)


def test_other_machines_and_hosts_without_a_place_stand_alone() -> None:
    nodes = [
        node("a", place=f"{BOX}/0-1"),
        node("b", place=f"{OTHER}/0-1"),
        node("c", cores=None),
        node("c", cores=8),  # a second node of host c: the host's first node's cores count
    ]
    loads = machine_loads(nodes, [1, 2, 1, 1])
    assert loads == [
        MachineLoad(("a",), 1, 2),
        MachineLoad(("b",), 2, 2),
        MachineLoad(("c",), 2, None),
    ]
    assert not any(m.crowded for m in loads)  # unknown cores are never crowded


def test_a_host_whose_first_node_has_no_place_takes_its_next_nodes() -> None:
    nodes = [node("a"), node("a", place=f"{BOX}/0"), node("b", place=f"{BOX}/0")]
    (load,) = machine_loads(nodes, [1, 1, 1])
    assert (load.hosts, load.ranks, load.cores, load.overlap) == (("a", "b"), 3, 1, True)
