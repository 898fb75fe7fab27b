"""Notebooks run once per session and shared by the tests that read them.

As root they run as a Binder user made for the session (:mod:`tests.notebooks.binder`: uid
1000, a home of its own, no sudo); otherwise as the user running the tests, who is not root
either. Either way, the way Binder runs them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from importlib.util import find_spec
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import require
from tests.notebooks.binder import make_binder_user
from tests.users import LocalUser, UserError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
#: Where each executed notebook is kept (to read its outputs after a failure, and for CI).
EXECUTED = Path(os.environ.get("CLUSTERBOOK_ARTIFACTS") or REPO / "test-artifacts") / "notebooks"
#: Every notebook in notebooks/, so that a new one is executed without being listed here
#: (notebooks in its folders are companions their tutorial runs).
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
#: The companions: notebooks a tutorial runs, or a reader opens beside it.
COMPANIONS = sorted(str(p.relative_to(NOTEBOOKS)) for p in NOTEBOOKS.glob("*/*.ipynb"))


@pytest.fixture(scope="session")
def runner() -> ModuleType:
    """The notebook runner (it needs nbclient, nbformat and ipykernel)."""
    missing = [m for m in ("nbclient", "nbformat", "ipykernel") if find_spec(m) is None]
    require(not missing, f"{', '.join(missing)} not installed (pip install -e '.[jupyter,dev]')")
    from tests.notebooks import runner

    return runner


@pytest.fixture(scope="session")
def binder_user() -> Iterator[LocalUser]:
    """The unprivileged user the notebooks run as (removed, with what it left, at the end)."""
    try:
        user = make_binder_user()
    except UserError as exc:
        pytest.fail(str(exc))
    try:
        yield user
    finally:
        user.close()


@pytest.fixture(scope="session")
def executed(
    runner: ModuleType,
    openmpi_python: str,
    binder_user: LocalUser,
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], object]:
    """``executed(name)``: the notebook ``name`` run once this session, as the Binder user (a
    failure to run is raised again to every test that asks)."""
    done: dict[str, object] = {}

    def get(name: str) -> object:
        if name not in done:
            if binder_user.made:
                workdir = binder_user.root / Path(name).stem
                workdir.mkdir()
            else:
                workdir = tmp_path_factory.mktemp(Path(name).stem)
            try:
                if binder_user.made:
                    done[name] = runner.execute_as(binder_user, NOTEBOOKS / name, workdir)
                else:
                    done[name] = runner.execute(NOTEBOOKS / name, workdir)
            except Exception as exc:
                done[name] = exc
            finally:
                _keep(workdir / f"executed-{name}")
        result = done[name]
        if isinstance(result, Exception):
            raise result
        return result

    return get


def _keep(path: Path) -> None:
    if path.exists():
        EXECUTED.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, EXECUTED / path.name)
