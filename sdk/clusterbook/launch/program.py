"""Checking a job's argv and working directory, and finding its program, before launch."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from clusterbook.errors import ConfigError, ProgramNotFoundError
from clusterbook.wording import spell

__all__ = ["check_argv", "check_cwd", "resolve_program"]

_PYTHON_NAMES = {"python", "python3"}


def check_argv(argv: object) -> list[str]:
    """A non-empty list of strings without NUL, or ConfigError."""
    if isinstance(argv, str):
        raise ConfigError(
            f"argv must be a list of words, not the string {argv!r}; write it like "
            f"{argv.split()!r} (shlex.split() splits a command line the way a shell does)."
        )
    if not isinstance(argv, Sequence) or not argv:
        raise ConfigError(f"argv must be a non-empty list of strings, got {argv!r}.")
    bad = [a for a in argv if not isinstance(a, str) or "\0" in a]
    if bad:
        raise ConfigError(f"Every word of argv must be a string without NUL; {bad[0]!r} is not.")
    return list(argv)


def check_cwd(cwd: str | os.PathLike[str] | None) -> str:
    """The absolute working directory (default: the current one), which must exist."""
    path = Path.cwd() if cwd is None else Path(cwd).expanduser()
    if not path.is_dir():
        raise ConfigError(f"cwd {str(path)!r} is not a directory; pass an existing directory.")
    return str(path.resolve())


def resolve_program(
    argv: list[str], *, python: str, path_env: str | None, cwd: str, local: bool
) -> list[str]:
    """``"python"`` becomes the cluster's interpreter; on local clusters the program (and a
    Python script) must exist. On remote nodes the launcher looks the program up there."""
    first = argv[0]
    if first in _PYTHON_NAMES:
        argv = [python, *argv[1:]]
    elif local or os.sep in first:
        found = shutil.which(first, path=path_env) if local else first
        if found is None:
            raise ProgramNotFoundError(
                f"Program {first!r} was not found"
                + (" on PATH" if os.sep not in first else "")
                + "; check the name, pass its full path, or install it."
            )
        argv = [found if os.sep not in first else first, *argv[1:]]
    if local and Path(argv[0]).name.startswith("python") and len(argv) > 1:
        script = argv[1]
        if not script.startswith("-") and not Path(cwd, script).is_file():
            raise ProgramNotFoundError(
                f"Python script {script!r} does not exist in {cwd}; check the name or "
                + (
                    f"pass {given} to run it from another directory."
                    if (given := spell("cwd", "/its/directory"))
                    else "run it from its own directory."
                )
            )
    return argv
