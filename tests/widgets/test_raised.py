"""An error a magic raises, shown by its message alone (a real shell: test_magics.py)."""

from __future__ import annotations

import clusterbook as cb
from clusterbook_widgets.raised import show_as_message


def test_the_error_is_shown_by_its_type_and_message_lines_and_keeps_both() -> None:
    cause = OSError("refused")
    error = cb.SSHConnectError("node1: refused.\nIs sshd running there?", host="node1")
    error.__cause__ = cause
    show_as_message(error)
    render = error._render_traceback_  # type: ignore[attr-defined]
    assert render() == [
        "\x1b[0;31mSSHConnectError\x1b[0m: node1: refused.",
        "Is sshd running there?",
    ]
    assert (type(error), error.host, error.__cause__) == (cb.SSHConnectError, "node1", cause)
    # Only that one: the type, and its other errors, are shown with their frames as ever.
    assert not hasattr(cb.SSHConnectError("x", host="h"), "_render_traceback_")


def test_an_error_without_a_message_shows_its_type() -> None:
    error = cb.ClusterError()
    show_as_message(error)
    assert error._render_traceback_() == ["\x1b[0;31mClusterError\x1b[0m"]  # type: ignore[attr-defined]
