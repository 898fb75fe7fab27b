"""The nodes the surrounding system gives this process: a Slurm allocation, a PBS/Torque job, a
SageMaker training job or a Kubeflow MPIJob launcher pod (``Cluster.from_environment``).

What each system says, and where clusterbook reads it
(:mod:`clusterbook.providers.environment.readers`):

==========  ===================================================================================
slurm       ``SLURM_JOB_NODELIST`` (expanded by ``scontrol show hostnames``, else by
            :func:`~clusterbook.providers.slurm.lists.expand_nodelist`); slots from
            ``SLURM_NTASKS_PER_NODE``, else ``SLURM_TASKS_PER_NODE``, else
            ``SLURM_JOB_CPUS_PER_NODE`` (``4(x2),2``), else 1
pbs         ``$PBS_NODEFILE``: one line per slot
mpijob      the launcher's hostfile (``OMPI_MCA_orte_default_hostfile``, ``HYDRA_HOST_FILE`` or
            ``I_MPI_HYDRA_HOST_FILE``, default ``/etc/mpi/hostfile``), the job's key pair at
            ``sshAuthMountPath`` (default ``/root/.ssh``; ``CLUSTERBOOK_SSH_AUTH_MOUNT_PATH``):
            ``id_rsa`` logs in, ``id_rsa.pub`` is every worker's host key
sagemaker   ``SM_HOSTS`` (a JSON list) and ``SM_CURRENT_HOST``, else
            ``/opt/ml/input/config/resourceconfig.json`` (``hosts``, ``current_host``); slots
            ``SM_NUM_GPUS`` when above 0, else ``SM_NUM_CPUS``, else 1; the first host
            (``algo-1``) leads, the others are workers
==========  ===================================================================================

On a host that does not lead the job (``Detected.role == "worker"``), ``clusterbook worker
serve`` (:mod:`clusterbook.providers.environment.worker`) serves the leader until it is done.

Detection goes in the order of :data:`DETECTION_ORDER`: the first system whose sign is there
(a Slurm or PBS variable, an MPIJob launcher's variables, SageMaker's variables or
resourceconfig.json) is read. ``kind=`` or ``CLUSTERBOOK_ENVIRONMENT`` (a kind, ``auto`` or
``none``) chooses instead. Every variable comes from ``environ`` and every file is read under
``root`` (both default to this process's), and commands run through ``runner``, so each
system can be reproduced in a test. The choice (:func:`choose`) and the parsers are pure; the
reading is at the edges.

A :class:`Detected` is what a provider needs to start on those nodes: the SSH provider, or in a
Slurm allocation the srun provider (:mod:`clusterbook.providers.slurm.srun`), whose jobs are steps
of the allocation (:func:`launch_via` chooses).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from clusterbook.errors import ConfigError, EnvironmentNotFoundError, WorkerHostError
from clusterbook.providers.environment.found import Detected, Runner, Surroundings, run_command
from clusterbook.providers.environment.readers import (
    MPIJOB_HOSTFILE_VARS,
    READERS,
    SAGEMAKER_RESOURCE_CONFIG,
)
from clusterbook.spec import CLUSTER_OPTIONS, validate_positive_int
from clusterbook.wording import spell, spell_or

__all__ = [
    "DETECTION_ORDER",
    "ENV_VAR",
    "VIA",
    "Detected",
    "Runner",
    "Surroundings",
    "choose",
    "cluster_spec",
    "detect_environment",
    "find_environment",
    "launch_via",
    "run_command",
    "signs",
]

#: Systems in the order they are looked for.
DETECTION_ORDER = ("slurm", "pbs", "mpijob", "sagemaker")
#: The variable that chooses the system (a kind, ``auto`` or ``none``).
ENV_VAR = "CLUSTERBOOK_ENVIRONMENT"


def signs(where: Surroundings) -> dict[str, str]:
    """What is seen of each system around this process (kind -> the sign), before reading."""
    seen: dict[str, str] = {}
    for name in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if where.get(name):
            seen.setdefault("slurm", name)
    if where.get("PBS_NODEFILE"):
        seen["pbs"] = "PBS_NODEFILE"
    for name in ("K_MPI_JOB_ROLE", *MPIJOB_HOSTFILE_VARS):
        if where.get(name):
            seen.setdefault("mpijob", name)
    if where.get("SM_HOSTS"):
        seen["sagemaker"] = "SM_HOSTS"
    elif where.path(SAGEMAKER_RESOURCE_CONFIG).is_file():
        seen["sagemaker"] = SAGEMAKER_RESOURCE_CONFIG
    return seen


def _looked_for() -> str:
    return (
        "SLURM_JOB_NODELIST (Slurm), PBS_NODEFILE (PBS/Torque), K_MPI_JOB_ROLE, "
        f"{', '.join(MPIJOB_HOSTFILE_VARS)} (a Kubeflow MPIJob launcher), SM_HOSTS or "
        f"{SAGEMAKER_RESOURCE_CONFIG} (SageMaker)"
    )


def choose(seen: Mapping[str, str], forced: str | None) -> str | None:
    """The kind to read: ``forced`` (a kind; ``"none"``: none; ``"auto"`` or None: the
    first of :data:`DETECTION_ORDER` in ``seen``), or None when there is none."""
    if forced in (None, "", "auto"):
        return next((kind for kind in DETECTION_ORDER if kind in seen), None)
    if forced == "none":
        return None
    if forced not in DETECTION_ORDER:
        raise ConfigError(
            f"The kind {forced!r} is not a system clusterbook reads; use one of "
            f"{', '.join(map(repr, DETECTION_ORDER))}, 'auto' (look for them in that order) or "
            f"'none' (also as {ENV_VAR})."
        )
    return forced


def find_environment(
    kind: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    runner: Runner | None = None,
) -> Detected | None:
    """:func:`detect_environment`, or None when no system is around (or ``kind`` / the
    environment's ``CLUSTERBOOK_ENVIRONMENT`` is ``"none"``)."""
    where = Surroundings.make(environ, root, runner)
    forced = kind if kind is not None else where.get(ENV_VAR)
    chosen = choose(signs(where), forced.strip().lower() if forced else None)
    return None if chosen is None else READERS[chosen](where)


def detect_environment(
    kind: str | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    root: str | os.PathLike[str] | None = None,
    runner: Runner | None = None,
) -> Detected:
    """The nodes of the system around this process (see the module's table), read now.

    ``kind`` reads that system whatever else is there (default: ``CLUSTERBOOK_ENVIRONMENT``,
    else the first found in :data:`DETECTION_ORDER`). ``environ``, ``root`` and ``runner``
    stand for this process's variables, ``/`` and the commands it runs. When nothing is
    found: :class:`EnvironmentNotFoundError`, saying what was looked for; a system that says
    something wrong (a node list that does not expand, a bad hostfile line): a
    :class:`ConfigError` naming the value."""
    found = find_environment(kind, environ=environ, root=root, runner=runner)
    if found is None:
        raise EnvironmentNotFoundError(
            "No scheduler or launcher environment was found around this process: looked for "
            f"{_looked_for()}. Run inside a Slurm allocation (salloc/sbatch), a PBS job, a "
            "SageMaker training job or an MPIJob launcher pod; elsewhere use "
            "Cluster.from_hostfile(path) or Cluster.ssh([...])."
            + (f" ({ENV_VAR}=none turned detection off.)" if _off(kind, environ) else "")
        )
    return found


def _off(kind: str | None, environ: Mapping[str, str] | None) -> bool:
    value = kind if kind is not None else (os.environ if environ is None else environ).get(ENV_VAR)
    return (value or "").strip().lower() == "none"


#: How a cluster of the nodes found starts its jobs (``via=``).
VIA = ("auto", "srun", "ssh")


def launch_via(
    detected: Detected, via: str | None, options: Mapping[str, Any], srun_found: bool
) -> str:
    """``"srun"`` (jobs as steps of the Slurm allocation) or ``"ssh"``: ``via``, or for
    ``"auto"`` (None) srun inside a Slurm allocation where ``srun`` is found (``srun_found``)
    and no SSH option is given in ``options``, else ssh."""
    ssh_given = sorted(k for k, v in options.items() if v is not None and k not in CLUSTER_OPTIONS)
    chosen = "auto" if via is None else via
    if chosen not in VIA:
        raise ConfigError(
            f"{spell('via', via)} is not a way to start jobs; use 'srun' (as steps of the "
            "Slurm allocation), 'ssh' (mpirun over ssh) or 'auto' (srun inside a Slurm "
            "allocation where srun is found, else ssh)."
        )
    if chosen == "auto":
        slurm = detected.kind == "slurm" and detected.job_id is not None and srun_found
        return "srun" if slurm and not ssh_given else "ssh"
    if chosen == "srun":
        if detected.kind != "slurm" or detected.job_id is None:
            raise ConfigError(
                f"{spell('via', 'srun')} starts jobs as steps of a Slurm allocation, but the "
                f"nodes are a {detected.kind} job's ({detected.source}); use "
                f"{spell('via', 'ssh')}."
            )
        if not srun_found:
            raise ConfigError(
                f"{spell('via', 'srun')}: Slurm's srun is not on PATH here; run where Slurm's "
                f"commands are, or use {spell('via', 'ssh')}."
            )
        if ssh_given:
            named = ", ".join(spell_or(k, options[k], k) for k in ssh_given)
            raise ConfigError(
                f"{named} {'is an option' if len(ssh_given) == 1 else 'are options'} of "
                f"clusters reached over ssh; jobs started with {spell('via', 'srun')} use none. "
                f"Leave {'it' if len(ssh_given) == 1 else 'them'} out, or use "
                f"{spell('via', 'ssh')}."
            )
    return chosen


def cluster_spec(
    detected: Detected,
    options: Mapping[str, Any],
    slots: int | None = None,
    via: str = "ssh",
) -> dict[str, Any]:
    """The cluster spec of ``detected``'s nodes (``slots`` each, if given), ``options`` over
    what the system implies: with ``via="ssh"`` an SSH cluster (the system's SSH options and
    MPI flavour), with ``via="srun"`` a cluster of the Slurm allocation's nodes whose jobs
    are its steps (see :func:`launch_via`). On a worker host: :class:`WorkerHostError`."""
    if detected.role == "worker":
        raise WorkerHostError(
            f"This host ({detected.current_host or 'unnamed'}) is a worker of the "
            f"{detected.kind} job ({detected.source}): the cluster is built on "
            f"{detected.leader}, which starts the ranks here over ssh. On this host run "
            "clusterbook worker serve (or cb.serve_worker()): it serves ssh until the leader "
            "is done (cb.detect_environment().role == 'worker' tells the two apart)."
        )
    hosts = detected.hosts
    if slots is not None:
        hosts = [f"{host}:{validate_positive_int(slots, 'slots')}" for host, _ in
                 detected.hosts_with_slots]  # fmt: skip
    if via == "srun":
        own = {k: v for k, v in options.items() if k in CLUSTER_OPTIONS}
        return {"kind": "srun", "hosts": hosts, "job_id": detected.job_id, **own}
    spec: dict[str, Any] = {"kind": "ssh", "hosts": hosts, **detected.ssh}
    if detected.mpi is not None:
        spec["mpi"] = detected.mpi
    spec.update({k: v for k, v in options.items() if v is not None or k not in spec})
    return spec
