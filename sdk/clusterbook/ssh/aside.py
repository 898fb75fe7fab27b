"""An agent's own sshd, started aside while the agent loads the rest of itself.

On Linux, a fork of the agent starts it: the sshd's setup (its modules, the cluster's derived
key, a host key, sshd's own start: ~60 ms of work, most of it Python's) runs on another
core, where on a thread it would take turns with the agent's own imports for the one
interpreter. The fork then holds the sshd as its child for as long as the agent lives, and
stops it, and the sessions it started, when the agent says so or dies: the pipe between them
closes either way. Where a fork is not safe (another platform, or threads already running,
which a fork would copy mid-step), a thread of the agent starts it instead.

Only the standard library is imported here at first: this module is loaded before the fork.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple, NoReturn, Protocol

if TYPE_CHECKING:
    from clusterbook.ssh.sshd import Sshd

__all__ = ["Aside", "SshdFacts", "start_aside"]

#: Seconds :meth:`Aside.end` waits for the sshd (and the fork holding it) to stop.
END_WITHIN = 15.0


class SshdFacts(NamedTuple):
    """Where the agent's sshd listens and the host key it shows: what the agent's join says."""

    port: int
    host_public_key: str


class Aside(Protocol):
    """An sshd being started aside: :meth:`sshd` waits for it, :meth:`end` stops it."""

    def sshd(self) -> SshdFacts:
        """The started sshd's facts, once it listens; what its start raised, raised here."""
        ...

    def end(self) -> None:
        """Stop the sshd (if it started), and what held it; again: nothing."""
        ...


def start_aside(start: Callable[[], Sshd], *, fork: bool | None = None) -> Aside:
    """Start ``start()`` (which starts an sshd and returns it) aside: on a fork of this
    process where ``fork`` (default: on Linux, with no thread running but this one), else on
    a thread."""
    if fork is None:
        fork = sys.platform.startswith("linux") and _alone()
    if fork:
        try:
            return OnFork(start)
        except OSError:  # no process to be had (a limit on them): a thread starts it
            pass
    return OnThread(start)


def _alone() -> bool:
    """True when this process runs no thread but this one (a fork copies only the caller)."""
    threading = sys.modules.get("threading")
    return threading is None or threading.active_count() == 1


