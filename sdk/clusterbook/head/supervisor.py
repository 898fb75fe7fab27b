"""The supervisor of a detached cluster: a process of its own that runs the cluster's head.

``Cluster(..., detached=True).start()`` calls :func:`launch_supervisor`, which starts
``python -m clusterbook.cluster.detached`` (:data:`SUPERVISOR`) in a session of its own (an
interrupt or the death of the kernel does not reach it), hands it the cluster's spec on its stdin
(never on disk: an SSH key's passphrase may be in it) and waits for its first line: ready, or the
error that stopped the cluster from starting, raised again here. The supervisor then runs the
cluster as a kernel would (record, stop file, life span, requests of attached handles) until it
stops, writing its own messages to ``supervisor.log`` in the cluster's directory. What it runs
is the cluster layer's (a head made again from the spec); what starts it, and how the two speak
(:func:`answer_ready`, :func:`answer_error`), is here.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.head.control import rebuilt_error

__all__ = ["LOG_FILE", "SUPERVISOR", "answer_error", "answer_ready", "launch_supervisor"]

LOG_FILE = "supervisor.log"
#: The module a supervisor runs (``python -m``).
SUPERVISOR = "clusterbook.cluster.detached"


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
            [sys.executable, "-m", SUPERVISOR],
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
    if isinstance(value, datetime.timedelta):  # a duration, as the seconds it stands for
        return value.total_seconds()
    raise TypeError(f"{value!r} ({type(value).__name__}) is not one")


def answer_ready(cluster_id: str) -> None:
    """Tell the starter the cluster runs (the supervisor's first line on its stdout); from
    then on, what the cluster prints goes to the log, as its errors do."""
    sys.stdout.write(json.dumps({"ready": cluster_id}) + "\n")
    sys.stdout.flush()
    os.dup2(2, 1)


def answer_error(exc: ClusterError) -> None:
    """Tell the starter the cluster could not start: ``exc``, raised again there."""
    sys.stdout.write(json.dumps({"error": {"type": type(exc).__name__, "message": str(exc)}}))
    sys.stdout.write("\n")
    sys.stdout.flush()
