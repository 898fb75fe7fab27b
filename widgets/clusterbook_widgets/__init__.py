"""The Jupyter layer of clusterbook: live widgets, the log viewer, the magics, notebook
progress bars and prompts.

``%load_ext clusterbook`` (or ``%load_ext clusterbook_widgets``) registers the magics; the
names below load on first use, so ``import clusterbook_widgets`` imports no ipywidgets until a
widget is made. The core finds :func:`display_cluster`, :func:`load_ipython_extension`,
:func:`clusterbook_widgets.progress.notebook_bars` and
:func:`clusterbook_widgets.notebook.prompt` through the ``clusterbook.jupyter`` entry points
(it never imports this package by name).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterbook._lazy import lazy_names

if TYPE_CHECKING:
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

_LAZY = {
    "ClusterWidget": "clusterbook_widgets.cluster_widget",
    "display_cluster": "clusterbook_widgets.cluster_widget",
    "LogViewer": "clusterbook_widgets.log_viewer",
    "Scheduler": "clusterbook_widgets.throttle",
    "ThreadScheduler": "clusterbook_widgets.throttle",
    "Throttle": "clusterbook_widgets.throttle",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())


def current_cluster(shell: Any = None) -> Any:
    """The cluster ``%cluster`` started (the one ``%%mpirun`` uses), or None."""
    from clusterbook_widgets.magics import current_cluster as current

    return current(shell)


def load_ipython_extension(ipython: Any) -> None:
    """Register clusterbook's magics (``%cluster``, ``%%mpirun``) with ``ipython``."""
    from clusterbook_widgets.magics import ClusterMagics

    ipython.register_magics(ClusterMagics)
