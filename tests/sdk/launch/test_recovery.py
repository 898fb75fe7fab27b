"""The recovery policy's decisions (pure), and a job's series of attempts with stand-in
attempts: retries, the delay before each, cancel and the deadline during a delay."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.errors import ClusterStateError, NodeLostError
from clusterbook.launch.job import Job
from clusterbook.launch.jobdir import attempt_dir
from clusterbook.launch.logstore import LogStore
from clusterbook.launch.nodes import remaining_nodes
from clusterbook.launch.recovery import (
    DEFAULT_RETRY_ON,
    Backoff,
    Recovery,
    Retry,
    Stop,
    next_step,
    outcome,
    reason,
)
from clusterbook.launch.result import JobResult, RankFailure
from clusterbook.spec import NodeSpec
from clusterbook.wording import speaking


def _result(**kw: object) -> JobResult:
    base: dict[str, object] = {
        "job_id": "job-0001",
        "returncode": 0,
        "rank_exit_codes": {0: 0},
        "failed": (),
        "duration": 1.0,
    }
    return JobResult(**{**base, **kw})  # type: ignore[arg-type]


FAILED = _result(returncode=1, failed=(RankFailure(3, "node2", 1, ("boom",)),))


# -- the policy ------------------------------------------------------------------------------


def test_backoff_doubles_up_to_its_limit() -> None:
    assert [Backoff().delay(n) for n in range(1, 9)] == [1, 2, 4, 8, 16, 32, 60, 60]
    assert [Backoff(5, 3, 100).delay(n) for n in (1, 2, 3, 4)] == [5, 15, 45, 100]
    assert Backoff.make("30s") == Backoff(30.0, 2.0, 60.0)
    assert Backoff.make(120) == Backoff(120.0, 2.0, 120.0)  # a long first delay is kept
    assert Backoff.make(0).delay(3) == 0
    assert Backoff.make("0") == Backoff.make(" 0.0s") == Backoff.make(0.0)  # --backoff 0


def test_recovery_defaults_retry_nothing() -> None:
    policy = Recovery.make()
    assert policy == Recovery(0, Backoff(), DEFAULT_RETRY_ON, None)
    assert next_step(policy, 1, "failure", 1.0) == Stop()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"retries": -2}, r"Retries -2 is negative; give 0 \(never\) or more, like retries=3"),
        ({"restarts": -1}, r"Restarts -1 is negative; give 0 \(never\) or more, like restarts=2"),
        ({"restarts": 0.5}, "Restarts 0.5 is not a whole number"),
        ({"restart_on_join": True}, r"give restarts=1 \(or more\) too"),
        ({"restart_on_join": 1, "restarts": 1}, "restart_on_join must be True or False, got 1"),
        ({"retries": True}, "Retries True is not a whole number"),
        ({"retries": "3"}, "Retries '3' is not a whole number"),
        ({"retry_on": "oops"}, "'oops' is not an ending a job can retry; choose among 'failure'"),
        ({"retry_on": []}, "nothing is not an ending"),
        ({"backoff": -1}, "backoff must be a duration >= 0, got -1 .it is negative."),
        ({"backoff": Backoff(1, 0.5)}, "factor 0.5 would shorten the delays"),
        ({"backoff": Backoff(float("nan"))}, "first nan must be a finite number"),
        ({"deadline": "soon"}, "deadline must be a duration > 0, got 'soon'"),
        ({"deadline": 0}, "deadline must be a duration > 0, got 0"),
        ({"deadline": "1m", "timeout": 120}, r"shorter than one attempt's timeout \(120 s\)"),
    ],
)
def test_bad_recovery_arguments_name_the_value_and_the_fix(
    args: dict[str, object], message: str
) -> None:
    with pytest.raises(cb.ConfigError, match=message):
        Recovery.make(**args)  # type: ignore[arg-type]


def test_errors_name_the_flags_on_the_command_line() -> None:
    with speaking("cli"), pytest.raises(cb.ConfigError, match="like --retries 3"):
        Recovery.make(retries=-1)
    with (
        speaking("magics"),
        pytest.raises(
            cb.ConfigError,
            match=r"^--backoff must be a duration >= 0, got .later.*like --backoff 30m\.$",
        ),
    ):
        Recovery.make(backoff="later")


def test_a_deadline_as_long_as_the_timeout_is_accepted() -> None:
    assert Recovery.make(deadline="2m", timeout=120).deadline == 120


def test_next_step_retries_what_it_is_asked_to_with_growing_delays() -> None:
    policy = Recovery.make(retries=3, backoff=2)
    assert next_step(policy, 1, "failure", 0.0) == Retry(2, 2.0)
    assert next_step(policy, 2, "node-lost", 0.0) == Retry(3, 4.0)
    assert next_step(policy, 3, "failure", 0.0) == Retry(4, 8.0)
    assert next_step(policy, 4, "failure", 0.0) == Stop("It ran 4 times (retries=3).")
    for ending in ("ok", "cancelled", "error", "timeout"):  # timeout: not unless asked
        assert next_step(policy, 1, ending, 0.0) == Stop()
    assert next_step(policy, 1, "failure", 0.0, cancelled=True) == Stop()
    timeouts = Recovery.make(retries=1, retry_on=["timeout"])
    assert next_step(timeouts, 1, "timeout", 0.0) == Retry(2, 1.0)
    assert next_step(timeouts, 1, "failure", 0.0) == Stop()


def test_a_lost_node_restarts_at_once_without_using_a_retry() -> None:
    policy = Recovery.make(restarts=2, retries=1, backoff=5)
    assert next_step(policy, 1, "node-lost", 0.0) == Retry(2, 0.0, restart=True)
    assert next_step(policy, 2, "node-lost", 0.0, restarts=1) == Retry(3, 0.0, restart=True)
    # Restarts used up: a lost node is then a failure like another, retried with a delay.
    assert next_step(policy, 3, "node-lost", 0.0, restarts=2) == Retry(4, 5.0)
    assert next_step(policy, 4, "node-lost", 0.0, restarts=2) == Stop(
        "It ran 4 times (restarts=2, retries=1)."
    )
    # A failing rank is not a reason to restart: that is what retries are for.
    assert next_step(Recovery.make(restarts=2), 1, "failure", 0.0) == Stop()
    assert next_step(policy, 1, "failure", 0.0) == Retry(2, 5.0)
    with_deadline = Recovery.make(restarts=1, deadline=10)
    assert next_step(with_deadline, 1, "node-lost", 10.0).deadline  # type: ignore[union-attr]


def test_a_node_that_joins_restarts_only_with_restarts_left() -> None:
    policy = Recovery.make(restarts=1, restart_on_join=True)
    assert next_step(policy, 1, "node-joined", 0.0) == Retry(2, 0.0, restart=True)
    assert next_step(policy, 2, "node-joined", 0.0, restarts=1) == Stop()


def test_a_restart_runs_on_the_nodes_left_and_no_fewer_than_the_minimum() -> None:
    nodes = tuple(NodeSpec(f"n{i}", f"10.0.0.{i}", 2) for i in (1, 2, 3))

    def unreachable(names: list[str], *, lost_only: bool = False) -> dict[str, str]:
        return {"n2": "Node n2 was lost"} if "n2" in names else {}

    left = remaining_nodes("c", nodes, unreachable, None)
    assert [n.name for n in left] == ["n1", "n3"]
    assert remaining_nodes("c", nodes, unreachable, (2, 4)) == left
    with pytest.raises(
        ClusterStateError, match=r"has 2 nodes left, fewer than the 3 it needs \(Node n2 was lost\)"
    ):
        remaining_nodes("c", nodes, unreachable, (3, 4))


def test_next_step_does_not_start_what_the_deadline_would_cut() -> None:
    policy = Recovery.make(retries=5, backoff=10, deadline=60)
    assert next_step(policy, 1, "failure", 49.0) == Retry(2, 10.0)
    step = next_step(policy, 1, "failure", 50.0)
    assert step == Stop(
        "Its deadline of 60 s would pass before attempt 2 could start (in 10 s).", deadline=True
    )


def test_outcome_and_reason_of_an_attempt() -> None:
    lost = NodeLostError("node2 stopped heartbeating", node="node2", host="10.0.0.2")
    cases = [
        (_result(), None, "ok", "succeeded"),
        (FAILED, None, "failure", "rank 3 exited 1"),
        (_result(returncode=1, error=str(lost)), lost, "node-lost", "node node2 lost"),
        (
            _result(returncode=-15, timed_out=True, duration=60.2),
            None,
            "timeout",
            "timed out after 60 s",
        ),
        (_result(returncode=-15, cancelled=True), None, "cancelled", "cancelled"),
        (_result(returncode=1, error="disk full"), None, "error", "disk full"),
        (_result(returncode=7), None, "failure", "the launcher exited 7"),
    ]
    for result, error, kind, words in cases:
        assert outcome(result, error) == kind
        assert reason(result, error) == words


# -- a job's series of attempts, with stand-in attempts -----------------------------------------


class FakeAttempt:
    """What a Job asks of an attempt; ``end(result)`` ends it."""

    def __init__(self, number: int, directory: Path, ends_with: JobResult | None) -> None:
        self.number = number
        self.directory = directory
        self.np = 2
        self.pid = 1000 + number
        self.plan = None
        self.error = None
        self.started = 0.0
        self.store = LogStore(directory, {0: "h", 1: "h"}, launcher_host="h", attempt=number)
        self.store.add(0, "stdout", f"attempt {number}")
        self.stopped: list[str] = []
        self.cleanups = 0
        self._done = threading.Event()
        self.result: JobResult | None = None
        if ends_with is not None:
            self.end(ends_with)

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def end(self, result: JobResult) -> None:
        self.result = result
        self.store.close()
        self._done.set()

    def wait(self, timeout: float | None = None) -> JobResult | None:
        self._done.wait(timeout)
        return self.result

    def stop(self, reason: str) -> None:
        self.stopped.append(reason)
        if not self.done:
            self.end(
                _result(returncode=-15, cancelled=reason == "cancel", timed_out=reason == "timeout")
            )

    def cleanup(self) -> list[int]:
        self.cleanups += 1
        return []


def _series(
    tmp_path: Path, endings: list[JobResult | None], recovery: Recovery
) -> tuple[Job, list[FakeAttempt]]:
    made: list[FakeAttempt] = []

    def start(number: int, directory: Path, restarts: int, restart: bool) -> FakeAttempt:
        if number > len(endings):
            raise ClusterStateError("no nodes left")
        directory.mkdir(exist_ok=True)
        made.append(FakeAttempt(number, directory, endings[number - 1]))
        return made[-1]

    job = Job("job-0001", tmp_path, start, recovery, argv=["prog"], timeout=None)  # type: ignore[arg-type]
    return job, made


def test_a_series_retries_until_an_attempt_succeeds(tmp_path: Path) -> None:
    seen: list[int] = []
    job, made = _series(tmp_path, [FAILED, FAILED, _result()], Recovery.make(retries=5, backoff=0))
    job._on_attempt = seen.append
    result = job.wait(timeout=30)
    assert result.ok
    assert result.attempt == 3
    assert [a.outcome for a in result.attempts] == ["failure", "failure", "ok"]
    assert [m.directory for m in made] == [attempt_dir(tmp_path, n) for n in (1, 2, 3)]
    assert (tmp_path / "attempt-2" / "result.json").exists()
    assert (
        JobResult.from_dict(__import__("json").loads((tmp_path / "result.json").read_text()))
        == result
    )
    assert list(job.logs().attempt) == [1, 2, 3]
    assert [r.line for r in job.stream()] == ["attempt 1", "attempt 2", "attempt 3"]


def test_an_attempt_that_cannot_start_ends_the_series_saying_why(tmp_path: Path) -> None:
    job, _ = _series(tmp_path, [FAILED], Recovery.make(retries=3, backoff=0))
    result = job.wait(timeout=30)
    assert result.failed_ranks == [3]
    assert "Attempt 2 could not start: no nodes left" in result.notes


def test_cancel_in_the_delay_before_a_retry(tmp_path: Path) -> None:
    job, made = _series(tmp_path, [FAILED, _result()], Recovery.make(retries=1, backoff=3600))
    pause = threading.Event()
    while job.retrying_in is None:
        pause.wait(0.01)
    assert 3500 < job.retrying_in <= 3600
    assert job.cancel()
    result = job.wait()
    assert result.cancelled
    assert len(made) == 1  # the retry never started
    assert job.retrying_in is None


def test_the_deadline_in_the_delay_before_a_retry(tmp_path: Path) -> None:
    job, made = _series(
        tmp_path, [FAILED, _result()], Recovery(1, Backoff(3000, 2, 3000), DEFAULT_RETRY_ON, 0.5)
    )
    result = job.wait(timeout=30)
    assert result.deadline_exceeded
    assert result.state == "timed out"
    assert len(made) == 1


def test_the_deadline_stops_the_running_attempt(tmp_path: Path) -> None:
    job, made = _series(tmp_path, [None], Recovery(3, Backoff(0), DEFAULT_RETRY_ON, 0.3))
    result = job.wait(timeout=30)
    assert made[0].stopped == ["timeout"]
    assert result.deadline_exceeded
    assert [a.outcome for a in result.attempts] == ["timeout"]


def test_summary_lists_the_attempts_of_a_retried_job(tmp_path: Path) -> None:
    job, _ = _series(tmp_path, [FAILED, _result()], Recovery.make(retries=1, backoff=0))
    summary = job.wait(timeout=30).summary()
    assert summary.startswith("Job job-0001 succeeded")
    assert "Attempts: 1: rank 3 exited 1 (1.0 s); 2: succeeded (1.0 s)." in summary
