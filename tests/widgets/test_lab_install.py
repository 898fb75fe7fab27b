"""The JupyterLab extension and its server side are installed and enabled: in the test venv
(the editable install and scripts/labextension.sh's build) and in a wheel built from the
checkout, which carries the prebuilt extension and the server's config."""

from __future__ import annotations

import os
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


def _checkout_copy(dest: Path) -> Path:
    """The checkout's tracked files (what a fresh clone has: no extension build) in ``dest``."""
    files = (
        subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, files):
        if (REPO / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes((REPO / name).read_bytes())
    return dest


def test_a_wheel_without_node_and_without_a_build_fails_saying_what_to_install(
    tmp_path: Path,
) -> None:
    clone = _checkout_copy(tmp_path / "clone")
    assert not (clone / "labextension" / "build").exists()
    # This venv's bin first (pip), and no Node.js on the PATH.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "out"), "."],
        cwd=clone,
        env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode != 0, "a wheel without its JupyterLab extension was built"
    said = done.stdout + done.stderr
    assert "needs Node.js and npm" in said, said[-3000:]
    assert "bash scripts/labextension.sh" in said
    assert not list((tmp_path / "out").glob("*.whl"))


def test_a_build_is_taken_only_when_it_is_newer_than_every_source(tmp_path: Path) -> None:
    sys.path.insert(0, str(REPO))
    try:
        from hatch_build import stale
    finally:
        sys.path.remove(str(REPO))
    ext = tmp_path / "labextension"
    (ext / "src").mkdir(parents=True)
    source = ext / "src" / "index.ts"
    source.write_text("export {};\n")
    assert "is missing" in (stale(ext) or "")
    built = ext / "build" / NAME / "package.json"
    built.parent.mkdir(parents=True)
    built.write_text("{}")
    os.utime(source, (1_000, 1_000))
    assert stale(ext) is None
    os.utime(source, None)  # edited after the build
    os.utime(built, (2_000, 2_000))
    assert "is older than the sources" in (stale(ext) or "")
