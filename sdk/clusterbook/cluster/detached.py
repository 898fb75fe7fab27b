"""What a detached cluster's supervisor runs: ``python -m clusterbook.cluster.detached``.

The starter (:func:`clusterbook.head.supervisor.launch_supervisor`) hands it the cluster's spec
and id on its stdin. It makes the cluster's head again from them, with the id and directory the
starter claimed (a :class:`~clusterbook.cluster.local_head.LocalHead`), runs it as a
kernel would until it stops, and ignores the interrupts and hang-ups of the session it came from;
SIGTERM stops the cluster.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from dataclasses import replace

from clusterbook.cluster.local_head import LocalHead
from clusterbook.cluster.options import split_spec
from clusterbook.errors import ClusterError
from clusterbook.head.supervisor import answer_error, answer_ready

__all__ = ["main"]


def main() -> int:
    """Run the cluster whose spec arrives on stdin until it stops."""
    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    envelope = json.loads(sys.stdin.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the kernel's pipe, which may go away: nothing reads it again
    os.close(null)
    try:
        provider, options, spec = split_spec(envelope["spec"])
        # The id and directory the starter claimed: this one is made again, not anew.
        options = replace(options, id=envelope["id"], own_run_dir=False)
        head = LocalHead(provider, options, spec=spec, supervised=True)
        stopped = threading.Event()
        head.subscribe(lambda snap: stopped.set() if snap.state == "stopped" else None)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=head.stop).start())
        head.start(progress=False)
    except ClusterError as exc:
        answer_error(exc)
        return 1
    answer_ready(head.id)
    while not stopped.wait(1.0):
        if head.state == "stopped":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
