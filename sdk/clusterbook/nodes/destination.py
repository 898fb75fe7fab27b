"""Where ``put(dest=)`` and ``write()`` put things on the nodes (pure): the path ``dest``
names there, checked, and where each of ``put``'s sources goes under it.

A relative ``dest`` is taken from the directory the cluster's jobs run in by default (the
head's working directory, at the same path on every node) and may not leave it; an absolute
one may be anywhere but among the cluster's own files (its run directory, ``~/.clusterbook``,
``~/.ssh``), where a file put would break the cluster or what keeps it safe.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from clusterbook.errors import ConfigError

__all__ = ["own_files", "placement", "target"]


def own_files(run_dir: str | os.PathLike[str]) -> tuple[str, ...]:
    """The cluster's own files, which ``dest`` may not name: its run directory, and the
    directories of clusterbook and ssh in the user's home."""
    home = os.path.expanduser("~")
    return (
        os.path.abspath(run_dir),
        os.path.join(home, ".clusterbook"),
        os.path.join(home, ".ssh"),
    )


def target(dest: object, base: str, own: Sequence[str], op: str) -> str:
    """The absolute path ``dest`` names on the nodes (``op``: the call, for the message):
    relative ones from ``base``, which they may not leave; none inside ``own``."""
    if not isinstance(dest, (str, os.PathLike)) or not os.fspath(dest):
        raise ConfigError(
            f"{op}(dest={dest!r}): give a path on the nodes, like dest='data/' (relative to the "
            f"directory jobs run in, {base}) or an absolute one."
        )
    text = os.path.expanduser(os.fspath(dest))
    if not isinstance(text, str):
        raise ConfigError(f"{op}(dest={dest!r}): give the path as text, not bytes.")
    if os.path.isabs(text):
        path = os.path.normpath(text)
    else:
        relative = os.path.normpath(text)
        if relative == ".." or relative.startswith("../"):
            raise ConfigError(
                f"{op}(dest={dest!r}): a relative dest stays inside the directory jobs run in "
                f"({base}), and this one leaves it; give an absolute path instead."
            )
        path = os.path.normpath(os.path.join(base, relative))
    for top in own:
        if path == top or path.startswith(top.rstrip("/") + "/"):
            raise ConfigError(
                f"{op}(dest={dest!r}): {path} is among the cluster's own files ({top}), which "
                "a put or write may not replace; choose a path outside it."
            )
    return path


def placement(
    sources: Sequence[Path], dest: str | os.PathLike[str], there: str
) -> Callable[[Path], str]:
    """Where each of ``sources`` (absolute) goes, given ``dest`` and the path ``there`` it
    names: a single source goes at ``there`` (a directory's contents in it), unless ``dest``
    ends with ``/``; then, as with several sources, each goes into ``there`` under its own
    name."""
    into = len(sources) > 1 or os.fspath(dest).endswith(("/", os.sep))

    def place(source: Path) -> str:
        return os.path.join(there, source.name) if into else there

    return place
