"""What Slurm, PBS, SageMaker and an MPIJob launcher pod say, read into nodes: each system's
variables and files as it writes them (files under a temporary root, commands through a fake
runner), the order of detection, and the errors when they say something wrong or nothing."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.providers.environment.detect import (
    DETECTION_ORDER,
    Detected,
    choose,
    cluster_spec,
    detect_environment,
    find_environment,
    launch_via,
)
from clusterbook.ssh.hostkeys import fingerprint

SLURM = {
    "SLURM_JOB_ID": "42",
    "SLURM_JOB_NODELIST": "snode[1-2]",
    "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
    "SLURMD_NODENAME": "snode1",
}
PUBLIC = "ecdsa-sha2-nistp521 AAAAE2VjZHNhLXNoYTItbmlzdHA1MjEAAAAIbmlzdHA1MjE= job\n"


class Scontrol:
    """A fake ``scontrol show hostnames``: prints ``hosts`` and records what it was asked."""

    def __init__(self, hosts: Sequence[str] = ("snode1", "snode2")) -> None:
        self.hosts, self.asked = hosts, []  # type: ignore[var-annotated]

    def __call__(self, argv: Sequence[str]) -> str:
        self.asked.append(list(argv))
        return "".join(f"{h}\n" for h in self.hosts)


def no_scontrol(argv: Sequence[str]) -> str:
    raise FileNotFoundError(2, "No such file or directory", argv[0])


def detect(environ: dict[str, str], root: Path | None = None, **kw: object) -> Detected:
    kw.setdefault("runner", no_scontrol)
    return detect_environment(environ=environ, root=root, **kw)  # type: ignore[arg-type]


# -- order ------------------------------------------------------------------------------------


def test_the_order_of_detection_and_how_to_choose() -> None:
    assert DETECTION_ORDER == ("slurm", "pbs", "mpijob", "sagemaker")
    every = {"slurm": "SLURM_JOB_NODELIST", "pbs": "PBS_NODEFILE", "mpijob": "K_MPI_JOB_ROLE",
             "sagemaker": "SM_HOSTS"}  # fmt: skip
    assert choose(every, None) == "slurm"
    assert choose({k: every[k] for k in ("mpijob", "sagemaker", "pbs")}, "auto") == "pbs"
    assert choose({"sagemaker": "SM_HOSTS", "mpijob": "HYDRA_HOST_FILE"}, None) == "mpijob"
    assert choose(every, "sagemaker") == "sagemaker"
    assert choose({}, "pbs") == "pbs"  # forced: read, and its reader says what is missing
    assert choose(every, "none") is None
    assert choose({}, None) is None
    with pytest.raises(cb.ConfigError, match="The kind 'lsf' is not a system clusterbook reads"):
        choose(every, "lsf")


def test_the_variable_chooses_and_none_turns_detection_off(tmp_path: Path) -> None:
    sm = {"SM_HOSTS": '["algo-1"]', "SM_CURRENT_HOST": "algo-1"}
    assert detect({**SLURM, **sm}).kind == "slurm"
    assert detect({**SLURM, **sm, "CLUSTERBOOK_ENVIRONMENT": "sagemaker"}).kind == "sagemaker"
    assert detect({**SLURM, **sm, "CLUSTERBOOK_ENVIRONMENT": "auto"}).kind == "slurm"
    assert find_environment(environ={**SLURM, "CLUSTERBOOK_ENVIRONMENT": "none"}) is None
    with pytest.raises(cb.EnvironmentNotFoundError, match="CLUSTERBOOK_ENVIRONMENT=none"):
        detect({**SLURM, "CLUSTERBOOK_ENVIRONMENT": "none"})


def test_nothing_found_says_what_was_looked_for(tmp_path: Path) -> None:
    assert find_environment(environ={"HOME": "/root"}, root=tmp_path) is None
    with pytest.raises(cb.EnvironmentNotFoundError) as excinfo:
        cb.Cluster.from_environment(environ={"HOME": "/root"}, root=tmp_path)
    message = str(excinfo.value)
    looked = ["SLURM_JOB_NODELIST", "PBS_NODEFILE", "K_MPI_JOB_ROLE", "SM_HOSTS"]
    looked += ["/opt/ml/input/config/resourceconfig.json", "Cluster.from_hostfile"]
    for name in looked:
        assert name in message
    assert isinstance(excinfo.value, cb.ConfigError)


# -- Slurm ------------------------------------------------------------------------------------


def test_slurm_asks_scontrol_to_expand_the_node_list() -> None:
    scontrol = Scontrol(["snode1", "snode2"])
    found = detect(SLURM, runner=scontrol)
    assert scontrol.asked == [["scontrol", "show", "hostnames", "snode[1-2]"]]
    assert found == Detected(
        "slurm",
        (("snode1", 4), ("snode2", 4)),
        "SLURM_JOB_NODELIST='snode[1-2]', SLURM_JOB_CPUS_PER_NODE='4(x2)'",
        current_host="snode1",
        job_id="42",
    )
    assert found.role == "leader"
    assert found.total_slots == 8


def test_without_scontrol_the_list_is_expanded_here() -> None:
    env = {"SLURM_NODELIST": "c[01-03],gpu7", "SLURM_TASKS_PER_NODE": "2(x3),1"}
    assert detect(env).hosts == ["c01:2", "c02:2", "c03:2", "gpu7:1"]


@pytest.mark.parametrize(
    ("extra", "slots"),
    [
        ({}, [4, 4]),
        ({"SLURM_TASKS_PER_NODE": "1,3"}, [1, 3]),
        ({"SLURM_TASKS_PER_NODE": "1,3", "SLURM_NTASKS_PER_NODE": "2"}, [2, 2]),
    ],
)
def test_slurm_slots_tasks_per_node_first(extra: dict[str, str], slots: list[int]) -> None:
    found = detect({**SLURM, **extra})
    assert [s for _, s in found.hosts_with_slots] == slots


def test_slurm_without_counts_gives_one_slot_each() -> None:
    assert detect({"SLURM_JOB_NODELIST": "a,b"}).hosts == ["a:1", "b:1"]


def test_a_node_list_that_does_not_expand() -> None:
    def failing(argv: Sequence[str]) -> str:
        raise subprocess.CalledProcessError(1, argv, "", "scontrol: error: Invalid hostlist\n")

    with pytest.raises(cb.ConfigError) as excinfo:
        detect({"SLURM_JOB_NODELIST": "n[1-"}, runner=failing)
    assert "SLURM_JOB_NODELIST='n[1-' does not expand" in str(excinfo.value)
    assert "Invalid hostlist" in str(excinfo.value)
    with pytest.raises(cb.ConfigError, match=r"SLURM_JOB_NODELIST='n\[1-' has an unclosed"):
        detect({"SLURM_JOB_NODELIST": "n[1-"})


def test_counts_that_do_not_fit_the_nodes() -> None:
    with pytest.raises(cb.ConfigError, match="gives 3 counts for 2 nodes"):
        detect({**SLURM, "SLURM_JOB_CPUS_PER_NODE": "4(x3)"})
    with pytest.raises(cb.ConfigError, match="SLURM_JOB_CPUS_PER_NODE='four'"):
        detect({**SLURM, "SLURM_JOB_CPUS_PER_NODE": "four"})


# -- PBS --------------------------------------------------------------------------------------


def test_pbs_nodefile_lists_a_host_once_per_slot(tmp_path: Path) -> None:
    nodefile = tmp_path / "var/spool/pbs/aux/7.server"
    nodefile.parent.mkdir(parents=True)
    nodefile.write_text("cn01\ncn01\ncn01\ncn02\ncn02\ncn02\n")
    env = {"PBS_NODEFILE": "/var/spool/pbs/aux/7.server", "PBS_JOBID": "7.server"}
    found = detect(env, tmp_path)
    assert (found.kind, found.hosts, found.job_id) == ("pbs", ["cn01:3", "cn02:3"], "7.server")


def test_pbs_nodefile_missing_or_bad(tmp_path: Path) -> None:
    with pytest.raises(cb.ConfigError, match="Cannot read the PBS nodefile '/nope'"):
        detect({"PBS_NODEFILE": "/nope"}, tmp_path)
    (tmp_path / "nf").write_text("cn01\ncn 02\n")
    with pytest.raises(cb.ConfigError, match="PBS nodefile '/nf' line 2: 'cn 02'"):
        detect({"PBS_NODEFILE": "/nf"}, tmp_path)


# -- SageMaker --------------------------------------------------------------------------------


def test_sagemaker_variables_algo_1_leads() -> None:
    env = {"SM_HOSTS": '["algo-1","algo-2"]', "SM_CURRENT_HOST": "algo-1", "SM_NUM_GPUS": "0",
           "SM_NUM_CPUS": "8", "TRAINING_JOB_NAME": "tj"}  # fmt: skip
    found = detect(env)
    assert found.hosts == ["algo-1:8", "algo-2:8"]
    assert (found.leader, found.role, found.job_id) == ("algo-1", "leader", "tj")
    assert detect({**env, "SM_NUM_GPUS": "4"}).hosts == ["algo-1:4", "algo-2:4"]
    worker = detect({**env, "SM_CURRENT_HOST": "algo-2"})
    assert worker.role == "worker"
    with pytest.raises(cb.WorkerHostError) as excinfo:
        cb.Cluster.from_environment(environ={**env, "SM_CURRENT_HOST": "algo-2"})
    assert "This host (algo-2) is a worker of the sagemaker job" in str(excinfo.value)
    assert "built on algo-1" in str(excinfo.value)
    assert "run clusterbook worker serve (or cb.serve_worker())" in str(excinfo.value)


def test_sagemaker_resource_config(tmp_path: Path) -> None:
    config = tmp_path / "opt/ml/input/config/resourceconfig.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"current_host": "algo-1", "hosts": ["algo-1", "algo-2"],
                                  "network_interface_name": "eth0"}))  # fmt: skip
    found = detect({}, tmp_path)
    assert (found.kind, found.hosts, found.current_host) == (
        "sagemaker",
        ["algo-1:1", "algo-2:1"],
        "algo-1",
    )
    config.write_text('{"current_host": "algo-1", "hosts": []}')
    with pytest.raises(cb.ConfigError, match="'hosts' in /opt/ml/input/config/resourceconfig"):
        detect({}, tmp_path)
    with pytest.raises(cb.ConfigError, match=r"SM_HOSTS='algo-1' is not JSON"):
        detect({"SM_HOSTS": "algo-1"})


# -- MPIJob launcher --------------------------------------------------------------------------


def launcher_pod(root: Path, hostfile: str, mount: str = "/root/.ssh") -> None:
    (root / "etc/mpi").mkdir(parents=True)
    (root / "etc/mpi/hostfile").write_text(hostfile)
    keys = root / mount.lstrip("/")
    keys.mkdir(parents=True)
    (keys / "id_rsa").write_text("-----BEGIN EC PRIVATE KEY-----\n")
    (keys / "id_rsa.pub").write_text(PUBLIC)


def test_mpijob_launcher_open_mpi(tmp_path: Path) -> None:
    launcher_pod(
        tmp_path, "pi-worker-0.pi.default.svc slots=2\npi-worker-1.pi.default.svc slots=2\n"
    )
    env = {"K_MPI_JOB_ROLE": "launcher", "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
           "OMPI_MCA_orte_keep_fqdn_hostnames": "true", "HOSTNAME": "pi-launcher"}  # fmt: skip
    found = detect(env, tmp_path)
    hosts = ["pi-worker-0.pi.default.svc", "pi-worker-1.pi.default.svc"]
    assert found.hosts == [f"{h}:2" for h in hosts]
    assert (found.kind, found.mpi, found.role) == ("mpijob", "openmpi", "leader")
    pinned = fingerprint(PUBLIC.split()[1])
    assert found.ssh == {
        "identity": str(tmp_path / "root/.ssh/id_rsa"),
        "host_keys": {h: pinned for h in hosts},
    }


def test_mpijob_launcher_mpich_at_another_mount(tmp_path: Path) -> None:
    launcher_pod(tmp_path, "job-worker-0.job.ns.svc:4\n", mount="/mnt/ssh")
    env = {"K_MPI_JOB_ROLE": "launcher", "HYDRA_HOST_FILE": "/etc/mpi/hostfile",
           "CLUSTERBOOK_SSH_AUTH_MOUNT_PATH": "/mnt/ssh"}  # fmt: skip
    found = detect(env, tmp_path)
    assert (found.hosts, found.mpi) == (["job-worker-0.job.ns.svc:4"], "mpich")
    assert found.ssh["identity"] == str(tmp_path / "mnt/ssh/id_rsa")
    spec = cluster_spec(found, {"port": 2222, "identity": None, "name": "j"})
    assert spec == {"kind": "ssh", "hosts": ["job-worker-0.job.ns.svc:4"], "mpi": "mpich",
                    **found.ssh, "port": 2222, "name": "j"}  # fmt: skip


def test_an_mpijob_worker_pod_is_a_worker(tmp_path: Path) -> None:
    launcher_pod(tmp_path, "w-0.j.ns.svc slots=1\n")
    found = detect({"K_MPI_JOB_ROLE": "worker", "HOSTNAME": "j-worker-0"}, tmp_path)
    assert found.role == "worker"
    with pytest.raises(cb.WorkerHostError, match=r"This host \(j-worker-0\) is a worker"):
        cluster_spec(found, {})


def test_an_mpijob_hostfile_with_a_bad_line(tmp_path: Path) -> None:
    launcher_pod(tmp_path, "w-0.j.ns.svc slots=1\nw-1.j.ns.svc slots=one\n")
    with pytest.raises(cb.ConfigError, match="MPIJob hostfile '/etc/mpi/hostfile' line 2"):
        detect({"K_MPI_JOB_ROLE": "launcher"}, tmp_path)


# -- the cluster ------------------------------------------------------------------------------


def test_from_environment_makes_an_ssh_cluster_options_win(tmp_path: Path) -> None:
    # No srun on the environment's PATH: mpirun over ssh.
    cluster = cb.Cluster.from_environment(environ=SLURM, runner=Scontrol(), name="alloc")
    assert (cluster.kind, cluster.name) == ("ssh", "alloc")
    assert [(n.host, n.slots) for n in cluster.nodes] == [("snode1", 4), ("snode2", 4)]
    fewer = cb.Cluster.from_environment("slurm", slots=1, environ=SLURM, runner=Scontrol())
    assert fewer.total_slots == 2
    with pytest.raises(cb.ConfigError, match="slots must be >= 1"):
        cb.Cluster.from_environment(slots=0, environ=SLURM, runner=Scontrol())


def _with_srun(tmp_path: Path) -> dict[str, str]:
    """:data:`SLURM` with an ``srun`` on its PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "srun").chmod(0o755)
    return {**SLURM, "PATH": str(bin_dir)}


