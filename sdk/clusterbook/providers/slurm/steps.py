"""Whether a Slurm cluster's jobs start as steps of its batch job: :class:`StepCheck`.

Jobs start as steps (``srun``, the MPI's PMI plugin: see :mod:`clusterbook.launch.srun`)
while every node of the round is one of the batch job's, once a start check found that MPI
gets its world through the plugin (:func:`~clusterbook.providers.slurm.srun.check_world`);
else with mpirun over the agents' sshd, and the first time it says why. The check runs once.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable, Sequence

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.launch.remote import SrunStep
from clusterbook.providers.base import StartContext
from clusterbook.providers.slurm.commands import SlurmRunner
from clusterbook.providers.slurm.srun import check_world
from clusterbook.spec import NodeSpec

__all__ = ["StepCheck"]

_log = logging.getLogger(__name__)


class StepCheck:
    """Decides, once, whether jobs start as steps of a batch job whose Slurm commands run
    through ``run`` (``which`` finds ``srun``: :func:`shutil.which` unless a test says)."""

    def __init__(self, run: SlurmRunner, which: Callable[[str], str | None] = shutil.which) -> None:
        self._run = run
        self._which = which
        self._lock = threading.Lock()
        self._checked: str | None = None  # srun, once the start check passed
        self.failed: str | None = None  # why jobs start over ssh instead

    def step(
        self, job_id: int | None, ctx: StartContext | None, nodes: Sequence[NodeSpec]
    ) -> SrunStep | None:
        """The step of job ``job_id`` that starts jobs on ``nodes``, or None: mpirun over
        ssh (a node that is not the job's, a start check that failed, no job)."""
        if job_id is None or ctx is None or self.failed is not None:
            return None
        suffix = f"-{job_id}"  # a node of the job is named after its Slurm node and the job
        if not nodes or not all(n.name.endswith(suffix) for n in nodes):
            return None
        names = {n.host: n.name.removesuffix(suffix) for n in nodes}
        with self._lock:
            if self._checked is None:
                srun = self._which("srun")
                try:
                    if srun is None:
                        raise ConfigError("srun is not on PATH here")
                    check_world(self._run, srun, str(job_id), sorted(set(names.values())), ctx)
                except ClusterError as exc:
                    self.failed = f"Jobs start with mpirun over ssh, not srun: {exc}"
                    _log.warning("%s", self.failed)
                    return None
                self._checked = srun
        return SrunStep(self._checked, str(job_id), names)
