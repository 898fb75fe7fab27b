"""Widget clicks handled while a cell blocks: the ``busy`` entry point's pump.

A kernel reads its shell messages (cells to run, widget clicks, completions, ...) on the
thread that runs the cell, one after the other, so a cell blocked in ``job.wait()`` holds
every click until it ends. While clusterbook's own waits block
(:mod:`clusterbook.waiting`), they call a :class:`Pump`, which takes the messages that came
meanwhile from the kernel's queue: the comm messages (``comm_open``, ``comm_msg``,
``comm_close``: what widgets send) are handled at once, as ipykernel itself handles them
beside a running async cell; every other message is handed back to the kernel's own
handling, in the order it came, to run once the cell has ended, as it would have. (What the
kernel read before the cell blocked, as the cell started, is the kernel's already: a click
sent in that instant waits for the cell.)

:func:`kernel_inbox` reaches the main shell's queue of ipykernel 7 (the version this was
written against: 7.4); where the kernel lacks what it needs (another ipykernel, a subshell's
thread, another kernel), :func:`busy` answers None and waits block as they always did.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Protocol

from clusterbook_widgets.notebook import is_notebook_shell, running_shell

__all__ = ["COMM_TYPES", "Inbox", "KernelInbox", "Pump", "busy", "kernel_inbox"]

_log = logging.getLogger("clusterbook")

#: What widgets send, which the pump handles at once.
COMM_TYPES = frozenset({"comm_open", "comm_msg", "comm_close"})

#: Messages one pump takes at most, so that a flood of clicks cannot hold the wait.
_AT_MOST = 100


class Inbox(Protocol):
    """A kernel's queue of shell messages, as the pump needs it."""

    def receive(self) -> Any | None:
        """The next message that came (without waiting), or None when none is left."""

    def kind(self, message: Any) -> str:
        """The message's type (``"comm_msg"``, ``"execute_request"``, ...)."""

    def handle(self, message: Any) -> None:
        """Handle the message now, on this thread."""

    def defer(self, message: Any) -> None:
        """Hand the message back to the kernel's own handling, after those deferred
        before it."""


class Pump:
    """Handles the widget messages of ``inbox`` now and defers every other (see the
    module). A message whose type cannot be read is deferred (the kernel's own handling says
    what is wrong with it); one whose handling fails is logged, and the pump goes on."""

    def __init__(self, inbox: Inbox, *, at_most: int = _AT_MOST) -> None:
        self.inbox = inbox
        self.at_most = at_most

    def __call__(self) -> None:
        for _ in range(self.at_most):
            message = self.inbox.receive()
            if message is None:
                return
            taken = False  # handled (or begun) or deferred: the kernel will not lose it
            try:
                try:
                    kind = self.inbox.kind(message)
                except Exception:
                    kind = ""  # the kernel's own handling says what is wrong with it
                if kind not in COMM_TYPES:
                    taken = True
                    self.inbox.defer(message)
                    continue
                taken = True
                try:
                    self.inbox.handle(message)
                except Exception:
                    _log.exception("clusterbook could not handle a %s while a cell waited", kind)
            except BaseException:
                # An interrupt between taking a message and passing it on: the kernel gets it
                # back, as if it had never been taken.
                if not taken:
                    self.inbox.defer(message)
                raise


class KernelInbox:
    """The main shell's queue of an ipykernel 7 kernel (see :func:`kernel_inbox`)."""

    def __init__(self, kernel: Any, stream: Any) -> None:
        import zmq  # there where a kernel runs

        self._kernel = kernel
        self._stream = stream
        self._again = zmq.Again
        self._noblock = zmq.NOBLOCK

    def receive(self) -> Any | None:
        try:
            return self._stream.socket.recv_multipart(self._noblock, copy=False)
        except self._again:
            return None

    def kind(self, message: Any) -> str:
        session = self._kernel.session
        _, frames = session.feed_identities(message, copy=False)
        # content=False: a look that does not count as reading it (its signature is checked
        # but not remembered), so that the kernel can read it later.
        return str(session.deserialize(frames, content=False, copy=False)["header"]["msg_type"])

    def handle(self, message: Any) -> None:
        """What ipykernel does with a comm message beside a running cell, on this thread: the
        message becomes the shell's parent while its handler runs (what the handler sends
        answers it), then the cell's parent is back (what the cell prints stays the cell's)."""
        kernel = self._kernel
        parent, ident = kernel.get_parent("shell"), kernel._parent_ident["shell"]
        idents, frames = kernel.session.feed_identities(message, copy=False)
        msg = kernel.session.deserialize(frames, content=True, copy=False)
        try:
            kernel.set_parent(idents, msg, channel="shell")
            handler = kernel.shell_handlers.get(msg["header"]["msg_type"])
            if handler is not None:
                handler(self._stream, idents, msg)  # the comm manager logs a handler's error
        finally:
            kernel.set_parent(ident, parent, channel="shell")

    def defer(self, message: Any) -> None:
        # Callbacks of the kernel's loop run in the order they were added, and each makes its
        # message's task at once: the deferred messages queue for the shell in the order they
        # came, before any the kernel reads itself once the cell has ended.
        self._stream.io_loop.add_callback(self._kernel.shell_main, None, message)


def kernel_inbox(kernel: Any) -> KernelInbox | None:
    """The queue of ``kernel``'s main shell when this thread runs it and the kernel has what
    the pump needs (ipykernel 7's main shell: its stream on this thread, ``shell_main``,
    ``set_parent``/``get_parent``); None otherwise."""
    needed = ("session", "shell_handlers", "set_parent", "get_parent", "shell_main")
    if not all(hasattr(kernel, name) for name in needed):
        return None
    if not hasattr(kernel, "_parent_ident"):
        return None
    channel = getattr(kernel, "shell_channel_thread", None)
    try:
        if channel is not None:
            # Subshells: a thread reads the shell socket and passes the main shell's
            # messages to this thread over a pair of sockets.
            if threading.current_thread() is not channel.parent_thread:
                return None
            stream = channel.manager.get_shell_channel_to_subshell_pair(None).to_stream
        else:
            if threading.current_thread() is not threading.main_thread():
                return None
            stream = kernel.shell_stream
        if stream is None or stream.socket is None or stream.io_loop is None:
            return None
    except Exception:  # another kernel's insides: no pump
        return None
    return KernelInbox(kernel, stream)


def busy() -> Pump | None:
    """The ``busy`` entry point: a :class:`Pump` of the running kernel while this thread runs
    a notebook's cell and the kernel allows it; None otherwise."""
    shell = running_shell()
    if not is_notebook_shell(shell):
        return None
    inbox = kernel_inbox(getattr(shell, "kernel", None))
    return None if inbox is None else Pump(inbox)
