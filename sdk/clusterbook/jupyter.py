"""The core's one door to a Jupyter layer it never imports by name: the ``clusterbook.jupyter``
entry points.

A package that brings clusterbook to notebooks registers, in that entry point group:

============= ============================================================================
``display``   cluster -> an object with ``_repr_mimebundle_`` (the live widget)
``extension`` ``%load_ext clusterbook``: a function that takes the IPython shell
``progress``  () -> a maker of progress bars (tqdm's options in, a tqdm-like bar out)
              while a notebook watches this process; None otherwise
``prompt``    () -> a prompt (``getpass``'s signature) while a notebook can answer it;
              None otherwise
``busy``      () -> a pump (no arguments: handles the widget clicks that came meanwhile)
              while this thread runs a notebook's cell and can handle them; None
              otherwise (:mod:`clusterbook.waiting` runs it while a wait blocks)
============= ============================================================================

clusterbook's own Jupyter layer, ``clusterbook_widgets``, registers all five, and it alone
answers whether a notebook watches. Without a Jupyter layer, clusters show as their repr and
static HTML, bars are terminal bars, passphrases are asked in a terminal only, and waits
handle no clicks while they block.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENTRY_POINTS",
    "Prompt",
    "Pump",
    "hook",
    "notebook_bars",
    "notebook_prompt",
    "notebook_pump",
]

ENTRY_POINTS = "clusterbook.jupyter"

Prompt = Callable[[str], str]

#: Handles the widget clicks that came while a cell waits; returns once none is left.
Pump = Callable[[], None]


@functools.cache
def hook(name: str) -> Callable[..., Any] | None:
    """The ``name`` entry of the installed Jupyter layer, loaded; None when there is none.

    Looked up once per process: reading the installed packages' metadata takes milliseconds,
    and progress bars ask at every ``put()``."""
    from importlib.metadata import entry_points  # only when asked: agents start faster

    for entry in entry_points(group=ENTRY_POINTS, name=name):
        try:
            loaded: Callable[..., Any] = entry.load()
        except ImportError:  # the layer's own dependencies are missing: no layer
            return None
        return loaded
    return None


def notebook_bars() -> Callable[[dict[str, Any]], Any] | None:
    """The Jupyter layer's maker of progress bars while a notebook watches this process;
    None otherwise (a terminal, a script, no Jupyter layer)."""
    ask = hook("progress")
    return None if ask is None else ask()


def notebook_prompt() -> Prompt | None:
    """The Jupyter layer's prompt while a notebook can answer it; None otherwise."""
    ask = hook("prompt")
    return None if ask is None else ask()


def notebook_pump() -> Pump | None:
    """The Jupyter layer's pump while this thread runs a notebook's cell and can handle its
    widget clicks; None otherwise (a terminal, a script, another thread, no Jupyter layer)."""
    ask = hook("busy")
    return None if ask is None else ask()
