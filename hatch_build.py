"""The wheel's JupyterLab extension: built from ``labextension/`` when the build is missing or
older than its sources, so that a wheel never leaves without it.

``scripts/labextension.sh`` builds it for a checkout's venv (and CI); this hook does the same
build for ``pip install .`` / ``pip wheel .`` / ``python -m build`` (Node.js and npm needed
then), and fails the wheel, saying what to install, where it cannot. An editable install
skips it: the venv loads the checkout's build through the link that script makes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

NAME = "clusterbook-labextension"
SOURCES = ("src", "style", "package.json", "package-lock.json", "tsconfig.json")


def _newest(paths: list[Path]) -> float:
    stamps = [p.stat().st_mtime for p in paths if p.is_file()]
    for root in (p for p in paths if p.is_dir()):
        stamps += [f.stat().st_mtime for f in root.rglob("*") if f.is_file()]
    return max(stamps, default=0.0)


def stale(ext: Path) -> str | None:
    """Why the build in ``ext/build`` cannot go into a wheel as it is; None when it can."""
    built = ext / "build" / NAME / "package.json"
    if not built.is_file():
        return f"{built} is missing"
    if _newest([ext / s for s in SOURCES]) > built.stat().st_mtime:
        return f"{built} is older than the sources in {ext}"
    return None


class LabExtensionHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        ext = Path(self.root) / "labextension"
        why = stale(ext)
        if why is None:
            return
        missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
        if missing:
            raise RuntimeError(
                f"clusterbook's wheel carries its JupyterLab extension, and {why}; building it "
                f"needs Node.js and npm ({' and '.join(missing)} not found on PATH). Install "
                "Node.js >= 18 with npm (apt-get install nodejs npm), or build it first where "
                "they are with `bash scripts/labextension.sh`, then build the wheel again."
            )
        env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        }
        for argv in (
            ["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            ["npx", "tsc"],
            [sys.executable, "-m", "jupyterlab.labextensions", "build", "."],
        ):
            subprocess.run(argv, cwd=ext, env=env, check=True)
        if (why := stale(ext)) is not None:
            raise RuntimeError(f"The JupyterLab extension's build did not give a wheel's: {why}.")
