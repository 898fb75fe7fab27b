"""Files in directories that someone else may write: opened without following a link, removed
only where they must be.

A cluster's directory can be in a place other users can write (a shared project directory),
and what is in it may have been put there by one of them: a symbolic link named like a lock
file points at one of your files, a record names a directory of yours as a job's. What
clusterbook opens there it opens with ``O_NOFOLLOW`` (a file it makes, with ``O_EXCL`` too)
and takes only when it is a regular file; what it removes it removes only inside the
directory it must be in, resolved first, walking down from that directory one component at a
time without following a link (a link swapped in along the way is not followed either).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from clusterbook.errors import ClusterStateError, UnsafePathError

__all__ = ["inside", "locked", "open_regular", "remove_tree", "touch"]

_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a FIFO does not hang open()


def _refused(path: Path, what: str) -> UnsafePathError:
    return UnsafePathError(
        f"Refusing {path}: it is {what}, not a file clusterbook made. Someone who can write "
        f"in {path.parent} may have put it there; remove it, and make the directory writable "
        "only by you.",
        path=path,
    )


def open_regular(path: Path, *, create: bool = False, mode: int = 0o600) -> int:
    """A descriptor (read-write) on the regular file ``path``, never through a symbolic link
    and never truncated; with ``create``, made (``O_EXCL``, ``mode``) when absent.

    Raises :class:`UnsafePathError` when ``path`` is a link, a directory, a FIFO or a
    device."""
    fd = -1
    for _ in range(3):  # made, or found: a file removed in between is looked for again
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS, mode)
            if fd < 0:
                fd = os.open(path, os.O_RDWR | _FLAGS)
            break
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused(path, "a symbolic link") from None
            if exc.errno == errno.EISDIR:
                raise _refused(path, "a directory") from None
            raise
    if fd < 0:
        raise FileNotFoundError(errno.ENOENT, "it came and went while it was opened", str(path))
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise _refused(path, "not a regular file")
    return fd


def touch(path: Path, mode: int = 0o644) -> None:
    """Make ``path`` exist as a regular file (like the stop file), never through a link."""
    os.close(open_regular(path, create=True, mode=mode))


@contextlib.contextmanager
def locked(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive lock on the lock file ``path`` (made if absent, never through a
    link, never truncated); :class:`ClusterStateError` if another process holds it over
    ``timeout`` s."""
    fd = open_regular(path, create=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ClusterStateError(
                        f"Another process has held {path} for {timeout:g} s; it is still "
                        "stopping the cluster. Try again once it is done (or it is gone)."
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)


def inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is in ``root`` (``root`` itself excluded) once both are resolved."""
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    return real != top and real.is_relative_to(top)


def remove_tree(path: Path, root: Path, *, itself: bool = False) -> bool:
    """Remove the directory ``path`` with all it holds, if it is inside ``root`` once both
    are resolved (or is ``root``, with ``itself``); return whether there was one.

    The directory is reached from ``root`` one component at a time, never through a link,
    and emptied through descriptors (a link inside is removed, not followed). Raises
    :class:`UnsafePathError` for a ``path`` elsewhere or that is a link, and the ``OSError``
    of what could not be removed."""
    if os.path.islink(path):
        raise _refused(path, "a symbolic link")
    real, top = Path(os.path.realpath(path)), Path(os.path.realpath(root))
    if not real.is_relative_to(top) or (real == top and not itself):
        raise UnsafePathError(
            f"Refusing to remove {path}: it is not inside {root}, the only place clusterbook "
            "removes from here. A record naming it was not written by clusterbook, or was "
            "changed since; remove what you no longer need by hand.",
            path=path,
        )
    start, parts = (top, real.relative_to(top).parts) if real != top else (top.parent, (top.name,))
    try:
        fd = os.open(start, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        for part in parts[:-1]:
            down = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = down
        info = os.lstat(parts[-1], dir_fd=fd)
        if stat.S_ISLNK(info.st_mode):
            raise _refused(path, "a symbolic link")
        if not stat.S_ISDIR(info.st_mode):
            raise _refused(path, "not a directory")
        _remove_at(fd, parts[-1])
    except FileNotFoundError:
        return False
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refused(path, "reached through a symbolic link") from None
        raise
    finally:
        os.close(fd)
    return True


def _remove_at(parent: int, name: str) -> None:
    """Remove directory ``name`` of the directory open as ``parent`` with all it holds,
    following no link (what ``shutil.rmtree(dir_fd=)`` does from Python 3.11 on)."""
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    try:
        with os.scandir(fd) as entries:
            for entry in list(entries):
                if entry.is_dir(follow_symlinks=False):
                    _remove_at(fd, entry.name)
                else:
                    os.unlink(entry.name, dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=parent)
