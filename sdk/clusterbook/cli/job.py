"""What ``clusterbook run`` and ``clusterbook export mpijob`` both take of a job: its command
after ``--``, ``--env``, and the recovery options (``--retries``, ``--backoff``,
``--retry-on``, ``--deadline``, ``--restarts``); and how every command reads a duration."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from clusterbook.durations import duration
from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    from clusterbook.launch.prepare import JobArgs

__all__ = [
    "add_env_option",
    "add_recovery_options",
    "command",
    "duration_arg",
    "env_args",
    "recovery_args",
]


def duration_arg(option: str) -> Callable[[str], float]:
    """An argparse ``type`` for ``option``: seconds > 0 from ``90``, ``90s``, ``30m``,
    ``1h30m`` (:func:`clusterbook.durations.duration`), or a usage error naming it."""

    def parse(text: str) -> float:
        try:
            return duration(text, option)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def command(cmd: list[str], example: str) -> list[str]:
    """The program and its arguments given after ``--``; ``example`` is the whole command
    line, to show how when there is none."""
    argv = cmd[1:] if cmd[:1] == ["--"] else list(cmd)
    if not argv:
        raise ConfigError(f"No command given; write it after '--', like: {example}")
    return argv


def add_env_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set a variable for the ranks (repeatable)",
    )


def env_args(items: list[str]) -> dict[str, str]:
    """``--env NAME=VALUE`` options as a mapping."""
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--env {item!r} has no '='; write it like --env SEED=1.")
        env[name] = value
    return env


def add_recovery_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--retries",
        type=int,
        default=0,
        metavar="N",
        help="run the job again after a failure, up to N times (default 0)",
    )
    parser.add_argument(
        "--backoff",
        default="1",
        metavar="D",
        help="how long before the first retry, doubled after each one up to 60s (default 1s; "
        "seconds or text like 30s, 2m)",
    )
    parser.add_argument(
        "--retry-on",
        metavar="WHAT,...",
        help="endings to retry, of failure, node-lost, timeout (default: failure,node-lost)",
    )
    parser.add_argument(
        "--deadline",
        metavar="D",
        help="stop the job and its retries after D together (seconds or text like 2h, 1h30m)",
    )
    parser.add_argument(
        "--restarts",
        type=int,
        default=0,
        metavar="N",
        help="when a node is lost, relaunch the job on the nodes left, up to N times",
    )


def recovery_args(args: argparse.Namespace) -> JobArgs:
    """What ``--retries``, ``--backoff``, ``--retry-on``, ``--deadline`` and ``--restarts``
    ask of ``mpirun``."""
    return {
        "retries": args.retries,
        "backoff": args.backoff,
        "retry_on": None if args.retry_on is None else _split_words(args.retry_on),
        "deadline": args.deadline,
        "restarts": args.restarts,
    }


def _split_words(text: str) -> list[str]:
    return [w.strip() for w in text.split(",") if w.strip()]
