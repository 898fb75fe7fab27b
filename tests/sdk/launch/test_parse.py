"""Unit tests of the incremental line parsers (LineSplitter, OmpiChunkParser)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from clusterbook.launch.parse import MAX_LINE, LineSplitter, OmpiChunkParser, Piece, TaggedLine

T = TaggedLine


def run(parser: LineSplitter | OmpiChunkParser, chunks: Iterable[bytes]) -> list:
    """Feed every chunk, then flush; return everything the parser produced, in order."""
    out: list = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    out.extend(parser.flush())
    return out


def per_rank(out: list[TaggedLine]) -> dict[int | None, list[TaggedLine]]:
    """Each rank's lines (both streams), in order: what the parser keeps in order. Lines of
    different ranks that one read completes come a rank at a time."""
    ranks: dict[int | None, list[TaggedLine]] = {}
    for line in out:
        ranks.setdefault(line.rank, []).append(line)
    return ranks


def texts(pieces: list[Piece]) -> list[str]:
    return [p.text for p in pieces]


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def glued(out: list[TaggedLine], target: tuple[int, str]) -> list[str]:
    """The lines of one rank and stream, each a line's pieces glued together."""
    lines: list[str] = []
    open_line = False
    for line in out:
        if (line.rank, line.stream) != target:
            continue
        if open_line:
            lines[-1] += line.text
        else:
            lines.append(line.text)
        open_line = line.partial
    return lines


# A realistic Open MPI --output tag:raw stream: chunks of ranks cut anywhere (mid-line,
# mid-character), stdout and stderr of a rank merged, invalid UTF-8, a NUL, CRLF, a rank's last
# line without newline followed by another rank's chunk, and a final partial line.
OMPI_SAMPLE = (
    b"[1,0]<stdout>: hello from 0\nsecond line of 0\n"
    b"[1,1]<stdout>: hello from "
    b"[1,1]<stderr>: warn \xff\xfe bad bytes\n"
    b"[1,1]<stdout>: 1\n"
    b"[1,0]<stdout>: caf\xc3"
    b"[1,2]<stdout>: two\n"
    b"[1,0]<stdout>: \xa9 \x00nul\r\n"
    b"[1,0]<stddiag>: diag\n"
    b"[1,1]<stdout>: tail"
    b"[1,0]<stderr>: tail2\n"
    b"[1,2]<stdout>: last words"
)
OMPI_EXPECTED = [
    T(0, "stdout", "hello from 0"),
    T(0, "stdout", "second line of 0"),
    T(1, "stderr", "warn \ufffd\ufffd bad bytes"),
    T(1, "stdout", "hello from 1"),
    T(2, "stdout", "two"),
    T(0, "stdout", "caf\u00e9 nul"),
    T(0, "stderr", "diag"),
    T(0, "stderr", "tail2"),
    T(1, "stdout", "tail"),
    T(2, "stdout", "last words"),
]

SPLIT_SAMPLE = b"first\nsecond \xc3\xa9\r\n\n\xff\x00x\nlast no newline"
SPLIT_EXPECTED = ["first", "second \u00e9", "", "\ufffdx", "last no newline"]


# -- OmpiChunkParser -----------------------------------------------------------------------


def test_ompi_sample_fed_at_once() -> None:
    out = run(OmpiChunkParser(), [OMPI_SAMPLE])
    assert per_rank(out) == per_rank(OMPI_EXPECTED)
    assert sorted(out, key=str) == sorted(OMPI_EXPECTED, key=str)


def test_ompi_split_at_every_position_matches_whole() -> None:
    for cut in range(len(OMPI_SAMPLE) + 1):
        chunks = [OMPI_SAMPLE[:cut], OMPI_SAMPLE[cut:]]
        out = run(OmpiChunkParser(), chunks)
        assert per_rank(out) == per_rank(OMPI_EXPECTED), f"split at {cut}"


def test_ompi_byte_by_byte_matches_whole() -> None:
    assert run(OmpiChunkParser(), bytewise(OMPI_SAMPLE)) == OMPI_EXPECTED


