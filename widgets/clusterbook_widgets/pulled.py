"""What ``%%mpirun --pull`` brings back into the kernel, and what it trusts.

The trust boundary: the kernel runs no code that a node hands it. On an SSH or elastic cluster
the ranks run on other machines, and whoever controls one of them controls what its ranks
write; a pickle is a program (its ``__reduce__`` may call ``os.system``), so a pulled value is
read as data only (:func:`load_data`): numbers, strings, bytes, lists, tuples, dicts, sets,
a few standard types (dates, decimals, fractions, ordered and default dicts, deques) and numpy
arrays and scalars. Anything else (a function, a class, an instance of one) is refused,
naming it, and runs nothing.

And it trusts only the job's own files: each rank signs its value with the cell's key (an
HMAC under a random key written only into the cell's 0600 script, bound to the rank's number),
and the values are read from the cell's own directory, which must be this user's and closed
to others (:func:`check_private_dirs`), through file descriptors that follow no link. A file
someone else put there, or one not signed by the job's rank of that number, is refused.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import os
import pickle
import stat
from pathlib import Path

from clusterbook.errors import ClusterError

__all__ = ["MAGIC", "check_private_dirs", "load_data", "read_pulled", "signed"]

#: What a pulled file starts with; the HMAC-SHA256 of ``b"rank N\n" + pickle`` follows.
MAGIC = b"CBPULL1\n"
_MAC = hashlib.sha256().digest_size

# The globals a pulled pickle may name: types whose reconstruction runs no code of the file's
# choosing (callable with plain arguments, or rebuilt from plain state). Not builtins at large:
# getattr, eval, exec and __import__ are builtins too.
_DATA_GLOBALS = {
    "builtins": {"bool", "bytearray", "bytes", "complex", "dict", "float", "frozenset"}
    | {"int", "list", "range", "set", "slice", "str", "tuple"},
    "collections": {"Counter", "OrderedDict", "defaultdict", "deque"},
    "datetime": {"date", "datetime", "time", "timedelta", "timezone"},
    "decimal": {"Decimal"},
    "fractions": {"Fraction"},
    "numpy": {"dtype", "ndarray"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.core.numeric": {"_frombuffer"},
}


class _DataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        dtype = module == "numpy.dtypes" and name.endswith("DType")  # numpy's dtype classes
        if name in _DATA_GLOBALS.get(module, ()) or dtype:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}")

    def persistent_load(self, pid: object) -> object:
        raise pickle.UnpicklingError("it refers to an object outside it")


def load_data(data: bytes) -> object:
    """The value pickled in ``data``, if it is plain data (see the module docstring); else
    :class:`pickle.UnpicklingError` naming what it is not (and nothing of it ran)."""
    return _DataUnpickler(io.BytesIO(data)).load()


def signed(key: bytes, rank: int, data: bytes) -> bytes:
    """The contents of rank ``rank``'s pulled file for the pickle ``data``: what the rank script
    writes (it has its own copy of these lines)."""
    return MAGIC + _mac(key, rank, data) + data


def _mac(key: bytes, rank: int, data: bytes) -> bytes:
    return hmac.new(key, b"rank %d\n" % rank + data, hashlib.sha256).digest()


def check_private_dirs(directory: Path, *, ours: int = 1) -> None:
    """Raise :class:`ClusterError` unless ``directory`` and the directories above it are safe
    to keep values in: the last ``ours`` of them this user's and writable by no one else, the
    others this user's or root's and writable by no one else unless sticky (as ``/tmp``).
    Otherwise someone else could replace what is in them (as OpenSSH's StrictModes checks)."""
    path = directory.absolute()
    own = [path, *path.parents][:ours]
    above = Path(os.path.realpath(own[-1].parent))  # links above are followed, as paths are
    for where, info, is_own in [
        *((d, os.lstat(d), True) for d in own),
        *((d, os.stat(d), False) for d in (above, *above.parents)),
    ]:
        if (why := _unsafe(info, own=is_own)) is not None:
            raise ClusterError(
                f"{where} cannot hold the cell's files and values: {why}, so another user could "
                "replace them. Give the cluster a run_dir of your own that only you can write "
                "to (the default is one)."
            )


def _unsafe(info: os.stat_result, *, own: bool) -> str | None:
    """Why a directory with ``info`` is no safe place (see :func:`check_private_dirs`)."""
    me, mode = os.geteuid(), info.st_mode
    if own and not stat.S_ISDIR(mode):
        return "it is not a directory (a symbolic link?)"
    if info.st_uid != me and (own or info.st_uid != 0):
        return f"it belongs to uid {info.st_uid}, not to this user (uid {me})"
    if mode & 0o022 and (own or not mode & stat.S_ISVTX):
        return f"others may change what is in it (mode {stat.filemode(mode)})"
    return None


def read_pulled(pull_dir: Path, ranks: int, key: bytes) -> list[object]:
    """The values ranks ``0 .. ranks-1`` left in ``pull_dir``, in rank order.

    ``pull_dir`` and the two directories above it (the cell's and ``cells``) must be this
    user's and closed to others; each file this user's, a regular file (no link followed),
    signed with ``key`` for its rank, and plain data. Anything else raises
    :class:`ClusterError` naming the rank, the file and why; nothing of it runs.
    """
    check_private_dirs(pull_dir.parent, ours=2)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        dir_fd = os.open(pull_dir, flags)
    except OSError as exc:
        raise ClusterError(f"Cannot open {pull_dir}: {exc.strerror or exc}.") from None
    try:
        info = os.fstat(dir_fd)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise ClusterError(
                f"{pull_dir} is not this user's alone (uid {info.st_uid}, mode "
                f"{stat.filemode(info.st_mode)}); nothing in it was read."
            )
        return [_read_rank(dir_fd, pull_dir, rank, key) for rank in range(ranks)]
    finally:
        os.close(dir_fd)


def _read_rank(dir_fd: int, pull_dir: Path, rank: int, key: bytes) -> object:
    name = f"rank-{rank}.pkl"
    path = pull_dir / name
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise ClusterError(f"rank {rank} left no value ({path} is missing)") from None
    except OSError as exc:  # ELOOP: a symbolic link
        raise ClusterError(f"rank {rank}'s value cannot be read ({path}: {exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            raise ClusterError(
                f"rank {rank}'s value ({path}) is not a file of this user's (uid {info.st_uid}, "
                f"{stat.filemode(info.st_mode)}): someone else put it there. It was not read."
            )
        blob = f.read()
    mac, data = blob[len(MAGIC) : len(MAGIC) + _MAC], blob[len(MAGIC) + _MAC :]
    if not blob.startswith(MAGIC) or not hmac.compare_digest(mac, _mac(key, rank, data)):
        raise ClusterError(
            f"rank {rank}'s value ({path}) was not written by rank {rank} of this cell (it is "
            "not signed with the cell's key): someone else put it there. Nothing of it was read."
        )
    try:
        return load_data(data)
    except Exception as exc:
        raise ClusterError(
            f"rank {rank}'s value is not plain data ({exc}): loading it would run code in this "
            "kernel, which it does not take from the ranks. Pull numbers, strings, lists, "
            "dicts, tuples, sets or numpy arrays (convert other objects on the ranks, e.g. "
            "df.to_dict())."
        ) from None
