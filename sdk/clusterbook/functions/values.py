"""What a function job's ranks left behind, read back: each rank's return value, or the error
that failed the job with the rank's own traceback as its cause.

Each rank of a function job (:mod:`clusterbook.functions.rank`) writes ``rank-N.value`` (its
return value, pickled) or ``rank-N.error`` (JSON: why it has none) in a folder that the head
gathers from the nodes once the job has ended. :func:`read_values` turns that folder and the
job's :class:`~clusterbook.JobResult` into the list of values by rank, or raises.
"""

from __future__ import annotations

import json
import linecache
import re
import types
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clusterbook.errors import JobFailedError, SerializationError
from clusterbook.functions.payload import load_value, verified

if TYPE_CHECKING:
    from clusterbook.launch.result import JobResult

__all__ = ["RemoteTraceback", "code_files", "read_values"]

# A frame of code cloudpickle sent by value: it names no file (the same bytes wherever the
# function was defined), so the head puts back where it was defined, and its line.
_DYNAMIC = re.compile(r'^  File "<dynamic-code>", line (\d+), in (\S+)$', re.MULTILINE)


class RemoteTraceback(Exception):
    """A rank's traceback, as the ``__cause__`` of the :class:`JobFailedError` its raise
    caused: Python prints it above that error, as ``concurrent.futures`` does for a process
    pool's. ``rank``, ``host`` and ``type`` say whose it is."""

    def __init__(self, text: str, *, rank: int, host: str, type: str) -> None:
        super().__init__(text)
        self.text, self.rank, self.host, self.type = text, rank, host, type

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


def code_files(fn: object) -> dict[str, str]:
    """The file each code object in ``fn`` (its own, and those nested in it) was defined in,
    by the code's name; names defined in two files are left out (which is it?)."""
    found: dict[str, set[str]] = {}
    code = getattr(fn, "__code__", None)  # a function's (a partial or a class: none known)
    todo = [code] if isinstance(code, types.CodeType) else []
    while todo:
        each = todo.pop()
        found.setdefault(each.co_name, set()).add(each.co_filename)
        todo += [c for c in each.co_consts if isinstance(c, types.CodeType)]
    return {name: files.pop() for name, files in found.items() if len(files) == 1}


def placed(text: str, files: Mapping[str, str]) -> str:
    """``text`` (a rank's traceback) with the frames of code sent by value put back in the
    file it came from, with its line, where ``files`` (:func:`code_files`) knows it."""

    def frame(match: re.Match[str]) -> str:
        line, name = int(match[1]), match[2]
        where = files.get(name)
        if where is None:
            return match[0]
        source = linecache.getline(where, line).strip()
        return f'  File "{where}", line {line}, in {name}' + (f"\n    {source}" if source else "")

    return _DYNAMIC.sub(frame, text)


def read_values(
    folder: Path, outcome: JobResult, key: bytes, files: Mapping[str, str] | None = None
) -> list[Any]:
    """The value each rank returned, by rank, from ``folder`` (each signed with ``key`` by
    that rank, else refused); a job that did not succeed is
    a :class:`JobFailedError`: the lowest rank's error when a rank left one (its traceback as
    the cause), else the job's own (as ``JobResult.check()``)."""
    if not outcome.ok:
        errors = sorted(_errors(folder), key=lambda e: e["rank"])
        if not errors:
            outcome.check()
        raise _failure(errors[0], outcome, others=len(errors) - 1, files=files or {})
    values = []
    for rank in sorted(outcome.rank_exit_codes):
        path = folder / f"rank-{rank}.value"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise JobFailedError(
                f"Job {outcome.job_id}: rank {rank} exited 0 but left no return value "
                f"({path}): did the function end the process itself (os._exit)? Return from "
                "it instead.",
                result=outcome,
            ) from None
        # The ranks run the user's own function; their values come from the cluster's private
        # folders (0700), as a process pool's results come from its workers.
        pickled = verified(key, rank, data)
        if pickled is None:
            raise JobFailedError(
                f"Job {outcome.job_id}: {path} is not rank {rank}'s value (not signed with the "
                "job's key): something else wrote it; nothing of it was read.",
                result=outcome,
            )
        try:
            values.append(load_value(pickled))
        except Exception as exc:
            raise SerializationError(
                f"Job {outcome.job_id}: rank {rank}'s return value cannot be read here "
                f"({type(exc).__name__}: {exc}); install here what it needs, or return plain "
                "data (numbers, arrays, a path)."
            ) from exc
    return values


def _errors(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in folder.glob("rank-*.error*"):  # a name two nodes sent gets .from-HOST
        try:
            record = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            continue  # a record that cannot be read says nothing; the job's result still does
        if isinstance(record, dict) and isinstance(record.get("rank"), int):
            found.append(record)
    return found


def _failure(
    record: dict[str, Any], outcome: JobResult, *, others: int, files: Mapping[str, str]
) -> JobFailedError:
    rank, host = record["rank"], str(record.get("host", "?"))
    kind, message = record.get("kind"), str(record.get("message", ""))
    name = str(record.get("type", "Exception")).removeprefix("builtins.")
    more = f" ({others} other rank{'s' if others > 1 else ''} failed too)" if others else ""
    if kind == "value":
        what = record.get("value_type") or "value"
        head = f"rank {rank} on {host} returned a {what}, which cannot be pickled{more}"
    elif kind == "load":
        head = f"rank {rank} on {host} could not load the function ({name}: {message}){more}"
    else:
        head = f"rank {rank} on {host} raised {name}: {message}{more}"
    error = JobFailedError(
        f"Job {outcome.job_id} failed: {head}. The rank's traceback is above.", result=outcome
    )
    text = placed(str(record.get("traceback", "")), files)
    error.__cause__ = RemoteTraceback(text, rank=rank, host=host, type=name)
    return error