def test_ompi_a_read_of_interleaved_chunks_is_one_batch_a_rank() -> None:
    # Ranks that print line by line: mpirun writes a chunk of a line or two per read of a
    # rank's pipe, the ranks' chunks alternating. What one read gives is a batch per rank
    # (one write to its file, one wake-up of the readers), its lines in order.
    data = b"".join(
        b"[1,%d]<stdout>: line %d of %d\n" % (rank, i, rank) for i in range(100) for rank in (0, 1)
    )
    batches = OmpiChunkParser().feed_batches(data)
    assert [(b.rank, b.stream) for b in batches] == [(0, "stdout"), (1, "stdout")]
    for rank, batch in enumerate(batches):
        assert batch.lines.texts == [f"line {i} of {rank}" for i in range(100)]


def test_ompi_batch_boundaries_keep_lines_whole_and_in_order() -> None:
    # Lines cut across reads anywhere, a rank's streams interleaved, a line longer than a
    # read, a rank ending mid-line: each rank's lines come whole and in order.
    long = b"x" * 5000
    data = (
        b"".join(
            b"[1,%d]<%s>: %s %d\n" % (rank, stream, long if i == 7 else b"line", i)
            for i in range(40)
            for rank, stream in ((0, b"stdout"), (1, b"stdout"), (1, b"stderr"), (2, b"stdout"))
        )
        + b"[1,2]<stdout>: cut off"
    )
    expected = run(OmpiChunkParser(), bytewise(data))
    for size in (1, 7, 64, 1000, 4096, 65536):
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        out = run(OmpiChunkParser(), chunks)
        assert per_rank(out) == per_rank(expected), size
    assert per_rank(expected)[2][-1] == T(2, "stdout", "cut off")
    assert per_rank(expected)[1][14:16] == [
        T(1, "stdout", "x" * 5000 + " 7"),
        T(1, "stderr", "x" * 5000 + " 7"),
    ]


def test_ompi_chunks_of_one_line_from_two_ranks_are_joined_per_rank() -> None:
    parser = OmpiChunkParser()
    assert parser.feed(b"[1,0]<stdout>: a-beg [1,1]<stdout>: b-beg ") == []
    assert parser.feed(b"[1,1]<stdout>: b-end\n[1,0]<stdout>: a-end\n") == [
        T(1, "stdout", "b-beg b-end"),
        T(0, "stdout", "a-beg a-end"),
    ]
    assert parser.flush() == []


def test_ompi_stdout_and_stderr_of_a_rank_are_separate_lines() -> None:
    data = b"[1,0]<stdout>: out [1,0]<stderr>: err\n[1,0]<stdout>: more\n"
    assert run(OmpiChunkParser(), [data]) == [T(0, "stderr", "err"), T(0, "stdout", "out more")]


def test_ompi_text_after_a_chunk_belongs_to_that_rank_until_the_next_tag() -> None:
    # Raw chunks carry one tag each: the lines after the chunk's first are the rank's too.
    data = b"[1,3]<stdout>: one\ntwo\nthree\n[1,0]<stdout>: zero\n"
    assert run(OmpiChunkParser(), [data]) == [
        T(3, "stdout", "one"),
        T(3, "stdout", "two"),
        T(3, "stdout", "three"),
        T(0, "stdout", "zero"),
    ]


RULE = b"-" * 74
HELP_IN_A_LINE = (
    b"[1,1]<stderr>: Traceback\n[1,1]<stderr>: ValueError"
    b"[1,1]<stderr>: "
    + RULE
    + b"\nMPI_ABORT was invoked on rank 1\n\nNOTE: all killed.\n"
    + RULE
    + b"\n[1,1]<stderr>: : the same\n[1,1]<stderr>: \n"
)


