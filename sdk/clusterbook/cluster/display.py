"""Where the core meets a Jupyter layer it never imports by name.

A package that shows clusters in notebooks registers itself in the ``clusterbook.jupyter``
entry point group (:mod:`clusterbook.jupyter`): an entry ``display`` (a function that turns a
cluster into an object with ``_repr_mimebundle_``: a live widget) and an entry ``extension``
(``%load_ext clusterbook``: a function that takes the IPython shell). clusterbook's own
Jupyter layer, ``clusterbook_widgets``, registers both; without one, a cluster shows as its
repr.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from clusterbook.errors import ConfigError
from clusterbook.jupyter import hook

if TYPE_CHECKING:
    from clusterbook.cluster.handle import ClusterHandle, Head
    from clusterbook.launch.flavour import Launcher

__all__ = ["head_repr", "load_ipython_extension", "mimebundle"]


def mimebundle(cluster: ClusterHandle, **kwargs: Any) -> dict[str, Any]:
    """What a notebook shows for ``cluster``: its repr (``text/plain``, what a terminal
    prints), a static HTML view of it now (``text/html``: what a saved notebook shows on
    GitHub or nbviewer), and the Jupyter layer's live widget when there is one (shown instead
    of the static view where widgets run)."""
    from clusterbook.views.html import render_cluster

    bundle: dict[str, Any] = {}
    show = hook("display")
    if show is not None:
        bundle.update(show(cluster)._repr_mimebundle_(**kwargs) or {})
    bundle["text/plain"] = repr(cluster)
    bundle["text/html"] = render_cluster(cluster.snapshot())
    return bundle


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext clusterbook``: load the installed Jupyter layer's magics."""
    load = hook("extension")
    if load is None:
        raise ConfigError(
            "%load_ext clusterbook needs clusterbook's Jupyter layer; install it with "
            "pip install 'clusterbook[jupyter]'."
        )
    load(ipython)


def head_repr(head: Head, launcher: Launcher | None, problem: str | None) -> str:
    """A running head's repr: name, kind, state, nodes and slots, launcher, problem."""
    used = f" {launcher.flavour.value} {launcher.version}" if launcher is not None else ""
    slots = sum(n.slots for n in head.nodes)
    return (
        f"<Cluster {head.name!r} {head.kind} {head.state}: {len(head.nodes)} nodes, "
        f"{slots} slots{used}{f' PROBLEM: {problem}' if problem else ''}>"
    )