class OnFork:
    """``start()`` on a fork of this process, which holds the sshd until :meth:`end` (or
    this process's end) and reports its facts, or its start's error, through a pipe."""

    def __init__(self, start: Callable[[], Sshd]) -> None:
        report_r, report_w = os.pipe()
        life_r, life_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the fork: it never returns
            os.close(report_r)
            os.close(life_w)
            _let_go_of_output()
            _hold(start, report_w, life_r)
        os.close(report_w)
        os.close(life_r)
        self.pid = pid
        self._report: int | None = report_r
        self._life: int | None = life_w
        self._facts: SshdFacts | None = None
        self._error: BaseException | None = None
        self._status: int | None = None

    def sshd(self) -> SshdFacts:
        if self._facts is None and self._error is None:
            self._read_report()
        if self._error is not None:
            raise self._error
        assert self._facts is not None
        return self._facts

    def _read_report(self) -> None:
        import json

        assert self._report is not None
        chunks = []
        while chunk := os.read(self._report, 65536):  # to the end: the fork closes it
            chunks.append(chunk)
        os.close(self._report)
        self._report = None
        if not chunks:  # it ended before it could say anything
            self._error = _ended_error(self._reap(wait=1.0))
            return
        record = json.loads(b"".join(chunks))
        if "error" in record:
            self._error = _error_from(record)
        else:
            self._facts = SshdFacts(int(record["port"]), str(record["host_public_key"]))

    def end(self) -> None:
        if self._life is None:
            return
        os.close(self._life)  # the fork reads its end: it stops the sshd, then exits
        self._life = None
        if self._report is not None:
            os.close(self._report)
            self._report = None
        if self._reap(wait=END_WITHIN) is None:
            with contextlib.suppress(ProcessLookupError):  # its sshd gets SIGTERM then: its
                os.kill(self.pid, signal.SIGKILL)  # parent-death signal
            self._reap(wait=None)

    def _reap(self, wait: float | None) -> int | None:
        """The fork's wait status once it has ended, waiting ``wait`` s (None: for good);
        None while it runs on. The fork is reaped once only."""
        if self._status is not None:
            return self._status
        deadline = None if wait is None else time.monotonic() + wait
        while True:
            try:
                pid, status = os.waitpid(self.pid, 0 if deadline is None else os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere (a SIGCHLD handler set to ignore)
                pid, status = self.pid, 0
            if pid == self.pid:
                self._status = status
                return status
            if deadline is not None and time.monotonic() >= deadline:
                return None
            time.sleep(0.005)


def _hold(start: Callable[[], Sshd], report: int, life: int) -> NoReturn:
    """The fork's life: start the sshd, report, hold it until ``life`` closes, stop it."""
    code = 1
    try:
        sshd = None
        try:
            sshd = start()
            record = {"port": sshd.port, "host_public_key": sshd.host_public_key}
            # The agent stops it: a signal meant for the agent (Ctrl-C in a terminal, a
            # Slurm step's SIGTERM to each of its processes) must not end this first, and
            # leave the sessions the sshd started.
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
        except BaseException as exc:  # said in the agent, by Aside.sshd()
            record = _error_record(exc)
        with contextlib.suppress(OSError):  # the agent no longer listens: it ended meanwhile
            _send(report, record)
        if sshd is not None:
            while os.read(life, 1):  # nothing comes: it closes as the agent ends, or says so
                pass
            sshd.stop()
            code = 0
    finally:  # never the agent's exit: its atexit handlers, its buffered output, run twice
        os._exit(code)


def _let_go_of_output() -> None:
    """Give the fork /dev/null for input and output: whoever reads the agent's output (a
    terminal, a Slurm step, a test) sees its end when the agent ends, not when the fork does;
    what goes wrong in the fork reaches the agent through the report."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _send(fd: int, record: dict[str, object]) -> None:
    import json

    data = memoryview(json.dumps(record).encode())
    while data:
        data = data[os.write(fd, data) :]
    os.close(fd)


def _error_record(exc: BaseException) -> dict[str, object]:
    from clusterbook.errors import ConfigError
    from clusterbook.ssh.sshd import SshdError

    if isinstance(exc, SshdError):
        return {
            "error": str(exc),
            "kind": "sshd",
            "port": exc.port,
            "directory": str(exc.directory),
            "log_tail": exc.log_tail,
        }
    if isinstance(exc, ConfigError):
        return {"error": str(exc), "kind": "config"}
    import traceback

    said = "".join(traceback.format_exception(exc)).rstrip()
    return {"error": f"The agent's sshd did not start: {said}", "kind": "other"}


def _error_from(record: dict[str, object]) -> BaseException:
    from pathlib import Path

    from clusterbook.errors import ClusterError, ConfigError
    from clusterbook.ssh.sshd import SshdError

    message = str(record["error"])
    if record.get("kind") == "sshd":
        port, directory = int(str(record["port"])), Path(str(record["directory"]))
        return SshdError(message, port=port, directory=directory, log_tail=str(record["log_tail"]))
    if record.get("kind") == "config":
        return ConfigError(message)
    return ClusterError(message)


def _ended_error(status: int | None) -> BaseException:
    from clusterbook.errors import ClusterError

    if status is None:
        how = "stopped saying anything"
    elif os.WIFSIGNALED(status):
        how = f"was killed by signal {os.WTERMSIG(status)}"
    else:
        how = f"exited with code {os.waitstatus_to_exitcode(status)}"
    return ClusterError(
        f"The process starting this agent's sshd {how} before the sshd started; run the "
        "agent again (its log above says what else went wrong)."
    )


class OnThread:
    """``start()`` on a thread of this process, which lives until :meth:`end`: an sshd gets
    SIGTERM when the thread that started it ends (its parent-death signal)."""

    def __init__(self, start: Callable[[], Sshd]) -> None:
        import threading

        self._start = start
        self._ready, self._done = threading.Event(), threading.Event()
        self._sshd: Sshd | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="clusterbook-sshd", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._sshd = self._start()
        except BaseException as exc:  # said by sshd(), in the agent's thread
            self._error = exc
            return
        finally:
            self._ready.set()
        self._done.wait()
        self._sshd.stop()

    def sshd(self) -> SshdFacts:
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self._sshd is not None
        return SshdFacts(self._sshd.port, self._sshd.host_public_key)

    def end(self) -> None:
        self._done.set()
        self._thread.join(END_WITHIN)
