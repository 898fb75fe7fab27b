"""The program each rank of a function job runs (``clusterbook.functions.rank``), run as the
ranks run it (a real Python, its file copied beside the call), with RANK set as the launcher's
wrapper sets it."""

from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from clusterbook.functions import payload, rank
from clusterbook.functions.submit import rank_program

KEY = b"k" * 32


def run_rank(tmp_path: Path, fn: Callable[..., Any], *args: Any, number: int = 0) -> Path:
    """Run ``fn(*args)`` as rank ``number``; the folder of what it left."""
    call = tmp_path / "call"
    call.mkdir(exist_ok=True)
    (call / "call.pkl").write_bytes(payload.envelope(payload.dumps(fn, args), KEY))
    shutil.copy(rank.__file__, call / "rank.py")
    env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    env["RANK"] = str(number)
    subprocess.run(
        [sys.executable, str(call / "rank.py"), str(call)],
        env=env, cwd=tmp_path, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return call / "values"


def value(folder: Path, number: int) -> Any:
    data = payload.verified(KEY, number, (folder / f"rank-{number}.value").read_bytes())
    assert data is not None
    return payload.load_value(data)


def test_a_rank_signs_what_it_returned(tmp_path: Path) -> None:
    offset = 5
    folder = run_rank(tmp_path, lambda x: (x + offset, os.environ["RANK"]), 1, number=3)
    assert value(folder, 3) == (6, "3")
    assert sorted(p.name for p in folder.iterdir()) == ["rank-3.value"]  # nothing half-written


class Box:
    def __init__(self, inside: object) -> None:
        self.inside = inside


def test_classes_sent_by_value_come_back(tmp_path: Path) -> None:
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        folder = run_rank(tmp_path, lambda: Box(Box(7)))
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert value(folder, 0).inside.inside == 7


def test_a_raising_rank_leaves_its_traceback_and_exits_1(tmp_path: Path) -> None:
    def raises(word: str) -> None:
        raise KeyError(word)

    folder = run_rank(tmp_path, raises, "gone", number=1)
    record = json.loads((folder / "rank-1.error").read_text())
    assert (record["rank"], record["kind"], record["type"]) == (1, "raised", "builtins.KeyError")
    assert record["message"] == "'gone'"
    assert "in raises" in record["traceback"]
    assert "KeyError: 'gone'" in record["traceback"]
    assert "rank.py" not in record["traceback"]  # the rank program's own frame is left out


def test_a_value_that_cannot_be_pickled_is_named_with_its_type(tmp_path: Path) -> None:
    folder = run_rank(tmp_path, threading.Lock)
    record = json.loads((folder / "rank-0.error").read_text())
    assert (record["kind"], record["value_type"]) == ("value", "_thread.lock")
    assert "Rank 0 returned a _thread.lock, which cannot be pickled" in record["traceback"]


@pytest.mark.parametrize(
    "make",
    [
        lambda: lambda: 1,
        lambda: lambda a=[1, 2]: sum(a),
    ],
)
def test_the_light_reconstructors_rebuild_what_cloudpickle_would(make: Callable[[], Any]) -> None:
    import cloudpickle

    fn = make()
    data = cloudpickle.dumps(fn)
    light = rank._load_call(data, light=True)
    assert light() == pickle.loads(data)() == fn()  # noqa: S301


def test_the_light_reconstructors_rebuild_closures_and_their_cells() -> None:
    import cloudpickle

    n = 3

    def outer() -> Callable[[], int]:
        inner = 4
        return lambda: n * inner

    data = cloudpickle.dumps(outer())
    light = rank._load_call(data, light=True)
    assert light() == 12
    assert light.__closure__ is not None


@pytest.mark.parametrize("size", [0, 32, 64, 65, 200])
def test_the_ranks_own_hmac_is_the_standard_one(size: int) -> None:
    import hashlib
    import hmac

    key, message = os.urandom(size), os.urandom(1000)
    assert rank._hmac_sha256(key, message) == hmac.new(key, message, hashlib.sha256).digest()


#: This Python, and newer CPythons where the machine has them (3.12 renamed _sha256 _sha2).
PYTHONS = [
    sys.executable,
    *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python"))),
]


@pytest.mark.parametrize("python", PYTHONS)
def test_the_ranks_hmac_loads_no_openssl(python: str) -> None:
    # hashlib and hmac load OpenSSL, ~2 ms of every rank's start.
    program = (
        "import sys; sys.path.insert(0, sys.argv[1]); from clusterbook.functions import rank; "
        "rank._hmac_sha256(b'k', b'm'); "
        "print(sorted({'hashlib', 'hmac', '_hashlib'} & set(sys.modules)))"
    )
    sdk = str(Path(rank.__file__).parents[2])
    run = subprocess.run([python, "-c", program, sdk], capture_output=True, text=True, timeout=60)
    assert run.stdout.strip() == "[]", run.stderr


def test_an_earlier_attempts_error_goes_when_the_rank_runs_again(tmp_path: Path) -> None:
    (tmp_path / "call" / "values").mkdir(parents=True)
    (tmp_path / "call" / "values" / "rank-0.error").write_text("{}")
    folder = run_rank(tmp_path, lambda: "again")
    assert sorted(p.name for p in folder.iterdir()) == ["rank-0.value"]


def run_loaded(
    tmp_path: Path, source: bytes, bytecode: bytes
) -> subprocess.CompletedProcess[bytes]:
    """Run a call of ``lambda: 42`` as the head starts a rank: ``python -c LOADER rank.py``."""
    call = tmp_path / "call"
    call.mkdir()
    (call / "call.pkl").write_bytes(payload.envelope(payload.dumps(lambda: 42), KEY))
    (call / "rank.py").write_bytes(source)
    (call / "rank.pyc").write_bytes(bytecode)
    env = {k: v for k, v in os.environ.items() if k not in ("OMPI_COMM_WORLD_RANK", "PMI_RANK")}
    return subprocess.run(
        [sys.executable, "-c", rank.LOADER, str(call / "rank.py"), str(call)],
        env={**env, "RANK": "0"}, cwd=tmp_path, capture_output=True, timeout=60, check=False,
    )  # fmt: skip


def test_a_rank_runs_from_the_bytecode_the_head_compiled(tmp_path: Path) -> None:
    _, bytecode = rank_program()
    ran = run_loaded(tmp_path, b"raise SystemExit(3)\n", bytecode)  # the source is not read
    assert ran.returncode == 0, ran.stderr
    assert value(tmp_path / "call" / "values", 0) == 42


def test_bytecode_of_another_python_is_left_for_the_source(tmp_path: Path) -> None:
    source, bytecode = rank_program()
    ran = run_loaded(tmp_path, source, b"\x00\x00\r\n" + bytecode[4:])  # another magic number
    assert ran.returncode == 0, ran.stderr
    assert value(tmp_path / "call" / "values", 0) == 42


def test_a_function_of_plain_code_runs_without_pickle(tmp_path: Path) -> None:
    def pickle_free(x: int, scale: int = 2) -> tuple[int, bool]:
        import sys

        return x * scale, sys.modules.keys().isdisjoint({"_pickle", "pickle", "functools"})

    folder = run_rank(tmp_path, pickle_free, 21)
    data = payload.verified(KEY, 0, (folder / "rank-0.value").read_bytes())
    assert data is not None
    assert data[:1] == b"M"  # plain data comes back in marshal's format
    assert payload.load_value(data) == (42, True)


def test_a_value_marshal_does_not_take_comes_back_pickled(tmp_path: Path) -> None:
    folder = run_rank(tmp_path, lambda: Path("/x"))
    data = payload.verified(KEY, 0, (folder / "rank-0.value").read_bytes())
    assert data is not None
    assert data[:1] == b"P"
    assert payload.load_value(data) == Path("/x")
