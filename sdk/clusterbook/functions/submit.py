"""``cluster.submit(fn, *args)``: a function run on every rank as an MPI job, whose value is
the list of what each rank returned.

The call is pickled here (:mod:`clusterbook.functions.payload`: what cannot be pickled is
named before any rank starts) into a private folder of the cluster's run directory,
``RUN_DIR/functions/call-XXXX/``, with the rank program beside it
(:mod:`clusterbook.functions.rank`); ``put`` brings the folder to nodes that do not share this
filesystem, and the job runs the rank program (``python -c rank.LOADER FOLDER/rank.py FOLDER``:
from its bytecode, ``rank.pyc``, in the same Python) on every rank, with every option
``mpirun`` takes. Once the job has ended, the first ``result()`` gathers ``values/`` from the
nodes, moves it into the job's directory (``JOB_DIR/values/rank-N.value``) and reads it
(:mod:`clusterbook.functions.values`). It works on any
:class:`~clusterbook.cluster.handle.ClusterHandle`: a cluster of this process, or one attached,
here or over ssh (where the folder is made and read through the handle's connection:
:mod:`clusterbook.functions.place`).
"""

from __future__ import annotations

import marshal
import secrets
from collections.abc import Callable, Mapping
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import ClusterError, ClusterStateError, JobFailedError
from clusterbook.functions import payload, rank
from clusterbook.functions.place import CallPlace, place_of
from clusterbook.functions.values import code_files, read_values

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from clusterbook.cluster.handle import ClusterHandle, JobHandle
    from clusterbook.launch.prepare import JobArgs
    from clusterbook.launch.result import JobResult

__all__ = ["start", "submit"]

_RANK_PROGRAM: tuple[bytes, bytes] | None = None


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
    _check_running(cluster)
    place = place_of(cluster)
    key = secrets.token_bytes(32)  # the ranks sign their values with it
    source, bytecode = rank_program()
    program = {"call.pkl": payload.envelope(call, key), "rank.py": source, "rank.pyc": bytecode}
    folder = place.create(program)
    try:
        cluster.put(folder, progress=False)  # nodes that do not share this filesystem
        options: JobArgs = {**job}
        # Lines as they are printed, as in a notebook; the job's own env has the last word.
        options["env"] = {"PYTHONUNBUFFERED": "1", **(job.get("env") or {})}
        argv = ["python", "-c", rank.LOADER, str(folder / "rank.py"), str(folder)]
        started = cluster.mpirun(argv, np, **options)
    except BaseException:
        place.discard(folder)  # nothing ran: nothing to keep
        raise
    reader = _Reader(cluster, place, folder, started.directory, key, files or {})
    started.bind_value(reader)
    return started


class _Reader:
    """A function job's value, read once it has ended (see the module)."""

    def __init__(
        self,
        cluster: ClusterHandle,
        place: CallPlace,
        folder: Path,
        job_dir: Path,
        key: bytes,
        files: Mapping[str, str],
    ) -> None:
        self.cluster, self.place, self.folder, self.job_dir = cluster, place, folder, job_dir
        self.key, self.files = key, files

    def __call__(self, outcome: JobResult) -> list[Any]:
        unreached: ClusterError | None = None
        try:
            self.cluster.gather(self.folder / "values", progress=False)
        except ClusterError as exc:  # stopped since, say: the nodes sharing its files are read
            unreached = exc
        try:
            with self.place.values(self.folder, self.job_dir) as values:
                return read_values(values, outcome, self.key, self.files)
        except JobFailedError as exc:
            if unreached is None or not outcome.ok:
                raise
            raise JobFailedError(
                f"{exc} Its values could not be gathered from the nodes: {unreached}",
                result=outcome,
            ) from unreached


def _check_running(cluster: ClusterHandle) -> None:
    if cluster.state != "running":
        raise ClusterStateError(
            f"Cluster {cluster.name} is {cluster.state}: submit() runs functions on a running "
            "cluster; start() it first (or use it as a context manager)."
        )


def rank_program() -> tuple[bytes, bytes]:
    """The rank program's source, and its bytecode in a .pyc file's layout (this Python's
    magic number; no date or size: the loader checks the magic number only)."""
    global _RANK_PROGRAM
    if _RANK_PROGRAM is None:
        source = Path(rank.__file__).read_bytes()
        code = compile(source, "rank.py", "exec", dont_inherit=True)
        _RANK_PROGRAM = source, MAGIC_NUMBER + bytes(12) + marshal.dumps(code)
    return _RANK_PROGRAM
