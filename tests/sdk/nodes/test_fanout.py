"""The fan-out: results and errors by item, the caller's context, threads kept for the next."""

from __future__ import annotations

import contextvars
import os
import threading

import pytest

from clusterbook.nodes.fanout import Workers, parallel

_WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_results_and_errors_come_back_by_item_in_the_items_order() -> None:
    def work(item: str) -> int:
        if item == "b":
            raise ValueError(item)
        return int(item, 16)

    done, failed = parallel(["c", "b", "a"], work)
    assert list(done.items()) == [("c", 12), ("a", 10)]
    assert list(failed) == ["b"]
    assert isinstance(failed["b"], ValueError)
    assert parallel([], work) == ({}, {})


def test_work_runs_in_a_copy_of_the_callers_context() -> None:
    _WHO.set("caller")
    done, _ = parallel(["x", "y"], lambda _: _WHO.get())
    assert done == {"x": "caller", "y": "caller"}


def test_the_threads_of_one_fan_out_serve_the_next() -> None:
    # A start() fans out five times in a row: new threads for each would cost ~0.2 ms of CPU
    # apiece. (The barrier holds each thread until all 4 have one item: 4 distinct threads.)
    def idents() -> set[int]:
        barrier = threading.Barrier(4, timeout=10)

        def work(_: str) -> int:
            barrier.wait()
            return threading.get_ident()

        return set(parallel(list("abcd"), work)[0].values())

    first = idents()
    assert len(first) == 4
    assert idents() == first


def test_idle_threads_end_after_a_while() -> None:
    workers = Workers(idle=0.05)
    done, _ = parallel(["a"], lambda _: threading.current_thread(), workers=workers)
    thread = done["a"]
    thread.join(5)
    assert not thread.is_alive()
    assert workers.waiting() == 0


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_wait_for_its_parents_threads() -> None:
    parallel(["warm"], lambda item: item)  # an idle thread here, none in the child
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            child = threading.Thread(target=lambda: None)  # noqa: F841 - threads work there
            done, _ = parallel(["x"], lambda item: item * 2)
            code = 0 if done == {"x": "xx"} else 1
        finally:
            os._exit(code)
    deadline = 10.0
    for _ in range(int(deadline / 0.05)):
        waited, status = os.waitpid(pid, os.WNOHANG)
        if waited:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        threading.Event().wait(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung in parallel()")
