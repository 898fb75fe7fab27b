"""Unit tests of the incremental line parsers (LineSplitter, OmpiTagParser)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterbook.launch.parse import MAX_LINE, LineSplitter, OmpiTagParser, TaggedLine

T = TaggedLine


def run(parser: LineSplitter | OmpiTagParser, chunks: Iterable[bytes]) -> list:
    """Feed every chunk, then flush; return everything the parser produced, in order."""
    out: list = []
    for chunk in chunks:
        out.extend(parser.feed(chunk))
    out.extend(parser.flush())
    return out


def bytewise(data: bytes) -> list[bytes]:
    return [data[i : i + 1] for i in range(len(data))]


def chunked(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# A realistic Open MPI --output tag stream: interleaved ranks, both streams, a launcher line,
# invalid UTF-8, a NUL, CRLF, a multi-byte character, a rank's last line without newline
# followed by another rank's tag, and a final partial line.
OMPI_SAMPLE = (
    b"[1,0]<stdout>: hello from 0\n"
    b"[1,1]<stdout>: hello from 1\n"
    b"[1,1]<stderr>: warn \xff\xfe bad bytes\n"
    b"mpirun: launcher note\n"
    b"[1,0]<stdout>: caf\xc3\xa9 \x00nul\r\n"
    b"[1,0]<stddiag>: diag\n"
    b"[1,1]<stdout>: tail[1,0]<stderr>: tail2\n"
    b"[1,2]<stdout>: last words"
)
OMPI_EXPECTED = [
    T(0, "stdout", "hello from 0"),
    T(1, "stdout", "hello from 1"),
    T(1, "stderr", "warn \ufffd\ufffd bad bytes"),
    T(None, None, "mpirun: launcher note"),
    T(0, "stdout", "caf\u00e9 nul"),
    T(0, "stderr", "diag"),
    T(1, "stdout", "tail"),
    T(0, "stderr", "tail2"),
    T(2, "stdout", "last words"),
]

SPLIT_SAMPLE = b"first\nsecond \xc3\xa9\r\n\n\xff\x00x\nlast no newline"
SPLIT_EXPECTED = ["first", "second \u00e9", "", "\ufffdx", "last no newline"]


# -- OmpiTagParser -------------------------------------------------------------------------


def test_ompi_sample_fed_at_once() -> None:
    assert run(OmpiTagParser(), [OMPI_SAMPLE]) == OMPI_EXPECTED


def test_ompi_ranks_interleave_line_by_line() -> None:
    parser = OmpiTagParser()
    assert parser.feed(b"[1,0]<stdout>: a0\n[1,1]<stdout>: b0\n") == [
        T(0, "stdout", "a0"),
        T(1, "stdout", "b0"),
    ]
    assert parser.feed(b"[1,1]<stderr>: b1\n[1,0]<stdout>: a1\n[1,1]<stdout>: b2\n") == [
        T(1, "stderr", "b1"),
        T(0, "stdout", "a1"),
        T(1, "stdout", "b2"),
    ]
    assert parser.flush() == []


def test_ompi_partial_line_kept_until_newline() -> None:
    parser = OmpiTagParser()
    assert parser.feed(b"[1,3]<stdout>: half") == []
    assert parser.feed(b" a line") == []
    assert parser.feed(b" done\n[1,3]<std") == [T(3, "stdout", "half a line done")]
    assert parser.feed(b"err>: next\n") == [T(3, "stderr", "next")]
    assert parser.flush() == []


def test_ompi_flush_returns_last_line_once() -> None:
    parser = OmpiTagParser()
    parser.feed(b"[1,0]<stdout>: no newline")
    assert parser.flush() == [T(0, "stdout", "no newline")]
    assert parser.flush() == []


def test_ompi_split_at_every_position_matches_whole() -> None:
    for cut in range(len(OMPI_SAMPLE) + 1):
        chunks = [OMPI_SAMPLE[:cut], OMPI_SAMPLE[cut:]]
        assert run(OmpiTagParser(), chunks) == OMPI_EXPECTED, f"split at {cut}"


def test_ompi_byte_by_byte_matches_whole() -> None:
    assert run(OmpiTagParser(), bytewise(OMPI_SAMPLE)) == OMPI_EXPECTED


def test_ompi_tail_without_newline_followed_by_other_rank_tag() -> None:
    parser = OmpiTagParser()
    assert parser.feed(b"[1,1]<stdout>: tail[1,0]<stderr>: tail2") == []
    assert parser.flush() == [T(1, "stdout", "tail"), T(0, "stderr", "tail2")]


def test_ompi_several_tags_on_one_line_each_get_their_text() -> None:
    data = b"[1,2]<stdout>: x[1,0]<stdout>: y[1,1]<stderr>: z\n"
    assert run(OmpiTagParser(), [data]) == [
        T(2, "stdout", "x"),
        T(0, "stdout", "y"),
        T(1, "stderr", "z"),
    ]


def test_ompi_untagged_lines_belong_to_launcher() -> None:
    data = b"plain launcher line\n[1,0]<stdout>: ranked\nanother one\n"
    assert run(OmpiTagParser(), [data]) == [
        T(None, None, "plain launcher line"),
        T(0, "stdout", "ranked"),
        T(None, None, "another one"),
    ]


def test_ompi_text_before_first_tag_is_launcher_text() -> None:
    assert run(OmpiTagParser(), [b"prefix [1,4]<stdout>: rest\n"]) == [
        T(None, None, "prefix "),
        T(4, "stdout", "rest"),
    ]


def test_ompi_tag_details() -> None:
    data = (
        b"[4711,12]<stdout>: big job id\n"
        b"[1,0]<stdout>:no space\n"
        b"[1,0]<stdout>:   indented\n"
        b"[1,0]<stdout>: \n"
        b"[1,0]<stddiag>: diag\n"
    )
    assert run(OmpiTagParser(), [data]) == [
        T(12, "stdout", "big job id"),
        T(0, "stdout", "no space"),
        T(0, "stdout", "  indented"),  # only the one separator space is dropped
        T(0, "stdout", ""),
        T(0, "stderr", "diag"),  # stddiag is reported as stderr
    ]


def test_ompi_crlf_line_endings() -> None:
    data = b"[1,0]<stdout>: one\r\n[1,1]<stderr>: two\r\nlauncher\r\n"
    assert run(OmpiTagParser(), [data]) == [
        T(0, "stdout", "one"),
        T(1, "stderr", "two"),
        T(None, None, "launcher"),
    ]
    # Only the \r right before the newline goes; one inside the line stays.
    assert run(OmpiTagParser(), [b"[1,0]<stdout>: a\rb\n"]) == [T(0, "stdout", "a\rb")]


def test_ompi_binary_garbage_is_replaced_and_nuls_dropped() -> None:
    data = b"[1,0]<stdout>: \x80\xfe\xff\x00\x00ok\xc3\n\x00\x00\n\xed\xa0\x80\n"
    out = run(OmpiTagParser(), [data])
    assert out == [
        T(0, "stdout", "\ufffd\ufffd\ufffdok\ufffd"),
        T(None, None, ""),
        T(None, None, "\ufffd\ufffd\ufffd"),
    ]


def test_ompi_multibyte_character_split_across_feeds() -> None:
    data = "[1,0]<stdout>: π ≈ 3.14 ✓\n".encode()
    assert run(OmpiTagParser(), bytewise(data)) == [T(0, "stdout", "π ≈ 3.14 ✓")]


def test_ompi_long_line_cut_into_pieces_with_rank_kept() -> None:
    text = bytes(range(ord("a"), ord("z") + 1)) * 10  # 260 bytes
    data = b"[1,3]<stderr>: " + text + b"\n[1,1]<stdout>: short\n"
    out = run(OmpiTagParser(max_line=16), [data])
    pieces, last = out[:-1], out[-1]
    assert all(p.rank == 3 and p.stream == "stderr" for p in pieces)
    assert all(len(p.text) <= 16 for p in pieces)
    assert len(pieces) == 17  # ceil(260 / 16)
    assert "".join(p.text for p in pieces) == text.decode()
    assert last == T(1, "stdout", "short")


def test_ompi_long_line_without_newline_across_many_feeds() -> None:
    max_line = 16
    text = b"0123456789" * 60  # 600 bytes
    parser = OmpiTagParser(max_line=max_line)
    early: list[TaggedLine] = []
    early.extend(parser.feed(b"[1,5]<stdout>: "))
    for i in range(0, len(text), 7):
        early.extend(parser.feed(text[i : i + 7]))
    # Memory stays bounded: most of the line came out before its end arrived.
    assert sum(len(p.text) for p in early) >= len(text) - (max_line + 64)
    late = parser.feed(b"\n[1,0]<stderr>: after\n") + parser.flush()
    pieces = early + late[:-1]
    assert all(p.rank == 5 and p.stream == "stdout" for p in pieces)
    assert all(0 < len(p.text) <= max_line for p in pieces)
    assert "".join(p.text for p in pieces) == text.decode()
    # The carried tag does not leak into the next line.
    assert late[-1] == T(0, "stderr", "after")


def test_ompi_long_untagged_line_stays_launcher_on_every_piece() -> None:
    text = b"L" * 300
    out = run(OmpiTagParser(max_line=32), chunked(text + b"\n", range(0, 301, 11)))
    assert all(p.rank is None and p.stream is None for p in out)
    assert all(len(p.text) <= 32 for p in out)
    assert "".join(p.text for p in out) == text.decode()


def test_ompi_long_tail_followed_by_other_rank_tag_then_flush() -> None:
    data = b"[1,1]<stdout>: " + b"y" * 200 + b"[1,0]<stderr>: tail2"
    for chunks in ([data], bytewise(data), chunked(data, range(0, len(data), 13))):
        out = run(OmpiTagParser(max_line=16), chunks)
        assert out[-1] == T(0, "stderr", "tail2")
        assert all(p.rank == 1 and p.stream == "stdout" for p in out[:-1])
        assert "".join(p.text for p in out[:-1]) == "y" * 200


def test_ompi_default_max_line() -> None:
    text = b"z" * (MAX_LINE + 10)
    out = run(OmpiTagParser(), [b"[1,0]<stdout>: " + text + b"\n"])
    assert [len(p.text) for p in out] == [MAX_LINE, 10]
    assert {(p.rank, p.stream) for p in out} == {(0, "stdout")}


def test_ompi_empty_segment_before_long_tagged_line() -> None:
    # A tag with nothing after it, straight before another rank's long line: the second tag
    # must never be cut through, however the bytes arrive.
    data = b"[1,0]<stdout>: [1,1]<stdout>: " + b"x" * 100 + b"\n"
    expected = [T(0, "stdout", ""), *(T(1, "stdout", "x" * n) for n in [16] * 6 + [4])]
    assert run(OmpiTagParser(max_line=16), [data]) == expected
    assert run(OmpiTagParser(max_line=16), bytewise(data)) == expected
    for cut in range(len(data) + 1):
        assert run(OmpiTagParser(max_line=16), [data[:cut], data[cut:]]) == expected, cut


# -- LineSplitter --------------------------------------------------------------------------


def test_splitter_sample_fed_at_once() -> None:
    assert run(LineSplitter(), [SPLIT_SAMPLE]) == SPLIT_EXPECTED


def test_splitter_split_at_every_position_matches_whole() -> None:
    for cut in range(len(SPLIT_SAMPLE) + 1):
        chunks = [SPLIT_SAMPLE[:cut], SPLIT_SAMPLE[cut:]]
        assert run(LineSplitter(), chunks) == SPLIT_EXPECTED, f"split at {cut}"


def test_splitter_byte_by_byte_matches_whole() -> None:
    assert run(LineSplitter(), bytewise(SPLIT_SAMPLE)) == SPLIT_EXPECTED


def test_splitter_partial_line_kept_until_newline() -> None:
    splitter = LineSplitter()
    assert splitter.feed(b"abc") == []
    assert splitter.feed(b"def") == []
    assert splitter.feed(b"\nnext") == ["abcdef"]
    assert splitter.flush() == ["next"]
    assert splitter.flush() == []


def test_splitter_keeps_empty_lines_and_crlf() -> None:
    assert run(LineSplitter(), [b"a\r\n\r\n\nb\rc\n"]) == ["a", "", "", "b\rc"]


def test_splitter_garbage_is_replaced_and_nuls_dropped() -> None:
    assert run(LineSplitter(), [b"\x00\x00\n\xff\xfeA\x00B\n\xc3"]) == [
        "",
        "\ufffd\ufffdAB",
        "\ufffd",
    ]


def test_splitter_long_line_cut_into_pieces() -> None:
    assert run(LineSplitter(max_line=4), [b"abcdefghij\nxy\n"]) == ["abcd", "efgh", "ij", "xy"]


def test_splitter_long_line_without_newline_comes_out_early() -> None:
    splitter = LineSplitter(max_line=4)
    early: list[str] = []
    for piece in bytewise(b"abcdefghij"):
        early.extend(splitter.feed(piece))
    assert early == ["abcd", "efgh"]
    assert splitter.feed(b"\n") == ["ij"]
    assert splitter.flush() == []


@pytest.mark.parametrize("line", [b"abcd", b"abcdefgh"])
def test_splitter_line_of_exact_multiple_of_max_line(line: bytes) -> None:
    # Its newline arriving later must not add an empty line.
    data = line + b"\nnext\n"
    expected = [line[i : i + 4].decode() for i in range(0, len(line), 4)] + ["next"]
    assert run(LineSplitter(max_line=4), [data]) == expected
    assert run(LineSplitter(max_line=4), bytewise(data)) == expected
    for cut in range(len(data) + 1):
        assert run(LineSplitter(max_line=4), [data[:cut], data[cut:]]) == expected, cut


# -- properties ----------------------------------------------------------------------------

TEXT_TOKENS = [
    b"a",
    b"bc",
    b" ",
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
TAGS = [
    b"[1,0]<stdout>: ",
    b"[1,1]<stderr>: ",
    b"[7,12]<stddiag>: ",
    b"[1,2]<stdout>:",
]
texts = st.lists(st.sampled_from(TEXT_TOKENS), max_size=12).map(b"".join)


@st.composite
def ompi_streams(draw: st.DrawFn) -> bytes:
    lines = []
    for _ in range(draw(st.integers(0, 6))):
        parts = [draw(texts)]  # untagged prefix (launcher text), often empty
        for _ in range(draw(st.integers(0, 3))):
            parts.append(draw(st.sampled_from(TAGS)))
            parts.append(draw(st.one_of(st.just(b""), texts)))  # often a tag right after
        lines.append(b"".join(parts))
    return b"\n".join(lines) + draw(st.sampled_from([b"", b"\n"]))


@settings(max_examples=80, deadline=None, database=None)
@given(
    data=ompi_streams(),
    max_line=st.integers(1, 24),
    cuts=st.lists(st.integers(0, 400), max_size=30),
)
def test_ompi_any_chunking_gives_same_lines(data: bytes, max_line: int, cuts: list[int]) -> None:
    whole = run(OmpiTagParser(max_line=max_line), [data])
    assert run(OmpiTagParser(max_line=max_line), chunked(data, cuts)) == whole
    assert run(OmpiTagParser(max_line=max_line), bytewise(data)) == whole
    for line in whole:
        assert len(line.text) <= max_line
        assert "\x00" not in line.text


@st.composite
def split_streams(draw: st.DrawFn) -> tuple[bytes, int]:
    max_line = draw(st.integers(1, 24))
    lines = draw(st.lists(texts, max_size=8))
    return b"".join(line + b"\n" for line in lines) + draw(texts), max_line


@settings(max_examples=80, deadline=None, database=None)
@given(sample=split_streams(), cuts=st.lists(st.integers(0, 400), max_size=30))
def test_splitter_any_chunking_gives_same_lines(sample: tuple[bytes, int], cuts: list[int]) -> None:
    data, max_line = sample
    whole = run(LineSplitter(max_line=max_line), [data])
    assert run(LineSplitter(max_line=max_line), chunked(data, cuts)) == whole
    assert run(LineSplitter(max_line=max_line), bytewise(data)) == whole
    assert all(len(line) <= max_line for line in whole)


@settings(max_examples=80, deadline=None, database=None)
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=20))
def test_arbitrary_bytes_never_raise(data: bytes, cuts: list[int]) -> None:
    for line in run(OmpiTagParser(max_line=8), chunked(data, cuts)):
        assert isinstance(line.text, str)
        assert "\x00" not in line.text
        assert line.stream in (None, "stdout", "stderr")
        assert len(line.text) <= 8
    for text in run(LineSplitter(max_line=8), chunked(data, cuts)):
        assert "\x00" not in text
        assert len(text) <= 8
