"""The ``Cluster`` facade stays thin: it makes clusters and delegates to its head, with no fork
to a second kind of head inside it, and nothing outside a cluster or its head reaches into
their private members (docs/architecture.md, "Heads: who runs the cluster")."""

from __future__ import annotations

import ast

import clusterbook as cb
from clusterbook.cluster.facade import Cluster
from clusterbook.testing import FakeProvider
from tests.test_architecture import MODS

#: The names code holds a cluster or a head by.
HOLDERS = frozenset({"cluster", "head", "local", "remote", "attached", "handle"})
#: Lines the Cluster class may take (its constructors are ClusterKinds', cluster/kinds.py).
MAX_CLUSTER_LINES = 300


def private_reaches(tree: ast.AST) -> list[str]:
    """``cluster._x`` (or a head's, by the names in :data:`HOLDERS`) anywhere in ``tree``."""
    return [
        f"line {node.lineno}: {node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in HOLDERS
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def test_nothing_reaches_into_a_clusters_or_a_heads_private_members() -> None:
    found = {
        name: reaches
        for name, path in sorted(MODS.items())
        if (reaches := private_reaches(ast.parse(path.read_text(), str(path))))
    }
    assert found == {}


def test_the_scan_finds_what_it_looks_for() -> None:
    code = (
        "def f(cluster, head):\n    cluster._options = 1\n    return head._jobs, cluster.__dict__"
    )
    assert private_reaches(ast.parse(code)) == ["line 2: cluster._options", "line 3: head._jobs"]


def test_the_facade_has_no_second_head_inside_and_stays_short() -> None:
    path = MODS["clusterbook.cluster.facade"]
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Cluster"]
    assert (cls.end_lineno or 0) - cls.lineno + 1 <= MAX_CLUSTER_LINES
    forks = [
        n.lineno for n in ast.walk(cls) if isinstance(n, ast.Attribute) and n.attr == "_remote"
    ]
    assert forks == []
    cluster = Cluster(FakeProvider(nodes=1))
    assert not hasattr(cluster, "_remote")
    assert isinstance(cluster, cb.Cluster)
