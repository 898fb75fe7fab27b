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

from importlib import import_module
from typing import TYPE_CHECKING, Any

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


def __getattr__(name: str) -> Any:
    """A name of :data:`_LAZY`, imported from its module on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once: later lookups do not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


def current_cluster(shell: Any = None) -> Any:
    """The cluster ``%cluster`` started (the one ``%%mpirun`` uses), or None."""
    from clusterbook_widgets.magics import current_cluster as current

    return current(shell)


def load_ipython_extension(ipython: Any) -> None:
    """Register clusterbook's magics (``%cluster``, ``%%mpirun``) with ``ipython``."""
    from clusterbook_widgets.magics import ClusterMagics

    ipython.register_magics(ClusterMagics)
