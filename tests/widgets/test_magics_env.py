"""``%cluster env``: the nodes of the system the kernel runs in, or a clear word why not."""

from __future__ import annotations

import pytest
from IPython.utils.capture import capture_output

from clusterbook_widgets.magics import ClusterMagics
from tests.widgets import test_magics

ip, magics = test_magics.ip, test_magics.magics  # the fixtures of the %cluster tests

SYSTEM_VARS = ("SLURM_JOB_NODELIST", "SLURM_NODELIST", "PBS_NODEFILE", "K_MPI_JOB_ROLE",
               "OMPI_MCA_orte_default_hostfile", "HYDRA_HOST_FILE", "SM_HOSTS")  # fmt: skip


def test_env_via_srun_outside_slurm_says_so_as_the_magic_spells_it(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    for name in SYSTEM_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("CLUSTERBOOK_ENVIRONMENT", raising=False)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("cn01\ncn01\n")
    monkeypatch.setenv("PBS_NODEFILE", str(nodefile))
    with capture_output() as out:
        ip.run_line_magic("cluster", "env --via srun")
    assert out.stderr.startswith(
        "%cluster: --via srun starts jobs as steps of a Slurm allocation, but the nodes are a "
        "pbs job's"
    )
    assert out.stderr.rstrip().endswith("use --via ssh.")
    assert magics.cluster is None


def test_env_outside_any_system_says_what_it_looked_for(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    for name in SYSTEM_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLUSTERBOOK_ENVIRONMENT", "none")
    with capture_output() as out:
        ip.run_line_magic("cluster", "env")
    assert out.stderr.startswith("%cluster: No scheduler or launcher environment was found")
    assert "SLURM_JOB_NODELIST" in out.stderr
    assert "Traceback" not in out.stderr
    assert magics.cluster is None


def test_env_on_a_sagemaker_worker_host_says_it_is_one(
    ip, magics: ClusterMagics, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("CLUSTERBOOK_ENVIRONMENT", raising=False)
    monkeypatch.setenv("SM_HOSTS", '["algo-1", "algo-2"]')
    monkeypatch.setenv("SM_CURRENT_HOST", "algo-2")
    with capture_output() as out:
        ip.run_line_magic("cluster", "env sagemaker")
    assert out.stderr.startswith("%cluster: This host (algo-2) is a worker of the sagemaker job")
    assert magics.cluster is None
