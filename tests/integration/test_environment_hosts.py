"""Clusters of the nodes a system gives, on fake hosts: each system's files and variables as it
writes them (a PBS nodefile, SageMaker's SM_HOSTS and resourceconfig.json, an MPIJob launcher's
/etc/mpi/hostfile and key mount), then a real MPI job across the hosts they name.

The systems name hosts (``cn1``, ``algo-1``, ``job-worker-0.job.default.svc``) that this
machine's resolver does not know: an ssh config maps them onto the fake hosts for the PBS and
SageMaker clusters, and the MPIJob's pods get an ``/etc/hosts`` of their own, as a cluster's DNS
would answer them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.export.mpijob import HOSTFILE, SSH_PORT, render_mpijob
from tests.integration.test_mpijob_pods import (
    HOME,
    SDK,
    container,
    job_key,
    mount_points,
    pod_binds,
    start_pod,
    stop,
    wait_for_port,
)
from tests.testbed import FakeHost, Testbed
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

WHERE = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()}", flush=True)
"""


def aliases(
    bed: Testbed, names: list[str], path: Path, ports: dict[str, int] | None = None
) -> Path:
    """An ssh config that sends ``names`` to the first fake hosts, as their DNS would (to
    another port than sshd's 22 for those in ``ports``)."""
    hosts = bed.hosts[: len(names)]
    port = ports or {}
    lines = [
        f"Host {name}\n  HostName {h.addr}\n" + (f"  Port {port[name]}\n" if name in port else "")
        for name, h in zip(names, hosts, strict=True)
    ]
    path.write_text("".join(lines) + f"Host *\n  User root\n  IdentityFile {bed.identity}\n")
    return path


def ranks_where(cluster: cb.Cluster, tmp_path: Path, np: int) -> list[str]:
    script = tmp_path / "where.py"
    script.write_text(WHERE)
    cluster.put(script)
    job = cluster.mpirun(["python", str(script)], np=np, timeout=60)
    job.wait(timeout=90).check()
    return list(job.logs().query("rank >= 0").sort_values("rank")["line"])


