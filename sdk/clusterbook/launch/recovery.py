"""What a job does when an attempt ends: the recovery policy, and its decisions (pure).

The policy is Kubeflow MPIJob's ``runPolicy`` in a job's own terms: ``retries`` (its
``backoffLimit``) with an increasing delay, which endings are worth another attempt
(``retry_on``), and a ``deadline`` for the job and all its attempts together (its
``activeDeadlineSeconds``); and torchrun's ``--max-restarts``: ``restarts``, a relaunch at
once on the nodes of the cluster when one is lost (or, with ``restart_on_join``, when one
joins an elastic cluster). :func:`next_step` decides; the job does what it says.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from clusterbook.durations import optional_duration
from clusterbook.errors import ConfigError, NodeLostError
from clusterbook.launch.result import JobResult
from clusterbook.wording import spell

__all__ = [
    "DEFAULT_RETRY_ON",
    "NO_RECOVERY",
    "RETRY_ON",
    "Backoff",
    "Recovery",
    "Retry",
    "Stop",
    "grown_restart",
    "next_step",
    "outcome",
    "reason",
]

#: The endings an attempt can have that another attempt may mend.
RETRY_ON = ("failure", "node-lost", "timeout")
#: Retried unless ``retry_on`` says otherwise: a timeout is not (it would likely time out again).
DEFAULT_RETRY_ON = frozenset({"failure", "node-lost"})


_LIMIT = 60.0


@dataclass(frozen=True, slots=True)
class Backoff:
    """The delay before each retry: ``first`` seconds, times ``factor`` after each one, at
    most ``limit`` (defaults: 1 s, 2 s, 4 s, ... up to 60 s)."""

    first: float = 1.0
    factor: float = 2.0
    limit: float = _LIMIT

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1: the first)."""
        return min(self.limit, self.first * self.factor ** (retry - 1))

    @classmethod
    def make(cls, value: object) -> Backoff:
        """``value`` as a backoff: a :class:`Backoff`, or the first delay (seconds, or a
        duration like ``"30s"``) doubled after each retry."""
        if isinstance(value, Backoff):
            backoff = value
        else:
            # How long before the first retry (it doubles after each one).
            first = optional_duration(value, "backoff", zero=True)
            if first is None:
                return cls()
            backoff = cls(first=first, limit=max(first, _LIMIT))
        for name in ("first", "factor", "limit"):
            number = getattr(backoff, name)
            if isinstance(number, bool) or not isinstance(number, int | float):
                raise ConfigError(f"Backoff's {name} {number!r} must be a number of seconds.")
            if not math.isfinite(number) or number < 0:
                raise ConfigError(f"Backoff's {name} {number!r} must be a finite number >= 0.")
        if backoff.factor < 1:
            raise ConfigError(
                f"Backoff's factor {backoff.factor!r} would shorten the delays; give 1 or more."
            )
        return backoff


@dataclass(frozen=True, slots=True)
class Recovery:
    """How a job recovers: see :func:`Recovery.make` for each field."""

    retries: int = 0
    backoff: Backoff = Backoff()
    retry_on: frozenset[str] = DEFAULT_RETRY_ON
    deadline: float | None = None
    restarts: int = 0
    restart_on_join: bool = False

    @classmethod
    def make(
        cls,
        *,
        retries: int = 0,
        backoff: object = 1.0,
        retry_on: Iterable[str] | str | None = None,
        deadline: object = None,
        timeout: float | None = None,
        restarts: int = 0,
        restart_on_join: bool = False,
    ) -> Recovery:
        """Check a job's recovery arguments.

        ``retries``: attempts after the first, at most (0: none). ``backoff``: see
        :meth:`Backoff.make`. ``retry_on``: which endings are retried, of ``"failure"`` (a rank
        failed), ``"node-lost"`` and ``"timeout"`` (default: the first two). ``deadline``: the
        seconds (or a duration like ``"2h"``) the job and all its attempts may take together;
        it may not be shorter than one attempt's ``timeout``. ``restarts``: relaunches, at most,
        when a node is lost, at once, on the nodes that are left (they do not count as
        retries); ``restart_on_join``: also when a node joins and the round grows.
        """
        if not isinstance(restart_on_join, bool):
            raise ConfigError(f"restart_on_join must be True or False, got {restart_on_join!r}.")
        if restart_on_join and not restarts:
            raise ConfigError(
                "restart_on_join=True relaunches the job when a node joins, which takes a "
                f"restart; give {spell('restarts', 1)} (or more) too."
            )
        for name, count, example in (("retries", retries, 3), ("restarts", restarts, 2)):
            if isinstance(count, bool) or not isinstance(count, int):
                raise ConfigError(
                    f"{name.capitalize()} {count!r} is not a whole number: give how many times "
                    f"to run the job again, like {spell(name, example)} (0: never)."
                )
            if count < 0:
                raise ConfigError(
                    f"{name.capitalize()} {count} is negative; give 0 (never) or more, like "
                    f"{spell(name, example)}."
                )
        chosen = DEFAULT_RETRY_ON if retry_on is None else _retry_on(retry_on)
        limit = optional_duration(deadline, "deadline")
        if limit is not None and timeout is not None and limit < timeout:
            raise ConfigError(
                f"The deadline ({limit:g} s) is shorter than one attempt's timeout "
                f"({timeout:g} s), which could never be reached; give a deadline of at least "
                "the timeout "
                "(it bounds all attempts together), or a shorter timeout."
            )
        return cls(retries, Backoff.make(backoff), chosen, limit, restarts, restart_on_join)


