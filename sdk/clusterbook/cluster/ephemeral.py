"""One job on a cluster that lives for it alone: ``cb.run(argv, np=..., cluster=...)``.

The cluster is started for the job and torn down after it, whatever happens: the job ends,
fails, times out, or the caller is interrupted (the job is cancelled first). Kubeflow's MPIJob
launcher and Oracle ADS's ephemeral clusters work this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from clusterbook.errors import ClusterStateError, JobTimeoutError
from clusterbook.views.progress import bar, checked

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.cluster.facade import Cluster
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.result import JobResult

__all__ = ["run"]


def run(
    argv: Sequence[str],
    np: int | None = None,
    *,
    cluster: Cluster | None = None,
    progress: bool | None = None,
    **job: Unpack[JobArgs],
) -> JobResult:
    """Start ``cluster`` (default: a local one, a slot per core), run ``argv`` on ``np`` ranks
    (the other arguments: those of ``Cluster.mpirun``), stop the cluster and return the job's
    result, also when the job fails or this is interrupted. ``cluster`` must not be started
    yet: a cluster someone else started is not ours to stop."""
    from clusterbook.cluster.facade import Cluster

    progress = checked(progress)
    if cluster is None:
        cluster = Cluster.local()
    if cluster.state != "created":
        raise ClusterStateError(
            f"cb.run() starts and stops its cluster, but cluster {cluster.name!r} is "
            f"{cluster.state}; pass a new cluster, or call cluster.mpirun() on this one."
        )
    try:
        cluster.start(progress=progress)
        running = cluster.mpirun(argv, np, **job)
        # A bar of the ranks that ended, where someone watches; an interrupt cancels the job.
        with bar(progress, f"running {running.id}", running.np, "rank") as shown:
            while True:
                try:
                    result = running.wait(0.2)
                except JobTimeoutError:
                    shown.update(running.ranks_ended)
                    continue
                shown.update(running.ranks_ended)
                return result
    finally:
        cluster.stop()
