"""A job as a Kubeflow MPIJob: the ``kubeflow.org/v2beta1`` manifest (mpi-operator v0.8) that
``kubectl apply -f`` submits, made from what ``cluster.mpirun`` takes.

The operator starts ``workers`` worker pods and, once they are ready
(``launcherCreationPolicy: WaitForWorkersReady``), one launcher pod, which runs ``clusterbook
run`` on the workers: what each pod runs is in :mod:`clusterbook.export.pods`. The job's options
map onto the MPIJob where it has them, and onto ``clusterbook run`` otherwise (see
:class:`MPIJobArgs`). Nothing here talks to Kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from clusterbook.durations import Duration
from clusterbook.errors import ConfigError
from clusterbook.export.checks import (
    MPI_IMPLEMENTATIONS,
    SSH_AUTH_MOUNT_PATH,
    check_clean,
    check_count,
    check_cwd,
    check_flavour,
    check_image,
    check_mount_path,
    check_name,
    check_namespace,
    check_retention,
    check_workers,
    default_name,
)
from clusterbook.export.plainyaml import dump
from clusterbook.export.pods import HOSTFILE, SSH_PORT, replica_specs, run_words
from clusterbook.launch.flavour import MPIFlavour
from clusterbook.launch.program import check_argv
from clusterbook.launch.recovery import Backoff, Recovery
from clusterbook.spec import validate_env, validate_timeout
from clusterbook.wording import spell

if TYPE_CHECKING:
    from clusterbook.spec import NodeSpec

__all__ = [
    "API_VERSION",
    "DEADLINE_GRACE",
    "HOSTFILE",
    "SSH_AUTH_MOUNT_PATH",
    "SSH_PORT",
    "MPIJobArgs",
    "render_for_nodes",
    "render_mpijob",
    "to_yaml",
]

API_VERSION = "kubeflow.org/v2beta1"
#: Seconds ``activeDeadlineSeconds`` gives beyond the job's ``deadline``, for clusterbook to
#: stop the job itself first (stacks dumped, summary printed) and for the workers to start.
DEADLINE_GRACE = 120


class MPIJobArgs(TypedDict, total=False):
    """What :func:`render_mpijob` (and ``Cluster.to_mpijob``) take besides the program, ``np``
    and ``image``.

    name, namespace
        The MPIJob's name (the operator names pods ``NAME-launcher`` and ``NAME-worker-I``
        after it: lowercase letters, digits and ``-``, starting with a letter), and its
        namespace (default: ``kubectl``'s).
    workers, slots_per_worker
        Worker pods, and ranks per pod (``slotsPerWorker``). Default workers: ``np`` /
        ``slots_per_worker``, which must then divide it; every worker given must get a rank.
    mpi
        ``"openmpi"`` or ``"mpich"``: ``mpiImplementation``, and the launcher
        ``clusterbook run`` looks for in the image.
    retries, backoff, retry_on, restarts, timeout, env, cwd
        As for ``cluster.mpirun``: passed to ``clusterbook run`` in the launcher, which runs
        each attempt on the same workers with its own logs. Kubernetes never restarts the
        launcher (``backoffLimit: 0``): a restarted launcher would run again a job that
        clusterbook already retried and gave up on (the Job default is 6 more runs).
    deadline
        The job and its retries together (seconds, or ``"6h"``): ``clusterbook run
        --deadline``, which stops the job as at a timeout (Python ranks dump their stacks);
        ``activeDeadlineSeconds`` is that plus :data:`DEADLINE_GRACE` seconds, Kubernetes'
        own bound should clusterbook not get to it.
    retention
        How long the finished MPIJob and its pods are kept (``"7d"``):
        ``ttlSecondsAfterFinished``.
    clean
        ``cleanPodPolicy``: which pods go when the job ends: ``"running"`` (default: the
        workers, whose sshd would run on), ``"all"``, ``"none"``; None: the operator's
        default (none).
    resources
        The workers' container resources, like ``{"limits": {"cpu": 4, "memory": "8Gi",
        "nvidia.com/gpu": 1}}`` (the launcher only runs ``clusterbook run``). An amount is
        what a Kubernetes quantity takes: a number (``0.5``) or text (``"500m"``, ``"1.5Gi"``,
        ``"1e3"``); a number that is not whole is written as text (``"0.5"``), the one form
        of it an MPIJob's schema takes.
    ssh_auth_mount_path
        Where the job's key pair is mounted (``sshAuthMountPath``); not a ``.ssh``
        directory, which clusterbook must be able to write.
    """

    name: str
    namespace: str | None
    workers: int | None
    slots_per_worker: int
    mpi: MPIFlavour | str
    retries: int
    backoff: Duration | Backoff
    retry_on: Sequence[str] | str | None
    deadline: Duration | None
    restarts: int
    timeout: Duration | None
    env: Mapping[str, str] | None
    cwd: str | None
    retention: Duration | None
    clean: str | None
    resources: Mapping[str, Mapping[str, str | float]] | None
    ssh_auth_mount_path: str


def render_mpijob(
    argv: Sequence[str],
    *,
    np: int,
    image: str,
    name: str,
    namespace: str | None = None,
    workers: int | None = None,
    slots_per_worker: int = 1,
    mpi: MPIFlavour | str = MPIFlavour.OPENMPI,
    retries: int = 0,
    backoff: Duration | Backoff = 1.0,
    retry_on: Sequence[str] | str | None = None,
    deadline: Duration | None = None,
    restarts: int = 0,
    timeout: Duration | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    retention: Duration | None = None,
    clean: str | None = "running",
    resources: Mapping[str, Mapping[str, str | float]] | None = None,
    ssh_auth_mount_path: str = SSH_AUTH_MOUNT_PATH,
) -> dict[str, Any]:
    """The MPIJob that runs ``argv`` as ``np`` ranks on ``workers`` pods of ``image``.

    Parameters
    ----------
    argv, np
        The program and its arguments (``"python"`` stands for the image's interpreter that
        runs clusterbook), and the number of ranks.
    image
        A container image with clusterbook, its MPI (``clusterbook[openmpi]`` or
        ``clusterbook[mpich]``), mpi4py, sshd (``/usr/sbin/sshd``) and the program.
    name, namespace, workers, slots_per_worker, mpi, retries, backoff, retry_on, deadline, \
