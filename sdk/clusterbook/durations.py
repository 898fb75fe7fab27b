"""Durations as people give them: the one parser of every time the user passes.

A duration is a number of seconds (``90``, ``1.5``), a :class:`datetime.timedelta` (pandas'
``Timedelta`` and numpy's ``timedelta64`` too: what a frame's duration column holds), or text:
a bare number of seconds (``"90"``) or numbers with units, alone or together (``"90s"``,
``"30m"``, ``"1.5h"``, ``"1h30m"``, ``"1h 30m"``, ``"2d"``). The units are ``ms``, ``s``,
``m``, ``h``, ``d`` and ``w``; words (``"30 minutes"``) are refused with the short form
to write instead, so that ``m`` never has to be guessed at (minutes, not months). Booleans,
NaN, infinities and negative durations are refused too; zero only where an option says it
means something (``zero=True``). Everything is pure: a value in, float seconds or a
:class:`~clusterbook.errors.ConfigError` out, whose message names the option, the value and
the forms it takes.
"""

from __future__ import annotations

import datetime
import math
import numbers
import re
from typing import Any, TypeAlias

from clusterbook.errors import ConfigError
from clusterbook.wording import spell

__all__ = ["FORMS", "TEXT_FORMS", "UNITS", "Duration", "duration", "optional_duration"]

#: What every duration option takes: seconds, a timedelta, or text like ``"30m"``.
Duration: TypeAlias = float | datetime.timedelta | str

#: Seconds in each unit text may use.
UNITS: dict[str, float] = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
}
#: The accepted forms, as error messages list them (on the command line and in the magics,
#: text only).
TEXT_FORMS = "seconds or text like '90s', '30m', '1.5h', '1h30m' or '2d' (units ms, s, m, h, d, w)"
FORMS = (
    "seconds (like 90 or 1.5), a datetime.timedelta, or text like '90s', '30m', '1.5h', "
    "'1h30m' or '2d' (units ms, s, m, h, d, w)"
)

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
# A part is a number and a word; the word is checked against UNITS afterwards, so that an
# unknown one can be named in the error.
_PART = re.compile(rf"\s*({_NUMBER})\s*([a-z]+)\s*")
_WORDS = {
    "sec": "s",
    "secs": "s",
    "second": "s",
    "seconds": "s",
    "min": "m",
    "mins": "m",
    "minute": "m",
    "minutes": "m",
    "hr": "h",
    "hrs": "h",
    "hour": "h",
    "hours": "h",
    "day": "d",
    "days": "d",
    "week": "w",
    "weeks": "w",
}


def duration(value: object, name: str, *, zero: bool = False) -> float:
    """``value`` as float seconds > 0 (>= 0 with ``zero``).

    Parameters
    ----------
    value
        Seconds (int or float), a :class:`datetime.timedelta`, or text (``"90"``, ``"90s"``,
        ``"30m"``, ``"1h30m"``, ``"1.5h"``, ``"2d"``).
    name
        The option, as the error names it (``"timeout"``, ``"--deadline"``).
    zero
        Whether 0 is allowed (it means "none" or "at once" for some options).

    Raises
    ------
    ConfigError
        If ``value`` is not a duration, or is negative, or zero where ``zero`` is False.
    """
    seconds, why = _seconds(value)
    if seconds is not None and (seconds > 0 or (zero and seconds == 0)):
        return seconds
    rule = ">= 0" if zero else "> 0"
    if seconds is not None:
        why = "it is negative" if seconds < 0 else "it is zero"
    if _in_python(name):
        raise ConfigError(f"{name} must be a duration {rule}, got {value!r} ({why}); give {FORMS}.")
    # On the command line and in the magics: the option as it is typed there, and its forms.
    flag = str(spell(name, "30m"))
    raise ConfigError(
        f"{flag.split()[0]} must be a duration {rule}, got {value!r} ({why}); give {TEXT_FORMS}, "
        f"like {flag}."
    )


def _in_python(name: str) -> bool:
    """Whether option ``name`` is named as Python has it: in Python, and for what the command
    line or the magics have no option of that name (a setting of a cluster's spec, say)."""
    spelt = spell(name, 0)
    return spelt is None or spelt == f"{name}=0"


def optional_duration(value: object, name: str, *, zero: bool = False) -> float | None:
    """As :func:`duration`, with None allowed and kept (no limit)."""
    if value is None:
        return None
    try:
        return duration(value, name, zero=zero)
    except ConfigError as exc:
        if not _in_python(name):
            raise  # no None to give on the command line or in a magic
        raise ConfigError(f"{str(exc)[:-1]}, or None for no limit.") from None


def _seconds(value: object) -> tuple[float | None, str]:
    """The seconds ``value`` stands for (any sign), or None and why it stands for none."""
    if isinstance(value, bool):
        return None, "a bool is not a duration"
    if isinstance(value, datetime.timedelta):  # pandas' Timedelta too
        return value.total_seconds(), ""
    if type(value).__name__ == "timedelta64":  # numpy's, as a frame's .values hold them
        if str(value) == "NaT":
            return None, "it is NaT"
        nanoseconds: Any = getattr(value, "astype")("timedelta64[ns]")  # noqa: B009
        return int(nanoseconds) / 1e9, ""
    if isinstance(value, numbers.Real):
        try:
            seconds = float(value)
        except OverflowError:  # an int too big for a float
            return None, "it is too large"
        if math.isnan(seconds):
            return None, "it is NaN"
        return (seconds, "") if math.isfinite(seconds) else (None, "it is infinite")
    if isinstance(value, str):
        return _text(value)
    return None, f"a {type(value).__name__} is not a duration"


def _text(value: str) -> tuple[float | None, str]:
    text = value.strip().lower()
    if not text:
        return None, "it is empty"
    if text.startswith("-"):
        inner, why = _text(text[1:])
        return (None if inner is None else -inner), why
    if re.fullmatch(_NUMBER, text):
        return float(text), ""
    if text in ("nan", "inf", "infinity", "+inf"):
        return None, "it is not a finite number"
    total = 0.0
    at = 0
    for part in _PART.finditer(text):
        if part.start() != at:
            break
        number, unit = part.groups()
        if unit not in UNITS:
            short = _WORDS.get(unit)
            hint = f"; write {number}{short}" if short else ""
            return None, f"unknown unit {unit!r}{hint}"
        total += float(number) * UNITS[unit]
        at = part.end()
    if at != len(text) or at == 0:
        return None, "it is not a number, nor numbers with units"
    return total, ""
