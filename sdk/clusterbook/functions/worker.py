"""A pool rank: connect back to the head, prove it belongs to the pool, then run items until told
to stop (or until the head goes).

This module runs on every rank of a sweep's pool, in the ranks' interpreter, which may hold no
clusterbook (only cloudpickle, to send back what a function returns): it imports the standard
library only, and the head sends its source (:data:`BOOT`). The wire format lives here so
that both ends share it: frames of a 4-byte big-endian length and that many bytes, over TLS.

The handshake: the rank dials one of the addresses it was given, completes TLS and compares the
certificate the head showed with the pinned SHA-256 fingerprint (TLS proves the head, as for the
rendezvous store); the head sends a fresh nonce; the rank answers with
``HMAC-SHA256(secret, MAGIC + nonce + hello) + hello``, where ``hello`` is its rank, host and
pid as JSON (the rank proves the pool's secret, which never crosses the wire). Then the head
sends pickled requests (``("fn", key, bytes)``, ``("task", id, key, bytes)``, ``("stop",)``) and
the rank answers each task with ``("ok", id, bytes)`` or ``("error", id, type, message,
traceback, bytes-or-None)``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import pickle
import socket
import ssl
import struct
import sys
import time
import traceback
import zlib
from typing import Any

#: The variable that carries the pool's addresses, port, fingerprint and secret to the ranks.
POOL_ENV = "CLUSTERBOOK_POOL"
#: Says "a clusterbook pool rank of this version" in the handshake's proof.
MAGIC = b"clusterbook-pool-1"
NONCE = 32
#: The largest frame either end accepts: a task's argument or a value, pickled.
MAX_FRAME = 1 << 30
_LENGTH = struct.Struct("!I")


def proof(secret: bytes, nonce: bytes, hello: bytes) -> bytes:
    """What a rank shows for ``nonce``: the HMAC of the nonce and its hello under ``secret``."""
    return hmac.new(secret, MAGIC + nonce + hello, hashlib.sha256).digest()


def loads(data: bytes) -> Any:
    """Unpickle a frame's bytes: they come only from the peer this end has proven (the head by
    its certificate, a rank by its HMAC) over TLS, never from whoever connects."""
    return pickle.loads(data)  # noqa: S301


def send_frame(sock: socket.socket, data: bytes) -> None:
    """Send ``data`` as one frame."""
    if len(data) > MAX_FRAME:
        raise ValueError(f"a frame of {len(data)} bytes is over the {MAX_FRAME}-byte limit")
    sock.sendall(_LENGTH.pack(len(data)) + data)


def recv_frame(sock: socket.socket) -> bytes:
    """The next frame; ``ConnectionError`` when the peer has gone."""
    (size,) = _LENGTH.unpack(_recv_exact(sock, _LENGTH.size))
    if size > MAX_FRAME:
        raise ConnectionError(f"the peer sent a frame of {size} bytes, over the limit")
    return _recv_exact(sock, size)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the peer closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _rank() -> int:
    for name in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def _dial(info: dict[str, Any], deadline: float) -> ssl.SSLSocket:
    """A TLS connection to the head, whose certificate has the pinned fingerprint."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # pinned below: no authority signs the head's key
    problems = []
    while time.monotonic() < deadline:
        for addr in info["addresses"]:
            try:
                raw = socket.create_connection((addr, info["port"]), timeout=5)
            except OSError as exc:
                problems.append(f"{addr}: {exc}")
                continue
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            sock = context.wrap_socket(raw)
            shown = (
                "sha256:" + hashlib.sha256(sock.getpeercert(binary_form=True) or b"").hexdigest()
            )
            if not hmac.compare_digest(shown, info["fingerprint"]):
                sock.close()
                raise ConnectionError(f"{addr} showed a certificate that is not the head's")
            sock.settimeout(None)
            return sock
        time.sleep(0.2)
    raise ConnectionError("cannot reach the head: " + "; ".join(problems[-3:]))


