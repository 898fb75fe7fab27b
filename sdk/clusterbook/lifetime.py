"""How long a cluster lives: durations, and the pure decision of when to stop it.

A cluster stops ``life_span`` after it started, or after ``idle_timeout`` with no job running,
or when a stop file appears in its directory (whoever wrote it); an ephemeral cluster, once
its job has ended. :func:`decide` takes the
cluster's times and the clock and returns what to do now; the head's keeper thread acts on it.
A warning comes :data:`WARN_BEFORE` seconds before a timed stop.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterbook.durations import optional_duration

__all__ = [
    "DETACHED_LIFE_SPAN",
    "WARN_BEFORE",
    "Decision",
    "Lifetime",
    "decide",
    "format_duration",
]

#: Seconds before a timed stop at which a warning is logged.
WARN_BEFORE = 60.0
#: The life span of a detached cluster that was given none: 12 hours.
DETACHED_LIFE_SPAN = 12 * 3600.0


def format_duration(seconds: float) -> str:
    """``seconds`` the way a person says it: ``45s``, ``12m``, ``1h05m``, ``3d02h``."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 and s < 600 else f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


@dataclass(frozen=True, slots=True)
class Lifetime:
    """The bounds of a cluster's life, in seconds (None: no bound)."""

    life_span: float | None = None
    idle_timeout: float | None = None

    @classmethod
    def make(cls, life_span: object = None, idle_timeout: object = None) -> Lifetime:
        return cls(
            optional_duration(life_span, "life_span"),
            optional_duration(idle_timeout, "idle_timeout"),
        )

    def deadline(self, started: float, idle_since: float | None) -> tuple[float, str] | None:
        """When the cluster is to stop (epoch seconds) and why, if it is."""
        ends = []
        if self.life_span is not None:
            ends.append((started + self.life_span, "life_span"))
        if self.idle_timeout is not None and idle_since is not None:
            ends.append((idle_since + self.idle_timeout, "idle_timeout"))
        return min(ends) if ends else None


@dataclass(frozen=True, slots=True)
class Decision:
    """What to do now: stop (and why), warn (what to say), or neither."""

    stop: str | None = None
    warn: str | None = None


def decide(
    lifetime: Lifetime,
    *,
    now: float,
    started: float,
    idle_since: float | None,
    stop_file: bool,
    warned: bool,
    one_job_done: bool = False,
) -> Decision:
    """Whether the cluster is to stop now; whether to warn that it soon will (once: ``warned``
    says whether it was). ``idle_since``: when the last job ended (or the cluster started), None
    while a job runs; ``one_job_done``: an ephemeral cluster's job has ended."""
    if stop_file:
        return Decision(stop="its stop file appeared")
    if one_job_done:
        return Decision(stop="its job ended (an ephemeral cluster)")
    end = lifetime.deadline(started, idle_since)
    if end is None:
        return Decision()
    at, why = end
    if now >= at:
        bound = lifetime.life_span if why == "life_span" else lifetime.idle_timeout
        said = "after" if why == "life_span" else "idle for"
        return Decision(stop=f"{said} {format_duration(bound or 0)} ({why})")
    if not warned and at - now <= WARN_BEFORE:
        return Decision(warn=f"stops in {format_duration(at - now)} ({why})")
    return Decision()
