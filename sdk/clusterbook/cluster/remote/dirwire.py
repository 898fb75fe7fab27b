"""The messages between a handle attached over ssh (:mod:`clusterbook.cluster.remote.sshdir`) and
the program that answers it on the cluster's machine (:mod:`clusterbook.cluster.remote.dirservice`).

A message is a frame (:data:`~clusterbook.rendezvous.backends.wire.FRAME_HEADER` and a
payload) whose payload is a JSON object, a newline, and raw bytes (a file's, for a read)::

    -> {"op": "record"}                                  <- {"record": {...}, "stale": B}
    -> {"op": "read", "files": [[PATH, OFFSET], ...]}    <- {"sizes": [N|null, ...],
                                                             "complete": [B, ...]} + bytes
    -> {"op": "listdir", "path": P}                      <- {"entries": [[NAME, IS_DIR], ...]}
    -> {"op": "size", "path": P}                         <- {"size": N|null}
    -> {"op": "secret"}                                  <- {"secret": HEX}
    -> {"op": "stop_file"}                               <- {}
    -> {"op": "stop", "timeout": S, "reason": TEXT}      <- {}
    -> {"op": "call_new"}                                <- {"folder": P}
    -> {"op": "call_add", "folder": P, "name": N} + bytes <- {}
    -> {"op": "call_drop", "folder": P}                  <- {}
    -> {"op": "call_done", "folder": P, "job_dir": J}    <- {"values": P}

The program's first message, before any request, says what it found: ``{"version",
"directory", "host", "record", "stale"}`` (or, listing, ``{"version", "clusters": [...]}``),
or ``{"error": ...}`` as :func:`~clusterbook.head.control.error_reply` writes it, then it ends.
A read answers at most :data:`READ_LIMIT` bytes; ``complete`` says which files were read to
their end. Paths must be in the cluster's directory. The ``call_`` requests make a function
job's call folder under ``functions/`` (:mod:`clusterbook.functions.place`), append bytes to
one of its files, remove it, or move its values into the job's directory ``J``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from clusterbook.rendezvous.backends.wire import FRAME_HEADER, MAX_FRAME, ProtocolError

__all__ = ["READ_LIMIT", "VERSION", "pack", "unpack"]

VERSION = 1
READ_LIMIT = 8 << 20  # bytes of files in one answer (a frame holds at most MAX_FRAME)


def pack(message: Mapping[str, Any], data: bytes = b"") -> bytes:
    """The frame of ``message`` and ``data``, header included."""
    payload = json.dumps(message).encode() + b"\n" + data
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"a message of {len(payload)} bytes (limit {MAX_FRAME})")
    return FRAME_HEADER.pack(len(payload)) + payload


def unpack(payload: bytes) -> tuple[dict[str, Any], bytes]:
    """The JSON object and the bytes of a frame's payload; :class:`ProtocolError` if it
    holds no such object."""
    text, _, data = payload.partition(b"\n")
    try:
        message = json.loads(text)
    except ValueError as exc:
        raise ProtocolError(f"not a message: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("not a message: no JSON object")
    return message, data
