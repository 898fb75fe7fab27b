"""The pump that handles widget clicks while a cell blocks (:mod:`clusterbook_widgets.busy`),
over a fake kernel queue; a real kernel's is in ``test_busy_kernel.py``."""

from __future__ import annotations

import logging
import types
from typing import Any

import pytest

from clusterbook_widgets.busy import KernelInbox, Pump, busy, kernel_inbox


class FakeInbox:
    """A kernel's queue of ``(type, name)`` messages; what was handled and deferred, in
    order. ``failing`` names messages whose handling raises, ``unreadable`` those whose type
    cannot be read."""

    def __init__(
        self, messages: list[tuple[str, str]], failing: set[str] = frozenset(), **kw: Any
    ) -> None:
        self.messages = list(messages)
        self.failing = failing
        self.unreadable: set[str] = kw.get("unreadable", set())
        self.handled: list[str] = []
        self.deferred: list[str] = []

    def receive(self) -> tuple[str, str] | None:
        return self.messages.pop(0) if self.messages else None

    def kind(self, message: tuple[str, str]) -> str:
        if message[1] in self.unreadable:
            raise ValueError("Invalid Signature")
        return message[0]

    def handle(self, message: tuple[str, str]) -> None:
        if message[1] in self.failing:
            raise RuntimeError(f"handler of {message[1]} failed")
        self.handled.append(message[1])

    def defer(self, message: tuple[str, str]) -> None:
        self.deferred.append(message[1])


def test_widget_messages_are_handled_now_and_the_rest_keep_their_order_for_later() -> None:
    inbox = FakeInbox(
        [
            ("execute_request", "cell 3"),
            ("comm_msg", "click stop"),
            ("complete_request", "completion"),
            ("comm_open", "open"),
            ("execute_request", "cell 4"),
            ("comm_close", "close"),
        ]
    )
    Pump(inbox)()
    assert inbox.handled == ["click stop", "open", "close"]
    assert inbox.deferred == ["cell 3", "completion", "cell 4"]
    assert inbox.messages == []


def test_a_click_whose_handling_fails_is_logged_and_the_next_is_handled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    inbox = FakeInbox(
        [("comm_msg", "bad click"), ("execute_request", "cell"), ("comm_msg", "good click")],
        failing={"bad click"},
    )
    with caplog.at_level(logging.ERROR, logger="clusterbook"):
        Pump(inbox)()
    assert inbox.handled == ["good click"]
    assert inbox.deferred == ["cell"]
    assert "handler of bad click failed" in caplog.text


def test_a_message_that_cannot_be_read_goes_to_the_kernel_as_it_came() -> None:
    inbox = FakeInbox([("comm_msg", "forged"), ("comm_msg", "click")], unreadable={"forged"})
    Pump(inbox)()
    assert inbox.deferred == ["forged"]  # the kernel's own handling says what is wrong
    assert inbox.handled == ["click"]


def test_one_pump_takes_at_most_its_bound_and_the_next_takes_the_rest() -> None:
    inbox = FakeInbox([("comm_msg", f"click {i}") for i in range(5)])
    pump = Pump(inbox, at_most=2)
    pump()
    assert inbox.handled == ["click 0", "click 1"]
    pump()
    pump()
    pump()
    assert inbox.handled == [f"click {i}" for i in range(5)]


def test_an_interrupt_while_a_click_is_handled_reaches_the_wait() -> None:
    class Interrupted(FakeInbox):
        def handle(self, message: tuple[str, str]) -> None:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        Pump(Interrupted([("comm_msg", "click")]))()


def test_an_interrupt_before_a_message_is_passed_on_gives_it_back_to_the_kernel() -> None:
    class Interrupted(FakeInbox):
        def kind(self, message: tuple[str, str]) -> str:
            if message[1] == "click 2":
                raise KeyboardInterrupt
            return message[0]

    inbox = Interrupted([("comm_msg", "click 1"), ("comm_msg", "click 2"), ("comm_msg", "3")])
    with pytest.raises(KeyboardInterrupt):
        Pump(inbox)()
    assert inbox.handled == ["click 1"]
    assert inbox.deferred == ["click 2"]  # not lost: the kernel handles it after the cell
    assert inbox.messages == [("comm_msg", "3")]  # not taken


def test_no_pump_outside_a_notebook_kernel() -> None:
    assert busy() is None  # pytest runs no kernel


