"""The documentation's table of environment variables (docs/reference/environment.md) names
every ``CLUSTERBOOK_*`` variable the code reads or sets, and no other: a variable added to the
code without a row fails here, and so does a row left behind by a variable the code no longer
has."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOTS = (REPO / "sdk", REPO / "widgets")
NAME = re.compile(r"CLUSTERBOOK_[A-Z0-9_]*[A-Z0-9]")


def in_code() -> dict[str, list[str]]:
    """Every variable the code names (source, the rank wrapper's shell, the node program),
    with the files that name it."""
    found: dict[str, list[str]] = {}
    for root in ROOTS:
        for path in sorted(root.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".sh", ".toml", ".json", ".txt"):
                for name in set(NAME.findall(path.read_text(encoding="utf-8"))):
                    found.setdefault(name, []).append(str(path.relative_to(REPO)))
    return found


def in_table(page: str) -> list[str]:
    """The variables of the first column of the page's table (the page's first section)."""
    section = page.split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [name for row in rows for name in NAME.findall(row.split("|")[1])]


def test_the_table_lists_every_variable_the_code_names_and_no_other() -> None:
    code = in_code()
    table = in_table((REPO / "docs" / "reference" / "environment.md").read_text(encoding="utf-8"))
    assert len(table) == len(set(table)), "a variable has two rows"
    missing = {name: files for name, files in code.items() if name not in table}
    assert not missing, f"add a row to docs/reference/environment.md for: {missing}"
    gone = sorted(set(table) - set(code))
    assert not gone, f"docs/reference/environment.md lists what the code no longer has: {gone}"


def test_the_table_is_read_as_it_is_laid_out() -> None:
    page = (
        "# Environment variables\n\n| variable | what | default |\n|---|---|---|\n"
        "| `CLUSTERBOOK_A`, `CLUSTERBOOK_B` | `CLUSTERBOOK_C` is not a row's | x |\n\n"
        "## Next\n| `CLUSTERBOOK_D` | | |\n"
    )
    assert in_table(page) == ["CLUSTERBOOK_A", "CLUSTERBOOK_B"]
