"""Turning the bytes launchers write into lines: pure, incremental parsers.

Open MPI runs with ``--output tag:raw,merge-stderr-to-stdout``: mpirun writes every chunk a
rank's stdout or stderr yields, as it reads it, behind a ``[JOB,RANK]<stream>: `` tag, all on
its own stdout (its own messages go to its stderr). Raw chunks, not lines: with whole lines,
mpirun holds a line until its newline arrives and spends time quadratic in the line's length
on it (a 20 MB line without a newline kept it busy for minutes). :class:`OmpiChunkParser`
joins each rank's chunks into lines again. MPICH's Hydra writes each rank's streams to their
own files (``-outfile-pattern``), which :class:`LineSplitter` alone splits. ``srun --label``
(ranks started as a Slurm step) writes each line behind its task's number, on srun's stdout
or stderr: :class:`LabelParser`.

Open MPI also writes its own help messages (the ``MPI_ABORT was invoked`` banner) behind a
rank's tag, as one chunk between rules of dashes, and it may write one while that rank's pipe
still holds the rest of a line (Python writes ``ValueError``, ``: `` and the message with
three writes). Such a chunk comes out as lines of its own, the rank's line is not cut by it.

Both keep a partial line until its newline arrives, replace bytes that are not UTF-8 (never
raising), and cut a line longer than ``max_line`` bytes (:data:`MAX_LINE`, 1 MiB) into pieces
at character boundaries: every piece but the line's last is marked ``partial`` (the line goes
on in the next piece of the same rank and stream), so memory stays bounded and nothing is
dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "MAX_LINE",
    "Batch",
    "LabelParser",
    "LineSplitter",
    "Lines",
    "OmpiChunkParser",
    "Piece",
    "TaggedLine",
]

#: Longest piece of a line, in bytes; a longer line comes in several pieces.
MAX_LINE = 1 << 20


class Piece(NamedTuple):
    """A line, or a piece of an over-long one that goes on in the next piece (``partial``)."""

    text: str
    partial: bool = False


class Lines(NamedTuple):
    """Lines (and pieces of over-long ones) in order: ``partial`` holds the indexes of the
    pieces that go on in the next one. What the parsers hand over at a time: the lines a
    read completed, to be stored in one go."""

    texts: list[str]
    partial: frozenset[int] = frozenset()

    def pieces(self) -> list[Piece]:
        partial = self.partial
        return [Piece(t, i in partial) for i, t in enumerate(self.texts)]


def as_lines(pieces: list[Piece]) -> Lines:
    """``pieces`` as one :class:`Lines`."""
    partial = frozenset(i for i, p in enumerate(pieces) if p.partial)
    return Lines([p.text for p in pieces], partial)


def _decode(raw: bytes | bytearray | memoryview, *, complete: bool = True) -> str:
    text = bytes(raw).decode("utf-8", errors="replace")
    return text[:-1] if complete and text.endswith("\r") else text


def _cut_point(buf: bytes | bytearray | memoryview, size: int) -> int:
    """Where to end a piece of at most ``size`` bytes: not inside a UTF-8 character."""
    cut = size
    while cut > size - 3 and cut > 1 and (buf[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut if (buf[cut] & 0xC0) != 0x80 else size


class LineSplitter:
    """Split a byte stream into lines, keeping a partial last line for later."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._buf = bytearray()
        self._max = max_line

    def feed(self, data: bytes) -> list[Piece]:
        """Add bytes; return the lines (and pieces of over-long lines) they complete."""
        return self.feed_lines(data).pieces()

    def feed_lines(self, data: bytes) -> Lines:
        """Add bytes; return the lines (and pieces of over-long lines) they complete, in one
        :class:`Lines`. Lines of at most ``max_line`` bytes, the usual case, are decoded and
        split all at once."""
        # NULs come from C strings some launchers print whole; they mean nothing in a log,
        # and go before anything is measured (a line's length, whether it ends with CR).
        if b"\x00" in data:
            data = data.replace(b"\x00", b"")
        end = data.rfind(b"\n")
        texts: list[str] = []
        partial: set[int] = set()
        if end >= 0:
            complete = bytes(self._buf) + data[:end] if self._buf else data[:end]
            self._buf = bytearray(data[end + 1 :])
            # Split in bytes only to measure the lines when the whole may hold a long one.
            raws = complete.split(b"\n") if len(complete) > self._max else []
            if not raws or max(map(len, raws)) <= self._max:
                # A newline is never inside a UTF-8 character: decoding the whole and
                # splitting it gives what decoding each line would.
                text = complete.decode("utf-8", errors="replace")
                texts = text.split("\n")
                if "\r" in text:
                    texts = [t[:-1] if t.endswith("\r") else t for t in texts]
            else:
                out: list[Piece] = []
                for raw in raws:
                    self._finish(raw, out)
                lines = as_lines(out)
                texts, partial = lines.texts, set(lines.partial)
        else:
            self._buf += data
        buf = self._buf
        while len(buf) > self._max:
            cut = _cut_point(buf, self._max)
            partial.add(len(texts))
            texts.append(_decode(buf[:cut], complete=False))
            del buf[:cut]
        return Lines(texts, frozenset(partial)) if partial else Lines(texts)

    @property
    def holding(self) -> bool:
        """Whether part of a line is waiting for its newline."""
        return bool(self._buf)

    def flush(self) -> list[Piece]:
        """Return what is left (a last line without newline), if anything."""
        out: list[Piece] = []
        if self._buf:
            self._finish(self._buf, out)
            self._buf = bytearray()
        return out

    def _finish(self, raw: bytes | bytearray, out: list[Piece]) -> None:
        """A complete line: its pieces, all but the last partial."""
        start = 0
        while len(raw) - start > self._max:
            cut = start + _cut_point(memoryview(raw)[start:], self._max)
            out.append(Piece(_decode(raw[start:cut], complete=False), True))
            start = cut
        out.append(Piece(_decode(raw[start:] if start else raw), False))


