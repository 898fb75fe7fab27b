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


def test_a_rank_srun_started_gets_them_from_slurms_variables() -> None:
    # srun --mpi=pmix starts Open MPI ranks without OMPI_COMM_WORLD_*: Slurm's say who is
    # who; the local world size is counted in the head's placement.
    slurm = {"SLURM_PROCID": "2", "SLURM_NTASKS": "3", "SLURM_LOCALID": "0"}
    got = run_rank({**slurm, **HEAD, "CLUSTERBOOK_RANK_NODES": "0 0 1"})
    assert got == {
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "NODE_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29611",
    }
    # The launcher's own variables win over Slurm's (a head that runs in a Slurm step).
    assert run_rank({**slurm, **OPENMPI, **HEAD})["RANK"] == "3"


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


# -- each rank's GPU ---------------------------------------------------------------------------

GPU_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LOCAL_RANK")


def rank_gpu(env: dict[str, str]) -> tuple[str | None, ...]:
    argv = [*PRINT[:2], PRINT[2] % (GPU_VARS,)]
    out = subprocess.run(
        wrap_argv(argv), env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    got = eval(out.stdout)  # noqa: S307 - the repr of a dict of strings, printed just above
    return tuple(got[name] for name in GPU_VARS)


def ranks_on(host: int, local_rank: int, launcher: str) -> dict[str, str]:
    """Rank 5 of 8, on host ``host`` (of 0 1 2), with ``local_rank`` there."""
    if launcher == "openmpi":
        return {
            "OMPI_COMM_WORLD_RANK": "5",
            "OMPI_COMM_WORLD_SIZE": "8",
            "OMPI_COMM_WORLD_LOCAL_RANK": str(local_rank),
        }
    return {"PMI_RANK": "5", "PMI_SIZE": "8", "MPI_LOCALRANKID": str(local_rank)}


@pytest.mark.parametrize("launcher", ["openmpi", "mpich"])
@pytest.mark.parametrize(
    ("host", "local_rank", "device"),
    [
        (0, 0, "0"),  # host 0 has GPUs 0-3: local rank i gets GPU i
        (0, 3, "3"),
        (0, 5, "1"),  # more ranks than GPUs: they take them in turn
        (1, 0, None),  # host 1 has none: nothing is set
        (2, 0, "2"),  # host 2's GPUs are 2 and 5 (what its CUDA_VISIBLE_DEVICES left)
        (2, 1, "5"),
        (2, 2, "2"),
    ],
)
def test_each_rank_gets_its_hosts_gpu_by_local_rank(
    launcher: str, host: int, local_rank: int, device: str | None
) -> None:
    env = {
        **ranks_on(host, local_rank, launcher),
        "CLUSTERBOOK_RANK_NODES": " ".join([str(host)] * 8),
        "CLUSTERBOOK_GPUS": "0,1,2,3 - 2,5",
    }
    order = None if device is None else "PCI_BUS_ID"
    assert rank_gpu(env) == (device, order, str(local_rank))


def test_the_jobs_own_cuda_device_order_stays() -> None:
    env = {
        **ranks_on(0, 1, "openmpi"),
        "CLUSTERBOOK_RANK_NODES": "0 0 0 0 0 0 0 0",
        "CLUSTERBOOK_GPUS": "0,1",
        "CUDA_DEVICE_ORDER": "FASTEST_FIRST",
        "CLUSTERBOOK_USER_SET": "CUDA_DEVICE_ORDER",
    }
    assert rank_gpu(env) == ("1", "FASTEST_FIRST", "1")


def test_without_gpus_or_outside_mpi_no_gpu_is_chosen() -> None:
    inherited = {"CUDA_VISIBLE_DEVICES": "7"}  # the head's own, left as it was
    assert rank_gpu({**ranks_on(0, 0, "openmpi"), **HEAD, **inherited})[0] == "7"
    assert rank_gpu({"CLUSTERBOOK_GPUS": "0,1", **HEAD}) == (None, None, None)


def test_master_port_is_asked_of_rank_zeros_node_else_guessed_below_ephemeral_ports() -> None:
    from clusterbook.launch.prepare import _master_port
    from clusterbook.spec import NodeSpec

    node = NodeSpec("n1", "10.0.0.1", 2)
    asked: list[str] = []

    def answers(n: NodeSpec) -> int:
        asked.append(n.name)
        return 45678

    def fails(n: NodeSpec) -> int:
        raise OSError("no route to host")

    assert _master_port(node, answers, local=False) == 45678
    assert asked == ["n1"]
    for ask in (fails, lambda n: None, None):
        assert 20000 <= _master_port(node, ask, local=False) < 32768
    here = _master_port(node, answers, local=True)  # this machine: bound here, not asked
    assert asked == ["n1"]
    assert 0 < here < 65536


def test_a_rank_starts_with_sigusr1_ignored_so_a_warning_while_it_starts_is_not_its_end() -> None:
    """The head's warnings come as SIGUSR1 (a Slurm time limit near, a job's timeout): one
    that reaches a rank before it set a handler (a Slurm allocation requeued and warned again
    as its job resumed did: exit 138) leaves it running."""
    selfish = ["/bin/sh", "-c", "kill -USR1 $$; echo alive"]  # no handler of its own
    out = subprocess.run(wrap_argv(selfish), capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout) == (0, "alive\n"), out.stderr
    handled = [  # a handler of its own still gets the signal
        sys.executable,
        "-c",
        "import os, signal; signal.signal(signal.SIGUSR1, lambda *a: print('warned'));"
        " os.kill(os.getpid(), signal.SIGUSR1)",
    ]
    out = subprocess.run(wrap_argv(handled), capture_output=True, text=True, check=False)
    assert (out.returncode, out.stdout) == (0, "warned\n"), out.stderr
