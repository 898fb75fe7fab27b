"""The JupyterLab extension and its server side are installed and enabled: in the test venv
(the editable install and scripts/labextension.sh's build) and in a wheel built from the
checkout, which carries the prebuilt extension and the server's config."""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
JUPYTER = Path(sys.executable).with_name("jupyter")
NAME = "clusterbook-labextension"


def _listed(*args: str) -> str:
    done = subprocess.run(
        [str(JUPYTER), *args], capture_output=True, text=True, timeout=120, check=True
    )
    return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # no colours


def test_jupyterlab_lists_the_extension_enabled() -> None:
    listed = _listed("labextension", "list")
    line = next((ln for ln in listed.splitlines() if NAME in ln), None)
    assert line is not None, f"{NAME} is not installed (bash scripts/labextension.sh):\n{listed}"
    assert "enabled" in line, line
    assert "OK" in line, line


def test_jupyter_server_loads_the_clusters_api() -> None:
    listed = _listed("server", "extension", "list")
    assert re.search(r"clusterbook_widgets\.lab\s+enabled", listed), listed
    assert re.search(r"clusterbook_widgets\.lab\s+OK", listed), listed


def test_the_wheel_carries_the_prebuilt_extension_and_the_server_config(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path), str(REPO)],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("clusterbook-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    data = next(n.split("/")[0] for n in names if n.endswith(".data/data/etc/jupyter/"
                "jupyter_server_config.d/clusterbook.json"))  # fmt: skip
    shared = f"{data}/data/share/jupyter/labextensions/{NAME}"
    assert f"{shared}/package.json" in names
    assert any(n.startswith(f"{shared}/static/remoteEntry.") for n in names), names
