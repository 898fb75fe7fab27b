"""Notebooks run once per session and shared by the tests that read them."""

from __future__ import annotations

from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import require

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
#: Every notebook in notebooks/, so that a new one is executed without being listed here.
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


@pytest.fixture(scope="session")
def runner() -> ModuleType:
    """The notebook runner (it needs nbclient, nbformat and ipykernel)."""
    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if find_spec(m) is None]
    require(not missing, f"{', '.join(missing)} not installed (pip install -e '.[jupyter,test]')")
    from tests.notebooks import runner

    return runner


@pytest.fixture(scope="session")
def executed(
    runner: ModuleType, openmpi_python: str, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], object]:
    """``executed(name)``: the notebook ``name`` run once this session (a failure to run is
    raised again to every test that asks)."""
    done: dict[str, object] = {}

    def get(name: str) -> object:
        if name not in done:
            workdir = tmp_path_factory.mktemp(Path(name).stem)
            try:
                done[name] = runner.execute(NOTEBOOKS / name, workdir)
            except Exception as exc:
                done[name] = exc
        result = done[name]
        if isinstance(result, Exception):
            raise result
        return result

    return get
