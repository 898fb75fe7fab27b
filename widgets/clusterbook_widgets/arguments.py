"""The arguments of the ``%cluster`` and ``%%mpirun`` magics, parsed (pure): what each asks
for, or an :class:`ArgsError` saying what is wrong and how to call the magic, or the help
text (:class:`HelpRequested`), never an exit of the kernel as argparse would."""

from __future__ import annotations

import argparse
import functools
import keyword
import shlex
from dataclasses import dataclass

from clusterbook.durations import duration
from clusterbook.errors import ConfigError
from clusterbook.launch import CLEAN

__all__ = [
    "ArgsError",
    "HelpRequested",
    "MpirunArgs",
    "parse_cluster_args",
    "parse_mpirun_args",
]


class ArgsError(Exception):
    """Bad magic arguments: ``message`` says what is wrong, ``usage`` how to call the magic."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage


class HelpRequested(Exception):
    """``-h`` was given; ``text`` is the help to print."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class _Parser(argparse.ArgumentParser):
    # argparse prints and calls sys.exit(); a magic must print a usage message and go on.
    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._printed: list[str] = []

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ArgsError(f"{self.prog}: {message}", self.format_usage())

    def _print_message(self, message: str, file: object = None) -> None:
        self._printed.append(message)

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        raise HelpRequested("".join(self._printed) + (message or ""))


def _split(parser: _Parser, line: str) -> list[str]:
    try:
        return shlex.split(line)
    except ValueError as exc:
        raise ArgsError(f"{parser.prog}: {exc} in {line!r}", parser.format_usage()) from exc


def _count(what: str, least: int = 1):  # type: ignore[no-untyped-def]
    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{what} must be a whole number >= {least}, got {text!r}"
            ) from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{what} must be >= {least}, got {value}")
        return value

    return convert


def _slots(text: str) -> int | str:
    if text == "gpus":
        return text
    try:
        return int(_count("--slots")(text))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"--slots must be a whole number >= 1 or 'gpus' (one per GPU), got {text!r}"
        ) from None


def _seconds(text: str, option: str = "timeout") -> float:
    """A duration as the magic's options take it: ``90``, ``30m``, ``1h30m``."""
    try:
        return duration(text, option)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _identifier(text: str) -> str:
    if not text.isidentifier() or keyword.iskeyword(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Python variable name")
    return text


def _identifiers(text: str) -> list[str]:
    return [_identifier(name.strip()) for name in text.split(",")]


@dataclass(frozen=True)
class MpirunArgs:
    """What ``%%mpirun`` was asked: ranks, time limit, variables to push and to pull, and
    whether a failed cell prints its error instead of raising it (``no_raise``)."""

    np: int | None = None
    timeout: float | None = None
    push: tuple[str, ...] = ()
    pull: str | None = None
    oversubscribe: bool = False
    retries: int = 0
    backoff: str | None = None
    retry_on: tuple[str, ...] | None = None
    deadline: str | None = None
    restarts: int = 0
    clean: str = "all"
    no_raise: bool = False


def _mpirun_parser() -> _Parser:
    p = _Parser(
        prog="%%mpirun",
        description="Run the cell as an MPI program on the current cluster (a local one is "
        "started if there is none), showing each rank's output as it comes.",
    )
    p.add_argument("-n", "--np", type=_count("-n"), metavar="N", help="number of ranks")
    p.add_argument(
        "--timeout",
        type=_seconds,
        metavar="D",
        help="stop the job after D (seconds or text like 90s, 30m, 1h30m)",
    )
    p.add_argument(
        "--push",
        type=_identifiers,
        action="append",
        default=[],
        metavar="A,B",
        help="notebook variables every rank gets (cloudpickled: functions too)",
    )
    p.add_argument(
        "--pull",
        type=_identifier,
        metavar="NAME",
        help="set NAME in the notebook to the list of the ranks' values of NAME: plain data "
        "only (numbers, strings, lists, dicts, numpy arrays...), since the kernel runs no "
        "code that the ranks' machines hand it",
    )
    p.add_argument(
        "--oversubscribe", action="store_true", help="allow more ranks than the cluster's slots"
    )
    p.add_argument(
        "--retries",
        type=_count("--retries", least=0),
        default=0,
        metavar="N",
        help="run the cell again after a failure, up to N times",
    )
    p.add_argument(
        "--backoff",
        metavar="D",
        help="how long before the first retry, doubled after each one (like 5 or 30s)",
    )
    p.add_argument(
        "--retry-on",
        metavar="WHAT,...",
        help="of failure, node-lost, timeout (default: the first two)",
    )
    p.add_argument(
        "--deadline",
        metavar="D",
        help="stop the job and its retries after D together (seconds or text like 2h)",
    )
    p.add_argument(
        "--restarts",
        type=_count("--restarts", least=0),
        default=0,
        metavar="N",
        help="when a node is lost, run the cell again on the nodes left, up to N times",
    )
    p.add_argument(
        "--clean",
        choices=CLEAN,
        default="all",
        help="what is left of a failed cell's processes: none keeps them stopped for "
        "inspection until %%cluster stop (default: all, nothing left)",
    )
    p.add_argument(
        "--no-raise",
        action="store_true",
        help="when the job fails, print its error and return as a cell that succeeded "
        "(default: raise it, so that Run All stops at this cell)",
    )
    return p


def parse_mpirun_args(line: str) -> MpirunArgs:
    """Parse the line of ``%%mpirun``; raise :class:`ArgsError` (or :class:`HelpRequested`)."""
    parser = _mpirun_parser()
    ns = parser.parse_args(_split(parser, line))
    push = tuple(dict.fromkeys(name for names in ns.push for name in names))
    retry_on = None if ns.retry_on is None else tuple(w.strip() for w in ns.retry_on.split(","))
    return MpirunArgs(
        ns.np,
        ns.timeout,
        push,
        ns.pull,
        ns.oversubscribe,
        ns.retries,
        ns.backoff,
        retry_on,
        ns.deadline,
        ns.restarts,
        ns.clean,
        ns.no_raise,
    )


def _cluster_parser() -> _Parser:
    p = _Parser(prog="%cluster", description="Start, show or stop the notebook's cluster.")
    sub = p.add_subparsers(
        dest="command",
        metavar="{local,ssh,slurm,env,profile,attach,status,scale,adapt,stop}",
        required=True,
    )
    local = sub.add_parser("local", help="a cluster on this machine")
    local.add_argument("--workers", type=_count("--workers"), default=1, metavar="N")
    local.add_argument(
        "--slots",
        type=_slots,
        default=None,
        metavar="S",
        help="ranks each node takes (default: the cores this process may use, shared among "
        "the nodes; 'gpus': one per GPU)",
    )
    ssh = sub.add_parser("ssh", help="a cluster of SSH hosts")
    ssh.add_argument("hosts", nargs="+", metavar="HOST[:SLOTS]")
    ssh.add_argument("--user", metavar="U")
    ssh.add_argument("--identity", metavar="F", help="private key file")
    ssh.add_argument("--port", type=_count("--port"), default=22, metavar="P")
    ssh.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust hosts not yet in known_hosts on first use (a changed key is still refused)",
    )
    slurm = sub.add_parser("slurm", help="nodes from one Slurm batch job")
    slurm.add_argument("--nodes", type=_count("--nodes"), default=2, metavar="N")
    slurm.add_argument(
        "--slots",
        type=_count("--slots"),
        default=None,
        metavar="S",
        help="ranks each node takes (default: whole nodes, one per CPU)",
    )
    slurm.add_argument("--partition", metavar="P")
    slurm.add_argument("--time", default="1:00:00", metavar="T", help="like 1:00:00 or 30m")
    slurm.add_argument("--account", metavar="A")
    slurm.add_argument(
        "--min-nodes",
        type=_count("--min-nodes"),
        default=None,
        metavar="M",
        help="start with at least M nodes (sbatch --nodes=M-N)",
    )
    env = sub.add_parser(
        "env",
        help="a cluster of the nodes of the Slurm allocation, PBS job, SageMaker training job "
        "or MPIJob launcher pod this kernel runs in",
    )
    env.add_argument(
        "kind",
        nargs="?",
        choices=["slurm", "pbs", "mpijob", "sagemaker"],
        help="read this system only (default: the first found)",
    )
    env.add_argument("--slots", type=_count("--slots"), metavar="N", help="ranks per node")
    env.add_argument(
        "--via",
        choices=["auto", "srun", "ssh"],
        default=None,
        help="how jobs start: as steps of the Slurm allocation (srun), or mpirun over ssh "
        "(default auto: srun in a Slurm allocation where srun is found, else ssh)",
    )
    env.add_argument("--user", metavar="U")
    env.add_argument("--identity", metavar="F", help="private key file")
    env.add_argument("--port", type=_count("--port"), metavar="P")
    env.add_argument(
        "--accept-new-host-keys",
        action="store_true",
        help="trust hosts not yet in known_hosts on first use (a changed key is still refused)",
    )
    _add_profile(sub)
    _add_current(sub)
    return p


