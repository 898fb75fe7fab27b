"""Every duration option of the ``clusterbook`` command and of the magics takes seconds and
text (``90``, ``90s``, ``1h30m``): read by the one parser, as in Python. The options are
found in the parsers, so that a new one that reads a number of seconds by itself fails."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator

import pytest

from clusterbook.cli.main import _parser, main
from clusterbook_widgets.arguments import (
    ArgsError,
    _cluster_parser,
    _mpirun_parser,
    parse_mpirun_args,
)
from tests.sdk.test_duration_options import DURATION

#: Options that keep the text as given, for the API's own parser to read it (``--time``:
#: Slurm's formats too; ``--backoff``, ``--deadline``: a job's recovery, checked with it).
AS_TEXT = {"--backoff", "--deadline", "--older-than", "--retention", "--time"}


def _options(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options(sub, f"{prog} {name}")
        elif action.option_strings and DURATION.search(action.dest):
            yield f"{prog} {action.option_strings[-1]}", action


def _every_option() -> list[tuple[str, argparse.Action]]:
    return [
        *_options(_parser(), "clusterbook"),
        *_options(_mpirun_parser(), "%%mpirun"),
        *_options(_cluster_parser(), "%cluster"),
    ]


@pytest.mark.parametrize(
    ("where", "action"), [pytest.param(*found, id=found[0]) for found in _every_option()]
)
def test_every_duration_option_reads_seconds_and_text(where: str, action: argparse.Action) -> None:
    flag = action.option_strings[-1]
    if flag in AS_TEXT:
        assert action.type is None, f"{where} reads its value itself"
        return
    assert action.type is not None, f"{where} takes any text: give it a duration type"
    assert [action.type(text) for text in ("5400", "5400s", "90m", "1h30m", "1.5h")] == [  # type: ignore[operator]
        5400.0
    ] * 5
    with pytest.raises(argparse.ArgumentTypeError, match=r"must be a duration > 0, got 'soon'"):
        action.type("soon")  # type: ignore[operator]


def test_the_options_are_found() -> None:
    found = {where for where, _ in _every_option()}
    assert {
        "clusterbook run --timeout",
        "clusterbook stop --timeout",
        "%%mpirun --timeout",
    } <= found
    assert "clusterbook worker serve --lease" in found


def test_a_bad_duration_on_the_command_line_is_a_usage_error_naming_it() -> None:
    said = io.StringIO()
    with contextlib.redirect_stderr(said), pytest.raises(SystemExit) as exit_:
        main(["stop", "some-cluster", "--timeout", "30 minutes"])
    assert exit_.value.code == 2
    assert "--timeout must be a duration > 0, got '30 minutes' (unknown unit 'minutes'; " in (
        said.getvalue()
    )


def test_mpijob_export_carries_durations_given_as_text() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            ["export", "mpijob", "-n", "1", "--image", "img", "--timeout", "1h30m",
             "--deadline", "2h", "--retention", "1d", "--", "python", "t.py"]
        )  # fmt: skip
    assert code == 0
    text = out.getvalue()
    assert "--deadline 7200 --timeout 5400" in text
    assert "ttlSecondsAfterFinished: 86400" in text


def test_mpirun_magic_takes_text_durations() -> None:
    args = parse_mpirun_args("-n 2 --timeout 1h30m --deadline 2h --backoff 30s")
    assert (args.timeout, args.deadline, args.backoff) == (5400.0, "2h", "30s")
    with pytest.raises(ArgsError, match="timeout must be a duration > 0, got '2 hours'"):
        parse_mpirun_args("--timeout '2 hours'")
