"""The documentation site's generated reference (docs/_ext/reference.py) covers what it says it
covers: every public name, every command, every error, every benchmark; and its pages link
only to what the site has."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import clusterbook
import clusterbook_widgets
from clusterbook.errors import ClusterError

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"


def _reference() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_reference", DOCS / "_ext" / "reference.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("docs_reference", module)
    spec.loader.exec_module(module)
    return module


def _documented(page: str) -> set[str]:
    return set(re.findall(r"^\.\. auto(?:class|function|data|exception):: (\S+)$", page, re.M))


def test_every_public_name_of_both_packages_has_an_entry_once() -> None:
    ref = _reference()
    pages = [ref.api_page("clusterbook", "t", ""), ref.api_page("clusterbook_widgets", "t", "")]
    pages.append(ref.errors_page())
    entries = [e for page in pages for e in _documented(page)]
    assert len(entries) == len(set(entries))
    wanted = {f"clusterbook.{n}" for n in clusterbook.__all__}
    wanted |= {f"clusterbook_widgets.{n}" for n in clusterbook_widgets.__all__}
    assert set(entries) == wanted


def test_the_error_tree_holds_every_public_error_under_cluster_error() -> None:
    page = _reference().errors_page()
    tree = page.split("## The tree", 1)[1].split("## Errors", 1)[0]
    errors = [
        n
        for n in clusterbook.__all__
        if isinstance(getattr(clusterbook, n), type)
        and issubclass(getattr(clusterbook, n), ClusterError)
    ]
    for name in errors:
        assert f"`{name} <clusterbook.{name}>`" in tree, name
    # Nested as the classes are: JobFailedError under JobError.
    job_error = tree.index("`JobError <")
    failed = tree.index("`JobFailedError <")
    indent = tree[: tree.index("- {py:exc}`JobFailedError")].rsplit("\n", 1)[1]
    assert failed > job_error
    assert len(indent) > len(tree[: tree.index("- {py:exc}`JobError")].rsplit("\n", 1)[1])


def test_the_command_page_has_every_subcommand() -> None:
    page = _reference().cli_page()
    for command in ("demo", "run", "ls", "status", "scale", "worker join", "export mpijob"):
        assert f"## `clusterbook {command}`" in page, command
    assert "## `clusterbook`\n" in page


def test_every_benchmark_and_its_figures_are_on_the_benchmarks_page() -> None:
    page = _reference().benchmarks_page()
    for path in (REPO / "benchmarks").glob("*.py"):
        assert f"## `{path.name}`" in page
    for path in (REPO / "benchmarks" / "results").glob("*.log"):
        assert f"benchmarks/results/{path.name}" in page