def test_ompi_help_message_written_inside_a_line_does_not_cut_it() -> None:
    # Open MPI writes its abort banner while the rank's pipe still holds the rest of the
    # line Python writes in three pieces: the banner's lines come out whole, the line too.
    expected = [
        T(1, "stderr", "Traceback"),
        T(1, "stderr", RULE.decode()),
        T(1, "stderr", "MPI_ABORT was invoked on rank 1"),
        T(1, "stderr", ""),
        T(1, "stderr", "NOTE: all killed."),
        T(1, "stderr", RULE.decode()),
        T(1, "stderr", "ValueError: the same"),
        T(1, "stderr", ""),
    ]
    assert run(OmpiChunkParser(), [HELP_IN_A_LINE]) == expected
    for cut in range(len(HELP_IN_A_LINE) + 1):
        chunks = [HELP_IN_A_LINE[:cut], HELP_IN_A_LINE[cut:]]
        assert run(OmpiChunkParser(), chunks) == expected, f"split at {cut}"
    assert run(OmpiChunkParser(), bytewise(HELP_IN_A_LINE)) == expected


def test_ompi_chunk_of_dashes_is_text_when_no_line_is_open_or_it_is_no_rule() -> None:
    # Without a line waiting, a rule is just the rank's next line; a shorter run of dashes
    # inside a line is part of that line; a rule cut short by the end of output is text.
    assert run(OmpiChunkParser(), [b"[1,0]<stdout>: " + RULE + b"\nx\n"]) == [
        T(0, "stdout", RULE.decode()),
        T(0, "stdout", "x"),
    ]
    assert run(OmpiChunkParser(), [b"[1,0]<stdout>: a[1,0]<stdout>: --b\n"]) == [
        T(0, "stdout", "a--b")
    ]
    assert run(OmpiChunkParser(), [b"[1,0]<stdout>: a[1,0]<stdout>: ---"]) == [
        T(0, "stdout", "a---")
    ]


def test_ompi_text_before_first_tag_is_launcher_text() -> None:
    assert run(OmpiChunkParser(), [b"launcher says\nprefix [1,4]<stdout>: rest\n"]) == [
        T(None, None, "launcher says"),
        T(4, "stdout", "rest"),
        T(None, None, "prefix "),
    ]


def test_ompi_flush_returns_last_lines_once() -> None:
    parser = OmpiChunkParser()
    parser.feed(b"[1,0]<stdout>: no newline")
    assert parser.flush() == [T(0, "stdout", "no newline")]
    assert parser.flush() == []


def test_ompi_tag_cut_across_feeds_is_held_back_not_emitted() -> None:
    parser = OmpiChunkParser()
    assert parser.feed(b"[1,0]<stdout>: x\n[1,1]<std") == [T(0, "stdout", "x")]
    assert parser.feed(b"err>: y\n") == [T(1, "stderr", "y")]
    # A "[" that turns out not to start a tag is text after all.
    assert parser.feed(b"[1,0]<stdout>: a [") == []
    assert parser.feed(b"b]\n") == [T(0, "stdout", "a [b]")]


def test_ompi_tag_details() -> None:
    data = (
        b"[4711,12]<stdout>: big job id\n"
        b"[1,0]<stdout>:   indented\n"
        b"[1,0]<stdout>: \n"
        b"[1,0]<stddiag>: diag\n"
    )
    assert per_rank(run(OmpiChunkParser(), [data])) == per_rank(
        [
            T(12, "stdout", "big job id"),
            T(0, "stdout", "  indented"),  # only the one separator space is dropped
            T(0, "stdout", ""),
            T(0, "stderr", "diag"),  # stddiag is reported as stderr
        ]
    )


def test_ompi_crlf_line_endings() -> None:
    data = b"[1,0]<stdout>: one\r\n[1,1]<stderr>: two\r\n"
    assert run(OmpiChunkParser(), [data]) == [T(0, "stdout", "one"), T(1, "stderr", "two")]
    # Only the \r right before the newline goes; one inside the line stays.
    assert run(OmpiChunkParser(), [b"[1,0]<stdout>: a\rb\n"]) == [T(0, "stdout", "a\rb")]


def test_ompi_binary_garbage_is_replaced_and_nuls_dropped() -> None:
    data = b"[1,0]<stdout>: \x80\xfe\xff\x00\x00ok\xc3\n\x00\x00\n\xed\xa0\x80\n"
    assert run(OmpiChunkParser(), [data]) == [
        T(0, "stdout", "\ufffd\ufffd\ufffdok\ufffd"),
        T(0, "stdout", ""),
        T(0, "stdout", "\ufffd\ufffd\ufffd"),
    ]