class Batch(NamedTuple):
    """Lines of one rank (None: the launcher) on one stream, in order."""

    rank: int | None
    stream: str | None
    lines: Lines


@dataclass(frozen=True, slots=True)
class TaggedLine:
    """A line (or a ``partial`` piece) of a rank on a stream; ``rank`` None: the launcher."""

    rank: int | None
    stream: str | None
    text: str
    partial: bool = False


_TAG = re.compile(rb"\[(\d+),(\d+)\]<(stdout|stderr|stddiag)>: ")
# The start of a tag, cut off at the end of what has arrived so far.
_TAG_START = re.compile(rb"\[(?:\d+(?:,(?:\d+(?:\](?:<(?:[a-z]{1,7}(?:>:?)?)?)?)?)?)?)?")
_LONGEST_TAG = 40
# The rule of dashes above and below each of Open MPI's help messages.
_RULE = b"-" * 74 + b"\n"


#: The chunks of each rank (its stream, its bytes) a read gave, not yet split into lines.
_Held = dict[int | None, tuple[str | None, list[bytes]]]


class OmpiChunkParser:
    """Parse Open MPI's ``--output tag:raw`` stream: each chunk of a rank's output comes
    behind a tag, cut anywhere (mid-line, mid-character); chunks of different ranks
    interleave. Bytes before the first tag are the launcher's."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self._max = max_line
        self._pending = b""  # the start of a tag, or of a chunk, until more arrives
        self._target: tuple[int | None, str | None] = (None, None)
        self._lines: dict[tuple[int | None, str | None], LineSplitter] = {}
        self._chunk_start = False  # a tag came, none of its chunk yet
        self._aside: LineSplitter | None = None  # the lines of a help message in a line

    def feed(self, data: bytes) -> list[TaggedLine]:
        """Add bytes; return the tagged lines (and pieces) they complete."""
        return _tagged(self.feed_batches(data))

    def flush(self) -> list[TaggedLine]:
        """Return what is left at end of stream: every rank's last line without newline."""
        return _tagged(self.flush_batches())

    def feed_batches(self, data: bytes) -> list[Batch]:
        """Add bytes; return the lines they complete, a batch per rank's chunk."""
        buf = self._pending + data if self._pending else data
        self._pending = b""
        return self._parse(buf, final=False)

    def flush_batches(self) -> list[Batch]:
        """What is left at end of stream: every rank's last line without newline."""
        out = self._parse(self._pending, final=True)
        self._pending = b""
        self._end_aside(out)
        for (rank, stream), splitter in self._lines.items():
            out.append(Batch(rank, stream, as_lines(splitter.flush())))
        self._lines.clear()
        return [b for b in out if b.lines.texts]

    def _parse(self, buf: bytes, *, final: bool) -> list[Batch]:
        out: list[Batch] = []
        # Each rank's chunks in this read, joined before they are split: mpirun writes a
        # chunk per read of a rank's pipe (a few lines when ranks print line by line), and
        # a batch per chunk would cost the store a write and a wake-up per few lines.
        held: _Held = {}
        pos = 0
        last_tag = -1
        for m in _TAG.finditer(buf):
            if m.start() > pos:
                self._emit(buf[pos : m.start()], out, held)
            self._end_aside(out)
            self._target = (int(m.group(2)), _stream(m.group(3)))
            self._chunk_start = True
            pos, last_tag = m.end(), m.start()
        hold = 0 if final else _tag_start_at_end(buf, pos)
        rest = buf[pos : len(buf) - hold]
        if not final and last_tag >= 0 and self._undecided(rest, out, held):
            # Whether this chunk is a help message decides where it goes: wait for more.
            self._pending = buf[last_tag:]
            self._drain_all(out, held)
            return out
        if rest:
            self._emit(rest, out, held)
        if hold:
            self._pending = buf[len(buf) - hold :]
        self._drain_all(out, held)
        return out

    def _undecided(self, chunk: bytes, out: list[Batch], held: _Held) -> bool:
        """A chunk too short yet to tell whether it is a help message inside a line."""
        if not (self._chunk_start and len(chunk) < len(_RULE) and _RULE.startswith(chunk)):
            return False
        self._drain(self._target[0], out, held)
        splitter = self._lines.get(self._target)
        return splitter is not None and splitter.holding

    def _splitter(self, target: tuple[int | None, str | None]) -> LineSplitter:
        splitter = self._lines.get(target)
        if splitter is None:
            splitter = self._lines[target] = LineSplitter(self._max)
        return splitter

    def _emit(self, raw: bytes, out: list[Batch], held: _Held) -> None:
        target = self._target
        rank, stream = target
        if self._chunk_start:
            self._chunk_start = False
            if raw.startswith(_RULE):
                self._drain(rank, out, held)  # whether a line is open needs all its bytes
                if self._splitter(target).holding:
                    self._aside = LineSplitter(self._max)
        if self._aside is not None:
            lines = self._aside.feed_lines(raw)
            if lines.texts:
                out.append(Batch(*target, lines))
            return
        chunks = held.get(rank)
        if chunks is not None and chunks[0] == stream:
            chunks[1].append(raw)
            return
        if chunks is not None:  # the rank's other stream: its bytes first, in order
            self._drain(rank, out, held)
        held[rank] = (stream, [raw])

    def _drain(self, rank: int | None, out: list[Batch], held: _Held) -> None:
        """Split the bytes ``held`` for ``rank`` into lines, as one batch."""
        chunks = held.pop(rank, None)
        if chunks is None:
            return
        stream, raws = chunks
        data = raws[0] if len(raws) == 1 else b"".join(raws)
        lines = self._splitter((rank, stream)).feed_lines(data)
        if lines.texts:
            out.append(Batch(rank, stream, lines))

    def _drain_all(self, out: list[Batch], held: _Held) -> None:
        for rank in list(held):
            self._drain(rank, out, held)

    def _end_aside(self, out: list[Batch]) -> None:
        """The end of a help message's chunk: its lines are out (and a last one without
        newline, which a help message does not have)."""
        if self._aside is not None:
            left = as_lines(self._aside.flush())
            if left.texts:
                out.append(Batch(*self._target, left))
            self._aside = None


