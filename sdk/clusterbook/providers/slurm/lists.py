"""Slurm's compressed lists, read without Slurm: host lists (``SLURM_JOB_NODELIST``, like
``node[01-03,7],gpu1``) and counts per node (``SLURM_JOB_CPUS_PER_NODE``, like ``4(x2),2``).

Pure functions: :func:`expand_nodelist` is what ``scontrol show hostnames`` prints for the
common forms (ranges keep their zero padding; several bracket groups in one name give every
combination, as Slurm's hostlist does); where Slurm's own ``scontrol`` is at hand it is asked
first (:mod:`clusterbook.providers.environment.detect`).
"""

from __future__ import annotations

import itertools
import re

from clusterbook.errors import ConfigError

__all__ = ["expand_counts", "expand_nodelist"]

_NAME_PART = re.compile(r"[A-Za-z0-9_.-]+")
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_COUNT = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_FIX = "write it like 'node[1-3,5],gpu1' (as Slurm's SLURM_JOB_NODELIST is)"


def expand_nodelist(text: str, name: str = "SLURM_JOB_NODELIST") -> list[str]:
    """Every host of a Slurm host list, in order: ``"a[1-3,5],b"`` gives ``["a1", "a2",
    "a3", "a5", "b"]``, ``"n[08-10]"`` gives ``["n08", "n09", "n10"]``. A list that does not
    parse is a :class:`ConfigError` naming ``name``, the value and the form."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"{name}={text!r} is empty; {_FIX}.")
    hosts: list[str] = []
    for entry in _top_level_split(text.strip(), name):
        hosts.extend(_expand_entry(entry, text, name))
    return hosts


def _top_level_split(text: str, name: str) -> list[str]:
    """``text`` cut at the commas outside brackets."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if depth not in (0, 1):
            raise ConfigError(f"{name}={text!r} has unbalanced brackets; {_FIX}.")
        if char == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"{name}={text!r} has an unclosed '['; {_FIX}.")
    entries.append(text[start:])
    if any(not e for e in entries):
        raise ConfigError(f"{name}={text!r} has an empty entry; {_FIX}.")
    return entries


def _expand_entry(entry: str, text: str, name: str) -> list[str]:
    """The hosts of one entry: literal parts and bracket groups, every combination."""
    if "[]" in entry:
        raise ConfigError(f"{name}={text!r} has an empty '[]'; {_FIX}.")
    parts: list[list[str]] = []
    for literal, group in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", entry):
        if literal:
            if not _NAME_PART.fullmatch(literal):
                raise ConfigError(
                    f"{name}={text!r}: {literal!r} is not part of a host name; {_FIX}."
                )
            parts.append([literal])
        if group:
            parts.append(_expand_group(group, text, name))
    return ["".join(p) for p in itertools.product(*parts)]


def _expand_group(group: str, text: str, name: str) -> list[str]:
    out: list[str] = []
    for item in group.split(","):
        match = _RANGE.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"{name}={text!r}: [{group}] holds {item!r}, which is not a number or a range "
                f"like 1-3; {_FIX}."
            )
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first):
            raise ConfigError(f"{name}={text!r}: the range {item!r} runs backwards; {_FIX}.")
        width = len(first) if first.startswith("0") else 1
        out.extend(str(n).zfill(width) for n in range(int(first), int(last) + 1))
    return out


def expand_counts(text: str, name: str = "SLURM_JOB_CPUS_PER_NODE") -> list[int]:
    """A Slurm list of counts per node: ``"4(x2),2"`` gives ``[4, 4, 2]``. Anything else (a
    count below 1 too) is a :class:`ConfigError` naming ``name`` and the value."""
    counts: list[int] = []
    for item in str(text).strip().split(","):
        match = _COUNT.fullmatch(item.strip())
        if match is None or int(match.group(1)) < 1 or match.group(2) == "0":
            raise ConfigError(
                f"{name}={text!r} is not a list of counts like '4(x2),2' (4 on each of 2 "
                "nodes, then 2); set it as Slurm does, or give the slots yourself (slots=N)."
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts
