"""RecordBuffer: a job's newest records kept as the batches they came in, made when read."""

from __future__ import annotations

import gc
import tracemalloc
from collections import deque
from pathlib import Path

from hypothesis import example, given, settings
from hypothesis import strategies as st

from clusterbook.launch.logbuffer import RecordBuffer, records_of
from clusterbook.launch.logs import LogRecord
from clusterbook.launch.logstore import LogStore


class Model:
    """The bound as a deque of records, one at a time: what the buffer must keep."""

    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records, self.max_bytes = max_records, max_bytes
        self.records: deque[tuple[int, LogRecord]] = deque()  # (seq, record)
        self.size = self.seq = 0

    def add(self, records: list[LogRecord]) -> None:
        for record in records:
            self.records.append((self.seq, record))
            self.seq += 1
            self.size += len(record.line)
        while len(self.records) > self.max_records or (
            self.size > self.max_bytes and len(self.records) > 1
        ):
            self.size -= len(self.records.popleft()[1].line)


batches = st.lists(
    st.tuples(
        st.integers(0, 2),  # rank
        st.lists(st.text(alphabet="ab\u00e9", max_size=12), min_size=1, max_size=9),
        st.sets(st.integers(0, 8)),  # partial indexes
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None, database=None)
@given(batches, st.integers(1, 20), st.integers(0, 60), st.integers(0, 200))
# Empty lines: the bound in characters lets go of no more than it must.
@example([(0, ["", "", ""], set())], 2, 0, 0)
@example([(0, ["ab", "", "c"], set()), (1, ["d"], set())], 9, 2, 0)
def test_buffer_keeps_what_a_record_at_a_time_bound_keeps(
    added: list[tuple[int, list[str], set[int]]], max_records: int, max_bytes: int, cursor: int
) -> None:
    buffer, model = RecordBuffer(max_records, max_bytes), Model(max_records, max_bytes)
    for i, (rank, texts, partial) in enumerate(added):
        marks = frozenset(p for p in partial if p < len(texts))
        buffer.add(float(i), rank, f"h{rank}", "stdout", texts, marks, 2)
        model.add(
            [
                LogRecord(float(i), rank, f"h{rank}", "stdout", t, j in marks, 2)
                for j, t in enumerate(texts)
            ]
        )
        assert (buffer.count, buffer.size, buffer.seq) == (
            len(model.records),
            model.size,
            model.seq,
        )
    assert records_of(buffer.since(0)) == [r for _, r in model.records]
    # A reader that has seen records up to ``cursor`` gets the rest, from the oldest kept.
    assert records_of(buffer.since(cursor)) == [r for s, r in model.records if s >= cursor]


def test_a_bound_inside_a_batch_cuts_it_and_keeps_its_partial_marks() -> None:
    buffer = RecordBuffer(max_records=3, max_bytes=1 << 20)
    buffer.add(1.0, 0, "h", "stdout", ["a", "b", "c1", "c2", "d"], frozenset({2}), 1)
    assert [(r.line, r.partial) for r in records_of(buffer.since(0))] == [
        ("c1", True),
        ("c2", False),
        ("d", False),
    ]
    assert records_of(buffer.since(4)) == [LogRecord(1.0, 0, "h", "stdout", "d", False, 1)]
    assert buffer.since(5) == []


def test_the_newest_record_stays_however_long() -> None:
    buffer = RecordBuffer(max_records=10, max_bytes=5)
    buffer.add(1.0, 0, "h", "stdout", ["x" * 8, "y" * 9], frozenset(), 1)
    assert [r.line for r in records_of(buffer.since(0))] == ["y" * 9]
    assert (buffer.count, buffer.size) == (1, 9)


def test_a_flood_keeps_memory_bounded_and_every_line_in_the_files(tmp_path: Path) -> None:
    # 200,000 lines in 1,000-line batches (what reads of ranks printing line by line give):
    # the buffer's memory stays within its bound, the files have every line.
    store = LogStore(tmp_path, {0: "n0"}, launcher_host="head", max_records=5_000)
    try:
        gc.collect()
        tracemalloc.start()
        for start in range(0, 200_000, 1_000):
            store.add_lines(0, "stdout", [f"line {i}" for i in range(start, start + 1_000)])
        gc.collect()
        held_bytes, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    assert store.held[0] == 5_000
    assert [r.line for r in store.records()] == [f"line {i}" for i in range(195_000, 200_000)]
    # 5,000 short strings and their lists: well under 2 MiB; 200,000 would be ~15 MiB.
    assert held_bytes < 2 << 20, held_bytes
    with open(tmp_path / "rank-0.log", encoding="utf-8") as f:
        assert sum(1 for _ in f) == 200_000


def test_storing_a_batch_makes_no_object_a_line(tmp_path: Path) -> None:
    # The head's cost a line: a batch is kept as it came, its records made when read.
    store = LogStore(tmp_path, {0: "n0"}, launcher_host="head")
    texts = [f"line {i}" for i in range(10_000)]
    try:
        gc.collect()
        tracemalloc.start()
        before, _ = tracemalloc.get_traced_memory()
        store.add_lines(0, "stdout", texts)
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        store.close()
    assert after - before < 16 << 10, after - before  # a record a line: over 1 MiB
    assert [r.line for r in store.records()] == texts
