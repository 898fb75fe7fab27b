"""How each system's variables and files become a
:class:`~clusterbook.providers.environment.found.Detected` (one reader per kind; the formats are
described in :mod:`clusterbook.providers.environment.detect`)."""

from __future__ import annotations

import json
import posixpath
import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterbook.errors import ConfigError
from clusterbook.providers.environment.found import Detected, Surroundings
from clusterbook.providers.slurm.lists import expand_counts, expand_nodelist
from clusterbook.spec import parse_host_slots, parse_hostfile, validate_host

__all__ = [
    "MPIJOB_HOSTFILE",
    "MPIJOB_HOSTFILE_VARS",
    "MPIJOB_SSH_PORT",
    "READERS",
    "SAGEMAKER_RESOURCE_CONFIG",
    "SSH_AUTH_MOUNT_VAR",
    "hosts_with_counts",
]

#: Where SageMaker writes the training job's hosts.
SAGEMAKER_RESOURCE_CONFIG = "/opt/ml/input/config/resourceconfig.json"
#: Variables that name an MPIJob launcher's hostfile, and the MPI they are for.
MPIJOB_HOSTFILE_VARS = {
    "OMPI_MCA_orte_default_hostfile": "openmpi",
    "HYDRA_HOST_FILE": "mpich",
    "I_MPI_HYDRA_HOST_FILE": "mpich",
}

#: Where the MPI operator mounts the launcher's hostfile.
MPIJOB_HOSTFILE = "/etc/mpi/hostfile"
#: The sshd port of an MPIJob's worker pods (the operator's base image's, which a non-root
#: sshd can open).
MPIJOB_SSH_PORT = 2222
#: The variable that says the MPIJob's ``sshAuthMountPath`` (default ``/root/.ssh``).
SSH_AUTH_MOUNT_VAR = "CLUSTERBOOK_SSH_AUTH_MOUNT_PATH"
_DEFAULT_SSH_AUTH_MOUNT = "/root/.ssh"


def hosts_with_counts(
    hosts: Sequence[str], counts: Sequence[int], source: str
) -> tuple[tuple[str, int], ...]:
    """``hosts`` paired with ``counts`` (one count: for every host), repeated hosts added up;
    counts that do not match the hosts are a ConfigError naming ``source``."""
    if len(counts) == 1:
        counts = [counts[0]] * len(hosts)
    if len(counts) != len(hosts):
        raise ConfigError(
            f"{source} gives {len(counts)} counts for {len(hosts)} nodes ({', '.join(hosts)}); "
            "give the slots yourself (slots=N) or fix the variable."
        )
    summed: dict[str, int] = {}
    for host, count in zip(hosts, counts, strict=True):
        validate_host(host)
        summed[host] = summed.get(host, 0) + count
    return tuple(summed.items())


def _entries(lines: list[str], default: int = 1) -> tuple[tuple[str, int], ...]:
    pairs = (parse_host_slots(entry, default) for entry in lines)
    return tuple((host, slots if isinstance(slots, int) else default) for host, slots in pairs)


def _read(where: Surroundings, path: str, what: str) -> str:
    try:
        return where.path(path).read_text()
    except OSError as exc:
        raise ConfigError(
            f"Cannot read {what} {path!r}: {exc.strerror}. It should be there as the system "
            "writes it; check the variable that names it, or give the hosts another way "
            "(Cluster.from_hostfile, Cluster.ssh)."
        ) from None


def _unset(name: str, kind: str, where: str) -> ConfigError:
    return ConfigError(
        f"{name} is not set, so there are no {kind} nodes to read (the kind {kind!r}, or "
        f"CLUSTERBOOK_ENVIRONMENT={kind}, asked for them); run {where}, or leave the kind out "
        "to look for any system."
    )


# -- Slurm ------------------------------------------------------------------------------------


def _slurm_hosts(nodelist: str, where: Surroundings, name: str) -> list[str]:
    """Slurm's own expansion (``scontrol show hostnames``), else the built-in one."""
    try:
        out = where.runner(["scontrol", "show", "hostnames", nodelist])
    except OSError:  # no scontrol here: the common forms are expanded without it
        return expand_nodelist(nodelist, name)
    except subprocess.CalledProcessError as exc:
        said = (exc.stderr or exc.stdout or "").strip() or f"exit code {exc.returncode}"
        raise ConfigError(
            f"{name}={nodelist!r} does not expand: scontrol show hostnames said {said!r}. "
            "Run inside the allocation (salloc/sbatch) that set it, or unset it."
        ) from None
    hosts = out.split()
    if not hosts:
        raise ConfigError(
            f"{name}={nodelist!r} expands to no host (scontrol show hostnames printed "
            "nothing); run inside the allocation (salloc/sbatch) that set it."
        )
    return hosts


def read_slurm(where: Surroundings) -> Detected:
    name = "SLURM_JOB_NODELIST" if where.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    nodelist = (where.get(name) or "").strip()
    if not nodelist:
        raise _unset("SLURM_JOB_NODELIST", "slurm", "inside an allocation (salloc, sbatch)")
    hosts = _slurm_hosts(nodelist, where, name)
    counts, source = [1], "one slot per node"
    for var in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_CPUS_PER_NODE"):
        value = where.get(var)
        if value is not None:
            counts, source = expand_counts(value, var), f"{var}={value!r}"
            break
    return Detected(
        kind="slurm",
        hosts_with_slots=hosts_with_counts(hosts, counts, source),
        source=f"{name}={nodelist!r}, {source}",
        current_host=where.get("SLURMD_NODENAME"),
        job_id=where.get("SLURM_JOB_ID") or where.get("SLURM_JOBID"),
    )


