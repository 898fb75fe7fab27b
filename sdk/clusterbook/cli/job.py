"""What ``clusterbook run`` and ``clusterbook export mpijob`` both take of a job: its command
after ``--``, ``--env``, and the recovery options (``--retries``, ``--backoff``,
``--retry-on``, ``--deadline``, ``--restarts``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    from clusterbook.launch.prepare import JobArgs

__all__ = ["add_env_option", "add_recovery_options", "command", "env_args", "recovery_args"]


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
        metavar="S",
        help="seconds before the first retry, doubled after each one up to 60 (default 1)",
    )
    parser.add_argument(
        "--retry-on",
        metavar="WHAT,...",
        help="endings to retry, of failure, node-lost, timeout (default: failure,node-lost)",
    )
    parser.add_argument(
        "--deadline",
        metavar="S",
        help="stop the job and its retries after S seconds together (or a duration like 2h)",
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