def _tagged(batches: list[Batch]) -> list[TaggedLine]:
    return [
        TaggedLine(b.rank, b.stream, text, partial)
        for b in batches
        for text, partial in b.lines.pieces()
    ]


def _tag_start_at_end(buf: bytes, pos: int) -> int:
    """How many bytes at the end of ``buf`` (from ``pos`` on) may be the start of a tag."""
    at = buf.rfind(b"[", max(pos, len(buf) - _LONGEST_TAG))
    if at < 0 or _TAG_START.fullmatch(buf, at) is None:
        return 0
    return len(buf) - at


def _stream(name: bytes) -> str:
    return "stdout" if name == b"stdout" else "stderr"


_LABEL = re.compile(r" *(\d+): ")


class LabelParser:
    """Parse one of ``srun --label``'s streams: Slurm writes each line of task N behind
    ``N: `` (padded with spaces to the width of the largest task number); its own lines
    (``srun: error: ...``) have no label and are the launcher's. A piece of an over-long line
    that goes on belongs to the rank of the piece before it."""

    def __init__(self, stream: str, max_line: int = MAX_LINE) -> None:
        self._stream = stream
        self._splitter = LineSplitter(max_line)
        self._going_on: int | None = None  # the rank of a piece that goes on, if one does

    def feed_batches(self, data: bytes) -> list[Batch]:
        """Add bytes; return the lines they complete, a batch per rank, each in order."""
        return self._batches(self._splitter.feed_lines(data).pieces())

    def flush_batches(self) -> list[Batch]:
        """What is left at the end of the stream (a last line without newline)."""
        return self._batches(self._splitter.flush())

    def _batches(self, pieces: list[Piece]) -> list[Batch]:
        # A batch per rank (in the order ranks first appear), not per run of its lines:
        # ranks printing line by line alternate, and each batch costs the store a write.
        runs: dict[int | None, list[Piece]] = {}
        for text, partial in pieces:
            if self._going_on is not None:
                owner: int | None = self._going_on
            elif (m := _LABEL.match(text)) is not None:
                owner, text = int(m.group(1)), text[m.end() :]
            else:
                owner = None
            self._going_on = owner if partial and owner is not None else None
            run = runs.get(owner)
            if run is None:
                run = runs[owner] = []
            run.append(Piece(text, partial))
        return [Batch(rank, self._stream, as_lines(run)) for rank, run in runs.items()]
