"""The wrapper every rank runs under, and the marker lines it writes.

Each rank runs as ``sh -c WRAPPER cb-rank PROGRAM ARGS...``. The wrapper is plain POSIX sh
(about 1 ms), needs no file on the node, and reports on the rank's stderr, through the
launcher's own output forwarding (so it works across hosts too):

- ``<RS>CB start HOST PID`` when the program starts, with the node's real hostname;
- ``<RS>CB exit CODE`` when it ends (128+N when killed by signal N).

It survives the signals mpirun forwards (which reach the program as well, being sent to the
process group) so that it can still report the program's exit code; the shell's own
"Terminated" notice is silenced (the exit code says it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HOOK_DIR", "MARK", "WRAPPER", "Marker", "parse_marker", "wrap_argv"]

MARK = "\x1eCB"
HOOK_DIR = str(Path(__file__).parent / "_rankhook")

WRAPPER = """\
read h </proc/sys/kernel/hostname 2>/dev/null || h=$(uname -n)
trap : TERM INT HUP QUIT USR1 USR2
"$@" <&0 &
c=$!
printf '\\036CB start %s %s\\n' "$h" "$c" >&2
while :; do wait "$c" 2>/dev/null; r=$?; kill -0 "$c" 2>/dev/null || break; done
printf '\\036CB exit %s\\n' "$r" >&2
exit "$r"
"""

_MARKER_RE = re.compile(r"\x1eCB (start|exit) (\S+)(?: (\d+))?$")


@dataclass(frozen=True, slots=True)
class Marker:
    """A parsed marker line: ``kind`` is ``start`` (host, pid) or ``exit`` (code)."""

    kind: str
    host: str | None = None
    pid: int | None = None
    code: int | None = None


def wrap_argv(argv: list[str]) -> list[str]:
    """The argv that runs ``argv`` under the rank wrapper."""
    return ["/bin/sh", "-c", WRAPPER, "cb-rank", *argv]


def parse_marker(line: str) -> tuple[str, Marker | None]:
    """Split a stderr line into the text before a marker and the marker, if there is one."""
    at = line.find(MARK)
    if at < 0:
        return line, None
    m = _MARKER_RE.fullmatch(line, at)
    if m is None:
        return line, None
    kind, first, second = m.groups()
    if kind == "start":
        return line[:at], Marker("start", host=first, pid=int(second) if second else None)
    try:
        return line[:at], Marker("exit", code=int(first))
    except ValueError:
        return line, None