# -- PBS / Torque -----------------------------------------------------------------------------


def read_pbs(where: Surroundings) -> Detected:
    path = where.get("PBS_NODEFILE") or ""
    if not path:
        raise _unset("PBS_NODEFILE", "pbs", "inside a PBS/Torque job (qsub)")
    source = f"PBS_NODEFILE={path!r}"
    text = _read(where, path, "the PBS nodefile")
    # One line per slot: a host's lines add up (parse_hostfile sums repeated hosts).
    hosts = parse_hostfile(text, f"the PBS nodefile {path!r}")
    return Detected(
        kind="pbs",
        hosts_with_slots=_entries(hosts),
        source=source,
        job_id=where.get("PBS_JOBID"),
    )


# -- Kubeflow MPIJob launcher -----------------------------------------------------------------


def read_mpijob(where: Surroundings) -> Detected:
    path, mpi = MPIJOB_HOSTFILE, None
    for var, flavour in MPIJOB_HOSTFILE_VARS.items():
        value = where.get(var)
        if value is not None:
            path, mpi = value, flavour
            break
    role = where.get("K_MPI_JOB_ROLE")
    hosts: tuple[tuple[str, int], ...] = ()
    if role != "worker" or where.path(path).is_file():  # the operator mounts it on the launcher
        text = _read(where, path, "the MPIJob launcher's hostfile")
        hosts = _entries(parse_hostfile(text, f"the MPIJob hostfile {path!r}"))
    mount = where.get(SSH_AUTH_MOUNT_VAR) or _DEFAULT_SSH_AUTH_MOUNT
    ssh: dict[str, Any] = {}
    identity = where.path(posixpath.join(mount, "id_rsa"))
    if identity.is_file():
        ssh["identity"] = str(identity)
    public = where.path(posixpath.join(mount, "id_rsa.pub"))
    if public.is_file():
        # The workers' sshd uses the job's private key as its host key: pin each to it.
        ssh["host_keys"] = {
            host: _fingerprint(public.read_text(), str(public)) for host, _ in hosts
        }
    current = where.get("HOSTNAME")
    return Detected(
        kind="mpijob",
        hosts_with_slots=hosts,
        source=f"the MPIJob hostfile {path!r}",
        current_host=current,
        leader="the launcher pod",  # not in the hostfile: the operator starts it last
        mpi=mpi,
        ssh=ssh,
        role="worker" if role == "worker" else "leader",
    )


def _fingerprint(line: str, path: str) -> str:
    from clusterbook.ssh.hostkeys import fingerprint

    words = line.split()
    if len(words) < 2:
        raise ConfigError(
            f"{path} is not an OpenSSH public key ('TYPE BASE64 [COMMENT]'); mount the job's "
            "key pair there (sshAuthMountPath), or give the hosts' keys yourself (host_keys or "
            "known_hosts)."
        )
    return fingerprint(words[1])


# -- SageMaker --------------------------------------------------------------------------------


def _json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{what} is not JSON ({exc}); SageMaker writes it as JSON.") from None


def _host_names(value: object, what: str) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(h, str) for h in value):
        raise ConfigError(
            f'{what} must be a non-empty JSON list of host names like ["algo-1", "algo-2"], '
            f"got {value!r}."
        )
    return [validate_host(h) for h in value]


def _sagemaker_slots(where: Surroundings) -> tuple[int, str]:
    for var in ("SM_NUM_GPUS", "SM_NUM_CPUS"):
        value = where.get(var)
        if value is not None and value.strip().isdigit() and int(value) > 0:
            return int(value), f"{var}={value}"
    return 1, "one slot per host"


def read_sagemaker(where: Surroundings) -> Detected:
    listed = where.get("SM_HOSTS")
    if listed is not None:
        hosts = _host_names(_json(listed, f"SM_HOSTS={listed!r}"), f"SM_HOSTS={listed!r}")
        current, source = where.get("SM_CURRENT_HOST"), f"SM_HOSTS={listed!r}"
    else:
        path = SAGEMAKER_RESOURCE_CONFIG
        config = _json(_read(where, path, "SageMaker's resource config"), path)
        if not isinstance(config, Mapping):
            raise ConfigError(f"{path} must hold a JSON object with 'hosts' and 'current_host'.")
        hosts = _host_names(config.get("hosts"), f"'hosts' in {path}")
        current, source = config.get("current_host"), path
    slots, said = _sagemaker_slots(where)
    current = current if isinstance(current, str) else None
    return Detected(
        kind="sagemaker",
        hosts_with_slots=hosts_with_counts(hosts, [slots], said),
        source=f"{source}, {said}",
        current_host=current,
        leader=hosts[0],  # algo-1: the toolkit's master_hostname is the first host
        job_id=where.get("TRAINING_JOB_NAME"),
        ssh={"host_keys": "accept-new"},  # every container is new: trusted on first use
        role="worker" if current not in (None, hosts[0]) else "leader",
    )


READERS: Mapping[str, Callable[[Surroundings], Detected]] = {
    "slurm": read_slurm,
    "pbs": read_pbs,
    "mpijob": read_mpijob,
    "sagemaker": read_sagemaker,
}
