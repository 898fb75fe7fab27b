"""What a user installs: the license, the version, the extras and the project's addresses, as
pyproject.toml declares them and as the installed package's metadata says them."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import clusterbook
from clusterbook.version import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def test_the_license_file_is_the_bsd_3_clause_license_the_metadata_names() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("BSD 3-Clause License\n")
    assert "Neither the name of the copyright holder" in text
    assert PROJECT["license"] == "BSD-3-Clause"
    assert PROJECT["license-files"] == ["LICENSE"]
    assert metadata.metadata("clusterbook")["License-Expression"] == "BSD-3-Clause"


def test_the_module_the_command_and_the_metadata_say_one_version() -> None:
    assert "version" in PROJECT["dynamic"]  # read from clusterbook/version.py, written once
    assert "version" not in PROJECT
    assert clusterbook.__version__ == __version__ == metadata.version("clusterbook")
    proc = subprocess.run(
        [sys.executable, "-m", "clusterbook", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout == f"clusterbook {__version__}\n"


def test_users_extras_hold_no_test_tools_and_all_is_what_a_user_wants() -> None:
    extras = PROJECT["optional-dependencies"]
    assert extras["all"] == ["clusterbook[jupyter,openmpi,remote]"]
    assert {"test", "torch"}.isdisjoint(extras)
    developer = {"torch", "pytest", "ruff", "mypy", "playwright", "sphinx", "myst-nb"}
    for name, requirements in extras.items():
        if name == "dev":
            continue
        named = {r.split(";")[0].split("[")[0].split(">")[0].split("=")[0] for r in requirements}
        assert not named & developer, f"the {name} extra holds {named & developer}"
    dev = " ".join(extras["dev"])
    assert all(tool in dev for tool in developer)


def test_the_project_urls_use_the_readmes_placeholder_address() -> None:
    urls = dict(
        u.split(", ", 1) for u in metadata.metadata("clusterbook").get_all("Project-URL") or []
    )
    assert set(urls) >= {"Homepage", "Documentation", "Source", "Issues"}
    assert urls["Source"] == "https://github.com/OWNER/REPO"
    # The Binder badge names the same repository.
    assert "mybinder.org/v2/gh/OWNER/REPO/" in (ROOT / "README.md").read_text(encoding="utf-8")
    assert any(c.startswith("Framework :: Jupyter") for c in PROJECT["classifiers"])
