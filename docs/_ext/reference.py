"""The reference pages, generated from the code when the build starts (into
``reference/generated/``, which git ignores): the public names of ``clusterbook`` and
``clusterbook_widgets`` (their docstrings, through autodoc), the ``clusterbook`` command (its
parser's help, command by command) and the error tree (``ClusterError`` and
its subclasses, and the warnings)."""

from __future__ import annotations

import argparse
import ast
import inspect
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parents[1]
REPO = DOCS.parent
OUT = DOCS / "reference" / "generated"
VARIABLE = re.compile(r"CLUSTERBOOK_[A-Z0-9_]*[A-Z0-9]")


def _first_line(obj: object) -> str:
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _is_error(obj: object) -> bool:
    return isinstance(obj, type) and issubclass(obj, (BaseException, Warning))


def api_page(module_name: str, title: str, intro: str) -> str:
    """A page of every name in ``module_name.__all__`` but its errors and warnings."""
    module = __import__(module_name)
    lines = [f"# {title}", "", intro, ""]
    for name in module.__all__:
        obj = getattr(module, name)
        if _is_error(obj):
            continue
        target = f"{module_name}.{name}"
        # autodoc writes reStructuredText: MyST reads it in eval-rst blocks.
        if isinstance(obj, type):
            directive = [f".. autoclass:: {target}", "   :members:", "   :inherited-members:"]
        elif callable(obj):
            directive = [f".. autofunction:: {target}"]
        else:
            directive = [f".. autodata:: {target}", "   :annotation:"]
        lines += ["```{eval-rst}", *directive, "```", ""]
    return "\n".join(lines)


def _tree(cls: type, names: set[str], depth: int) -> Iterator[str]:
    for sub in sorted(cls.__subclasses__(), key=lambda c: c.__name__):
        if sub.__name__ in names:
            yield f"{'  ' * depth}- {{py:exc}}`{sub.__name__} <clusterbook.{sub.__name__}>`: " + (
                _first_line(sub)
            )
            yield from _tree(sub, names, depth + 1)


def errors_page() -> str:
    """The error tree, then each error and warning with its docstring."""
    import clusterbook
    from clusterbook.errors import ClusterError

    public = {n for n in clusterbook.__all__ if _is_error(getattr(clusterbook, n))}
    errors = sorted(n for n in public if issubclass(getattr(clusterbook, n), ClusterError))
    warnings = sorted(public - set(errors))
    lines = [
        "# Errors and warnings",
        "",
        "Every error clusterbook raises is a `ClusterError`; its message names the value, the",
        "rule and the fix. Catch `ClusterError` for all of them, or the subclass you handle.",
        "",
        "## The tree",
        "",
        "- {py:exc}`ClusterError <clusterbook.ClusterError>`: " + _first_line(ClusterError),
        *_tree(ClusterError, public, 1),
        "",
        "## Errors",
        "",
    ]
    for name in [*errors, "## Warnings", *warnings]:
        if name.startswith("#"):
            lines += [name, ""]
        else:
            lines += ["```{eval-rst}", f".. autoexception:: clusterbook.{name}", "```", ""]
    return "\n".join(lines)


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:  # argparse keeps its subcommands there, and only there
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases map to one parser
                yield from _commands(sub)


def cli_page() -> str:
    """Each command's ``--help``, as its parser writes it."""
    from clusterbook.cli.main import _parser

    lines = [
        "# The `clusterbook` command",
        "",
        "`clusterbook` (also `python -m clusterbook`) runs jobs, lists and reaches clusters,",
        "and joins workers, from a terminal. Each command's `--help`, as its parser writes it:",
        "",
    ]
    for parser in _commands(_parser()):
        text = parser.format_help().replace("```", "'''")
        lines += [f"## `{parser.prog}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def benchmarks_page() -> str:
    """Each benchmark: what it measures (its docstring) and how to run it; then the figures
    kept in benchmarks/results."""
    lines = [
        "# Benchmarks",
        "",
        "Each script in `benchmarks/` runs clusterbook and what it is compared with side by",
        "side, in one run, and prints both (the machine's speed changes from day to day: compare",
        "only figures from one run). Run one from a checkout with its venv, as",
        "`.venv/bin/python benchmarks/NAME.py --help` says; how to read them, and the figures",
        "measured while building clusterbook, are in",
        "[development's Benchmarks](../../development.md#benchmarks).",
        "",
    ]
    for path in sorted((REPO / "benchmarks").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        lines += [
            f"## `{path.name}`",
            "",
            doc,
            "",
            "```sh",
            f".venv/bin/python benchmarks/{path.name}",
            "```",
            "",
        ]
    lines += ["## Figures kept", ""]
    for path in sorted((REPO / "benchmarks" / "results").glob("*.log")):
        lines += [
            f"### `{path.name}`",
            "",
            f"```{{literalinclude}} ../../../benchmarks/results/{path.name}",
            ":language: text",
            "```",
            "",
        ]
    return "\n".join(lines)


PAGES: dict[str, Any] = {
    "api.md": lambda: api_page(
        "clusterbook",
        "`clusterbook`",
        "The public names of the core: `import clusterbook as cb`. Its errors are on "
        "[their own page](errors.md).",
    ),
    "widgets.md": lambda: api_page(
        "clusterbook_widgets",
        "`clusterbook_widgets`",
        "The Jupyter layer: the cluster widget, the log viewer, the magics' extension.",
    ),
    "errors.md": errors_page,
    "cli.md": cli_page,
    "benchmarks.md": benchmarks_page,
}


def write_pages(app: Any = None) -> None:
    """Write the generated pages, leaving a page whose text did not change untouched (so
    Sphinx does not rebuild it)."""
    OUT.mkdir(parents=True, exist_ok=True)
    for name, make in PAGES.items():
        path, text = OUT / name, make()
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", write_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
