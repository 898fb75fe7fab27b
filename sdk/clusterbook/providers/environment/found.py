"""The system around this process, as clusterbook reads it: where its variables, files and
commands come from (:class:`Surroundings`, this process's own unless a test says otherwise),
and what it says of the nodes it gives (:class:`Detected`).

:mod:`clusterbook.providers.environment.readers` turns each system's words into a
:class:`Detected`; :mod:`clusterbook.providers.environment.detect` chooses the system.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Detected", "Runner", "Surroundings", "run_command"]

#: Runs a command, returns its standard output; raises ``OSError`` when it is not there and
#: ``subprocess.CalledProcessError`` (with ``stderr``) when it fails.
Runner = Callable[[Sequence[str]], str]


def run_command(argv: Sequence[str]) -> str:
    """The default :data:`Runner`: ``argv`` run here, stopped after 30 seconds."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=30)
    except subprocess.TimeoutExpired as exc:
        raise subprocess.CalledProcessError(
            -1, list(argv), "", f"no answer within {exc.timeout:g} seconds"
        ) from None
    return done.stdout


@dataclass(frozen=True, slots=True)
class Surroundings:
    """Where the system's variables, files and commands come from (this process's own by
    default): ``environ``, file paths read under ``root``, commands through ``runner``."""

    environ: Mapping[str, str]
    root: Path = Path("/")
    runner: Runner = run_command

    @classmethod
    def make(
        cls,
        environ: Mapping[str, str] | None = None,
        root: str | os.PathLike[str] | None = None,
        runner: Runner | None = None,
    ) -> Surroundings:
        return cls(
            dict(os.environ if environ is None else environ),
            Path("/" if root is None else root),
            runner or run_command,
        )

    def path(self, absolute: str) -> Path:
        """Where ``absolute`` (as the system names it) is under :attr:`root`."""
        return self.root / absolute.lstrip("/")

    def get(self, name: str) -> str | None:
        """The variable's value, None when unset or blank."""
        value = self.environ.get(name)
        return value if value and value.strip() else None


@dataclass(frozen=True, slots=True)
class Detected:
    """The nodes a system gives this process, and what it says about them.

    Attributes
    ----------
    kind
        ``"slurm"``, ``"pbs"``, ``"mpijob"`` or ``"sagemaker"``.
    hosts_with_slots
        ``(host, slots)`` per node, in the system's order, each host once (none on an
        MPIJob's worker pod, which is given no hostfile).
    source
        Where they were read, for messages (``"SLURM_JOB_NODELIST='n[1-2]'"``).
    current_host
        This host's name, when the system says it.
    leader
        Where the cluster is to be built, when the system says (SageMaker: the first host;
        an MPIJob: its launcher pod); None: anywhere.
    role
        ``"worker"`` on a host where the cluster is not to be built (another SageMaker host
        than the first, an MPIJob's worker pod), else ``"leader"``.
    job_id
        The system's id of the job or allocation, when it says it.
    mpi
        The MPI flavour the system prepared for (an MPIJob's), else None.
    ssh
        Options for the SSH provider the system implies (``identity``, ``host_keys``...);
        those given to ``from_environment`` win.
    """

    kind: str
    hosts_with_slots: tuple[tuple[str, int], ...]
    source: str
    current_host: str | None = None
    leader: str | None = None
    job_id: str | None = None
    mpi: str | None = None
    ssh: Mapping[str, Any] = field(default_factory=dict)
    role: str = "leader"

    @property
    def hosts(self) -> list[str]:
        """``["node1:4", ...]``, as ``Cluster.ssh`` takes them."""
        return [f"{host}:{slots}" for host, slots in self.hosts_with_slots]

    @property
    def total_slots(self) -> int:
        return sum(slots for _, slots in self.hosts_with_slots)
