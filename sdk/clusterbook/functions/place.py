"""Where a function job's call folder is made and its values are read back: a
:class:`CallPlace`.

A call folder (``RUN_DIR/functions/call-XXXX/``, private to its user) is on the machine the
cluster's head runs on, since the head ``put``s it to the nodes and ``gather``s the ranks'
values into it. :class:`LocalCalls` makes and reads it in this process's file system (a cluster
of this process, or one attached on this machine); a handle attached over ssh gives its own
place (``call_place()``, :class:`HasCallPlace`), which does the same on the head's machine
through its connection. The file work itself is here, once: :func:`new_call_dir`,
:func:`add_file` and :func:`settle` serve both.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from clusterbook.errors import ClusterStateError, ConfigError

if TYPE_CHECKING:
    from clusterbook.cluster.handle import ClusterHandle

__all__ = [
    "CALL_FILES",
    "CallPlace",
    "HasCallPlace",
    "LocalCalls",
    "add_file",
    "new_call_dir",
    "place_of",
    "settle",
]

#: The files a call folder holds, besides ``values/``.
CALL_FILES = ("call.pkl", "rank.py", "rank.pyc")
_PREFIX = "call-"


class CallPlace(Protocol):
    """Makes call folders on the head's machine and reads what ranks left in them."""

    def create(self, files: Mapping[str, bytes]) -> Path:
        """A new private folder under the run directory's ``functions/`` holding ``files``
        (names of :data:`CALL_FILES`) and an empty ``values/``; its path as the head's
        machine names it."""
        ...

    def discard(self, folder: Path) -> None:
        """Remove ``folder`` (a call that did not start)."""
        ...

    def values(self, folder: Path, job_dir: Path) -> contextlib.AbstractContextManager[Path]:
        """Move ``folder/values`` into ``job_dir/values`` (where it is kept), remove the
        folder, and give a directory of this machine that holds the values while the context
        lasts."""
        ...


@runtime_checkable
class HasCallPlace(Protocol):
    """A cluster handle whose call folders are not made in this process's file system."""

    def call_place(self) -> CallPlace: ...


def place_of(cluster: ClusterHandle) -> CallPlace:
    """Where ``cluster``'s function jobs keep their calls."""
    if isinstance(cluster, HasCallPlace):
        return cluster.call_place()
    return LocalCalls(cluster.run_dir)


class LocalCalls:
    """Call folders in a run directory of this machine."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir

    def create(self, files: Mapping[str, bytes]) -> Path:
        if not self.run_dir.is_dir():
            raise ClusterStateError(
                f"submit() writes the call into the cluster's run directory, {self.run_dir}, "
                "which is not on this machine: attach to the cluster through its ssh:// "
                "address, or submit from the machine its head runs on."
            )
        folder = new_call_dir(self.run_dir)
        try:
            for name, data in files.items():
                add_file(folder, name, data)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def discard(self, folder: Path) -> None:
        shutil.rmtree(folder, ignore_errors=True)

    @contextlib.contextmanager
    def values(self, folder: Path, job_dir: Path) -> Iterator[Path]:
        yield settle(folder, job_dir)


def new_call_dir(run_dir: Path) -> Path:
    """A new folder for one call under ``run_dir/functions`` (0700, a name of its own), with
    an empty ``values/`` for the ranks' values."""
    functions = run_dir / "functions"
    functions.mkdir(mode=0o700, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=_PREFIX, dir=functions))
    (folder / "values").mkdir(mode=0o700)
    return folder


def check_call_dir(run_dir: Path, folder: Path) -> Path:
    """``folder``, once it is sure to be a call folder of ``run_dir`` (a request from
    another machine names it)."""
    real = Path(os.path.realpath(folder))
    parent = Path(os.path.realpath(run_dir / "functions"))
    if real.parent != parent or not real.name.startswith(_PREFIX) or not real.is_dir():
        raise ConfigError(
            f"{folder} is not a call folder of the cluster (one under {run_dir / 'functions'}, "
            f"named {_PREFIX}...)."
        )
    return real


def add_file(folder: Path, name: str, data: bytes) -> None:
    """Append ``data`` to ``folder/name`` (made 0600 if new; never through a link), a name of
    :data:`CALL_FILES`."""
    if name not in CALL_FILES:
        raise ConfigError(f"A call folder holds {', '.join(CALL_FILES)}, not {name!r}.")
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    fd = os.open(folder / name, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def settle(folder: Path, job_dir: Path) -> Path:
    """Move ``folder/values`` to ``job_dir/values`` and remove ``folder``; where the values
    are now (still in ``folder`` when the job's directory cannot take them)."""
    values = folder / "values"
    kept = job_dir / "values"
    try:
        os.replace(values, kept)
    except OSError:  # the job's directory elsewhere: read them where they are
        return values
    try:  # the files it holds, by name: a fraction of rmtree's walk, at every job's end
        for name in CALL_FILES:
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()
    except OSError:  # something more in it
        shutil.rmtree(folder, ignore_errors=True)
    return kept
