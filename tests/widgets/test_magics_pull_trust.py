"""``%%mpirun --pull`` runs no code in the kernel that the ranks' side hands it, with real MPI
and a real second user: a rank whose value would run code when unpickled (what a compromised
node would write), and a value another local user plants where the cell's values go. Either
would leave a mark holding the pid of the process it ran in; the kernel's must never appear."""

from __future__ import annotations

import os
import pickle
from collections.abc import Iterator
from pathlib import Path

import pytest
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython
from IPython.utils.capture import capture_output

import clusterbook as cb
from clusterbook_widgets.cell_job import CellError
from clusterbook_widgets.magics import ClusterMagics
from tests.users import LocalUser

pytestmark = pytest.mark.mpi


def marking(mark: Path) -> str:
    """Source that writes this process's pid to ``mark``."""
    return f"open({str(mark)!r}, 'w').write(str(__import__('os').getpid()))"


@pytest.fixture(scope="module")
def ip():  # type: ignore[no-untyped-def]
    return start_ipython() or get_ipython()


@pytest.fixture
def magics(ip) -> Iterator[ClusterMagics]:  # type: ignore[no-untyped-def]
    m = ClusterMagics(ip)
    ip.register_magics(m)
    yield m
    m.stop_cluster()


def test_a_rank_whose_value_would_run_code_in_the_kernel_is_refused(
    ip, magics: ClusterMagics, openmpi_python: str, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    mark = tmp_path / "mark"
    magics.cluster = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=tmp_path / "run")
    magics.cluster.start()
    ip.user_ns.pop("y", None)
    cell = (
        "class Evil:\n"
        "    def __reduce__(self):\n"
        f"        return (exec, ({marking(mark)!r},))\n"
        "from mpi4py import MPI\n"
        "y = Evil() if MPI.COMM_WORLD.rank == 1 else 'fine'\n"
    )
    with capture_output(), pytest.raises(CellError) as raised:
        ip.run_cell_magic("mpirun", "-n 2 --pull y", cell)
    assert not mark.exists()  # not in the kernel (nor anywhere)
    assert "y" not in ip.user_ns
    said = str(raised.value)
    assert said.startswith(
        "--pull y: rank 1's value is not plain data (it names builtins.exec): loading it would "
        "run code in this kernel"
    )
    assert said.endswith("y not set.")


PLANT = """\
import os, sys
cells, planted = sys.argv[1], bytes.fromhex(sys.argv[2])
if sys.argv[3] == "before":  # a directory of this user's where the cluster keeps its cells
    os.mkdir(cells)
    os.chmod(cells, 0o777)
    sys.exit(0)
# While the cell runs: its directory moved aside, one of ours in its place, with a value in it.
os.rename(os.path.join(cells, "cell-0001"), os.path.join(cells, "taken"))
pull = os.path.join(cells, "cell-0001", "pull")
os.makedirs(pull)
for d in (pull, os.path.dirname(pull)):
    os.chmod(d, 0o777)
with open(os.path.join(pull, "rank-0.pkl"), "wb") as f:
    f.write(planted)
"""


@pytest.mark.root
def test_a_value_another_user_plants_where_the_cells_go_never_runs_in_the_kernel(
    ip, magics: ClusterMagics, openmpi_python: str, other_user: LocalUser, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A run directory everyone may write in (sticky, as /tmp), where the other user made the
    cells' directory first, with a value of its own in it: the cluster does not start there at
    all (its directory would be someone else's to change), so no cell runs and nothing the
    other user put there is read. (Should a cells' directory be someone else's anyway, the
    cell refuses it: tests/widgets/test_pulled.py.)"""
    shared = other_user.root / f"shared-{os.getpid()}"
    shared.mkdir()
    shared.chmod(0o1777)
    mark = tmp_path / "mark"
    planted = pickle.dumps(type("Evil", (), {"__reduce__": lambda _: (exec, (marking(mark),))})())
    cells = shared / "cells"
    done = other_user.run_python(PLANT, str(cells), planted.hex(), "before")
    assert done.returncode == 0, done.stderr
    ip.user_ns.pop("y", None)
    magics.cluster = cb.Cluster.local(1, 2, python=openmpi_python, run_dir=shared)
    with pytest.raises(cb.UnsafePathError, match=f"{shared} is writable by other users"):
        magics.cluster.start()
    assert magics.cluster.state == "created"
    assert not mark.exists()
