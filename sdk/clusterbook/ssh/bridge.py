"""Bytes between a socket and an ssh channel: :func:`pump` copies them both ways, and
:func:`bridge` makes a socket of a channel (what code that wants a socket is given: a control
client whose head is reached through a command on another machine, say).

No paramiko here: a channel is anything with ``recv``, ``sendall``, ``shutdown_write``,
``fileno``, ``closed`` and ``close``, as paramiko's is.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Any

__all__ = ["bridge", "pump"]


def pump(conn: socket.socket, channel: Any) -> None:
    """Copy bytes both ways between ``conn`` and ``channel`` until both ends have closed."""
    open_ends = {conn, channel}
    while open_ends:
        ready, _, _ = select.select(list(open_ends), [], [], 60)
        for end in ready:
            other = channel if end is conn else conn
            data = end.recv(65536)
            if not data:
                open_ends.discard(end)
                with contextlib.suppress(OSError):
                    if other is conn:
                        conn.shutdown(socket.SHUT_WR)
                    else:
                        channel.shutdown_write()
                continue
            other.sendall(data)
        if channel.closed:
            return


def bridge(channel: Any, name: str) -> socket.socket:
    """A socket whose other end is ``channel``: what is sent on it goes to the channel, what
    the channel receives can be read from it, and each side's end reaches the other. A thread
    named ``name`` copies the bytes; it closes the channel once both ends are closed, or one
    of them fails."""
    mine, theirs = socket.socketpair()

    def run() -> None:
        try:
            pump(theirs, channel)
        except OSError:
            pass  # the channel or the socket went away: both are closed below
        finally:
            theirs.close()
            channel.close()

    try:
        threading.Thread(target=run, name=name, daemon=True).start()
    except BaseException:
        mine.close()
        theirs.close()
        raise
    return mine
