"""The program every rank of a function job runs: ``python rank.py CALL_DIR``, or as the head
starts it, from its bytecode (:data:`LOADER`).

It reads the call (``CALL_DIR/call.pkl``, :mod:`clusterbook.functions.payload`), runs it, and
leaves what it returned in ``CALL_DIR/values/rank-N.value`` (a pickle, signed with the call's
key: :func:`clusterbook.functions.payload.signed`), or why it did not in
``rank-N.error`` (JSON: the exception's type, message and traceback, the host): the head gathers
these files, never the logs. A rank that raises prints its traceback too and exits 1, which
fails the job. Plain standard library (and cloudpickle when the call needs it, which loading it
imports): it runs in the cluster's Python, which need not have clusterbook; the head copies
this file next to the call (``python -m clusterbook.functions.rank`` runs it as well).
"""

import marshal
import os
import sys

TYPE_CHECKING = False  # not typing's: importing typing costs a rank more than the rest
if TYPE_CHECKING:
    from typing import Any

MAGIC = b"CBVALUE2\n"  # payload.MAGIC
CODE = b"CBCODE1\n"  # payload.CODE: a call of plain code, in marshal's format
# How a rank starts this program (``python -c LOADER PATH_OF_THIS_FILE CALL_DIR``): from the
# bytecode the head compiled beside it (``rank.pyc``, a .pyc file's layout) when it is this
# Python's (its magic number), else from the source. Compiling this file took a rank ~2-4 ms.
LOADER = (
    "import sys,marshal,_frozen_importlib_external as e;p=sys.argv[1];del sys.argv[0];"
    "q=p+'c';d=open(q,'rb').read() if __import__('os').path.exists(q) else b'';"
    "exec(marshal.loads(d[16:]) if d[:4]==e.MAGIC_NUMBER "
    "else compile(open(p,'rb').read(),p,'exec'))"
)
_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", "RANK")


def rank_number() -> int:
    """This rank's number, as the launcher says it."""
    for name in _RANK_VARIABLES:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    from mpi4py import MPI  # no launcher said it: ask MPI itself

    return int(MPI.COMM_WORLD.Get_rank())


def _make_function(
    code: "Any", globals: "Any", name: "Any", argdefs: "Any", closure: "Any"
) -> "Any":
    globals["__builtins__"] = __builtins__
    function: Any = type(rank_number)  # types.FunctionType, without importing types
    return function(code, globals, name, argdefs, closure)


def _function_setstate(obj: "Any", state: "Any") -> None:
    state, slotstate = state
    obj.__dict__.update(state)
    obj_globals = slotstate.pop("__globals__")
    obj_closure = slotstate.pop("__closure__")
    slotstate.pop("_cloudpickle_submodules")
    obj.__globals__.update(obj_globals)
    obj.__globals__["__builtins__"] = __builtins__
    if obj_closure is not None:
        for i, cell in enumerate(obj_closure):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            obj.__closure__[i].cell_contents = value
    for k, v in slotstate.items():
        setattr(obj, k, v)


def _make_empty_cell() -> "Any":
    if False:
        cell: Any = None  # makes the lambda's closure hold an empty cell
    closure: Any = (lambda: cell).__closure__
    return closure[0]


def _make_cell(*value: "Any") -> "Any":
    cell = _make_empty_cell()
    if value:
        cell.cell_contents = value[0]
    return cell


def _subimport(name: str) -> "Any":
    __import__(name)
    return sys.modules[name]


# cloudpickle 3's reconstructors of plain functions and closures, copied: importing cloudpickle
# (inspect, typing, dataclasses, logging, ...) costs a rank more than Python's own start. A
# call that names anything else of cloudpickle (a class made in a notebook, say) imports it.
_LIGHT = {
    "_make_function": _make_function,
    "_function_setstate": _function_setstate,
    "_builtin_type": lambda name: getattr(__import__("types"), name),
    "_make_empty_cell": _make_empty_cell,
    "_make_cell": _make_cell,
    "subimport": _subimport,
}


def _pickle() -> "Any":
    """The C pickler alone (the pickle module's own imports, re, struct, ..., cost a rank more),
    imported only for a call or a value that needs it: with functools, ~3 ms of a rank."""
    try:
        import _pickle as pickle
    except ImportError:  # another Python than CPython
        import pickle  # type: ignore[no-redef]
    return pickle


def _load_call(data: bytes, light: bool) -> "Any":
    if data.startswith(CODE):  # a function of plain code: no pickle at all (payload.as_code)
        parts = marshal.loads(data[len(CODE) :])  # noqa: S302 - the head's, in a private folder
        code, name, qualname, module, defaults, kwdefaults, args, kwargs = parts
        function: Any = type(rank_number)  # types.FunctionType, without importing types
        fn = function(code, {"__builtins__": __builtins__, "__name__": module}, name, defaults)
        fn.__qualname__, fn.__kwdefaults__, fn.__module__ = qualname, kwdefaults, module
        return fn, args, kwargs
    import io

    pickle = _pickle()
    if light:

        class Unpickler(pickle.Unpickler):  # type: ignore[misc,name-defined]
            def find_class(self, module: str, name: str) -> object:
                if module == "cloudpickle.cloudpickle" and name in _LIGHT:
                    return _LIGHT[name]
                return super().find_class(module, name)

        return Unpickler(io.BytesIO(data)).load()
    return pickle.loads(data)  # the head's, in a private folder


