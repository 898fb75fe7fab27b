"""How long a cluster lives: durations, and the pure decision of when to stop it.

A cluster stops ``life_span`` after it started, or after ``idle_timeout`` with no job running,
or when a stop file appears in its directory (whoever wrote it); an ephemeral cluster, once
its job has ended. :func:`decide` takes the
cluster's times and the clock and returns what to do now; the head's keeper thread acts on it.
A warning comes :data:`WARN_BEFORE` seconds before a timed stop.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from clusterbook.errors import ConfigError

__all__ = [
    "DETACHED_LIFE_SPAN",
    "WARN_BEFORE",
    "Decision",
    "Lifetime",
    "decide",
    "format_duration",
    "parse_duration",
]

#: Seconds before a timed stop at which a warning is logged.
WARN_BEFORE = 60.0
#: The life span of a detached cluster that was given none: 12 hours.
DETACHED_LIFE_SPAN = 12 * 3600.0

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([smhdw])")


def parse_duration(value: object, name: str) -> float | None:
    """Seconds from ``value``: a number of seconds, or text like ``"90"``, ``"30m"``,
    ``"2h"``, ``"1h30m"``, ``"7d"``; None stays None. ``name`` is the option, for errors."""
    if value is None:
        return None
    seconds: float | None = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            seconds = float(text)
        except ValueError:
            parts = list(_PART.finditer(text))
            if parts and "".join(m.group(0) for m in parts) == text.replace(" ", ""):
                seconds = sum(float(m.group(1)) * _UNITS[m.group(2)] for m in parts)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(
            f"{name}={value!r} is not a duration; give seconds (a positive number) or text "
            "like '90s', '30m', '2h', '1h30m' or '7d'."
        )
    return seconds


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
            parse_duration(life_span, "life_span"), parse_duration(idle_timeout, "idle_timeout")
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
