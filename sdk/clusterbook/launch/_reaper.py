"""The guard process (run as a script with ``python -S``, so it imports nothing else).

It reads ``+ TOKEN`` / ``- TOKEN`` lines from stdin. At end of input, which means the process
that started it has died, it kills every process tagged with a token still registered.
"""

import contextlib
import os
import signal
import sys
import time

ENV = "CLUSTERBOOK_JOB"


def tagged(tokens):  # type: ignore[no-untyped-def]
    """Pids of live processes whose environment has ``CLUSTERBOOK_JOB`` set to a token."""
    marks = {f"{ENV}={t}".encode() for t in tokens}
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for pid in entries:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marks.intersection(f.read().split(b"\0")):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def kill_tagged(tokens, grace):  # type: ignore[no-untyped-def]
    """SIGTERM the tagged processes, SIGKILL those still there after ``grace`` seconds."""
    for sig, pause in ((signal.SIGTERM, grace), (signal.SIGKILL, 0.0)):
        pids = tagged(tokens)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + pause
        while pids and time.monotonic() < deadline:
            time.sleep(0.05)
            pids = tagged(tokens)


def main() -> None:
    tokens = set()
    for line in sys.stdin:
        op, _, token = line.strip().partition(" ")
        if op == "+":
            tokens.add(token)
        else:
            tokens.discard(token)
    if tokens:
        kill_tagged(tokens, 1.0)


if __name__ == "__main__":
    main()