def test_a_pbs_job_runs_on_the_hosts_of_its_nodefile(
    testbed: Testbed, openmpi_python: str, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    nodefile = root / "var/spool/pbs/aux/17.pbs01"
    nodefile.parent.mkdir(parents=True)
    nodefile.write_text("cn1\ncn1\ncn2\ncn2\n")  # one line per slot, as PBS writes it
    env = {"PBS_NODEFILE": "/var/spool/pbs/aux/17.pbs01", "PBS_JOBID": "17.pbs01"}
    cluster = cb.Cluster.from_environment(
        environ=env,
        root=root,
        ssh_config=aliases(testbed, ["cn1", "cn2"], tmp_path / "ssh_config"),
        known_hosts=testbed.write_known_hosts(),
        python=openmpi_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    assert [(n.host, n.slots) for n in cluster.nodes] == [("cn1", 2), ("cn2", 2)]
    with cluster:
        assert ranks_where(cluster, tmp_path, 4) == [
            "rank 0 of 4 on node1",
            "rank 1 of 4 on node1",
            "rank 2 of 4 on node2",
            "rank 3 of 4 on node2",
        ]
        with pytest.raises(cb.ConfigError, match="more than the cluster's 4 slots"):
            cluster.mpirun(["python", "-c", "pass"], np=5)


def test_a_sagemaker_job_runs_from_algo_1(
    testbed: Testbed, mpich_python: str, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    config = root / "opt/ml/input/config/resourceconfig.json"
    config.parent.mkdir(parents=True)
    hosts = ["algo-1", "algo-2"]
    resource = {"current_host": "algo-1", "hosts": hosts, "network_interface_name": "eth0"}
    config.write_text(json.dumps(resource))
    env = {  # as the training toolkit sets them
        "SM_HOSTS": json.dumps(hosts),
        "SM_CURRENT_HOST": "algo-1",
        "SM_NUM_GPUS": "0",
        "SM_NUM_CPUS": "1",
        "SM_RESOURCE_CONFIG": json.dumps(resource),
        "TRAINING_JOB_NAME": "tj-1",
    }
    config_file = aliases(testbed, hosts, tmp_path / "ssh_config")
    with pytest.raises(cb.WorkerHostError, match="built on algo-1"):
        cb.Cluster.from_environment(environ={**env, "SM_CURRENT_HOST": "algo-2"}, root=root)
    cluster = cb.Cluster.from_environment(
        environ=env,
        root=root,
        ssh_config=config_file,
        # SageMaker's containers are new: their keys are trusted on first use, recorded here.
        known_hosts=tmp_path / "known_hosts",
        python=mpich_python,
        run_dir=tmp_path / "run",
        connect_timeout=10,
    )
    assert (cluster.total_slots, cluster.launcher.flavour.value) == (2, "mpich")
    with cluster:
        assert ranks_where(cluster, tmp_path, 2) == [
            "rank 0 of 2 on node1",
            "rank 1 of 2 on node2",
        ]
    assert (tmp_path / "known_hosts").read_text().count(" ssh-ed25519 ") >= 2


SHOW_ENV = """\
import json, os, socket
names = ("SM_TRAINING_ENV", "CB_TEST_FORWARDED", "CB_TEST_NOT_FORWARDED")
print(socket.gethostname(), json.dumps({n: os.environ.get(n) for n in names}), flush=True)
"""


def test_the_launch_environment_and_forward_env_reach_remote_ranks_under_either_mpi(
    testbed: Testbed, mpi_python: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process stands for a SageMaker training job's leader: its environment is the job's.
    training_env = json.dumps({"hosts": ["algo-1", "algo-2"], "current_host": "algo-1"})
    tricky = 'it\'s "quoted" $HOME `id`\nsecond line'
    monkeypatch.setenv("SM_TRAINING_ENV", training_env)
    monkeypatch.setenv("CB_TEST_FORWARDED", tricky)
    monkeypatch.setenv("CB_TEST_NOT_FORWARDED", "the head's own")
    script = tmp_path / "show_env.py"
    script.write_text(SHOW_ENV)
    cluster = testbed.cluster(
        mpi_python, tmp_path / "run", hosts=2, forward_env=["CB_TEST_FORWARDED*"]
    )
    with cluster:
        job = cluster.mpirun(["python", str(script)], np=2, timeout=60)
        job.wait(timeout=90).check()
        lines = sorted(job.logs().query("rank >= 0")["line"])
    seen = {host: json.loads(values) for host, values in (ln.split(" ", 1) for ln in lines)}
    expected = {
        "SM_TRAINING_ENV": training_env,
        "CB_TEST_FORWARDED": tricky,  # byte for byte
        "CB_TEST_NOT_FORWARDED": None,  # not named: it stays here, whichever the MPI
    }
    assert seen == {"node1": expected, "node2": expected}


@pytest.fixture
def pods(testbed: Testbed, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Pods started by the test (stopped afterwards), with the mount points they need."""
    started: list[subprocess.Popen[str]] = []
    with mount_points(tmp_path / "mnt" / "ssh", HOME / ".ssh", HOME / ".clusterbook",
                      files=(Path(HOSTFILE),)):  # fmt: skip
        try:
            yield started
        finally:
            for pod in started:
                stop(pod)


def test_an_mpijob_launcher_pod_runs_clusterbook_run_without_hosts(
    testbed: Testbed, pods: list[subprocess.Popen[str]], openmpi_python: str, tmp_path: Path
) -> None:
    mount = tmp_path / "mnt" / "ssh"  # sshAuthMountPath
    keys = job_key(tmp_path / "secret")
    names = [f"job-worker-{i}.job.default.svc" for i in range(2)]
    etc_hosts = tmp_path / "hosts"  # what the cluster's DNS answers
    workers = testbed.hosts[:2]
    lines = [f"{h.addr} {name}\n" for name, h in zip(names, workers, strict=True)]
    etc_hosts.write_text("127.0.0.1 localhost\n" + "".join(lines))
    hostfile = tmp_path / "hostfile"  # as the operator writes it for Open MPI
    hostfile.write_text("".join(f"{name} slots=2\n" for name in names))
    program = tmp_path / "where.py"
    program.write_text(WHERE)
    job = render_mpijob(["true"], np=4, image="img", name="job", slots_per_worker=2,
                        ssh_auth_mount_path=str(mount))  # fmt: skip

    def binds(name: str) -> list[tuple[Path, Path, bool]]:
        return pod_binds(
            tmp_path / "pods", name, keys, mount, (etc_hosts, Path("/etc/hosts"), True)
        )

    base = {"HOME": str(HOME), "PATH": f"{Path(openmpi_python).parent}:/usr/bin:/bin"}
    for i, host in enumerate(testbed.hosts[:2]):
        name = f"job-worker-{i}"
        worker = container(job, "Worker")["command"]
        pods.append(
            start_pod(host, name, worker, binds(name), {**base, "K_MPI_JOB_ROLE": "worker"})
        )
    for host in testbed.hosts[:2]:
        wait_for_port(host.addr, SSH_PORT)
    env = {  # what the operator sets in an Open MPI launcher
        **base,
        "PYTHONPATH": str(SDK),
        "K_MPI_JOB_ROLE": "launcher",
        "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
        "OMPI_MCA_orte_default_hostfile": HOSTFILE,
        "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
        "OMPI_MCA_orte_set_default_slots": "2",
        "CLUSTERBOOK_SSH_AUTH_MOUNT_PATH": str(mount),
    }
    run = [openmpi_python, "-m", "clusterbook", "run", "-n", "4", "--port", str(SSH_PORT),
           "--", "python", str(program)]  # fmt: skip
    launcher = start_pod(
        testbed.hosts[2],
        "job-launcher",
        run,
        [*binds("job-launcher"), (hostfile, Path(HOSTFILE), True)],
        env,
    )
    pods.append(launcher)
    try:
        out, err = launcher.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        out, err = stop(launcher)
        pytest.fail(f"the launcher did not end:\n{out}\n{err}")
    assert launcher.returncode == 0, f"{out}\n{err}"
    assert "clusterbook: the nodes of mpijob: the MPIJob hostfile '/etc/mpi/hostfile'" in err
    ranks = sorted(line for line in out.splitlines() if " rank " in line)
    assert ranks == [
        "[0] rank 0 of 4 on job-worker-0",
        "[1] rank 1 of 4 on job-worker-0",
        "[2] rank 2 of 4 on job-worker-1",
        "[3] rank 3 of 4 on job-worker-1",
    ]


# -- the worker side of a SageMaker job: clusterbook worker serve -----------------------------

SM_HOSTS = ["algo-1", "algo-2"]
SERVE_PORT = 2222  # the fake host's own sshd has 22
LEADER = """\
import json, sys, time
import clusterbook as cb
args = json.loads(sys.argv[1])
cluster = cb.Cluster.from_environment(**args)
cluster.start()
print("started", cluster.id, flush=True)
time.sleep(600)
"""


def sagemaker_env(current: str) -> dict[str, str]:
    """SageMaker's variables on host ``current`` (the training toolkit's)."""
    resource = {"current_host": current, "hosts": SM_HOSTS, "network_interface_name": "eth0"}
    return {"SM_HOSTS": json.dumps(SM_HOSTS), "SM_CURRENT_HOST": current, "SM_NUM_CPUS": "1",
            "SM_NUM_GPUS": "0", "SM_RESOURCE_CONFIG": json.dumps(resource),
            "TRAINING_JOB_NAME": "tj-1"}  # fmt: skip


class Lines:
    """A process's output lines as they come (a thread reads them), to wait for one."""

    def __init__(self, stream: object) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while not (found := [ln for ln in self.lines if text in ln]):
            assert time.monotonic() < deadline, f"no {text!r} in {self.lines}"
            time.sleep(0.05)
        return found[0]

    def text(self) -> str:
        self._thread.join(timeout=10)
        return "".join(self.lines)


def serve(host: FakeHost, name: str, pods: list[subprocess.Popen[str]], *args: str) -> Lines:
    """``clusterbook worker serve`` on ``host`` as SageMaker's host ``name``: its hostname,
    the host's own ``~/.ssh`` and ``~/.clusterbook``, the job's variables. Returns its output
    (stdout); the process is the last of ``pods``."""
    binds = [(host.home / d, HOME / d, False) for d in (".ssh", ".clusterbook")]
    env = {"HOME": str(HOME), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(SDK),
           **sagemaker_env(name)}  # fmt: skip
    argv = [sys.executable, "-m", "clusterbook", "worker", "serve", "--port", str(SERVE_PORT)]
    argv += args
    pods.append(start_pod(host, name, argv, binds, env))
    return Lines(pods[-1].stdout)


def leader_options(testbed: Testbed, tmp_path: Path, python: str) -> dict[str, object]:
    """What the leader (algo-1) gives from_environment: its SageMaker surroundings, and an ssh
    config that sends algo-1 to node1's sshd and algo-2 to the worker's, on node2."""
    root = tmp_path / "root"
    config = root / "opt/ml/input/config/resourceconfig.json"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(sagemaker_env("algo-1")["SM_RESOURCE_CONFIG"])
    ssh_config = aliases(testbed, SM_HOSTS, tmp_path / "ssh_config", {"algo-2": SERVE_PORT})
    return {"environ": sagemaker_env("algo-1"), "root": str(root), "ssh_config": str(ssh_config),
            "known_hosts": str(tmp_path / "known_hosts"), "python": python,
            "run_dir": str(tmp_path / "run"), "connect_timeout": 10}  # fmt: skip


def refused(addr: str, port: int) -> bool:
    try:
        socket.create_connection((addr, port), timeout=2).close()
    except OSError:
        return True
    return False


def test_a_sagemaker_worker_serves_the_leaders_job_and_exits_0_when_it_is_done(
    testbed: Testbed, pods: list[subprocess.Popen[str]], openmpi_python: str, tmp_path: Path
) -> None:
    node2 = testbed.hosts[1]
    out = serve(node2, "algo-2", pods)
    said = out.wait_for(f"serves ssh on port {SERVE_PORT}")
    assert "worker algo-2 of the sagemaker job" in said, said
    assert "until its leader, algo-1, is done" in said, said
    options = leader_options(testbed, tmp_path, openmpi_python)
    cluster = cb.Cluster.from_environment(**options)  # type: ignore[arg-type]
    with cluster:
        # Rank 1 runs on algo-2, reached through the worker's sshd (its hostname is algo-2).
        where = ranks_where(cluster, tmp_path, 2)
        assert where == ["rank 0 of 2 on node1", "rank 1 of 2 on algo-2"]
        assert pods[-1].poll() is None  # serving while the cluster runs
    worker = pods[-1]
    try:
        code = worker.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit once the leader was done:\n{out.text()}")
    err = worker.stderr.read()  # type: ignore[union-attr]
    assert code == 0, f"{out.text()}\n{err}"
    assert f"the leader is done with this host (cluster {cluster.id})" in err
    assert refused(node2.addr, SERVE_PORT)  # its sshd went with it
    served = node2.home / ".clusterbook" / "worker-algo-2"
    assert not (served / "status.json").exists()
    assert not (node2.home / ".clusterbook" / "clusters" / cluster.id).exists()


def test_a_sagemaker_worker_exits_1_when_its_leader_is_gone(
    testbed: Testbed, pods: list[subprocess.Popen[str]], openmpi_python: str, tmp_path: Path
) -> None:
    node2 = testbed.hosts[1]
    out = serve(node2, "algo-2", pods, "--lease", "1")
    out.wait_for(f"serves ssh on port {SERVE_PORT}")
    worker = pods[-1]
    options = leader_options(testbed, tmp_path, openmpi_python)
    leader = subprocess.Popen(
        [openmpi_python, "-c", LEADER, json.dumps(options)],
        env={**os.environ, "PYTHONPATH": str(SDK)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    pods.append(leader)
    started = Lines(leader.stdout).wait_for("started", timeout=90)
    cluster_id = started.split()[1]
    assert worker.poll() is None
    os.killpg(leader.pid, signal.SIGKILL)  # the leader's container ends without a word
    leader.wait(timeout=10)
    try:
        code = worker.wait(timeout=30)  # its agent's lease (2 s), then the worker's (1 s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the worker did not exit when the leader went:\n{out.text()}")
    err = worker.stderr.read()  # type: ignore[union-attr]
    assert code == 1, f"{out.text()}\n{err}"
    assert "clusterbook: error: This worker stops: the leader (algo-1) is gone" in err, err
    assert f"the agent of its cluster {cluster_id} here stopped" in err, err
    assert refused(node2.addr, SERVE_PORT)


def test_a_sagemaker_worker_whose_leader_never_comes_exits_1(
    testbed: Testbed, pods: list[subprocess.Popen[str]]
) -> None:
    out = serve(testbed.hosts[1], "algo-2", pods, "--wait", "1")
    worker = pods[-1]
    code = worker.wait(timeout=30)
    err = worker.stderr.read()  # type: ignore[union-attr]
    assert code == 1, f"{out.text()}\n{err}"
    assert "no cluster of the leader (algo-1) reached this host within 1 s" in err, err
    assert "(--wait 2.0)" in err, err
