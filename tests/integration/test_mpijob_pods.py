"""A rendered MPIJob's pods, run as the mpi-operator would run them, on fake hosts: no Kubernetes
here, so each pod is a network namespace of the testbed with a hostname and mounts of its own,
and this test does what the operator does around the containers' commands.

What the operator gives the pods (pkg/controller/mpi_job_controller.go, v0.8.2): an ECDSA P-521
key pair of the job's own (PEM ``EC PRIVATE KEY`` as ``id_rsa``, the public key as
``id_rsa.pub`` and ``authorized_keys``), mounted read-only at ``sshAuthMountPath`` (mode 0644
anywhere but ``/root/.ssh``); the launcher's hostfile at ``/etc/mpi/hostfile`` (read-only; Open
MPI's ``HOST slots=N``); the launcher's variables (``K_MPI_JOB_ROLE``, ``OMPI_MCA_*``); and a
fresh home in each container. The launcher starts once the workers are ready (the readiness
probe: sshd answers on its port). Each pod then runs exactly its container's ``command``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from clusterbook.export.mpijob import HOSTFILE, SSH_PORT, render_mpijob
from tests.testbed import FakeHost, Testbed
from tests.testbed import testbed as fake_hosts

pytestmark = [pytest.mark.root, pytest.mark.sshd, pytest.mark.mpi]
testbed = fake_hosts

HOME = Path(pwd.getpwuid(os.geteuid()).pw_dir)
SDK = Path(__file__).resolve().parents[2] / "sdk"
RANKS = """\
import socket, sys
from mpi4py import MPI
comm = MPI.COMM_WORLD
print(f"rank {comm.rank} of {comm.size} on {socket.gethostname()}", flush=True)
if comm.rank == 1 and sys.argv[1:] == ["fail"]:
    1 / 0
"""


def job_key(directory: Path) -> Path:
    """The job's key pair as the operator makes and mounts it."""
    key = ec.generate_private_key(ec.SECP521R1())
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # "EC PRIVATE KEY", as x509 makes it
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    directory.mkdir(parents=True)
    for name, data in {
        "id_rsa": private,
        "id_rsa.pub": public + b"\n",
        "authorized_keys": public + b"\n",
    }.items():
        (directory / name).write_bytes(data)
        (directory / name).chmod(0o644)
    return directory


def pod_binds(
    pods: Path, name: str, keys: Path, mount: Path, *more: tuple[Path, Path, bool]
) -> list[tuple[Path, Path, bool]]:
    """What pod ``name`` mounts: its own ``~/.ssh`` and ``~/.clusterbook`` (under ``pods``),
    the job's key pair at ``mount`` (read-only), and ``more``."""
    own = pods / name
    for d in (".ssh", ".clusterbook"):
        (own / d).mkdir(parents=True, mode=0o700)
    return [
        (own / ".ssh", HOME / ".ssh", False),
        (own / ".clusterbook", HOME / ".clusterbook", False),
        (keys, mount, True),
        *more,
    ]


@contextlib.contextmanager
def mount_points(*paths: Path, files: tuple[Path, ...] = ()) -> Iterator[None]:
    """Make the directories (and ``files``) the pods mount on, where missing; remove what was
    made afterwards."""
    made: list[Path] = []
    try:
        for path in (*paths, *files):
            for part in [*reversed(path.parents), path]:
                if part.exists():
                    continue
                if part in files:
                    part.touch(mode=0o644)
                else:
                    part.mkdir(mode=0o755)
                made.append(part)
        yield
    finally:
        for part in reversed(made):
            with contextlib.suppress(OSError):
                part.rmdir() if part.is_dir() else part.unlink()