def test_inside_a_slurm_allocation_with_srun_jobs_are_its_steps(tmp_path: Path) -> None:
    environ = _with_srun(tmp_path)
    cluster = cb.Cluster.from_environment(environ=environ, runner=Scontrol(), name="alloc")
    assert (cluster.kind, cluster.name) == ("srun", "alloc")
    assert cluster._provider.job_id == "42"  # type: ignore[attr-defined]
    assert [(n.host, n.slots) for n in cluster.nodes] == [("snode1", 4), ("snode2", 4)]
    # An SSH option given means ssh; so does via="ssh".
    given = cb.Cluster.from_environment(environ=environ, runner=Scontrol(), port=2222)
    assert given.kind == "ssh"
    assert cb.Cluster.from_environment(environ=environ, runner=Scontrol(), via="ssh").kind == "ssh"


def test_via_srun_where_it_cannot_be(tmp_path: Path) -> None:
    with pytest.raises(cb.ConfigError, match="via='srun': Slurm's srun is not on PATH here"):
        cb.Cluster.from_environment(environ=SLURM, runner=Scontrol(), via="srun")
    environ = _with_srun(tmp_path)
    with pytest.raises(cb.ConfigError, match="port=22 is an option of clusters reached over ssh"):
        cb.Cluster.from_environment(environ=environ, runner=Scontrol(), via="srun", port=22)
    with pytest.raises(cb.ConfigError, match="via='mpirun' is not a way to start jobs"):
        cb.Cluster.from_environment(environ=environ, runner=Scontrol(), via="mpirun")
    nodefile = tmp_path / "var/spool/pbs/aux/7"
    nodefile.parent.mkdir(parents=True)
    nodefile.write_text("cn01\n")
    found = detect({"PBS_NODEFILE": "/var/spool/pbs/aux/7", "PBS_JOBID": "7"}, tmp_path)
    with pytest.raises(cb.ConfigError, match="but the nodes are a pbs job's"):
        launch_via(found, "srun", {}, srun_found=True)
    assert launch_via(found, None, {}, srun_found=True) == "ssh"


def test_a_kind_asked_for_whose_variable_is_unset() -> None:
    with pytest.raises(cb.ConfigError, match="SLURM_JOB_NODELIST is not set, so there are no"):
        detect({}, kind="slurm")
    with pytest.raises(cb.ConfigError, match="PBS_NODEFILE is not set"):
        detect({"CLUSTERBOOK_ENVIRONMENT": "pbs"})
