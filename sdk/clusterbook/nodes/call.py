"""The head's way to run a node task on one node, whatever carries it (an SSH session, a far
agent's sshd, a one-task ``srun`` step): a :class:`Call`.

It imports nothing of clusterbook, so that every layer that asks nodes for something (a job
kept for inspection, files, commands) can take one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

__all__ = ["Call"]


class Call(Protocol):
    """Runs a node task on one node: ``call(task, args, timeout)`` returns the task's result;
    ``frames=`` (bytes to send after the request) and ``on_frame=`` (told each frame of the
    reply) as ``NodeSession.call`` takes them."""

    def __call__(
        self, task: str, args: Mapping[str, Any], timeout: float, **streams: Any
    ) -> Any: ...
