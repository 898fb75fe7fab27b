"""Turning the bytes launchers write into lines: pure, incremental parsers.

Open MPI (``--output tag``) writes ``[JOB,RANK]<stdout>: text`` per line on its stdout and
stderr; MPICH's Hydra writes each rank's streams to their own files (``-outfile-pattern``),
which are split by :class:`LineSplitter` alone. Both cope with partial lines (kept until the
newline arrives), bytes that are not UTF-8 (replaced, never raising) and very long lines (cut
into pieces of at most ``max_line`` bytes, so memory stays bounded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["MAX_LINE", "LineSplitter", "OmpiTagParser", "TaggedLine"]

MAX_LINE = 64 * 1024


def _decode(raw: bytes) -> str:
    # NULs come from C strings some launchers print whole; they mean nothing in a log.
    text = raw.decode("utf-8", errors="replace").replace("\x00", "")
    return text[:-1] if text.endswith("\r") else text


def _take_lines(buf: bytearray) -> list[bytes]:
    """Remove and return the complete lines at the start of ``buf`` (without newlines)."""
    *lines, rest = bytes(buf).split(b"\n")
    buf[:] = rest
    return lines


def _cut(raw: bytes, size: int) -> list[bytes]:
    return [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]


class LineSplitter:
    """Split a byte stream into decoded lines, keeping a partial last line for later."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> list[str]:
        """Add bytes; return the lines they complete."""
        self._buf += data
        lines = [_decode(c) for raw in _take_lines(self._buf) for c in _cut(raw, self._max)]
        while len(self._buf) > self._max:
            lines.append(_decode(bytes(self._buf[: self._max])))
            del self._buf[: self._max]
        return lines

    def flush(self) -> list[str]:
        """Return what is left (a last line without newline), if anything."""
        rest, self._buf = bytes(self._buf), bytearray()
        return [_decode(c) for c in _cut(rest, self._max)] if rest else []


@dataclass(frozen=True, slots=True)
class TaggedLine:
    """A line of a rank (``rank`` None for the launcher's own output) on a stream."""

    rank: int | None
    stream: str | None
    text: str


_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>: ?")


class OmpiTagParser:
    """Parse Open MPI's ``--output tag`` stream into per-rank lines.

    A rank's last line without newline is emitted by mpirun at exit with no newline, so the next
    tag follows on the same line; such a line is split at every tag.
    """

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line
        # Tag of an over-long line whose start was already emitted.
        self._carry: tuple[int | None, str | None] = (None, None)

    def feed(self, data: bytes) -> list[TaggedLine]:
        """Add bytes; return the tagged lines they complete."""
        self._buf += data
        out: list[TaggedLine] = []
        for raw in _take_lines(self._buf):
            out.extend(self._parse(raw))
        while len(self._buf) > self._max + 64:
            if m := _TAG.match(self._buf):
                self._carry = (int(m.group(2)), _stream(m.group(3)))
                del self._buf[: m.end()]
            nxt = _TAG.search(self._buf)
            rank, stream = self._carry
            if nxt is not None and nxt.start() == 0:  # a tag with nothing after it
                out.append(TaggedLine(rank, stream, ""))
                continue
            size = min(nxt.start(), self._max) if nxt else self._max
            out.append(TaggedLine(rank, stream, _decode(bytes(self._buf[:size]))))
            del self._buf[:size]
        return out

    def flush(self) -> list[TaggedLine]:
        """Return what is left at end of stream."""
        rest, self._buf = bytes(self._buf), bytearray()
        out = self._parse(rest) if rest else []
        self._carry = (None, None)
        return out

    def _parse(self, raw: bytes) -> list[TaggedLine]:
        tags = list(_TAG.finditer(raw))
        first = tags[0].start() if tags else len(raw)
        out: list[TaggedLine] = []
        if first > 0 or not tags:
            rank, stream = self._carry
            out.extend(_pieces(rank, stream, raw[:first], self._max))
        self._carry = (None, None)
        for i, m in enumerate(tags):
            end = tags[i + 1].start() if i + 1 < len(tags) else len(raw)
            out.extend(_pieces(int(m.group(2)), _stream(m.group(3)), raw[m.end() : end], self._max))
        return out


def _stream(name: bytes) -> str:
    return "stdout" if name == b"stdout" else "stderr"


def _pieces(rank: int | None, stream: str | None, raw: bytes, size: int) -> list[TaggedLine]:
    return [TaggedLine(rank, stream, _decode(c)) for c in _cut(raw, size)]