def start_pod(
    host: FakeHost,
    hostname: str,
    command: list[str],
    binds: list[tuple[Path, Path, bool]],
    env: dict[str, str],
) -> subprocess.Popen[str]:
    """``command`` in ``host``'s network namespace, with ``hostname`` and ``binds`` (source,
    target, read-only) in a mount namespace of its own: a container of a pod."""
    steps = [f"hostname {shlex.quote(hostname)}"]
    for source, target, read_only in binds:
        steps.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
        if read_only:
            steps.append(f"mount -o remount,bind,ro {shlex.quote(str(target))}")
    script = " && ".join([*steps, f"exec {shlex.join(command)}"])
    unshare = ["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", script]
    return subprocess.Popen(
        ["ip", "netns", "exec", host.netns, *unshare],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for_port(addr: str, port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection((addr, port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stop(pod: subprocess.Popen[str]) -> tuple[str, str]:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pod.pid, signal.SIGTERM)
    return pod.communicate(timeout=10)


def container(job: dict[str, Any], kind: str) -> dict[str, Any]:
    (spec,) = job["spec"]["mpiReplicaSpecs"][kind]["template"]["spec"]["containers"]
    return spec  # type: ignore[no-any-return]


@pytest.fixture
def mpijob(testbed: Testbed, tmp_path: Path) -> Iterator[Any]:
    """Run a rendered job: worker pods on node1 and node2, its launcher on node3; returns the
    launcher's (returncode, stdout, stderr)."""
    mount = tmp_path / "mnt" / "ssh"  # sshAuthMountPath: the same in every pod
    keys = job_key(tmp_path / "secret")
    program = tmp_path / "ranks.py"
    program.write_text(RANKS)
    workers, launcher_host = testbed.hosts[:2], testbed.hosts[2]
    started: list[subprocess.Popen[str]] = []
    pods = tmp_path / "pods"

    def run(*args: str, np: int = 4, slots: int = 2) -> tuple[int, str, str]:
        job = render_mpijob(
            ["python", str(program), *args],
            np=np,
            image="img",
            name="job",
            slots_per_worker=slots,
            ssh_auth_mount_path=str(mount),
        )
        assert job["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == len(workers)
        base = {"HOME": str(HOME), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
        for i, host in enumerate(workers):
            name = f"job-worker-{i}"
            env = {**base, "K_MPI_JOB_ROLE": "worker"}
            binds = pod_binds(pods, name, keys, mount)
            started.append(start_pod(host, name, container(job, "Worker")["command"], binds, env))
        for host in workers:  # the readiness probe; then WaitForWorkersReady
            wait_for_port(host.addr, SSH_PORT)
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{h.addr} slots={slots}\n" for h in workers))
        env = {
            **base,
            "PYTHONPATH": str(SDK),  # this checkout's clusterbook, as the image would have it
            "K_MPI_JOB_ROLE": "launcher",
            "OMPI_MCA_orte_keep_fqdn_hostnames": "true",
            "OMPI_MCA_orte_default_hostfile": HOSTFILE,
            "OMPI_MCA_plm_rsh_args": "-o ConnectionAttempts=10",
            "OMPI_MCA_orte_set_default_slots": str(slots),
            "NVIDIA_VISIBLE_DEVICES": "",
            "NVIDIA_DRIVER_CAPABILITIES": "",
        }
        binds = pod_binds(
            tmp_path / "pods", "job-launcher", keys, mount, (hostfile, Path(HOSTFILE), True)
        )
        launcher = start_pod(
            launcher_host, "job-launcher", container(job, "Launcher")["command"], binds, env
        )
        started.append(launcher)
        try:
            out, err = launcher.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            out, err = stop(launcher)
            pytest.fail(f"the launcher did not end:\n{out}\n{err}")
        return launcher.returncode, out, err

    with mount_points(mount, HOME / ".ssh", HOME / ".clusterbook", files=(Path(HOSTFILE),)):
        try:
            yield run
        finally:
            for pod in started:
                stop(pod)


def clusterbook_processes(host: FakeHost) -> list[str]:
    found = []
    for pid in host.processes():
        with contextlib.suppress(psutil.Error):
            line = " ".join(psutil.Process(pid).cmdline())
            if "clusterbook" in line or "prted" in line:
                found.append(line)
    return found


def test_the_launcher_runs_the_job_on_the_worker_pods(mpijob: Any, testbed: Testbed) -> None:
    code, out, err = mpijob()
    assert code == 0, f"{out}\n{err}"
    ranks = sorted(line for line in out.splitlines() if " rank " in line)
    assert ranks == [
        "[0] rank 0 of 4 on job-worker-0",
        "[1] rank 1 of 4 on job-worker-0",
        "[2] rank 2 of 4 on job-worker-1",
        "[3] rank 3 of 4 on job-worker-1",
    ]
    deadline = time.monotonic() + 10
    while any(clusterbook_processes(h) for h in testbed.hosts[:2]):
        assert time.monotonic() < deadline, [clusterbook_processes(h) for h in testbed.hosts]
        time.sleep(0.2)


def test_a_failing_job_fails_the_launcher_with_the_summary_in_its_log(mpijob: Any) -> None:
    code, out, err = mpijob("fail", np=2, slots=1)
    assert code == 1, f"{out}\n{err}"
    assert "[1] rank 1 of 2 on job-worker-1" in out
    assert err.count("ZeroDivisionError: division by zero") == 1, err
    assert "each rank's log is in" in err
