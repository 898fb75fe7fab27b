"""A rank's traceback, placed back in the caller's source (pure but for ``linecache``).

cloudpickle sends a function's code by value with its file name blanked (``<dynamic-code>``, so
that the same function pickles to the same bytes wherever it was defined), and a rank has no
source for it anyway: its traceback names the line and the function only. The head still has
both. :func:`placed` puts each such frame of the function (or of a function defined inside it)
back at its file, with the source line, as a local traceback would show it; in a notebook,
that is the cell.
"""

from __future__ import annotations

import linecache
import re
from collections.abc import Callable, Iterator
from types import CodeType
from typing import Any

__all__ = ["placed"]

_FRAME = re.compile(r'^  File "<dynamic-code>", line (\d+), in (\S+)$')


def _codes(code: CodeType) -> Iterator[CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, CodeType):
            yield from _codes(const)


def _lines(code: CodeType) -> set[int]:
    return {line for _, _, line in code.co_lines() if line is not None}


def placed(text: str, fn: Callable[..., Any]) -> str:
    """``text`` (a formatted traceback from a rank) with the frames of ``fn``'s code at their
    file and line, each followed by its source line when this process has it."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType) or "<dynamic-code>" not in text:
        return text
    codes = list(_codes(code))
    out = []
    for line in text.splitlines(keepends=True):
        match = _FRAME.match(line.rstrip("\n"))
        found = None
        if match:
            number, name = int(match.group(1)), match.group(2)
            found = next((c for c in codes if c.co_name == name and number in _lines(c)), None)
        if match is None or found is None:
            out.append(line)
            continue
        out.append(f'  File "{found.co_filename}", line {number}, in {name}\n')
        source = linecache.getline(found.co_filename, number).strip()
        if source:
            out.append(f"    {source}\n")
    return "".join(out)
