"""The Jupyter layer of clusterbook: live widgets, the log viewer and the magics.

``%load_ext clusterbook`` (or ``%load_ext clusterbook_widgets``) registers the magics; the
widgets import ipywidgets only when used.
"""

from __future__ import annotations

from typing import Any

from clusterbook_widgets.cluster_widget import ClusterWidget, display_cluster
from clusterbook_widgets.log_viewer import LogViewer
from clusterbook_widgets.throttle import Scheduler, ThreadScheduler, Throttle

__all__ = [
    "ClusterWidget",
    "LogViewer",
    "Scheduler",
    "ThreadScheduler",
    "Throttle",
    "current_cluster",
    "display_cluster",
    "load_ipython_extension",
]


def current_cluster(shell: Any = None) -> Any:
    """The cluster ``%cluster`` started (the one ``%%mpirun`` uses), or None."""
    from clusterbook_widgets.magics import current_cluster as current

    return current(shell)


def load_ipython_extension(ipython: Any) -> None:
    """Register clusterbook's magics (``%cluster``, ``%%mpirun``) with ``ipython``."""
    from clusterbook_widgets.magics import ClusterMagics

    ipython.register_magics(ClusterMagics)