def test_no_pump_where_the_kernel_lacks_what_it_needs() -> None:
    # ipykernel 6 had no shell_main (messages went through a queue of its own): no pump, and
    # waits block as they did.
    old = types.SimpleNamespace(
        session=object(),
        shell_handlers={},
        set_parent=lambda *a, **k: None,
        get_parent=lambda *a: {},
        _parent_ident={"shell": b""},
        shell_stream=None,
    )
    assert kernel_inbox(old) is None
    assert kernel_inbox(None) is None


def test_no_pump_on_a_thread_that_does_not_run_the_main_shell() -> None:
    import threading

    channel = types.SimpleNamespace(parent_thread=object())  # some other thread
    kernel = types.SimpleNamespace(
        session=object(),
        shell_handlers={},
        set_parent=lambda *a, **k: None,
        get_parent=lambda *a: {},
        shell_main=lambda *a: None,
        _parent_ident={"shell": b""},
        shell_channel_thread=channel,
    )
    assert kernel_inbox(kernel) is None
    channel.parent_thread = threading.current_thread()
    channel.manager = types.SimpleNamespace()  # no socket pair: another kernel's insides
    assert kernel_inbox(kernel) is None


class FakeSession:
    """What KernelInbox asks of jupyter_client's Session, over messages that are dicts."""

    def __init__(self) -> None:
        self.read: list[tuple[str, bool]] = []  # (msg_id, content): how each was read

    def feed_identities(self, message: dict[str, Any], copy: bool) -> tuple[list[bytes], Any]:
        return [b"client"], message

    def deserialize(self, message: dict[str, Any], content: bool, copy: bool) -> dict[str, Any]:
        self.read.append((message["header"]["msg_id"], content))
        return message


class FakeKernel:
    """An ipykernel 7 kernel as KernelInbox sees it: its session, handlers, parent and
    shell_main; what happened, in order, in ``said``."""

    def __init__(self) -> None:
        self.session = FakeSession()
        self.parent: tuple[Any, dict[str, Any]] = (b"cell ident", {"header": {"msg_id": "cell"}})
        self.said: list[Any] = []
        self.shell_handlers = {"comm_msg": self.comm_msg}

    @property
    def _parent_ident(self) -> dict[str, Any]:
        return {"shell": self.parent[0]}

    def get_parent(self, channel: str) -> dict[str, Any]:
        return self.parent[1]

    def set_parent(self, ident: Any, parent: dict[str, Any], channel: str) -> None:
        self.parent = (ident, parent)

    def comm_msg(self, stream: Any, idents: Any, msg: dict[str, Any]) -> None:
        self.said.append(("handled", msg["header"]["msg_id"], self.parent[1]["header"]["msg_id"]))
        if msg["header"]["msg_id"] == "bad":
            raise RuntimeError("the handler failed")

    async def shell_main(self, subshell_id: str | None, message: Any) -> None:
        raise AssertionError("run by the loop only")


class FakeLoop:
    def __init__(self, kernel: FakeKernel) -> None:
        self.kernel = kernel

    def add_callback(self, callback: Any, *args: Any) -> None:
        self.kernel.said.append(("later", callback.__name__, args[0], args[1]["header"]["msg_id"]))


def _message(kind: str, msg_id: str) -> dict[str, Any]:
    return {"header": {"msg_type": kind, "msg_id": msg_id}}


def test_the_kernel_inbox_handles_a_click_under_its_parent_and_gives_the_cell_s_back() -> None:
    kernel = FakeKernel()
    stream = types.SimpleNamespace(socket=None, io_loop=FakeLoop(kernel))
    inbox = KernelInbox(kernel, stream)
    click = _message("comm_msg", "click")
    assert inbox.kind(click) == "comm_msg"
    inbox.handle(click)
    with pytest.raises(RuntimeError):
        inbox.handle(_message("comm_msg", "bad"))
    inbox.defer(_message("execute_request", "next cell"))
    assert kernel.said == [
        ("handled", "click", "click"),  # what the handler sends answers the click
        ("handled", "bad", "bad"),
        ("later", "shell_main", None, "next cell"),  # the main shell's, after the cell
    ]
    assert kernel.parent == (b"cell ident", {"header": {"msg_id": "cell"}})  # the cell's again
    # A look at a message's type does not count as reading it: the kernel reads it later.
    assert kernel.session.read[0] == ("click", False)
