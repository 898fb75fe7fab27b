"""The ``clusterbook`` command: its parser and the dispatch to a command, with one exit code
for every error. Each group of commands has a module of its own: ``run``
(:mod:`clusterbook.cli.run`), ``demo`` (:mod:`~clusterbook.cli.demo`), ``cleanup``
(:mod:`~clusterbook.cli.cleanup`), the commands about clusters elsewhere (``ls``, ``status``,
``logs``, ``exec``, ``stop``, ``prune``: :mod:`~clusterbook.cli.clusters`), ``export mpijob``
(:mod:`~clusterbook.cli.export`), ``profiles`` (:mod:`~clusterbook.cli.profiles`) and ``worker
join|serve`` (:mod:`~clusterbook.cli.worker`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from clusterbook.cli.worker import add_worker
from clusterbook.errors import ClusterError, ConfigError
from clusterbook.wording import speaking

__all__ = ["main"]

EXIT_INTERRUPTED = 130
EXIT_USAGE = 2


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``clusterbook`` command; returns the exit code."""
    words = list(sys.argv[1:] if argv is None else argv)
    if words[:1] == ["serve-dir"]:
        # What a handle attached over ssh runs here (not a command people type): no parser.
        from clusterbook.cluster.remote.dirservice import main as serve_dir

        return serve_dir(words[1:])
    worker = words[1] if words[:1] == ["worker"] and len(words) > 1 else None
    parser = _parser(worker_only=worker if worker in ("join", "serve") else None)
    command: list[str] | None = None
    if words[:1] == ["exec"] and "--" in words:
        # exec's ID comes before its options: argparse would take the command for its own.
        cut = words.index("--")
        words, command = words[:cut], words[cut + 1 :]
    args, unknown = parser.parse_known_args(words)
    if command is not None:
        args.cmd = command
    if unknown:
        return _unknown_options(parser, words, unknown)
    if not hasattr(args, "func"):
        _subparser(parser, words).print_help()
        return EXIT_USAGE
    try:
        with speaking("cli"):  # messages name the options of this command, not Python's
            return int(args.func(args))
    except ClusterError as exc:
        print(f"clusterbook: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, ConfigError) else 1
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


def _subparser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The (sub)command ``words`` name: ``clusterbook worker join ...`` is ``join``'s parser."""
    current = parser
    for word in words:
        if word.startswith("-"):
            continue
        choices = next(
            (a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)),
            None,
        )
        if not choices or word not in choices:
            break
        current = choices[word]
    return current


def _unknown_options(parser: argparse.ArgumentParser, words: list[str], unknown: list[str]) -> int:
    """A mistyped option: the subcommand's usage, and the closest options it has."""
    import difflib

    where = _subparser(parser, words)
    known = [s for a in where._actions for s in a.option_strings]
    lines = []
    for word in unknown:
        if not word.startswith("-"):
            continue
        close = difflib.get_close_matches(word.partition("=")[0], known, n=1, cutoff=0.6)
        lines.append(f"{word} (did you mean {close[0]}?)" if close else word)
    if not lines:  # stray words: a command without '--' before it, say
        lines = [" ".join(unknown) + " (put the command after '--')"]
    where.print_usage(sys.stderr)
    print(f"{where.prog}: error: unrecognized arguments: {'; '.join(lines)}", file=sys.stderr)
    return EXIT_USAGE


def _parser(*, worker_only: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; with ``worker_only``, of that ``worker`` command alone (``join``:
    what an agent parses, every node's at every bootstrap), without making, or importing for,
    the rest."""
    from clusterbook.version import __version__

    parser = argparse.ArgumentParser(
        prog="clusterbook", description="Run MPI on a handful of machines."
    )
    parser.add_argument("--version", action="version", version=f"clusterbook {__version__}")
    sub = parser.add_subparsers(title="commands")
    if not worker_only:
        _add_commands(sub)
    add_worker(sub, worker_only)
    return parser


def _add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Every command but ``worker``, in the order ``--help`` lists them."""
    from clusterbook.cli.cleanup import add_cleanup
    from clusterbook.cli.clusters import add_commands
    from clusterbook.cli.demo import add_demo
    from clusterbook.cli.export import add_export
    from clusterbook.cli.profiles import add_profiles
    from clusterbook.cli.run import add_run

    add_demo(sub)
    add_run(sub)
    add_cleanup(sub)
    add_commands(sub)
    add_export(sub)
    add_profiles(sub)


if __name__ == "__main__":
    sys.exit(main())
