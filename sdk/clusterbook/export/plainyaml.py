"""YAML for plain data, without PyYAML: what a Kubernetes manifest holds (mappings with string
keys, lists, strings, whole numbers, booleans, None), in block style.

A string is written plain only when no YAML reader can take it for anything else: it starts
with a letter, ``_`` or ``/``, holds only letters, digits and ``_./-``, and is none of YAML
1.1's booleans and nulls (``yes``, ``off``, ``null``, ... which go-yaml, under ``kubectl``,
still reads as such). A string of several lines is a literal block (``|``) when it can be one
exactly; every other string is double-quoted, with escapes for what is not printable and for
the characters YAML 1.1 takes for line breaks (U+0085, U+2028, U+2029).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = ["dump"]

_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./-]*")
# YAML 1.1 resolves these plain words to booleans or null (YAML 1.2 only some of them).
_BOOLEANS = ("y", "yes", "n", "no", "true", "false", "on", "off")
_RESERVED = {
    spelled for word in (*_BOOLEANS, "null") for spelled in (word, word.capitalize(), word.upper())
}
_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\0": "\\0"}
# Line breaks to YAML 1.1 besides \n and \r: inside quotes they would fold into a space.
_BREAKS = {"\x85", "\u2028", "\u2029"}
# A byte order mark is printable to YAML but means something else at the start of a line.
_BOM = "\ufeff"
_INDENT = "  "


def dump(data: object) -> str:
    """``data`` as a YAML document (ending in a newline); a TypeError for values other than
    mappings with string keys, lists and tuples, str, int, bool and None."""
    if isinstance(data, Mapping | list | tuple) and data:
        return "".join(f"{line}\n" for line in _block(data, ""))
    return _inline(data) + "\n"


def _block(data: Mapping[object, object] | Sequence[object], indent: str) -> list[str]:
    """The lines of a non-empty mapping or list at ``indent``."""
    lines: list[str] = []
    if isinstance(data, Mapping):
        for key, value in data.items():
            if not isinstance(key, str):
                raise TypeError(f"mapping keys must be strings, got {key!r}")
            lines += _entry(f"{indent}{_quoted_or_plain(key)}:", value, indent + _INDENT)
        return lines
    for item in data:
        if isinstance(item, Mapping) and item:
            # "- first: ..." then the other keys under it, two columns in.
            inner = _block(item, indent + _INDENT)
            lines += [f"{indent}- {inner[0][len(indent) + len(_INDENT) :]}", *inner[1:]]
        else:
            lines += _entry(f"{indent}-", item, indent + _INDENT)
    return lines


def _entry(head: str, value: object, indent: str) -> list[str]:
    """``head`` (``key:`` or ``-``) with its value: inline, or as the block under it."""
    if isinstance(value, Mapping | list | tuple) and value:
        return [head, *_block(value, indent)]
    if isinstance(value, str) and (literal := _literal(value, indent)) is not None:
        return [f"{head} {literal[0]}", *literal[1:]]
    return [f"{head} {_inline(value)}"]


def _inline(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(int(value))  # an IntEnum too: its number
    if isinstance(value, str):
        return _quoted_or_plain(value)
    if isinstance(value, Mapping):
        if value:
            raise TypeError("a non-empty mapping has no inline form here")
        return "{}"
    if isinstance(value, list | tuple):
        if value:
            raise TypeError("a non-empty list has no inline form here")
        return "[]"
    raise TypeError(f"cannot write {type(value).__name__} {value!r} as YAML")


def _quoted_or_plain(text: str) -> str:
    if _PLAIN.fullmatch(text) and text not in _RESERVED:
        return text
    return '"' + "".join(_escape(c) for c in text) + '"'


def _escape(char: str) -> str:
    if char in _ESCAPES:
        return _ESCAPES[char]
    code = ord(char)
    if char in _BREAKS or char == _BOM or not _printable(code):
        if code <= 0xFF:
            return f"\\x{code:02x}"
        return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"
    return char


def _printable(code: int) -> bool:
    """YAML's c-printable (tab and line breaks aside, which callers handle)."""
    return (
        0x20 <= code <= 0x7E
        or 0xA0 <= code <= 0xD7FF
        or 0xE000 <= code <= 0xFFFD
        or 0x10000 <= code <= 0x10FFFF
    )


def _literal(text: str, indent: str) -> list[str] | None:
    """``text`` as a literal block scalar (``|``, ``|-`` or ``|+`` and its lines at
    ``indent``), or None when a block could not hold it exactly: a single line; a first
    non-empty line that starts with a space (it would set the block's indentation); a
    carriage return, a character YAML would take for a line break, or one not printable."""
    if "\n" not in text.rstrip("\n"):
        return None
    if any(
        c in _BREAKS or c in "\r" + _BOM or (c not in "\t\n" and not _printable(ord(c)))
        for c in text
    ):
        return None
    body = text.rstrip("\n")
    if body.lstrip("\n").startswith(" "):
        return None
    trailing = len(text) - len(body)
    chomp = "-" if trailing == 0 else "" if trailing == 1 else "+"
    lines = body.split("\n") + [""] * (trailing - 1 if trailing > 1 else 0)
    return [f"|{chomp}", *(f"{indent}{line}" if line else "" for line in lines)]
