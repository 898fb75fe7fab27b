"""A call as bytes: a function and its arguments, pickled for ranks to run, and back.

:func:`dumps` pickles ``fn(*args, **kwargs)`` with cloudpickle, so lambdas, closures and the
functions and classes a notebook (``__main__``) defines travel by value; what cannot be pickled
is a :class:`~clusterbook.errors.SerializationError` naming it (the function, or which
argument), raised here, before any rank starts. :func:`loads` is its inverse. The bytes are
what :mod:`clusterbook.functions.rank` reads (:func:`envelope`): a plain pickle of ``(python,
key, call)``, where ``python`` is this interpreter's ``(major, minor)`` (cloudpickle's code
objects load only in the same Python), ``key`` the random key each rank signs its value with
(:func:`signed`, :func:`verified`) and ``call`` cloudpickle's bytes of ``(fn, args, kwargs)``.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterbook.errors import SerializationError

__all__ = ["MAGIC", "Call", "dumps", "dumps_value", "envelope", "loads", "signed", "verified"]

#: What a rank's value file starts with; the HMAC-SHA256 of ``b"rank N\n" + pickle`` follows.
MAGIC = b"CBVALUE1\n"
_MAC = hashlib.sha256().digest_size

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def dumps(
    fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None
) -> bytes:
    """cloudpickle's bytes of the call ``fn(*args, **kwargs)``; a part that cannot be pickled
    is a :class:`SerializationError` naming it and why."""
    if not callable(fn):
        raise SerializationError(
            f"submit({fn!r}, ...): the first argument must be a function (or any callable) to "
            f"run on every rank, not a {type(fn).__name__}; for a program, use "
            "cluster.mpirun([...])."
        )
    kwargs = dict(kwargs or {})
    call = (fn, tuple(args), kwargs)
    try:
        return dumps_value(call)
    except SerializationError:
        _name_the_culprit(fn, args, kwargs)
        raise


def envelope(call: bytes, key: bytes) -> bytes:
    """The call file's bytes: ``call`` (from :func:`dumps`), this Python's version, ``key``,
    and whether the rank may rebuild plain functions without importing cloudpickle (it has
    copies of cloudpickle 3's reconstructors)."""
    import cloudpickle  # type: ignore[import-untyped]  # (no type information)

    version = tuple(sys.version_info[:2])
    light = str(cloudpickle.__version__).startswith("3.")
    return pickle.dumps((version, key, light, call), protocol=pickle.HIGHEST_PROTOCOL)


def signed(key: bytes, rank: int, data: bytes) -> bytes:
    """Rank ``rank``'s value file for the pickle ``data`` (what the rank program writes; it has
    its own copy of these lines)."""
    return MAGIC + _mac(key, rank, data) + data


def verified(key: bytes, rank: int, content: bytes) -> bytes | None:
    """The pickle in a value file, if rank ``rank`` of the call signed it with ``key``."""
    head, mac, data = content[: len(MAGIC)], content[len(MAGIC) : len(MAGIC) + _MAC], content
    if head != MAGIC or not hmac.compare_digest(mac, _mac(key, rank, data[len(MAGIC) + _MAC :])):
        return None
    return data[len(MAGIC) + _MAC :]


def _mac(key: bytes, rank: int, data: bytes) -> bytes:
    return hmac.new(key, b"rank %d\n" % rank + data, hashlib.sha256).digest()


def dumps_value(value: Any) -> bytes:
    """``value`` pickled with cloudpickle (by value where pickle would name a module);
    :class:`SerializationError` when it cannot be."""
    import cloudpickle

    try:
        return bytes(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as exc:  # pickle raises TypeError, PicklingError, AttributeError, ...
        raise SerializationError(
            f"{type(value).__name__} value cannot be pickled ({type(exc).__name__}: {exc})."
        ) from exc


def loads(data: bytes) -> Call:
    """The call in a call file (:func:`envelope`), in the same Python version."""
    python, _, _, blob = pickle.loads(data)  # noqa: S301 - our own bytes, from a private folder
    if tuple(python) != tuple(sys.version_info[:2]):
        raise SerializationError(
            f"The call was pickled by Python {python[0]}.{python[1]} and cannot be read by "
            f"Python {sys.version_info[0]}.{sys.version_info[1]}: run the same Python version "
            "on the head and the nodes (the cluster's python)."
        )
    fn, args, kwargs = pickle.loads(blob)  # noqa: S301 - as above
    return fn, tuple(args), dict(kwargs)


def _name_the_culprit(
    fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> None:
    """Raise a :class:`SerializationError` naming the first part of the call that cannot be
    pickled on its own (returns when each can, alone)."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    parts: list[tuple[str, Any]] = [(f"the function {name}", fn)]
    parts += [(f"argument {i} ({type(a).__name__})", a) for i, a in enumerate(args)]
    parts += [(f"keyword argument {k}= ({type(v).__name__})", v) for k, v in kwargs.items()]
    for what, part in parts:
        try:
            dumps_value(part)
        except SerializationError as exc:
            cause = exc.__cause__
            raise SerializationError(
                f"submit({name}, ...): {what} cannot be pickled to send it to the ranks "
                f"({type(cause).__name__}: {cause}). Pass what it holds instead (a path, "
                "numbers, arrays), or make it inside the function, on each rank."
            ) from cause
