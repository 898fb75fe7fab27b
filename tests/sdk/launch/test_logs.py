"""A rank's log line: its line in the files and back, as text to print, and as a DataFrame."""

from __future__ import annotations

import pandas as pd

from clusterbook.launch.logs import (
    LAUNCHER_RANK,
    LiveText,
    LogRecord,
    format_log_lines,
    parse_log_line,
    records_frame,
)

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z


def test_lines_format_and_parse_back_with_their_time_stream_and_pieces() -> None:
    texts = ["whole", "a piece ", "of a line", ""]
    text = format_log_lines(T0 + 0.25, "stderr", texts, frozenset({1}))
    assert text.splitlines() == [
        "2023-11-14T22:13:20.250000+00:00 err whole",
        "2023-11-14T22:13:20.250000+00:00 err+ a piece ",
        "2023-11-14T22:13:20.250000+00:00 err of a line",
        "2023-11-14T22:13:20.250000+00:00 err ",
    ]
    back = [parse_log_line(raw, 3, "h", 2) for raw in text.removesuffix("\n").split("\n")]
    assert back == [
        LogRecord(T0 + 0.25, 3, "h", "stderr", t, i == 1, 2) for i, t in enumerate(texts)
    ]
    plain = format_log_lines(T0, "stdout", ["x", "y"], frozenset())
    stamp = "2023-11-14T22:13:20.000000+00:00"
    assert plain == f"{stamp} out x\n{stamp} out y\n"


def test_a_line_the_store_did_not_write_is_kept_whole_and_undated() -> None:
    record = parse_log_line("not a dated line", 0)
    assert record == LogRecord(0.0, 0, "?", "stdout", "not a dated line", False, 1)


def test_live_text_glues_the_pieces_of_a_long_line_behind_one_prefix() -> None:
    live = LiveText()
    piece = LogRecord(T0, 1, "h", "stdout", "abc", partial=True)
    other = LogRecord(T0, LAUNCHER_RANK, "h", "stdout", "launcher says")
    rest = LogRecord(T0, 1, "h", "stdout", "def")
    assert live.render(piece, "[1]") == "[1] abc"
    assert live.continues(rest)
    assert live.render(other, "[launcher]") == "[launcher] launcher says\n"
    assert live.render(rest, "[1]") == "def\n"
    assert not live.continues(rest)
    assert live.render(rest, "[1]") == "[1] def\n"


def test_records_frame_empty() -> None:
    frame = records_frame([])
    assert list(frame.columns) == ["time", "rank", "host", "stream", "line", "partial", "attempt"]
    assert len(frame) == 0
    assert str(frame["time"].dt.tz) == "UTC"


def test_records_frame_accepts_any_iterable() -> None:
    records = (LogRecord(T0 + i, i, "h", "stdout", str(i)) for i in range(3))
    frame = records_frame(records)
    assert list(frame["line"]) == ["0", "1", "2"]
    assert frame["time"].iloc[2] - frame["time"].iloc[0] == pd.Timedelta(seconds=2)
