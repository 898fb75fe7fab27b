"""A job as a future (``clusterbook.launch.future``): a real ``Job`` over attempts the test
ends, so that every state of ``concurrent.futures.Future``'s protocol is reached on purpose."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from clusterbook.errors import JobFailedError, JobTimeoutError
from clusterbook.launch.job import Job
from clusterbook.launch.recovery import NO_RECOVERY
from clusterbook.launch.result import JobResult
from tests.sdk.launch.test_recovery import FAILED, FakeAttempt, _result


def _job(tmp_path: Path) -> tuple[Job, list[FakeAttempt]]:
    made: list[FakeAttempt] = []

    def start(number: int, directory: Path, restarts: int, restart: bool) -> FakeAttempt:
        made.append(FakeAttempt(number, directory, None))
        return made[-1]

    job = Job("job-0001", tmp_path, start, NO_RECOVERY, argv=["prog"], timeout=None)  # type: ignore[arg-type]
    return job, made


def test_a_running_job_is_running_and_its_result_waits(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    assert job.running()
    assert not job.done()
    assert not job.cancelled()
    assert job.outcome is None
    with pytest.raises(JobTimeoutError):
        job.result(timeout=0.01)
    with pytest.raises(JobTimeoutError):
        job.exception(timeout=0.01)
    attempt.end(_result())
    outcome = job.result(timeout=10)
    assert isinstance(outcome, JobResult)
    assert outcome.ok
    assert job.done()
    assert not job.running()
    assert job.exception() is None
    assert job.outcome is outcome


def test_a_failed_argv_job_raises_as_check_does(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    attempt.end(FAILED)
    with pytest.raises(JobFailedError, match="Rank 3 on node2 exited with code 1") as info:
        job.result(timeout=10)
    assert info.value.result is job.outcome
    error = job.exception()
    assert isinstance(error, JobFailedError)
    assert error.result is job.outcome


def test_done_callbacks_run_once_the_job_ends_and_at_once_after(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    seen: list[object] = []
    called = threading.Event()

    def later(j: object) -> None:
        seen.append(j)
        called.set()

    def broken(j: object) -> None:
        raise RuntimeError("a callback's own error is logged, not raised")

    job.add_done_callback(broken)
    job.add_done_callback(later)
    assert seen == []
    attempt.end(_result())
    assert called.wait(10)
    assert seen == [job]
    job.add_done_callback(seen.append)  # the job has ended: called here and now
    assert seen == [job, job]


def test_cancel_is_true_for_a_running_job_and_false_once_it_ended(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    assert job.cancel()
    assert attempt.stopped == ["cancel"]
    assert job.done()
    assert job.cancelled()
    assert job.cancel() is False
    with pytest.raises(JobFailedError, match="cancelled"):
        job.result()


def test_a_bound_reader_gives_the_value_once(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    reads: list[JobResult] = []

    def reader(outcome: JobResult) -> list[int]:
        reads.append(outcome)
        return [1, 2]

    job.bind_value(reader)
    attempt.end(_result())
    assert job.result() == [1, 2]
    assert job.result() == [1, 2]
    assert len(reads) == 1


def test_await_gives_the_result_without_blocking_the_loop(tmp_path: Path) -> None:
    job, (attempt,) = _job(tmp_path)
    failing, (other,) = _job(tmp_path / "two")

    async def main() -> tuple[object, BaseException | None, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        ticker = asyncio.create_task(tick())
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, attempt.end, _result())
        loop.call_later(0.05, other.end, FAILED)
        value = await job
        try:
            await failing
            error: BaseException | None = None
        except JobFailedError as exc:
            error = exc
        ticker.cancel()
        return value, error, ticks

    value, error, ticks = asyncio.run(main())
    assert value is job.outcome
    assert isinstance(error, JobFailedError)
    assert ticks > 1  # the loop ran while the job did