restarts, timeout, env, cwd, retention, clean, resources, ssh_auth_mount_path
        The MPIJob's options: see :class:`MPIJobArgs`.

    Returns
    -------
    dict
        The manifest: plain dicts, lists, strings and numbers (:func:`to_yaml` writes it).
    """
    program = check_argv(argv)
    image = check_image(image)
    check_name(name, 1)
    slots = check_count(slots_per_worker, "slots_per_worker", 2)
    np = check_count(np, "np", 4)
    workers = check_workers(np, workers, slots)
    name = check_name(name, workers)  # the last worker's pod name must be valid too
    flavour = check_flavour(mpi)
    limit = validate_timeout(timeout)
    recovery = Recovery.make(
        retries=retries,
        backoff=backoff,
        retry_on=retry_on,
        deadline=deadline,
        timeout=limit,
        restarts=restarts,
    )
    mount = check_mount_path(ssh_auth_mount_path)
    run = run_words(program, np, flavour, recovery, limit, validate_env(env), check_cwd(cwd), mount)
    policy = _run_policy(recovery, retention, clean)
    replicas = replica_specs(image, run, mount, resources, workers)
    return {
        "apiVersion": API_VERSION,
        "kind": "MPIJob",
        "metadata": _metadata(name, namespace),
        "spec": {
            "slotsPerWorker": slots,
            "runPolicy": policy,
            "sshAuthMountPath": mount,
            "mpiImplementation": MPI_IMPLEMENTATIONS[flavour],
            "launcherCreationPolicy": "WaitForWorkersReady",
            "mpiReplicaSpecs": replicas,
        },
    }


def render_for_nodes(
    argv: Sequence[str],
    np: int | None,
    *,
    image: str,
    nodes: Sequence[NodeSpec],
    cluster_name: str,
    flavour: MPIFlavour | str | None,
    cluster_env: Mapping[str, str],
    **options: Any,
) -> dict[str, Any]:
    """:func:`render_mpijob` with what a cluster knows as the defaults: a worker per node
    (when ``np`` is not given), the nodes' slots, its MPI flavour, its name and its ``env``
    (the job's ``env`` adds to it). No ``nodes`` (not known yet): ``slots_per_worker`` and
    ``np`` or ``workers`` must be given."""
    given = dict(options)
    counted = np is not None or given.get("workers") is not None
    if not nodes and ("slots_per_worker" not in given or not counted):
        raise ConfigError(
            "The cluster's nodes are not known yet (those of an elastic or Slurm cluster join "
            "once it started; an SSH host's 'gpus' slots are counted at start), so there is "
            "nothing to count slots, ranks and workers from; wait for them (start(), "
            f"wait_ready()), or give {spell('slots_per_worker', 4)} and {spell('np', 8)} "
            f"(or {spell('workers', 2)})."
        )
    if "slots_per_worker" not in given:
        counts = sorted({n.slots for n in nodes})
        if len(counts) > 1:
            raise ConfigError(
                f"The cluster's nodes have different slots ({', '.join(map(str, counts))}); "
                f"an MPIJob's workers all have the same: give "
                f"{spell('slots_per_worker', counts[0])}."
            )
        given["slots_per_worker"] = counts[0]
    if np is None:
        workers = given.get("workers")
        workers = check_count(len(nodes) if workers is None else workers, "workers", 2)
        given["workers"] = workers
        np = workers * check_count(given.get("slots_per_worker", 1), "slots_per_worker", 2)
    given.setdefault("mpi", flavour or MPIFlavour.OPENMPI)
    given["env"] = {**cluster_env, **validate_env(given.get("env"))}
    if "name" not in given:
        given["name"] = default_name(cluster_name)
    return render_mpijob(argv, np=np, image=image, **given)


def to_yaml(manifest: Mapping[str, Any]) -> str:
    """The manifest as YAML, for ``kubectl apply -f`` (written without PyYAML: see
    :mod:`clusterbook.export.plainyaml`)."""
    return dump(manifest)


# -- the manifest's parts ---------------------------------------------------------------------


def _metadata(name: str, namespace: str | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = check_namespace(namespace)
    return metadata


def _run_policy(
    recovery: Recovery, retention: Duration | None, clean: str | None
) -> dict[str, Any]:
    """``runPolicy``: the launcher is never run again (clusterbook retries), the job's
    deadline with a grace, how long it is kept and which pods go when it ends."""
    policy: dict[str, Any] = {"backoffLimit": 0}
    if recovery.deadline is not None:
        policy["activeDeadlineSeconds"] = math.ceil(recovery.deadline) + DEADLINE_GRACE
    if (kept := check_retention(retention)) is not None:
        policy["ttlSecondsAfterFinished"] = kept
    if clean is not None:
        policy["cleanPodPolicy"] = check_clean(clean)
    return policy
