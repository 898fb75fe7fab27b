"""Launching MPI jobs: launcher discovery, argv builders, running jobs and collecting logs.

The names below are what the layers above (the CLI, the Jupyter layer) use of launch: how a
job's output is read and shown, and the choices of a job's ``clean``. They load on first use,
so importing one module of the package loads no other; the modules themselves are launch's
own and may change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clusterbook._lazy import lazy_names

if TYPE_CHECKING:
    from clusterbook.launch.fold import failure_report, fold_live
    from clusterbook.launch.keep import CLEAN
    from clusterbook.launch.logs import LAUNCHER_RANK, LiveText, LogRecord, read_log_file

__all__ = [
    "CLEAN",
    "LAUNCHER_RANK",
    "LiveText",
    "LogRecord",
    "failure_report",
    "fold_live",
    "read_log_file",
]

_LAZY = {
    "CLEAN": "clusterbook.launch.keep",
    "LAUNCHER_RANK": "clusterbook.launch.logs",
    "LiveText": "clusterbook.launch.logs",
    "LogRecord": "clusterbook.launch.logs",
    "failure_report": "clusterbook.launch.fold",
    "fold_live": "clusterbook.launch.fold",
    "read_log_file": "clusterbook.launch.logs",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