def _add_current(sub: argparse._SubParsersAction[_Parser]) -> None:
    """The commands about a cluster that runs: attach, status, scale, adapt, stop."""
    attach = sub.add_parser("attach", help="a cluster another kernel or process runs")
    attach.add_argument("id", metavar="ID", help="its id (clusterbook ls), name or directory")
    sub.add_parser("status", help="show the cluster's nodes")
    scale = sub.add_parser("scale", help="grow or shrink the Slurm cluster to N nodes")
    scale.add_argument("nodes", type=_count("N"), metavar="N", help="the number of nodes")
    adapt = sub.add_parser(
        "adapt",
        help="let the Slurm cluster grow while jobs wait for slots and shrink when idle",
    )
    adapt.add_argument("minimum", type=_count("MIN"), metavar="MIN", help="the fewest nodes")
    adapt.add_argument("maximum", type=_count("MAX"), metavar="MAX", help="the most nodes")
    for option, default in (("--interval", "30s"), ("--grace", "1m")):
        adapt.add_argument(
            option,
            type=functools.partial(_seconds, option=option),
            default=default,
            metavar="D",
            help=f"default {default} (seconds or text like 90s, 2m)",
        )
    sub.add_parser("stop", help="stop the cluster and every process of it")


def _add_profile(sub: argparse._SubParsersAction[_Parser]) -> None:
    profile = sub.add_parser(
        "profile", help="the cluster of a profile in profiles.toml (clusterbook profiles)"
    )
    profile.add_argument("name", metavar="NAME", help="the profile's name")


def parse_cluster_args(line: str) -> argparse.Namespace:
    """Parse the line of ``%cluster``; raise :class:`ArgsError` (or :class:`HelpRequested`)."""
    parser = _cluster_parser()
    args = parser.parse_args(_split(parser, line))
    if args.command == "adapt" and args.minimum > args.maximum:
        parser.error(
            f"adapt {args.minimum} {args.maximum}: MIN must be at most MAX; give the fewest "
            f"nodes first, like adapt {args.maximum} {args.minimum}"
        )
    return args