def _answer(functions: dict[str, Any], request: tuple[Any, ...]) -> tuple[Any, ...]:
    """Run one task; what goes back (its value pickled, or what it raised)."""
    _, task, key, argument = request
    try:
        value = functions[key](loads(argument))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # the item failed, not the rank (sys.exit too): go on
        return _error(task, exc)
    try:
        return ("ok", task, _dumps(value))
    except Exception as exc:
        return (
            "error",
            task,
            "PicklingError",
            f"its return value, of type {type(value).__qualname__}, cannot be pickled: {exc}",
            "",
            None,
        )


def _unloadable(exc: Exception) -> Any:
    """What runs in place of a function this rank cannot load: it fails each item, saying why
    (the rank stays, for the next sweep's function)."""
    said = f"{type(exc).__name__}: {exc}"

    def unloadable(item: object) -> None:
        raise RuntimeError(
            f"the function cannot be loaded on this rank ({said}): it refers to a module the "
            "rank's Python cannot import; define it where map is called (a notebook, the "
            "script run as __main__), or install its module on the nodes"
        )

    return unloadable


def _error(task: int, exc: BaseException) -> tuple[Any, ...]:
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None else None  # from the function down: not this loop's frame
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        carried: bytes | None = _dumps(exc)
    except Exception:
        carried = None
    return ("error", task, type(exc).__qualname__, str(exc), text, carried)


def _dumps(value: object) -> bytes:
    try:
        import cloudpickle  # type: ignore[import-untyped]  # (no type information)
    except ImportError:  # plain pickle still carries data and importable objects
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return bytes(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))


def serve(sock: socket.socket, secret: bytes) -> None:
    """The handshake, then tasks until the head says stop or goes."""
    nonce = recv_frame(sock)
    hello = json.dumps({"rank": _rank(), "host": socket.gethostname(), "pid": os.getpid()})
    send_frame(sock, proof(secret, nonce, hello.encode()) + hello.encode())
    functions: dict[str, Any] = {}
    while True:
        try:
            request = loads(recv_frame(sock))
        except ConnectionError:
            return  # the head has gone: so does the pool
        if request[0] == "fn":
            try:
                functions[request[1]] = loads(request[2])
            except Exception as exc:  # a module only the caller has: each item says so
                functions[request[1]] = _unloadable(exc)
        elif request[0] == "task":
            send_frame(sock, pickle.dumps(_answer(functions, request)))
            sys.stdout.flush()
            sys.stderr.flush()
        else:
            return


def main() -> None:
    """A pool rank's life: the connection information out of the environment (no child of a
    task sees it), the head dialled, tasks served."""
    info = json.loads(os.environ.pop(POOL_ENV))
    secret = bytes.fromhex(info.pop("secret"))
    sock = _dial(info, time.monotonic() + float(info["timeout"]))
    try:
        serve(sock, secret)
    finally:
        sock.close()


#: The variable that carries this module's source, packed, to the ranks.
PROGRAM_ENV = "CLUSTERBOOK_POOL_PROGRAM"
#: What a pool rank runs (``python -c BOOT``): the program in :data:`PROGRAM_ENV`, which no
#: rank needs installed; the command line stays short, so a job listing stays readable.
BOOT = (
    "import os,base64,zlib;_g={'__name__':'clusterbook_pool_worker'};"
    f"exec(compile(zlib.decompress(base64.b64decode(os.environ.pop({PROGRAM_ENV!r}))),"
    "'clusterbook-pool-worker','exec'),_g);_g['main']()"
)


def packed_source() -> str:
    """This module's source, compressed and in base64: the value of :data:`PROGRAM_ENV`."""
    with open(__file__, "rb") as f:
        return base64.b64encode(zlib.compress(f.read(), 9)).decode("ascii")


if __name__ == "__main__":
    main()