def test_ompi_multibyte_character_split_across_chunks_of_the_rank() -> None:
    data = "[1,0]<stdout>: π ≈ 3.14 ✓".encode()
    data = data[:-2] + b"[1,1]<stdout>: other\n[1,0]<stdout>: " + data[-2:] + b"\n"
    assert run(OmpiChunkParser(), bytewise(data)) == [
        T(1, "stdout", "other"),
        T(0, "stdout", "π ≈ 3.14 ✓"),
    ]


def test_ompi_long_line_in_partial_pieces_with_rank_kept() -> None:
    text = bytes(range(ord("a"), ord("z") + 1)) * 10  # 260 bytes
    data = b"[1,3]<stderr>: " + text + b"\n[1,1]<stdout>: short\n"
    out = run(OmpiChunkParser(max_line=16), [data])
    pieces, last = out[:-1], out[-1]
    assert all(p.rank == 3 and p.stream == "stderr" for p in pieces)
    assert [len(p.text) for p in pieces] == [16] * 16 + [4]
    assert [p.partial for p in pieces] == [True] * 16 + [False]
    assert "".join(p.text for p in pieces) == text.decode()
    assert last == T(1, "stdout", "short")


def test_ompi_long_line_without_newline_comes_out_before_its_end() -> None:
    max_line = 16
    text = b"0123456789" * 60  # 600 bytes
    parser = OmpiChunkParser(max_line=max_line)
    early: list[TaggedLine] = []
    for i in range(0, len(text), 7):
        early.extend(parser.feed(b"[1,5]<stdout>: " + text[i : i + 7]))
    # Memory stays bounded: all but the last piece came out before the line's end arrived.
    assert sum(len(p.text) for p in early) >= len(text) - max_line
    assert all(p.partial for p in early)
    late = parser.feed(b"[1,5]<stdout>: \n[1,0]<stderr>: after\n") + parser.flush()
    pieces = early + late[:-1]
    assert all(p.rank == 5 and p.stream == "stdout" for p in pieces)
    assert "".join(p.text for p in pieces) == text.decode()
    assert late[-1] == T(0, "stderr", "after")


def test_ompi_pieces_never_cut_a_character() -> None:
    text = "é" * 40  # 80 bytes, 2 each
    out = run(OmpiChunkParser(max_line=15), [b"[1,0]<stdout>: " + text.encode() + b"\n"])
    assert "\ufffd" not in "".join(p.text for p in out)
    assert "".join(p.text for p in out) == text
    assert all(len(p.text.encode()) <= 15 for p in out)


def test_ompi_default_max_line_is_one_mebibyte() -> None:
    assert MAX_LINE == 1 << 20
    text = b"z" * (MAX_LINE + 10)
    out = run(OmpiChunkParser(), [b"[1,0]<stdout>: " + text + b"\n"])
    assert [(len(p.text), p.partial) for p in out] == [(MAX_LINE, True), (10, False)]


def test_ompi_empty_chunk_tags_and_fake_tag_prefixes() -> None:
    data = b"[1,0]<stdout>: [1,1]<stdout>: x[1,\n[1,0]<stdout>: [9]<stdout> y\n"
    expected = [T(1, "stdout", "x[1,"), T(0, "stdout", "[9]<stdout> y")]
    assert run(OmpiChunkParser(max_line=16), [data]) == expected
    assert run(OmpiChunkParser(max_line=16), bytewise(data)) == expected


# -- LineSplitter --------------------------------------------------------------------------


def test_splitter_sample_fed_at_once() -> None:
    assert texts(run(LineSplitter(), [SPLIT_SAMPLE])) == SPLIT_EXPECTED


def test_splitter_split_at_every_position_matches_whole() -> None:
    for cut in range(len(SPLIT_SAMPLE) + 1):
        chunks = [SPLIT_SAMPLE[:cut], SPLIT_SAMPLE[cut:]]
        assert texts(run(LineSplitter(), chunks)) == SPLIT_EXPECTED, f"split at {cut}"


def test_splitter_byte_by_byte_matches_whole() -> None:
    assert texts(run(LineSplitter(), bytewise(SPLIT_SAMPLE))) == SPLIT_EXPECTED


