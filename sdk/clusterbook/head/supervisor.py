"""The supervisor of a detached cluster: a process of its own that runs the cluster's head.

``Cluster(..., detached=True).start()`` calls :func:`launch_supervisor`, which starts
``python -m clusterbook.head.supervisor`` in a session of its own (an interrupt or the death of the
kernel does not reach it), hands it the cluster's spec on its stdin (never on disk: an SSH
key's passphrase may be in it) and waits for its first line: ready, or the error that stopped
the cluster from starting, raised again here. The supervisor then runs the cluster as a kernel
would (record, stop file, life span, requests of attached handles) until it stops, writing its
own messages to ``supervisor.log`` in the cluster's directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.head.control import rebuilt_error

__all__ = ["LOG_FILE", "launch_supervisor", "main"]

LOG_FILE = "supervisor.log"


def launch_supervisor(spec: Mapping[str, Any], cluster_id: str, run_dir: Path) -> int:
    """Start the supervisor of the cluster ``spec`` describes; return its pid once the
    cluster runs. Raises the error that kept it from starting."""
    try:
        envelope = json.dumps({"spec": dict(spec), "id": cluster_id}, default=_plain)
    except TypeError as exc:
        raise ConfigError(
            f"A detached cluster is made again by its supervisor from its arguments, which "
            f"must be plain values (text, numbers, lists, mappings, paths): {exc}."
        ) from exc
    log = open(run_dir / LOG_FILE, "ab")  # noqa: SIM115 - handed to the child, closed below
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "clusterbook.head.supervisor"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            cwd=os.getcwd(),
        )
    finally:
        log.close()
    assert proc.stdin is not None
    assert proc.stdout is not None
    with proc.stdin:
        proc.stdin.write(envelope.encode() + b"\n")
    first = proc.stdout.readline()
    proc.stdout.close()
    try:
        answer = json.loads(first) if first else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("ready"):
        threading.Thread(target=proc.wait, daemon=True).start()  # reaped if it ends first
        return proc.pid
    proc.wait()
    if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
        raise rebuilt_error(answer["error"])
    tail = (run_dir / LOG_FILE).read_text(errors="replace")[-2000:]
    raise ClusterError(
        f"The supervisor of cluster {cluster_id} exited ({proc.returncode}) before the "
        f"cluster ran; {run_dir / LOG_FILE} ends with:\n{tail}"
    )


def _plain(value: object) -> object:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(f"{value!r} ({type(value).__name__}) is not one")


def main() -> int:
    """Run the cluster whose spec arrives on stdin until it stops."""
    from clusterbook.cluster.facade import Cluster

    for sig in (signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    envelope = json.loads(sys.stdin.readline())
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # the kernel's pipe, which may go away: nothing reads it again
    os.close(null)
    reply = sys.stdout
    try:
        cluster = Cluster.from_spec(envelope["spec"])
        cluster._options = replace(cluster._options, id=envelope["id"], own_run_dir=False)
        cluster._supervised = True
        stopped = threading.Event()
        cluster.subscribe(lambda snap: stopped.set() if snap.state == "stopped" else None)
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=cluster.stop).start())
        cluster.start(progress=False)
    except ClusterError as exc:
        reply.write(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}}))
        reply.write("\n")
        reply.flush()
        return 1
    reply.write(json.dumps({"ready": cluster.id}) + "\n")
    reply.flush()
    # From now on, what the cluster prints goes to the log, as its errors do.
    os.dup2(2, 1)
    while not stopped.wait(1.0):
        if cluster.state == "stopped":
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
