"""Whether someone watches this process in a notebook: the one place that answers it.

A notebook's kernel is an IPython ``ZMQInteractiveShell``: what it prints, displays and asks
(``getpass``, which ipykernel routes to the front end) reaches the person at the notebook. A
terminal IPython, a script or a node's process are not watched from a notebook. IPython is
never imported here: it is looked at only if it runs already.

The core asks through the ``clusterbook.jupyter`` entry points (:mod:`clusterbook.jupyter`):
:func:`prompt` is the ``prompt`` entry; the ``progress`` entry
(:func:`clusterbook_widgets.progress.notebook_bars`) asks :func:`watching` too.
"""

from __future__ import annotations

import getpass
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["is_notebook_shell", "prompt", "running_shell", "watching"]


def running_shell() -> Any:
    """The IPython shell this process runs, or None (IPython not running, or not imported)."""
    ipython = sys.modules.get("IPython")
    return None if ipython is None else ipython.get_ipython()


def is_notebook_shell(shell: object) -> bool:
    """Whether ``shell`` is a notebook's kernel (ipykernel's ``ZMQInteractiveShell``; by name,
    so that asking never imports ipykernel)."""
    return type(shell).__name__ == "ZMQInteractiveShell"


def watching() -> bool:
    """Whether this process is a notebook's kernel: someone watches it in a notebook."""
    return is_notebook_shell(running_shell())


def prompt() -> Callable[[str], str] | None:
    """``getpass`` while a notebook can answer it (the front end asks, never echoing), else
    None. A front end that takes no input makes ``getpass`` raise: the caller's to handle."""
    return getpass.getpass if watching() else None