def test_splitter_partial_line_kept_until_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"abc") == []
    assert splitter.feed(b"def") == []
    assert splitter.feed(b"\nnext") == [Piece("abcdef")]
    assert splitter.flush() == [Piece("next")]
    assert splitter.flush() == []


def test_splitter_keeps_empty_lines_and_crlf() -> None:
    assert texts(run(LineSplitter(), [b"a\r\n\r\n\nb\rc\n"])) == ["a", "", "", "b\rc"]


def test_splitter_garbage_is_replaced_and_nuls_dropped() -> None:
    assert texts(run(LineSplitter(), [b"\x00\x00\n\xff\xfeA\x00B\n\xc3"])) == [
        "",
        "\ufffd\ufffdAB",
        "\ufffd",
    ]


def test_splitter_long_line_cut_into_partial_pieces() -> None:
    assert run(LineSplitter(max_line=4), [b"abcdefghij\nxy\n"]) == [
        Piece("abcd", True),
        Piece("efgh", True),
        Piece("ij"),
        Piece("xy"),
    ]


def test_splitter_long_line_without_newline_comes_out_early() -> None:
    splitter = LineSplitter(max_line=4)
    early: list[Piece] = []
    for piece in bytewise(b"abcdefghij"):
        early.extend(splitter.feed(piece))
    assert early == [Piece("abcd", True), Piece("efgh", True)]
    assert splitter.feed(b"\n") == [Piece("ij")]
    assert splitter.flush() == []


@pytest.mark.parametrize("line", [b"abcd", b"abcdefgh"])
def test_splitter_line_of_exact_multiple_of_max_line(line: bytes) -> None:
    # Its newline arriving later must not add an empty line.
    data = line + b"\nnext\n"
    cut = [line[i : i + 4].decode() for i in range(0, len(line), 4)]
    expected = [Piece(t, i < len(cut) - 1) for i, t in enumerate(cut)] + [Piece("next")]
    assert run(LineSplitter(max_line=4), [data]) == expected
    assert run(LineSplitter(max_line=4), bytewise(data)) == expected
    for at in range(len(data) + 1):
        assert run(LineSplitter(max_line=4), [data[:at], data[at:]]) == expected, at


# -- properties ----------------------------------------------------------------------------

TEXT_TOKENS = [
    b"a",
    b"bc",
    b" ",
    b"\n",
    b"\r",
    b"\x00",
    b"\xff",
    b"\xc3",
    b"\xc3\xa9",
    "\u2713".encode(),
    b"[",
    b"]",
    b"1,",
    b"<stdout>",
    b"[1,0]<std",
    b"0123456789" * 3,
    b"L" * 90,  # long enough to make the parsers cut lines before their newline
]
TARGETS = [(0, "stdout"), (1, "stderr"), (12, "stdout"), (0, "stderr")]
byte_texts = st.lists(st.sampled_from(TEXT_TOKENS), max_size=12).map(b"".join)


def _tag(rank: int, stream: str) -> bytes:
    return f"[1,{rank}]<{stream}>: ".encode()


@st.composite
def ompi_streams(draw: st.DrawFn) -> tuple[bytes, dict[tuple[int, str], bytes]]:
    """A raw tagged stream of chunks, and what each rank wrote on each stream."""
    written: dict[tuple[int, str], bytes] = {}
    parts = []
    for _ in range(draw(st.integers(0, 10))):
        target = draw(st.sampled_from(TARGETS))
        chunk = draw(byte_texts)
        parts.append(_tag(*target) + chunk)
        written[target] = written.get(target, b"") + chunk
    return b"".join(parts), written


def _clean(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"")


