"""A pool rank's side, against a head played by the test over a socket pair: the handshake's
proof, the tasks, what comes back of a value, an exception and a value that cannot be pickled;
and that the program sent to the ranks needs nothing but the standard library."""

from __future__ import annotations

import ast
import json
import os
import pickle
import socket
import sys
import threading
from base64 import b64decode
from collections.abc import Iterator
from pathlib import Path

import cloudpickle  # type: ignore[import-untyped]
import pytest

from clusterbook.functions import worker
from clusterbook.functions.worker import loads, proof, recv_frame, send_frame, serve

SECRET = b"s" * 32


@pytest.fixture
def rank() -> Iterator[socket.socket]:
    """The head's end of a connection to a rank served in a thread."""
    head, far = socket.socketpair()
    thread = threading.Thread(target=serve, args=(far, SECRET), daemon=True)
    thread.start()
    yield head
    head.close()
    thread.join(5)
    far.close()
    assert not thread.is_alive()  # the rank's loop ends when the head goes


def _hello(head: socket.socket, nonce: bytes = b"n" * 32) -> dict[str, object]:
    send_frame(head, nonce)
    answer = recv_frame(head)
    shown, hello = answer[:32], answer[32:]
    assert shown == proof(SECRET, nonce, hello)
    assert shown != proof(b"t" * 32, nonce, hello)  # another secret gives another proof
    said: dict[str, object] = json.loads(hello)
    return said


def _task(head: socket.socket, fn: object, item: object, task: int = 0) -> tuple[object, ...]:
    send_frame(head, pickle.dumps(("fn", "k", cloudpickle.dumps(fn))))
    send_frame(head, pickle.dumps(("task", task, "k", cloudpickle.dumps(item))))
    answer: tuple[object, ...] = loads(recv_frame(head))
    return answer


def test_a_rank_proves_the_secret_and_says_where_it_runs(rank: socket.socket) -> None:
    said = _hello(rank)
    assert said["host"] == socket.gethostname()
    assert isinstance(said["pid"], int)


def test_a_value_comes_back_pickled(rank: socket.socket) -> None:
    _hello(rank)
    offset = 5
    assert _task(rank, lambda x: x + offset, 2, task=7)[:2] == ("ok", 7)
    assert loads(_task(rank, lambda x: {"x": x}, 3)[2]) == {"x": 3}  # type: ignore[arg-type]


def test_an_exception_comes_back_with_its_traceback_from_the_function_down(
    rank: socket.socket,
) -> None:
    _hello(rank)

    def fails(x: int) -> int:
        raise KeyError(f"no {x}")

    kind, task, type_name, message, text, carried = _task(rank, fails, 4)
    assert (kind, task, type_name, message) == ("error", 0, "KeyError", "'no 4'")
    assert isinstance(text, str)
    assert "in fails" in text
    assert "_answer" not in text
    assert isinstance(carried, bytes)
    assert isinstance(loads(carried), KeyError)
    # the rank goes on after an item failed
    assert _task(rank, lambda x: x, 1)[0] == "ok"


def test_a_value_that_cannot_be_pickled_is_named_by_its_type(rank: socket.socket) -> None:
    _hello(rank)
    kind, _, type_name, message, *_ = _task(rank, lambda x: threading.Lock(), 0)
    assert (kind, type_name) == ("error", "PicklingError")
    assert isinstance(message, str)
    assert "lock" in message


def test_stop_ends_the_rank() -> None:
    head, far = socket.socketpair()
    with head, far:
        thread = threading.Thread(target=serve, args=(far, SECRET), daemon=True)
        thread.start()
        _hello(head)
        send_frame(head, pickle.dumps(("stop",)))
        thread.join(5)
        assert not thread.is_alive()


def test_the_ranks_program_imports_the_standard_library_only() -> None:
    tree = ast.parse(Path(worker.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert imported - {"cloudpickle"} <= set(sys.stdlib_module_names) | {"__future__"}
    compile(worker.BOOT, "boot", "exec")  # what python -c gets is one valid program


def test_the_boot_line_runs_the_program_it_is_given(tmp_path: Path) -> None:
    import subprocess
    import zlib
    from base64 import b64encode

    program = b64encode(zlib.compress(b"def main():\n    print('ran', __name__)\n")).decode()
    env = {**os.environ, worker.PROGRAM_ENV: program}
    done = subprocess.run(
        [sys.executable, "-c", worker.BOOT], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.stdout == "ran clusterbook_pool_worker\n", done.stderr
    assert zlib.decompress(b64decode(worker.packed_source())) == Path(worker.__file__).read_bytes()
