"""The pods of a Kubeflow MPIJob (see :mod:`clusterbook.export.mpijob`): what each runs.

The operator gives the pods a key pair of the job's own (a Secret mounted at
``sshAuthMountPath``) and the launcher a hostfile, :data:`HOSTFILE`, that lists the workers
with ``slotsPerWorker`` slots each. Here:

- each worker copies the job's key into its own ``~/.ssh`` and runs sshd on port
  :data:`SSH_PORT` with the job's private key as its host key (as the operator's base image
  does), in the foreground; it is ready when sshd answers;
- the launcher pins every worker's host key to the job's public key, waits until the workers'
  names resolve, then runs ``clusterbook run -n NP --hostfile /etc/mpi/hostfile ... -- CMD``:
  the job runs as it would from a terminal, with each rank's output prefixed in the pod's log
  (``kubectl logs``), the failure summary and, at a timeout, every Python rank's stacks.

The key is mounted elsewhere than ``~/.ssh`` (``SSH_AUTH_MOUNT_PATH``) because a Secret is
mounted read-only, and ``clusterbook run`` adds its cluster's own key to the workers'
``~/.ssh/authorized_keys`` when it starts (the MPI launcher's ssh uses that key).
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Mapping
from typing import Any

from clusterbook.export.checks import backoff_text, check_resources
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.recovery import DEFAULT_RETRY_ON, Backoff, Recovery
from clusterbook.providers.environment.readers import MPIJOB_SSH_PORT

__all__ = ["HOSTFILE", "RESOLVE_WAIT", "SSH_PORT", "replica_specs", "run_words"]

#: Where the operator puts the launcher's hostfile.
HOSTFILE = "/etc/mpi/hostfile"
#: The workers' sshd port (the operator's base image's, which a non-root sshd can open).
SSH_PORT = MPIJOB_SSH_PORT
#: Seconds the launcher waits for each worker's name to resolve.
RESOLVE_WAIT = 60


def replica_specs(
    image: str,
    run: list[str],
    mount: str,
    resources: Mapping[str, Mapping[str, str | float]] | None,
    workers: int,
) -> dict[str, Any]:
    """``mpiReplicaSpecs``: one launcher pod that runs ``run``, and the workers' sshd pods,
    ready when sshd answers."""
    launcher = _container("mpi-launcher", image, ["/bin/sh", "-c", _launcher_script(run, mount)])
    worker = _container("mpi-worker", image, ["/bin/sh", "-c", _worker_script(mount)])
    worker["readinessProbe"] = {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 2}
    if resources is not None:
        worker["resources"] = check_resources(resources)
    return {"Launcher": _replicas(1, launcher), "Worker": _replicas(workers, worker)}


def run_words(
    program: list[str],
    np: int,
    flavour: MPIFlavour,
    recovery: Recovery,
    timeout: float | None,
    env: Mapping[str, str],
    cwd: str | None,
    mount: str,
) -> list[str]:
    """``clusterbook run ...`` as the launcher runs it."""
    words = ["clusterbook", "run", "-n", str(np), "--hostfile", HOSTFILE, "--mpi", flavour.value]
    words += ["--port", str(SSH_PORT), "--identity", posixpath.join(mount, "id_rsa")]
    words += ["--known-hosts", "~/.ssh/known_hosts"]
    if recovery.retries:
        words += ["--retries", str(recovery.retries)]
        if recovery.backoff != Backoff():
            words += ["--backoff", backoff_text(recovery.backoff)]
    if recovery.retry_on != DEFAULT_RETRY_ON:
        words += ["--retry-on", ",".join(sorted(recovery.retry_on))]
    if recovery.deadline is not None:
        words += ["--deadline", f"{recovery.deadline:g}"]
    if recovery.restarts:
        words += ["--restarts", str(recovery.restarts)]
    if timeout is not None:
        words += ["--timeout", f"{timeout:g}"]
    if cwd is not None:
        words += ["--wdir", cwd]
    for key, value in env.items():
        words += ["--env", f"{key}={value}"]
    return [*words, "--", *program]


def _launcher_script(run: list[str], mount: str) -> str:
    # The job's public key is every worker's host key: pinned for any name (``*``).
    return (
        "set -e\n"
        'mkdir -p "$HOME/.ssh"\n'
        f"printf '* %s\\n' \"$(cat {shlex.quote(mount)}/id_rsa.pub)\""
        ' > "$HOME/.ssh/known_hosts"\n'
        f"for host in $(cut -d' ' -f1 {HOSTFILE} | cut -d: -f1); do\n"
        "  tries=0\n"
        '  until getent ahosts "$host" > /dev/null; do\n'
        "    tries=$((tries + 1))\n"
        f'    if [ "$tries" -ge {RESOLVE_WAIT} ]; then\n'
        '      echo "clusterbook: worker $host does not resolve" >&2; exit 1\n'
        "    fi\n"
        "    sleep 1\n"
        "  done\n"
        "done\n"
        f"exec {shlex.join(run)}\n"
    )


def _worker_script(mount: str) -> str:
    keys = shlex.quote(mount)
    return (
        "set -e\n"
        "umask 077\n"
        'mkdir -p "$HOME/.ssh"\n'
        f'cat {keys}/authorized_keys >> "$HOME/.ssh/authorized_keys"\n'
        f'cat {keys}/id_rsa > "$HOME/.ssh/mpijob_host_key"\n'
        f'exec /usr/sbin/sshd -De -p {SSH_PORT} -h "$HOME/.ssh/mpijob_host_key"\n'
    )


def _container(name: str, image: str, command: list[str]) -> dict[str, Any]:
    return {"name": name, "image": image, "command": command}


def _replicas(count: int, container: dict[str, Any]) -> dict[str, Any]:
    # Never: a failed pod is not restarted in place (backoffLimit 0 ends the job instead).
    return {
        "replicas": count,
        "restartPolicy": "Never",
        "template": {"spec": {"containers": [container]}},
    }
