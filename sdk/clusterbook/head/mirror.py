"""A copy of a cluster's directory somewhere else: ``work_dir="sftp://host/path"`` (any fsspec
URL: ``s3://``, ``gs://``, ``sftp://``, ``file://``...).

The cluster's own directory stays local (jobs write their logs there as they run, at the
speed of a local disk); the mirror copies its record (``cluster.json``) each time it is
rewritten, and a job's files (``job.json``, ``rank-N.log``, ``launcher.log``,
``result.json``) once the job has ended, on a thread of its own so that a slow store never
slows the cluster. ``stop()`` waits for what is queued (up to :data:`FLUSH_TIMEOUT`).
The control token never goes there: the mirror is for reading.

SSH hosts are checked as the cluster's own SSH connections are: the key must be in
``known_hosts`` (``work_dir_options={"known_hosts": PATH}``, default the user's); fsspec's
own default, trusting any key, is never used.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterbook.errors import ClusterError, ConfigError

__all__ = ["FLUSH_TIMEOUT", "JOB_FILES", "Mirror", "is_url"]

FLUSH_TIMEOUT = 30.0
JOB_FILES = ("job.json", "result.json", "launcher.log", "hostfile")
_log = logging.getLogger("clusterbook.head.mirror")


def is_url(text: str) -> bool:
    """Whether ``text`` names a place by URL (``scheme://...``) rather than a local path."""
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme.isidentifier()


class Mirror:
    """Copies of a cluster's record and finished jobs at ``url`` (see the module docstring)."""

    def __init__(self, url: str, options: Mapping[str, Any] | None = None) -> None:
        try:
            import fsspec  # type: ignore[import-untyped]
        except ImportError as exc:
            raise ConfigError(
                f"work_dir={url!r} needs fsspec; pip install fsspec (and the package of its "
                "protocol, like s3fs), or give a local directory."
            ) from exc
        self.url = url
        opts = dict(options or {})
        scheme = url.partition("://")[0]
        if scheme in ("sftp", "ssh"):
            opts = _checked_ssh(url, opts)
        try:
            self._fs, self._root = fsspec.core.url_to_fs(url, **opts)
            self._fs.makedirs(self._root, exist_ok=True)
        except ClusterError:
            raise
        except Exception as exc:
            raise ConfigError(f"Cannot use work_dir={url!r}: {type(exc).__name__}: {exc}") from exc
        self._queue: queue.Queue[tuple[str, Any] | None] = queue.Queue()
        self._done: set[str] = set()
        self._thread = threading.Thread(target=self._run, name="clusterbook-mirror", daemon=True)
        self._thread.start()

    def record(self, text: str) -> None:
        """Copy the cluster's record (its latest text wins)."""
        self._queue.put(("record", text))

    def job(self, directory: Path) -> None:
        """Copy the files of the job in ``directory`` (once: it has ended)."""
        if str(directory) not in self._done:
            self._done.add(str(directory))
            self._queue.put(("job", directory))

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Copy what is queued, then stop (after ``timeout`` seconds at most)."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive():
            _log.warning("The copy to %s did not finish in %g s.", self.url, timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, value = item
            if kind == "record":
                # Only the newest record matters: skip those already replaced in the queue.
                while not self._queue.empty():
                    nxt = self._queue.queue[0]
                    if nxt is None or nxt[0] != "record":
                        break
                    _, value = nxt
                    self._queue.get()
            try:
                if kind == "record":
                    self._write(f"{self._root}/cluster.json", value.encode())
                else:
                    self._copy_job(value)
            except Exception as exc:
                _log.warning("Could not copy %s to %s: %s", kind, self.url, exc)

    def _write(self, path: str, data: bytes) -> None:
        with self._fs.open(path, "wb") as f:
            f.write(data)

    def _copy_job(self, directory: Path) -> None:
        target = f"{self._root}/jobs/{directory.name}"
        self._fs.makedirs(target, exist_ok=True)
        for path in sorted(directory.iterdir()):
            if path.name in JOB_FILES or (path.name.startswith("rank-") and path.suffix == ".log"):
                self._fs.put_file(str(path), f"{target}/{path.name}")


def _checked_ssh(url: str, opts: dict[str, Any]) -> dict[str, Any]:
    """Options for fsspec's SFTP file system that check the host's key against known_hosts."""
    from urllib.parse import urlsplit

    import paramiko

    from clusterbook.ssh.hostkeys import HostKey, make_policy

    known_hosts = opts.pop("known_hosts", None)
    policy = make_policy(opts.pop("host_keys", None), known_hosts)
    port = int(opts.get("port") or urlsplit(url).port or 22)

    class Checked(paramiko.MissingHostKeyPolicy):
        # fsspec's client loads no known_hosts of its own: every key comes here.
        def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
            policy.check(hostname, port, HostKey(key.get_name(), key.get_base64()))

    if "host_key_policy" in opts:
        raise ConfigError(
            f"work_dir={url!r}: give known_hosts= (or host_keys=) in work_dir_options; host "
            "keys are checked as for the cluster's own SSH hosts."
        )
    opts["host_key_policy"] = Checked()
    return opts