NO_RECOVERY = Recovery()
"""A job that runs once, without a deadline."""


def _retry_on(value: Iterable[str] | str) -> frozenset[str]:
    items = [value] if isinstance(value, str) else list(value)
    unknown = [v for v in items if v not in RETRY_ON]
    if unknown or not items:
        raise ConfigError(
            f"Retry on {value!r}: {', '.join(map(repr, unknown)) or 'nothing'} is not an ending "
            f"a job can retry; choose among {', '.join(map(repr, RETRY_ON))}."
        )
    return frozenset(items)


def outcome(result: JobResult, error: BaseException | None) -> str:
    """How an attempt ended: ``ok``, ``failure``, ``node-lost``, ``timeout``, ``cancelled`` or
    ``error`` (clusterbook stopped it for another reason, such as a full disk). (An attempt
    the job stopped because a node joined is ``node-joined``: the job says so itself.)"""
    if result.ok:
        return "ok"
    if result.cancelled:
        return "cancelled"
    if isinstance(error, NodeLostError):
        return "node-lost"
    if result.timed_out:
        return "timeout"
    if error is not None or result.error is not None:
        return "error"
    return "failure"


def reason(result: JobResult, error: BaseException | None) -> str:
    """The ending of an attempt in a few words, for a status line: "rank 3 exited 1",
    "node node2 lost", "timed out after 60 s", ..."""
    kind = outcome(result, error)
    if kind == "ok":
        return "succeeded"
    if kind == "node-lost":
        assert isinstance(error, NodeLostError)
        return f"node {error.node} lost"
    if kind == "timeout":
        return f"timed out after {result.duration:.0f} s"
    if kind == "cancelled":
        return "cancelled"
    if kind == "error":
        return str(error or result.error)
    if result.failed:
        first = result.failed[0]
        return f"rank {first.rank} exited {first.exit_code}"
    return f"the launcher exited {result.returncode}"


@dataclass(frozen=True, slots=True)
class Retry:
    """Start attempt ``attempt`` after ``delay`` seconds; ``restart``: a relaunch on the nodes
    that are left (not a retry)."""

    attempt: int
    delay: float
    restart: bool = False


@dataclass(frozen=True, slots=True)
class Stop:
    """The job has ended; ``why`` (None: its last attempt says it all); ``deadline``: because
    of its deadline."""

    why: str | None = None
    deadline: bool = False


def next_step(
    policy: Recovery,
    attempts: int,
    ending: str,
    elapsed: float,
    *,
    restarts: int = 0,
    cancelled: bool = False,
) -> Retry | Stop:
    """What to do after attempt number ``attempts`` ended with ``ending`` (see
    :func:`outcome`), ``elapsed`` seconds after the job started, ``restarts`` of its
    attempts having been restarts."""
    if cancelled or ending in ("ok", "cancelled", "error"):
        return Stop()
    step: Retry | Stop
    retried = attempts - 1 - restarts
    if ending in ("node-lost", "node-joined") and restarts < policy.restarts:
        step = Retry(attempts + 1, 0.0, restart=True)
    elif ending not in policy.retry_on:
        return Stop()
    elif retried >= policy.retries:
        said = [f"restarts={policy.restarts}"] if policy.restarts else []
        said += [f"retries={policy.retries}"] if policy.retries else []
        return Stop(f"It ran {attempts} times ({', '.join(said)}).") if attempts > 1 else Stop()
    else:
        step = Retry(attempts + 1, policy.backoff.delay(retried + 1))
    if policy.deadline is not None and elapsed + step.delay >= policy.deadline:
        return Stop(
            f"Its deadline of {policy.deadline:g} s would pass before attempt {attempts + 1} "
            f"could start (in {step.delay:g} s).",
            deadline=True,
        )
    return step


def grown_restart(
    policy: Recovery, joined: Sequence[str], *, restarts: int, busy: bool
) -> str | None:
    """Why a running attempt is stopped for a restart on a round that grew by the nodes
    ``joined`` (``restart_on_join``, a restart left, the job not ``busy`` being cancelled,
    restarted or ended), or None when it goes on."""
    if not joined or not policy.restart_on_join or restarts >= policy.restarts or busy:
        return None
    return f"node{'s' if len(joined) > 1 else ''} {', '.join(joined)} joined"
