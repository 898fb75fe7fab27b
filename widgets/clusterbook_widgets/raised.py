"""How the magics' errors reach the notebook: raised, so that "Run All", nbclient and papermill
stop at the cell, and shown as what they say, without the frames of the magic that raised
them (the message names the value, the rule and the fix; the frames are clusterbook's, not
the notebook's).

IPython shows an exception that has a ``_render_traceback_`` by the lines that returns, in
place of a traceback: the protocol ipyparallel's remote errors use. :func:`show_as_message`
gives one exception that, keeping its type (``except cb.JobFailedError``, or any other
``ClusterError`` of the core, still catches it) and its cause.
"""

from __future__ import annotations

__all__ = ["show_as_message"]

# The colour IPython gives an exception's name (its tracebacks' "ename" line).
_RED, _RESET = "\x1b[0;31m", "\x1b[0m"


def show_as_message(exc: BaseException) -> None:
    """Have ``exc`` shown in a notebook (and terminal IPython) as ``Name: message``, its
    message's lines as they are, and no frames, once it is raised."""
    lines = str(exc).splitlines()
    name = f"{_RED}{type(exc).__name__}{_RESET}"
    shown = [f"{name}: {lines[0]}", *lines[1:]] if lines else [name]

    def render() -> list[str]:
        return list(shown)

    # On the instance: only the magics' errors are shown so; the same type raised by the
    # user's own code keeps its traceback.
    setattr(exc, "_render_traceback_", render)  # noqa: B010 (not an attribute of its type)