@settings(max_examples=120, deadline=None, database=None)
@given(
    sample=ompi_streams(),
    max_line=st.integers(4, 24),
    cuts=st.lists(st.integers(0, 400), max_size=30),
)
@example(sample=(b"[1,0]<stdout>: \x00", {(0, "stdout"): b"\x00"}), max_line=4, cuts=[])
@example(sample=(b"[1,0]<stdout>: \n\x00", {(0, "stdout"): b"\n\x00"}), max_line=4, cuts=[])
@example(  # a NUL after a last CR: once made the CR the end of a full-length piece
    sample=(b"[1,0]<stdout>: aaa[1,0]<stdout>: \r\x00", {(0, "stdout"): b"aaa\r\x00"}),
    max_line=4,
    cuts=[],
)
def test_ompi_any_chunking_gives_same_lines_and_loses_nothing(
    sample: tuple[bytes, dict[tuple[int, str], bytes]], max_line: int, cuts: list[int]
) -> None:
    data, written = sample
    whole = run(OmpiChunkParser(max_line=max_line), [data])
    assert per_rank(run(OmpiChunkParser(max_line=max_line), chunked(data, cuts))) == per_rank(whole)
    assert per_rank(run(OmpiChunkParser(max_line=max_line), bytewise(data))) == per_rank(whole)
    for line in whole:
        assert len(line.text) <= max_line
        assert "\x00" not in line.text
    # Every byte of every rank arrives, in order, on its rank and stream: the pieces, glued,
    # are the lines a plain split of what the rank wrote gives. (Valid UTF-8 only: a piece
    # may not end inside a bad sequence the way the whole line does.)
    for target, raw in written.items():
        if b"\xff" in raw or b"\xc3" in raw.replace(b"\xc3\xa9", b""):
            continue
        clean = _clean(raw)  # a NUL is nothing: what the rank wrote is the rest
        lines = clean.split(b"\n")
        if lines[-1] == b"" and clean.endswith(b"\n"):
            lines.pop()
        expected = [ln.removesuffix(b"\r").decode() for ln in lines]
        assert glued(whole, target) == (expected if clean else []), (target, raw)


HELP = b"-" * 74 + b"\nhelp text\n" + b"-" * 74 + b"\n"


@settings(max_examples=120, deadline=None, database=None)
@given(
    chunks=st.lists(
        st.tuples(st.sampled_from(TARGETS), st.one_of(byte_texts, st.just(HELP))), max_size=10
    ),
    cuts=st.lists(st.integers(0, 600), max_size=30),
)
def test_ompi_help_messages_anywhere_any_chunking_gives_same_lines(
    chunks: list[tuple[tuple[int, str], bytes]], cuts: list[int]
) -> None:
    data = b"".join(_tag(*target) + chunk for target, chunk in chunks)
    whole = run(OmpiChunkParser(), [data])
    assert per_rank(run(OmpiChunkParser(), chunked(data, cuts))) == per_rank(whole)
    assert per_rank(run(OmpiChunkParser(), bytewise(data))) == per_rank(whole)
    # A help message comes out as its own lines, whatever the rank had begun.
    helps = sum(chunk == HELP for _, chunk in chunks)
    assert sum(line.text == "help text" for line in whole) == helps


@st.composite
def split_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    max_line = draw(st.integers(1, 24))
    lines = draw(st.lists(byte_texts, max_size=8))
    return b"".join(line + b"\n" for line in lines) + draw(byte_texts), max_line


@settings(max_examples=80, deadline=None, database=None)
@given(sample=split_streams(), cuts=st.lists(st.integers(0, 400), max_size=30))
def test_splitter_any_chunking_gives_same_lines(sample: tuple[bytes, int], cuts: list[int]) -> None:
    data, max_line = sample
    whole = run(LineSplitter(max_line=max_line), [data])
    assert run(LineSplitter(max_line=max_line), chunked(data, cuts)) == whole
    assert run(LineSplitter(max_line=max_line), bytewise(data)) == whole
    assert all(len(p.text) <= max_line for p in whole)


@settings(max_examples=80, deadline=None, database=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=20))
def test_arbitrary_bytes_never_raise(data: bytes, cuts: list[int]) -> None:
    for line in run(OmpiChunkParser(max_line=8), chunked(data, cuts)):
        assert isinstance(line.text, str)
        assert "\x00" not in line.text
        assert line.stream in (None, "stdout", "stderr")
        assert len(line.text) <= 8
    for piece in run(LineSplitter(max_line=8), chunked(data, cuts)):
        assert "\x00" not in piece.text
        assert len(piece.text) <= 8
