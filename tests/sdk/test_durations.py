"""The one parser of durations (clusterbook.durations): seconds, timedeltas and text in,
float seconds or a ConfigError that names the option, the value and the forms out."""

from __future__ import annotations

import datetime
import math
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import clusterbook as cb
from clusterbook.durations import FORMS, TEXT_FORMS, duration, optional_duration


@pytest.mark.parametrize(
    ("given", "seconds"),
    [(90, 90.0), (1.5, 1.5), (Fraction(1, 4), 0.25), ("90", 90.0), (" 90 ", 90.0),
     ("1.5", 1.5), (".5", 0.5), ("90s", 90.0), ("30m", 1800.0), ("2h", 7200.0),
     ("1d", 86400.0), ("1w", 604800.0), ("250ms", 0.25), ("1h30m", 5400.0),
     ("1h 30m", 5400.0), ("1.5h", 5400.0), ("2H", 7200.0), ("1d2h3m4s", 93784.0),
     ("30 m", 1800.0), (datetime.timedelta(minutes=30), 1800.0),
     (datetime.timedelta(milliseconds=1), 0.001)],
)  # fmt: skip
def test_seconds_timedeltas_and_text_are_seconds(given: object, seconds: float) -> None:
    assert duration(given, "timeout") == seconds


@pytest.mark.parametrize(
    ("bad", "why"),
    [(0, "it is zero"), ("0s", "it is zero"), (datetime.timedelta(0), "it is zero"),
     (-1, "it is negative"), ("-5m", "it is negative"),
     (datetime.timedelta(seconds=-1), "it is negative"), (math.nan, "it is NaN"),
     (math.inf, "it is infinite"), (10**400, "it is too large"), ("nan", "not a finite"),
     ("inf", "not a finite"), (True, "a bool is not a duration"),
     ([5], "a list is not a duration"), (b"5", "a bytes is not a duration"),
     ("", "it is empty"), ("soon", "not a number, nor numbers with units"),
     ("1h30", "not a number, nor numbers with units"), ("h", "not a number, nor numbers"),
     ("2x", "unknown unit 'x'"), ("30 minutes", "unknown unit 'minutes'; write 30m"),
     ("2 hours", "unknown unit 'hours'; write 2h"), ("1mo", "unknown unit 'mo'")],
)  # fmt: skip
def test_a_bad_duration_names_the_option_the_value_why_and_the_forms(bad: object, why: str) -> None:
    with pytest.raises(cb.ConfigError) as info:
        duration(bad, "deadline")
    message = str(info.value)
    assert message.startswith(f"deadline must be a duration > 0, got {bad!r} (")
    assert why in message
    assert FORMS in message


def test_numpy_and_pandas_durations_are_seconds_too() -> None:
    # What a frame's timedelta64 column hands back, as .values or as items.
    column = pd.Series(pd.to_timedelta([2.5], unit="s"))
    assert duration(column.values[0], "timeout") == 2.5
    assert duration(column[0], "timeout") == 2.5
    assert duration(np.timedelta64(90, "s"), "timeout") == 90.0
    assert duration(np.int64(5), "timeout") == 5.0
    with pytest.raises(cb.ConfigError, match=r"got np.timedelta64\('NaT'\) \(it is NaT\)"):
        duration(np.timedelta64("NaT"), "timeout")


def test_zero_is_allowed_only_where_the_option_says_so() -> None:
    assert duration(0, "backoff", zero=True) == 0.0
    assert duration("0s", "backoff", zero=True) == 0.0
    with pytest.raises(cb.ConfigError, match=r"backoff must be a duration >= 0, got -1 "):
        duration(-1, "backoff", zero=True)


def test_none_means_no_limit_only_where_optional() -> None:
    assert optional_duration(None, "timeout") is None
    assert optional_duration("2m", "timeout") == 120.0
    with pytest.raises(cb.ConfigError, match=r"got None \(a NoneType is not a duration\)") as info:
        duration(None, "timeout")
    assert "None for no limit" not in str(info.value)
    with pytest.raises(cb.ConfigError, match=r"or None for no limit\.$"):
        optional_duration("soon", "timeout")


_PARTS = st.tuples(*(st.integers(0, 400) for _ in range(5)))


@given(_PARTS)
def test_units_add_up_in_any_combination(parts: tuple[int, ...]) -> None:
    weeks, days, hours, minutes, seconds = parts
    text = f"{weeks}w{days}d{hours}h{minutes}m{seconds}s"
    total = weeks * 604800 + days * 86400 + hours * 3600 + minutes * 60 + seconds
    if total:
        assert duration(text, "timeout") == total
        assert duration(text.replace("m", "m "), "timeout") == total


@given(st.floats(min_value=1e-6, max_value=1e12))
def test_every_form_of_the_same_seconds_is_the_same(seconds: float) -> None:
    as_timedelta = datetime.timedelta(seconds=seconds)
    assert duration(seconds, "timeout") == seconds
    assert duration(repr(seconds), "timeout") == seconds
    assert duration(as_timedelta, "timeout") == as_timedelta.total_seconds()
    assert duration(f"{seconds!r}s", "timeout") == seconds


def test_on_the_command_line_and_in_the_magics_the_flag_is_named() -> None:
    from clusterbook.wording import speaking

    with speaking("cli"), pytest.raises(cb.ConfigError) as info:
        optional_duration("soon", "deadline")
    assert str(info.value) == (
        "--deadline must be a duration > 0, got 'soon' (it is not a number, nor numbers with "
        f"units); give {TEXT_FORMS}, like --deadline 30m."
    )
    with (
        speaking("magics"),
        pytest.raises(cb.ConfigError, match=r"^--timeout must be .* got 0 .*--timeout 30m\.$"),
    ):
        duration(0, "timeout")
    # What neither has an option for is named as in Python.
    with speaking("cli"), pytest.raises(cb.ConfigError, match=r"^idle_timeout must be"):
        duration(0, "idle_timeout")
