"""What a handle on a cluster another process runs holds open, let go of together: :class:`Held`.

An :class:`~clusterbook.cluster.remote.attached.AttachedCluster` holds its directory (attached
over ssh: a connection to that machine), a connection to the cluster's head once it asked
something of it, and the thread that follows its record for subscribers. Its ``close()`` lets go
of them, and so does its finalizer when a handle is dropped without it: what it holds is here,
apart from the handle, so that the finalizer does not keep the handle alive.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from clusterbook.cluster.remote.rundir import ClusterDir
from clusterbook.head.control import ControlClient

__all__ = ["Held"]


class Held:
    """What a handle holds open: its directory (over ssh: a connection), its connection to the
    head, and the thread that follows its record. Let go of by the handle's ``close()``, or its
    finalizer: nothing here refers to the handle."""

    def __init__(self, where: ClusterDir) -> None:
        self.dir = where
        self.client: ControlClient | None = None
        self._stop = threading.Event()
        self._poller: threading.Thread | None = None

    def follow(self, poll: Callable[..., None], *args: Any) -> None:
        """Start ``poll(*args, stop)`` on a thread of its own, once (``stop`` is set when
        the handle lets go)."""
        if self._poller is None:
            self._poller = threading.Thread(
                target=poll, args=(*args, self._stop), name="clusterbook-attached", daemon=True
            )
            self._poller.start()

    def close_client(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            client.close()

    def close(self) -> None:
        self._stop.set()
        self.close_client()
        self.dir.close()
