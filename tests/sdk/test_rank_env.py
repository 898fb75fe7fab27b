"""The rank wrapper gives every rank torch.distributed's variables, from the launcher's own:
run with a real /bin/sh and the variables Open MPI or MPICH would set."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusterbook.launch.command import TORCH_ENV, host_ranks, master_addr
from clusterbook.launch.rankwrap import wrap_argv
from clusterbook.spec import NodeSpec

PRINT = [sys.executable, "-c", "import os; print(repr({k: os.environ.get(k) for k in %r}))"]

OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
}
MPICH = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"}
HEAD = {
    "CLUSTERBOOK_RANK_NODES": "0 0 1 1",
    "CLUSTERBOOK_MASTER_ADDR": "10.0.0.1",
    "CLUSTERBOOK_MASTER_PORT": "29611",
}


def run_rank(env: dict[str, str]) -> dict[str, str | None]:
    argv = [*PRINT[:2], PRINT[2] % (TORCH_ENV,)]
    out = subprocess.run(
        wrap_argv(argv), env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return eval(out.stdout)  # noqa: S307 - the repr of a dict of strings, printed just above


@pytest.mark.parametrize("launcher", [OPENMPI, MPICH], ids=["openmpi", "mpich"])
def test_every_rank_gets_torch_distributed_variables(launcher: dict[str, str]) -> None:
    assert run_rank({**launcher, **HEAD}) == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29611",
    }


def test_what_the_job_set_stays_what_the_head_inherited_does_not() -> None:
    got = run_rank(
        {
            **OPENMPI,
            **HEAD,
            "MASTER_PORT": "40000",  # the job's env=
            "CLUSTERBOOK_USER_SET": "MASTER_PORT",
            "RANK": "99",  # left over in the head's environment: wrong for this rank
        }
    )
    assert got["MASTER_PORT"] == "40000"
    assert got["RANK"] == "3"


def test_outside_mpi_nothing_is_set() -> None:
    assert set(run_rank(HEAD).values()) == {None}


def test_host_of_each_rank_follows_the_hostfile() -> None:
    nodes = (NodeSpec("a", "h1", 2), NodeSpec("b", "h2", 1), NodeSpec("c", "h1", 1))
    # h1 has 3 slots (a and c together, as the hostfile says), h2 has 1; then it wraps.
    assert host_ranks(nodes, 6) == [0, 0, 0, 1, 0, 0]
    assert master_addr(nodes) == "h1"
    assert master_addr((NodeSpec("l", "localhost", 4),)) == "127.0.0.1"
