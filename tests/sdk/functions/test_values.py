"""Reading back what a function job's ranks left (``clusterbook.functions.values``): values by
rank, the error of a raising rank with its traceback as the cause, files nobody signed."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from clusterbook.errors import JobFailedError
from clusterbook.functions import payload
from clusterbook.functions.values import RemoteTraceback, code_files, placed, read_values
from clusterbook.launch.result import JobResult, RankFailure

KEY = b"k" * 32


def outcome(**kw: object) -> JobResult:
    base: dict[str, object] = {
        "job_id": "job-0007",
        "returncode": 0,
        "rank_exit_codes": {0: 0, 1: 0},
        "failed": (),
        "duration": 1.0,
    }
    return JobResult(**{**base, **kw})  # type: ignore[arg-type]


FAILED = outcome(returncode=1, rank_exit_codes={0: 0, 1: 1}, failed=(RankFailure(1, "n2", 1, ()),))


def leave(folder: Path, rank: int, value: object, key: bytes = KEY) -> None:
    folder.mkdir(exist_ok=True)
    data = b"P" + pickle.dumps(value)
    (folder / f"rank-{rank}.value").write_bytes(payload.signed(key, rank, data))


def test_values_come_by_rank(tmp_path: Path) -> None:
    leave(tmp_path, 1, "b")
    leave(tmp_path, 0, {"a": 1})
    assert read_values(tmp_path, outcome(), KEY) == [{"a": 1}, "b"]


def test_a_value_nobody_signed_is_refused_unread(tmp_path: Path) -> None:
    leave(tmp_path, 0, "mine")
    leave(tmp_path, 1, "theirs", key=b"another key")
    with pytest.raises(JobFailedError, match=r"not rank 1's value .* nothing of it was read"):
        read_values(tmp_path, outcome(), KEY)


def test_a_missing_value_is_named(tmp_path: Path) -> None:
    leave(tmp_path, 0, "mine")
    with pytest.raises(JobFailedError, match="rank 1 exited 0 but left no return value"):
        read_values(tmp_path, outcome(), KEY)


def raises_here() -> None:
    raise ValueError("here")


def test_a_raising_rank_is_the_error_with_its_traceback_as_the_cause(tmp_path: Path) -> None:
    line = raises_here.__code__.co_firstlineno + 1
    text = (
        "Traceback (most recent call last):\n"
        f'  File "<dynamic-code>", line {line}, in raises_here\n'
        "ValueError: here\n"
    )
    record = {"rank": 1, "host": "n2", "kind": "raised", "type": "builtins.ValueError"}
    (tmp_path / "rank-1.error").write_text(
        json.dumps({**record, "message": "here", "traceback": text})
    )
    with pytest.raises(JobFailedError, match="rank 1 on n2 raised ValueError: here") as info:
        read_values(tmp_path, FAILED, KEY, code_files(raises_here))
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert (cause.rank, cause.host, cause.type) == (1, "n2", "ValueError")
    # Where the function was defined, and its line, as in a local traceback.
    assert f'File "{__file__}", line {line}, in raises_here' in str(cause)
    assert 'raise ValueError("here")' in str(cause)
    assert info.value.result is FAILED


def test_a_failed_job_without_an_error_file_fails_as_check_does(tmp_path: Path) -> None:
    with pytest.raises(JobFailedError, match="Rank 1 on n2 exited with code 1"):
        read_values(tmp_path, FAILED, KEY)


def test_frames_of_unknown_code_stay_as_they_came() -> None:
    text = '  File "<dynamic-code>", line 3, in elsewhere\n'
    assert placed(text, {"other": __file__}) == text