def _hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 (RFC 2104) with the interpreter's own SHA-256: hashlib and hmac would load
    OpenSSL, ~2 ms of every rank's start; the head checks it with hmac."""
    try:
        from _sha2 import sha256  # type: ignore[import-not-found]  # (no stub) Python >= 3.12
    except ImportError:
        try:
            from _sha256 import sha256  # type: ignore[import-not-found]  # < 3.12
        except ImportError:  # a Python built without them
            import hashlib
            import hmac

            return hmac.new(key, message, hashlib.sha256).digest()
    if len(key) > 64:
        key = sha256(key).digest()
    key = key.ljust(64, b"\0")
    inner = sha256(bytes(k ^ 0x36 for k in key) + message).digest()
    return bytes(sha256(bytes(k ^ 0x5C for k in key) + inner).digest())


def _write(folder: str, name: str, data: bytes) -> None:
    """``data`` in ``folder/name``, whole or not at all (a hidden file, renamed)."""
    part = os.path.join(folder, f".{name}.{os.getpid()}")
    with open(part, "wb") as f:
        f.write(data)
    os.replace(part, os.path.join(folder, name))


def _fail(
    folder: str, rank: int, kind: str, exc: BaseException, text: str, value_type: str = ""
) -> int:
    import json
    import socket

    record = {
        "rank": rank,
        "host": socket.gethostname(),
        "kind": kind,
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": text,
        "value_type": value_type,
    }
    _write(folder, f"rank-{rank}.error", json.dumps(record).encode("utf-8"))
    sys.stdout.flush()
    os.write(2, text.encode("utf-8", "backslashreplace"))  # one write: the logs show it whole
    return 1


def _dumps(value: "Any") -> bytes:
    """``value`` as its file holds it: ``M`` and marshal's bytes when marshal takes it (plain
    data of builtin types: no pickle to import), else ``P`` and a pickle."""
    try:
        return b"M" + marshal.dumps(value)
    except ValueError:  # a type marshal does not know, or too deep
        pass
    try:
        return b"P" + bytes(_pickle().dumps(value, protocol=5))
    except Exception:
        import cloudpickle  # type: ignore[import-untyped]  # by value: a lambda, or a class of the function's own

        return b"P" + bytes(cloudpickle.dumps(value, protocol=5))


def main(argv: list[str]) -> int:
    call_dir = argv[1]
    folder = os.path.join(call_dir, "values")
    os.makedirs(folder, exist_ok=True)
    rank = rank_number()
    # An earlier attempt's error (a retry running here now) is not this one's.
    try:  # noqa: SIM105 - contextlib would cost every rank an import
        os.unlink(os.path.join(folder, f"rank-{rank}.error"))
    except FileNotFoundError:
        pass
    sys.argv = argv[1:]
    sys.path[0] = ""  # import from the working directory, as the notebook does
    try:
        with open(os.path.join(call_dir, "call.pkl"), "rb") as f:
            python, key, light, blob = marshal.loads(f.read())  # noqa: S302 - payload.envelope
        if tuple(python) != tuple(sys.version_info[:2]):
            raise RuntimeError(
                f"the call was pickled by Python {python[0]}.{python[1]}, and this rank runs "
                f"Python {sys.version_info[0]}.{sys.version_info[1]} ({sys.executable}): run "
                "the same Python version on the head and the nodes (the cluster's python)"
            )
        fn, args, kwargs = _load_call(blob, light)
    except Exception as exc:
        import traceback

        text = traceback.format_exc()
        return _fail(folder, rank, "load", exc, f"Rank {rank} could not load the call:\n{text}")
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # SystemExit and KeyboardInterrupt end the rank as errors too
        import traceback

        frames = exc.__traceback__
        tb = traceback.format_exception(type(exc), exc, frames and frames.tb_next)  # not main's
        return _fail(folder, rank, "raised", exc, "".join(tb))
    try:
        data = _dumps(value)
    except Exception as exc:
        kind = f"{type(value).__module__}.{type(value).__qualname__}".removeprefix("builtins.")
        text = (
            f"Rank {rank} returned a {kind}, which cannot be pickled to send it back "
            f"({type(exc).__name__}: {exc}); return what it holds instead (numbers, arrays, "
            "a path).\n"
        )
        return _fail(folder, rank, "value", exc, text, kind)
    mac = _hmac_sha256(key, b"rank %d\n" % rank + data)
    _write(folder, f"rank-{rank}.value", MAGIC + mac + data)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
