"""``cluster.submit(fn, *args)``: a function run on every rank as an MPI job, whose value is
the list of what each rank returned.

The call is pickled here (:mod:`clusterbook.functions.payload`: what cannot be pickled is
named before any rank starts) into a private folder of the cluster's run directory,
``RUN_DIR/functions/call-XXXX/``, with the rank program beside it
(:mod:`clusterbook.functions.rank`); ``put`` brings the folder to nodes that do not share this
filesystem, and the job runs ``python rank.py FOLDER`` on every rank, with every option
``mpirun`` takes. Once the job has ended, the first ``result()`` gathers ``values/`` from the
nodes, moves it into the job's directory (``JOB_DIR/values/rank-N.value``) and reads it
(:mod:`clusterbook.functions.values`). It works on any
:class:`~clusterbook.cluster.handle.ClusterHandle`: a cluster of this process, or one attached.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ClusterError, ClusterStateError, JobFailedError
from clusterbook.functions import payload, rank
from clusterbook.functions.values import code_files, read_values

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.cluster.handle import ClusterHandle, JobHandle
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.result import JobResult

__all__ = ["start", "submit"]

_RANK_SOURCE: bytes | None = None


def submit(
    cluster: ClusterHandle,
    fn: Callable[..., Any],
    /,
    *args: Any,
    np: int | None = None,
    **job: Unpack[JobArgs],
) -> JobHandle:
    """Run ``fn(*args)`` on ``np`` ranks of ``cluster`` (see ``Cluster.submit``)."""
    return start(cluster, payload.dumps(fn, args), np=np, files=code_files(fn), **job)


def start(
    cluster: ClusterHandle,
    call: bytes,
    *,
    np: int | None = None,
    files: Mapping[str, str] | None = None,
    **job: Unpack[JobArgs],
) -> JobHandle:
    """Run the call :func:`payload.dumps` made on ``np`` ranks of ``cluster``; the job, whose
    ``result()`` is the list of the ranks' values (``files``: where the function's code was
    defined, :func:`~clusterbook.functions.values.code_files`, for a raising rank's
    traceback)."""
    folder = _call_dir(cluster)
    key = secrets.token_bytes(32)  # the ranks sign their values with it
    try:
        _write(folder / "call.pkl", payload.envelope(call, key))
        _write(folder / "rank.py", _rank_source())
        cluster.put(folder, progress=False)  # nodes that do not share this filesystem
        options: JobArgs = {**job}
        # Lines as they are printed, as in a notebook; the job's own env has the last word.
        options["env"] = {"PYTHONUNBUFFERED": "1", **(job.get("env") or {})}
        argv = ["python", str(folder / "rank.py"), str(folder)]
        started = cluster.mpirun(argv, np, **options)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)  # nothing ran: nothing to keep
        raise
    started.bind_value(_Reader(cluster, folder, started.directory, key, files or {}))
    return started


class _Reader:
    """A function job's value, read once it has ended (see the module)."""

    def __init__(
        self,
        cluster: ClusterHandle,
        folder: Path,
        job_dir: Path,
        key: bytes,
        files: Mapping[str, str],
    ) -> None:
        self.cluster, self.folder, self.job_dir = cluster, folder, job_dir
        self.key, self.files = key, files

    def __call__(self, outcome: JobResult) -> list[Any]:
        values = self.folder / "values"
        values.mkdir(mode=0o700, exist_ok=True)
        unreached: ClusterError | None = None
        try:
            self.cluster.gather(values, progress=False)
        except ClusterError as exc:  # stopped since, say: the nodes sharing its files are read
            unreached = exc
        kept = self.job_dir / "values"
        with contextlib.suppress(OSError):  # the job's directory elsewhere: read them here
            os.replace(values, kept)
            values = kept
            shutil.rmtree(self.folder, ignore_errors=True)
        try:
            return read_values(values, outcome, self.key, self.files)
        except JobFailedError as exc:
            if unreached is None or not outcome.ok:
                raise
            raise JobFailedError(
                f"{exc} Its values could not be gathered from the nodes: {unreached}",
                result=outcome,
            ) from unreached


def _call_dir(cluster: ClusterHandle) -> Path:
    """A new private folder for one call, under the cluster's run directory."""
    run_dir = cluster.run_dir
    if cluster.state != "running":
        raise ClusterStateError(
            f"Cluster {cluster.name} is {cluster.state}: submit() runs functions on a running "
            "cluster; start() it first (or use it as a context manager)."
        )
    if not run_dir.is_dir():
        raise ClusterStateError(
            f"submit() writes the call into cluster {cluster.name}'s run directory, {run_dir}, "
            "which is not on this machine (a cluster attached over ssh): submit from the "
            "machine its head runs on, or run a script there with mpirun()."
        )
    functions = run_dir / "functions"
    functions.mkdir(mode=0o700, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="call-", dir=functions))  # 0700, a name of its own


def _rank_source() -> bytes:
    global _RANK_SOURCE
    if _RANK_SOURCE is None:
        _RANK_SOURCE = Path(rank.__file__).read_bytes()
    return _RANK_SOURCE


def _write(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
