"""Starting Open MPI's ``prterun`` as its ``mpirun`` would, without the ``mpirun`` in between.

Open MPI 5's ``mpirun`` is a front for ``prterun`` (``ompi/tools/mpirun/main.c``): it initialises
Open MPI's utility layer, sets a few variables (``PRTE_MCA_schizo_proxy=ompi``, ``OMPI_VERSION``,
``OMPI_TOOL_NAME``, ``OMPI_LIBDIR_LOC``, ``OMPI_MCA_PREFIXES``, and ``PRTE_PREFIX`` and
``PMIX_PREFIX`` from ``OPAL_PREFIX``, which the PyPI wheel's stub in front of it sets first), then
execs the ``prterun`` beside it with its own arguments (``argv[0]`` the full path, for an
absolute ``mpirun``). Those two starts cost every job 3 ms on a 2-core machine and 14 ms on a
16-core one with Ubuntu's Python (``benchmarks/job_timeline.py``).

The head learns once what ``mpirun`` sets, from ``mpirun`` itself: ``OMPI_PRTERUN`` (where
``mpirun`` reads its ``prterun`` from) pointed at ``env -0`` prints the environment it would hand
``prterun``. A job then starts that ``prterun`` with the same arguments and those variables: the
processes, arguments and environment ``mpirun`` would have made, less its own two. Where the
job's environment sets one of those variables itself, or anything is not as learned, the job
starts ``mpirun`` as before.
"""

from __future__ import annotations

import logging
import os
import posixpath
import shutil
import subprocess
from collections.abc import Mapping

__all__ = ["OWN", "added", "learn", "prterun_start"]

_log = logging.getLogger("clusterbook.launch")

#: The variable ``mpirun`` reads for its ``prterun``: the learning sets it; a job that does
#: starts ``mpirun``.
OWN = "OMPI_PRTERUN"
#: What only Open MPI 5's ``mpirun`` sets: proof that the learning reached it.
_MARK = "PRTE_MCA_schizo_proxy"


def added(before: Mapping[str, str], after: Mapping[str, str]) -> dict[str, str]:
    """The variables ``after`` sets that ``before`` did not have (or had otherwise), but
    :data:`OWN`."""
    return {k: v for k, v in after.items() if before.get(k) != v and k != OWN}


def learn(mpirun: str, version: str) -> tuple[tuple[str, str], ...] | None:
    """What Open MPI ``version``'s ``mpirun`` sets before it execs ``prterun``, learned from it;
    None where it cannot be (before Open MPI 5, no ``prterun`` beside it, no ``env``)."""
    if not version.split(".")[0].isdigit() or int(version.split(".")[0]) < 5:
        return None
    env_tool = shutil.which("env")
    if env_tool is None or not os.access(
        posixpath.join(posixpath.dirname(mpirun), "prterun"), os.X_OK
    ):
        return None
    before = dict(os.environ)
    try:
        shown = subprocess.run(
            [mpirun, "-0"],
            env={**before, OWN: env_tool},
            capture_output=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        _log.debug("Could not learn what %s sets: %s", mpirun, exc)
        return None
    after = dict(
        item.decode("utf-8", "surrogateescape").partition("=")[::2]
        for item in shown.split(b"\0")
        if b"=" in item
    )
    sets = added(before, after)
    if _MARK not in sets:
        return None
    return tuple(sorted(sets.items()))


def prterun_start(
    mpirun: str, sets: tuple[tuple[str, str], ...] | None, env: Mapping[str, str]
) -> tuple[str, dict[str, str]] | None:
    """The ``prterun`` to start instead of ``mpirun`` and the variables to give it, for a job
    whose launcher environment ``env`` would be; None when ``mpirun`` must start it (nothing
    learned, or ``env`` sets one of the variables or :data:`OWN` itself)."""
    if sets is None or OWN in env or any(name in env for name, _ in sets):
        return None
    return posixpath.join(posixpath.dirname(mpirun), "prterun"), dict(sets)
