"""A job seen through its directory: from another process, or long after it ended.

A job's directory holds ``job.json`` (what it runs, written at its start), ``rank-N.log`` and
``launcher.log`` (every line as it arrived, see :mod:`clusterbook.launch.logs`), the same in
``attempt-2/``, ... for each retry, and, once it ended, ``result.json``. :class:`SavedJob`
reads them: ``logs()``, ``outcome``, ``wait()`` (a future, as ``Job``) and a live
``stream()`` that follows the files while the job runs. ``cb.Job.load(directory)`` makes
one. The files are read through a :class:`~clusterbook.launch.files.Files`: this machine's,
or (for a cluster attached over ssh) those of the machine its head runs on.
"""

from __future__ import annotations

import heapq
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.durations import Duration
from clusterbook.errors import JobTimeoutError, RecordError
from clusterbook.launch.files import LOCAL, Files
from clusterbook.launch.future import JobFuture
from clusterbook.launch.logs import LAUNCHER_RANK, LogRecord, parse_log_line, records_frame
from clusterbook.launch.result import JobResult
from clusterbook.spec import validate_timeout
from clusterbook.waiting import pause

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["SavedJob"]

_POLL = 0.1


class SavedJob(JobFuture):
    """A job read from its directory (see the module's docstring).

    ``cancel`` is what the cluster that runs it gives (an attached cluster's handle passes
    one); a job loaded on its own cannot be cancelled from here. ``files`` reads the
    directory (default: on this machine).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        cancel: Callable[[str], object] | None = None,
        files: Files = LOCAL,
    ) -> None:
        self._init_future()
        self.directory = Path(directory)
        self._fs = files
        info = _read_json(files, self.directory / "job.json", "a job's directory")
        if info is None:
            where = f"{files.where}:" if files.where else ""
            raise RecordError(
                f"{where}{self.directory} is not a job's directory: it has no job.json.",
                path=self.directory / "job.json",
            )
        try:
            self.id: str = str(info["id"])
            self.np: int = int(info["np"])
            self.argv: list[str] = [str(a) for a in info["argv"]]
            self.started: float = float(info.get("started", 0.0))
            self.launcher: str = str(info.get("launcher", "mpirun"))
            self._hosts = {int(k): str(v) for k, v in info.get("hosts", {}).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise RecordError(
                f"{self.directory / 'job.json'} is not a job's record ({exc!r}).",
                path=self.directory / "job.json",
            ) from exc
        self._cancel = cancel
        self._result: JobResult | None = None

    # -- state ---------------------------------------------------------------------------

    @property
    def outcome(self) -> JobResult | None:
        """The :class:`JobResult` once the job has ended (its ``result.json`` is there), else
        None."""
        if self._result is None:
            data = _read_json(self._fs, self.directory / "result.json", "a job's result")
            if data is None:
                return None
            self._result = JobResult.from_dict(data)
            hosts = self._result.rank_hosts
            self._hosts.update({r: h for r, h in hosts.items() if h != "?"})
        return self._result

    @property
    def ranks_ended(self) -> int:
        """How many ranks have ended (all once the job has; its files say no more before)."""
        result = self.outcome
        return 0 if result is None else sum(c is not None for c in result.rank_exit_codes.values())

    def wait(self, timeout: Duration | None = None) -> JobResult:
        """Wait for the job's result (``timeout``: for this wait only, as ``Job.wait``)."""
        limit = validate_timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        while (result := self.outcome) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise JobTimeoutError(
                    f"Job {self.id} is still running after waiting {limit:g} s; wait longer, "
                    "or cancel it.",
                    timeout=limit or 0.0,
                )
            pause(_POLL)  # in a notebook, the widgets' buttons act meanwhile
        return result

    def _request_cancel(self) -> None:
        """``cancel()``: stop the job through the cluster that runs it, and wait for its
        end."""
        if self.outcome is None:
            if self._cancel is None:
                from clusterbook.errors import ClusterStateError

                raise ClusterStateError(
                    f"Job {self.id} was loaded from {self.directory}; cancel it through its "
                    "cluster: cb.Cluster.attach(ID).jobs[...].cancel(), or clusterbook stop ID."
                )
            self._cancel(self.id)
        self.wait()

    # -- output --------------------------------------------------------------------------

    def logs(self, rank: int | None = None) -> pd.DataFrame:
        """Every line the job's files hold so far, in the order they arrived (columns as
        ``Job.logs()``); ``rank`` keeps one rank's (-1: the launcher's)."""
        return records_frame(self.records(rank))

    def records(self, rank: int | None = None) -> list[LogRecord]:
        """What :meth:`logs` holds, as :class:`LogRecord` values."""
        self.outcome  # noqa: B018 - reads the hosts the result knows
        files = [f for f in self._files() if rank is None or f[0] == rank]
        per_file = self._read_new(files, {})
        return list(heapq.merge(*per_file, key=lambda rec: (rec.attempt, rec.time)))

    def stream(self, *, from_start: bool = True) -> Iterator[LogRecord]:
        """Yield records as they reach the files, until the job has ended and every file
        is read (``from_start=False``: only what comes from now on)."""
        offsets: dict[Path, int] = {}
        if not from_start:
            offsets = {path: self._fs.size(path) or 0 for _, path, _ in self._files()}
        while True:
            ended = self.outcome is not None  # before reading: nothing written after is missed
            yield from self.read_new(offsets)
            if ended:
                return
            time.sleep(_POLL)

    def read_new(self, offsets: dict[Path, int]) -> list[LogRecord]:
        """The records the files got since ``offsets`` (a file's path: how many of its bytes
        were read; it moves past what is returned), in the order they arrived: one look of
        :meth:`stream`, for a reader that looks when it likes."""
        batch = [rec for recs in self._read_new(self._files(), offsets) for rec in recs]
        batch.sort(key=lambda rec: (rec.attempt, rec.time))
        return batch

    def _read_new(
        self, files: list[tuple[int, Path, int]], offsets: dict[Path, int]
    ) -> list[list[LogRecord]]:
        """The whole lines of each file after ``offsets[path]`` (which moves past them), read
        in one batch."""
        starts = [offsets.get(path, 0) for _, path, _ in files]
        got = self._fs.read_many([(f[1], start) for f, start in zip(files, starts, strict=True)])
        out: list[list[LogRecord]] = []
        for (rank, path, attempt), start, data in zip(files, starts, got, strict=True):
            if data is None:
                out.append([])
                continue
            end = data.rfind(b"\n") + 1  # a line being written is read once it is whole
            offsets[path] = start + end
            host = self._hosts.get(rank, "?")
            text = data[:end].decode("utf-8", errors="replace")
            out.append(
                [parse_log_line(line, rank, host, attempt) for line in text.split("\n")[:-1]]
            )
        return out

    def _files(self) -> list[tuple[int, Path, int]]:
        """Every log file: its rank, path and attempt, attempt by attempt."""
        found = []
        entries = self._fs.listdir(self.directory)
        folders = [(1, self.directory, entries)] + [
            (int(name[8:]), self.directory / name, self._fs.listdir(self.directory / name))
            for name, is_dir in entries
            if name.startswith("attempt-") and name[8:].isdigit() and is_dir
        ]
        for attempt, folder, listed in sorted(folders, key=lambda f: f[0]):
            for name in sorted(n for n, is_dir in listed if n.endswith(".log") and not is_dir):
                stem = name[:-4]
                if name == "launcher.log":
                    found.append((LAUNCHER_RANK, folder / name, attempt))
                elif stem.startswith("rank-") and stem[5:].isdigit():
                    found.append((int(stem[5:]), folder / name, attempt))
        return found

    def __repr__(self) -> str:
        result = self.outcome
        state = "running" if result is None else ("ok" if result.ok else "failed")
        where = f"{self._fs.where}:" if self._fs.where else ""
        return (
            f"<Job {self.id} np={self.np} {state} argv={self.argv!r} "
            f"(from {where}{self.directory})>"
        )


def _read_json(files: Files, path: Path, what: str) -> dict[str, Any] | None:
    """The JSON object in ``path``, None when there is no such file."""
    name = f"{files.where}:{path}" if files.where else str(path)
    try:
        (raw,) = files.read_many([(path, 0)])
        if raw is None:
            return None
        data = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError) as exc:
        raise RecordError(f"Cannot read {name}: {exc}.", path=path) from exc
    if not isinstance(data, dict):
        raise RecordError(f"{name} is not {what}: it holds no JSON object.", path=path)
    return data
