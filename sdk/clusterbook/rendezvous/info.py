"""A node's report as the rendezvous state holds it: the JSON text its node sent, read on use.

A node sends its report (facts at join, load with every heartbeat) with its steps; the store
keeps it as the text it came as and writes it into the state as a JSON string, so that a
round of many nodes neither parses every report in the store nor encodes it again at every
write, and a state holds one string per node instead of a tree of objects per node (which the
garbage collector of the head's process would walk again and again). Whoever reads a report
(the head, rank 0's address in a view, torchrun's store address) parses it on first use, and
text that is no JSON object reads as an empty report: a report never makes a state corrupt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

__all__ = ["Info"]


class Info(Mapping[str, Any]):
    """A node's report: ``text``, the JSON of an object, and read as that object (empty when
    it is not one). Equal to another report of the same text, or to a mapping of its items."""

    __slots__ = ("_data", "_quoted", "text", "version")

    def __init__(self, text: str) -> None:
        self.text = text
        self._data: dict[str, Any] | None = None
        self._quoted: str | None = None
        self.version = 0  # the token of the write that stored it, where a store tells

    @property
    def quoted(self) -> str:
        """The text as a JSON string (escaped once: every encoding of the state reuses it)."""
        quoted = self._quoted
        if quoted is None:
            quoted = self._quoted = encode_basestring_ascii(self.text)
        return quoted

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Info:
        """The report of ``data`` (kept as it is when it is one already)."""
        if isinstance(data, Info):
            return data
        return cls(json.dumps(dict(data), separators=(",", ":")))

    @property
    def data(self) -> dict[str, Any]:
        """The report as a dict (parsed once; empty when the text is no JSON object)."""
        data = self._data
        if data is None:
            try:
                parsed = json.loads(self.text)
            except ValueError:
                parsed = None
            data = self._data = parsed if isinstance(parsed, dict) else {}
        return data

    def __getitem__(self, key: str) -> Any:
        return self.data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Info):
            return self.text == other.text or self.data == other.data
        if isinstance(other, Mapping):
            return self.data == dict(other.items())
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a mapping, as dict

    def __repr__(self) -> str:
        return f"Info({self.text!r})"
