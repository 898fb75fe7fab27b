"""A call as bytes: a function and its arguments, pickled for ranks to run, and back.

:func:`dumps` pickles ``fn(*args, **kwargs)`` with cloudpickle, so lambdas, closures and the
functions and classes a notebook (``__main__``) defines travel by value; what cannot be pickled
is a :class:`~clusterbook.errors.SerializationError` naming it (the function, or which
argument), raised here, before any rank starts. A function of plain code (no closure, no
global but builtins) called with plain data goes in marshal's format instead
(:func:`as_code`), which a rank reads without importing pickle. :func:`loads` is the inverse.
The bytes are what :mod:`clusterbook.functions.rank` reads (:func:`envelope`): marshal's bytes
of ``(python, key, light, call)``, where ``python`` is this interpreter's ``(major, minor)``
(code objects load only in the same Python), ``key`` the random key each rank signs its value
with (:func:`signed`, :func:`verified`) and ``call`` the bytes of ``(fn, args, kwargs)``. A
value comes back as ``M`` and marshal's bytes, or ``P`` and a pickle (:func:`load_value`).
"""

from __future__ import annotations

import builtins
import dis
import hashlib
import hmac
import marshal
import pickle
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterbook.errors import SerializationError

__all__ = [
    "CODE",
    "MAGIC",
    "Call",
    "as_code",
    "dumps",
    "dumps_value",
    "envelope",
    "load_value",
    "loads",
    "signed",
    "verified",
]

#: What a rank's value file starts with; the HMAC-SHA256 of ``b"rank N\n" + value`` follows.
MAGIC = b"CBVALUE2\n"
#: What a call of plain code starts with (:func:`as_code`); marshal's bytes follow.
CODE = b"CBCODE1\n"
_GLOBAL_OPS = frozenset({"LOAD_GLOBAL", "STORE_GLOBAL", "DELETE_GLOBAL", "LOAD_NAME"})
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
    code = as_code(fn, tuple(args), kwargs)
    if code is not None:
        return code
    call = (fn, tuple(args), kwargs)
    try:
        return dumps_value(call)
    except SerializationError:
        _name_the_culprit(fn, args, kwargs)
        raise


def as_code(fn: object, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes | None:
    """The call in marshal's format, when ``fn`` is a function of plain code (no closure, no
    attributes, no global name but a builtin it does not shadow) and its defaults and arguments
    are plain data of builtin types; else None (cloudpickle then carries it). The rank makes
    the function again from its code, in a namespace of its own, as cloudpickle would."""
    if type(fn) is not types.FunctionType or fn.__closure__ or fn.__dict__:
        return None
    shadowed = fn.__globals__.keys()
    if any(n in shadowed or not hasattr(builtins, n) for n in _global_names(fn.__code__)):
        return None
    what = (_dynamic(fn.__code__), fn.__name__, fn.__qualname__, fn.__module__,
            fn.__defaults__, fn.__kwdefaults__, args, kwargs)  # fmt: skip
    try:
        return CODE + marshal.dumps(what)
    except ValueError:  # an argument marshal does not know (exact builtin types only)
        return None


def _dynamic(code: types.CodeType) -> types.CodeType:
    """``code`` (and the code nested in it) named as cloudpickle names code it sends by value,
    ``<dynamic-code>``: the head places a rank's traceback by that name
    (:func:`~clusterbook.functions.values.placed`), and the bytes do not say where it was."""
    consts = tuple(_dynamic(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="<dynamic-code>", co_consts=consts)


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` and the code nested in it read or write."""
    names = set()
    todo = [code]
    while todo:
        each = todo.pop()
        names |= {i.argval for i in dis.get_instructions(each) if i.opname in _GLOBAL_OPS}
        todo += [c for c in each.co_consts if isinstance(c, types.CodeType)]
    return names


def envelope(call: bytes, key: bytes) -> bytes:
    """The call file's bytes: ``call`` (from :func:`dumps`), this Python's version, ``key``,
    and whether the rank may rebuild plain functions without importing cloudpickle (it has
    copies of cloudpickle 3's reconstructors)."""
    import cloudpickle  # type: ignore[import-untyped]  # (no type information)

    version = tuple(sys.version_info[:2])
    light = str(cloudpickle.__version__).startswith("3.")
    return marshal.dumps((version, key, light, call), 4)  # a format every Python 3 reads


def signed(key: bytes, rank: int, data: bytes) -> bytes:
    """Rank ``rank``'s value file for the value ``data`` (what the rank program writes; it has
    its own copy of these lines)."""
    return MAGIC + _mac(key, rank, data) + data


def verified(key: bytes, rank: int, content: bytes) -> bytes | None:
    """The value in a value file (:func:`load_value` reads it), if rank ``rank`` of the call
    signed it with ``key``."""
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


def load_value(data: bytes) -> Any:
    """A rank's value from the bytes it signed: ``M`` and marshal's, or ``P`` and a pickle's."""
    kind, body = data[:1], data[1:]
    if kind == b"M":
        return marshal.loads(body)  # noqa: S302 - signed by the job's own ranks
    if kind == b"P":
        return pickle.loads(body)  # noqa: S301 - signed by the job's own ranks
    raise ValueError(f"not a value of this clusterbook (it begins {data[:1]!r})")


def loads(data: bytes) -> Call:
    """The call in a call file (:func:`envelope`), in the same Python version."""
    python, _, _, blob = marshal.loads(data)  # noqa: S302 - our own bytes, a private folder
    if tuple(python) != tuple(sys.version_info[:2]):
        raise SerializationError(
            f"The call was pickled by Python {python[0]}.{python[1]} and cannot be read by "
            f"Python {sys.version_info[0]}.{sys.version_info[1]}: run the same Python version "
            "on the head and the nodes (the cluster's python)."
        )
    if blob.startswith(CODE):
        made = marshal.loads(blob[len(CODE) :])  # noqa: S302 - the head's, in a private folder
        code, name, qualname, module, defaults, kwdefaults, args, kwargs = made
        fn = types.FunctionType(
            code, {"__builtins__": builtins, "__name__": module}, name, defaults
        )
        fn.__qualname__, fn.__kwdefaults__, fn.__module__ = qualname, kwdefaults, module
    else:
        fn, args, kwargs = pickle.loads(blob)  # noqa: S301 - our own bytes, a private folder
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
