"""A cluster's place on a node: ``install`` its files and key line, its ``status``, and its
leaving: ``cleanup`` (by the head) and ``release`` (by the node's agent, when it lost the
head), which remove what ``install`` and ``put`` made, and stop the cluster's processes."""

import base64
import contextlib
import json
import os
import socket

from .common import (
    STATUS_FILE,
    TAG_SEP,
    Args,
    Reply,
    _inside,
    _rmtree,
    cluster_dir,
    worker_dir,
    write_atomic,
)
from .files import _put_log, _remove_put
from .procs import kill_tagged, stop_jobs


def install(args: Args) -> Reply:
    directory = cluster_dir(args["cluster_id"])
    os.makedirs(directory, mode=0o700, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, (mode, data) in sorted(args["files"].items()):
        path = _inside(directory, name)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        write_atomic(path, base64.b64decode(data), int(mode, 8))
    for name, target in sorted(args.get("links", {}).items()):
        # A link to this node's own environment, at the same path on every node.
        path = _inside(directory, name)
        tmp = f"{path}.{os.getpid()}.tmp"
        os.symlink(target, tmp)
        os.replace(tmp, path)
    line = args.get("authorized_key")
    if line:
        # This node is in the cluster; nodes that share this home (NFS) each have a marker.
        write_atomic(_marker(directory), b"", 0o600)
        ssh_dir = os.path.join(os.path.expanduser("~"), ".ssh")
        os.makedirs(ssh_dir, mode=0o700, exist_ok=True)
        keys = os.path.join(ssh_dir, "authorized_keys")
        try:
            with open(keys, "rb") as f:
                old = f.read()
            mode = os.stat(keys).st_mode & 0o777
        except FileNotFoundError:
            old, mode = b"", 0o600
        lines = old.decode("utf-8", "replace").splitlines()
        if line not in lines:
            text = old.decode("utf-8", "replace")
            if text and not text.endswith("\n"):
                text += "\n"
            write_atomic(keys, (text + line + "\n").encode(), mode)
    return {"home": os.path.expanduser("~"), "dir": directory}


def _leave_status(data: bytes) -> bool:
    """Give the worker that serves this host, if one does, the cluster's status ``data``."""
    directory = worker_dir()
    if not os.path.isdir(directory):
        return False
    write_atomic(os.path.join(directory, STATUS_FILE), data, 0o644)
    return True


def status(args: Args) -> Reply:
    data = json.dumps(args["status"]).encode()
    write_atomic(_inside(cluster_dir(args["cluster_id"]), STATUS_FILE), data, 0o644)
    return {"served": _leave_status(data)}


def _marker(directory: str) -> str:
    return _inside(directory, f"node-{socket.gethostname()}")


def _remove_key_lines(tag: str | None) -> int:
    """Remove the lines ending in `` TAG`` from ``~/.ssh/authorized_keys``; return how many."""
    keys = os.path.join(os.path.expanduser("~"), ".ssh", "authorized_keys")
    if not tag or not os.path.exists(keys):
        return 0
    with open(keys, "rb") as f:
        lines = f.read().decode("utf-8", "replace").splitlines()
    kept = [ln for ln in lines if not ln.endswith(" " + tag)]
    removed = len(lines) - len(kept)
    if removed:
        data = ("\n".join(kept) + "\n" if kept else "").encode()
        write_atomic(keys, data, os.stat(keys).st_mode & 0o777)
    return removed


def cleanup(args: Args) -> Reply:
    cluster_id = args["cluster_id"]
    grace = float(args.get("grace", 2.0))
    killed = kill_tagged([cluster_id + TAG_SEP], grace, prefix=True, daemons=True)
    removed = _remove_key_lines(args.get("tag"))
    directory = cluster_dir(cluster_id)
    _remove_put(directory)
    _rmtree(directory)
    # Last: a worker that serves this host and sees "done" exits, and may take its sshd along.
    served = "status" in args and _leave_status(json.dumps(args["status"]).encode())
    return {
        "killed": killed,
        "keys_removed": removed,
        "dir_removed": not os.path.exists(directory),
        "served": served,
    }


def release(args: Args) -> Reply:
    """Stop the cluster's jobs on this node, remove this node's marker and what ``put`` made
    here; then, unless a marker of another node in the cluster is left (a home shared with
    nodes still in it), the cluster's key lines and directory too, as ``cleanup`` would."""
    cluster_id = args["cluster_id"]
    killed = stop_jobs(cluster_id, float(args.get("grace", 1.0)))
    directory = cluster_dir(cluster_id)
    with contextlib.suppress(OSError):
        os.unlink(_marker(directory))
    _remove_put(directory)
    with contextlib.suppress(OSError):
        os.unlink(_put_log(directory))
    try:
        others = sorted(n for n in os.listdir(directory) if n.startswith("node-"))
    except FileNotFoundError:
        others = []
    if others:
        return {"killed": killed, "keys_removed": 0, "kept_for": others}
    removed = _remove_key_lines(args.get("tag"))
    _rmtree(directory)
    return {"killed": killed, "keys_removed": removed, "kept_for": []}
