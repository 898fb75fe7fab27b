"""The architecture, checked: no import circles, layers that only point down, modules and
functions of a size one can read (``docs/architecture.md`` says why and lists the layers).

Every import counts: at module level, inside functions and under ``TYPE_CHECKING`` alike. A
module's layer is that of the longest prefix of its name in :data:`LAYERS`; an import may
point at its own layer or one below. The few deliberate exceptions are listed by name in
:data:`UPWARD` (with why), and a listed exception that no longer exists fails too, so the list
stays true.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "sdk", REPO / "widgets")

#: The layers, from the bottom up: a module may import its own layer and those below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    # The node program: plain standard library, sent to nodes as source.
    ("clusterbook.nodes.tasks",),
    # Values and words everything uses; the door to the Jupyter layer (entry points).
    (
        "clusterbook.errors",
        "clusterbook.durations",
        "clusterbook.wording",
        "clusterbook.version",
        "clusterbook._lazy",
        "clusterbook.jupyter",
        # Waits that let a notebook's widgets act while a cell blocks (through ``jupyter``).
        "clusterbook.waiting",
        "clusterbook.preempt",
    ),
    (
        "clusterbook.lifetime",
        "clusterbook.scaling",
        "clusterbook.gpus",
        "clusterbook.spec",
        "clusterbook.paths",
        "clusterbook.config",
        "clusterbook.names",
        "clusterbook.events",
        "clusterbook.status",
        "clusterbook.resources",
        "clusterbook.sample_ring",
        "clusterbook.fs",
        # The same work on every node at once, and the call that runs a node task: plain
        # threads and a Protocol, which every layer that asks nodes for something takes.
        "clusterbook.nodes.fanout",
        "clusterbook.nodes.call",
    ),
    ("clusterbook.ssh",),
    ("clusterbook.launch",),
    ("clusterbook.rendezvous",),
    ("clusterbook.views",),
    ("clusterbook.nodes",),
    ("clusterbook.providers",),
    # What a running head serves; torchrun's handler, which finds a cluster as the CLI does.
    ("clusterbook.head", "clusterbook.torch"),
    ("clusterbook.cluster.handle",),
    # Functions as jobs, an executor and sweeps: they work on any ClusterHandle.
    ("clusterbook.functions",),
    ("clusterbook.engines", "clusterbook.export"),
    ("clusterbook.cluster",),
    ("clusterbook.cli",),
    (
        "clusterbook",
        "clusterbook.__main__",
        "clusterbook.testing",
        "clusterbook.gpu_fakes",
        "clusterbook._demo_rank",
    ),
    ("clusterbook_widgets",),
    # Jupyter Server's side of the JupyterLab extension: REST over the clusters of this user.
    ("clusterbook_widgets.lab",),
)

#: Imports that point up on purpose: (importer, imported) -> why.
UPWARD: dict[tuple[str, str], str] = {
    ("clusterbook.launch.job", "clusterbook.views.html"): "Job._repr_html_, inside the method: "
    "a job shows itself in a notebook with the views' renderer, which reads launch's records",
    ("clusterbook.launch.result", "clusterbook.views.html"): "JobResult._repr_html_, inside the "
    "method, for the same reason",
}


def modules() -> dict[str, Path]:
    found = {}
    for root in ROOTS:
        for path in root.rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Every module each module imports (ours only), wherever the import statement is."""
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in mods else base
                    for alias in node.names
                ]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges[name].add(target)
    return edges


def layer(name: str) -> int:
    best, found = -1, None
    for i, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), i
    if found is None:
        raise AssertionError(f"{name} is in no layer: add it to LAYERS")
    return found


def circles(edges: dict[str, set[str]]) -> Iterator[list[str]]:
    """The import circles (strongly connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    counter = [0]

    def strong(v: str) -> Iterator[list[str]]:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                yield from strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                yield sorted(component)

    for v in sorted(edges):
        if v not in index:
            yield from strong(v)


MODS = modules()
EDGES = imports(MODS)


def test_every_module_has_a_layer() -> None:
    for name in MODS:
        layer(name)


def test_no_import_circles() -> None:
    assert list(circles(EDGES)) == []


def test_imports_point_down_the_layers() -> None:
    upward = {(a, b) for a, targets in EDGES.items() for b in targets if layer(b) > layer(a)}
    unexplained = sorted(upward - set(UPWARD))
    assert unexplained == [], "imports against the layer order (docs/architecture.md)"
    stale = sorted(set(UPWARD) - upward)
    assert stale == [], "exceptions in UPWARD that no longer exist: remove them"


def test_the_node_program_is_plain_standard_library() -> None:
    ours = {n for n in EDGES if n.startswith("clusterbook.nodes.tasks")}
    outside = {
        (a, b) for a in ours for b in EDGES[a] if not b.startswith("clusterbook.nodes.tasks")
    }
    assert outside == set()


MAX_MODULE = 400
MAX_FUNCTION = 80
#: Modules and functions allowed past the limits, with why.
LONG: dict[str, str] = {}


@pytest.mark.parametrize("name", sorted(MODS))
def test_modules_and_functions_are_short(name: str) -> None:
    path = MODS[name]
    text = path.read_text()
    too_long = []
    allowed = LONG.keys()
    if len(text.splitlines()) > MAX_MODULE and name not in allowed:
        too_long.append(f"{name}: {len(text.splitlines())} lines")
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            if size > MAX_FUNCTION and f"{name}.{node.name}" not in allowed:
                too_long.append(f"{name}.{node.name}: {size} lines")
    assert too_long == []
