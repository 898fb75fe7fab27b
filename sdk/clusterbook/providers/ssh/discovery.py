"""The host discovery loop of an SSH cluster: :class:`DiscoveryLoop`.

Every ``every`` seconds it runs the discovery command (with a deadline), reads its output
(:mod:`~clusterbook.providers.ssh.discovered`) and hands the changes to the provider, which
bootstraps the hosts that appeared and drains and cleans those that went. A run that fails,
times out or prints what is not a host list changes nothing: the cluster keeps its last good
set, and the error is the loop's :attr:`~DiscoveryLoop.problem` (shown in status and the
widget) and a warning in the log once per new error. The loop is stopped with the cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping

from clusterbook.errors import ClusterError, ConfigError
from clusterbook.gpus import Slots
from clusterbook.providers.ssh.discovered import Changes, Discovery, changes, parse_discovered
from clusterbook.wording import spell

__all__ = ["DiscoveryLoop", "first_hosts", "run_discovery"]

_log = logging.getLogger("clusterbook.discovery")

#: What a command's failure keeps of its error output.
_TAIL = 400


def run_discovery(discovery: Discovery, started: Callable[[subprocess.Popen[str]], None]) -> str:
    """The output of one run of ``discovery``'s command, within its deadline (``started`` is
    told the process, so that a stop can end it); a :class:`ConfigError` saying how it
    failed."""
    where = f"Discovery command {discovery.command!r}"
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", discovery.command],
            cwd=discovery.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its children go with it at the deadline
        )
    except OSError as exc:
        raise ConfigError(f"{where} could not start: {exc}.") from None
    started(proc)
    try:
        out, err = proc.communicate(timeout=discovery.timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise ConfigError(
            f"{where} did not finish within {discovery.timeout:g} s; make it answer sooner "
            f"(or run it less often, like {spell('every', '1m')})."
        ) from None
    if proc.returncode != 0:
        said = err.strip()[-_TAIL:] or "(nothing on stderr)"
        raise ConfigError(f"{where} exited {proc.returncode}: {said}")
    return out


def first_hosts(discovery: Discovery | None) -> tuple[tuple[str, Slots], ...]:
    """The hosts a cluster given none starts with: what its discovery command says now (its
    failure is the cluster's: there is no last good set yet)."""
    if discovery is None:
        raise ConfigError(
            "An SSH cluster needs hosts (['node1:4', 'node2:4']) or a command that prints "
            f"them ({spell('discover', './hosts.sh')})."
        )
    return parse_discovered(run_discovery(discovery, lambda _: None), discovery.command)


#: Applies changes to the cluster; returns the hosts it could not add or remove, with why.
Apply = Callable[[Changes], Mapping[str, str]]


class DiscoveryLoop:
    """Runs ``discovery`` every so often (see the module docstring): ``hosts()`` are the
    cluster's hosts now, ``apply(changes)`` makes the cluster's hosts the ones found."""

    def __init__(
        self,
        discovery: Discovery,
        hosts: Callable[[], list[str]],
        apply: Apply,
        *,
        changed: Callable[[], None] = lambda: None,
    ) -> None:
        self.discovery = discovery
        self._hosts = hosts
        self._apply = apply
        self._changed = changed
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self._problem: str | None = None
        self.runs = 0  # runs done, for tests and benchmarks

    @property
    def problem(self) -> str | None:
        """The last run's error (the cluster kept its hosts), None once a run worked."""
        return self._problem

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._loop, name="clusterbook-discovery", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the loop, ending a command that runs; returns once the loop has."""
        self._stop.set()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.discovery.every):
            try:
                self.tick()
            except Exception as exc:  # the loop goes on: the next run may work
                _log.exception("Host discovery failed.")
                self._said(f"{type(exc).__name__}: {exc}")

    def tick(self) -> None:
        """One run: the changes it finds applied, or its error kept."""
        try:
            text = run_discovery(self.discovery, self._started)
            found = parse_discovered(text, self.discovery.command)
        except ClusterError as exc:
            if not self._stop.is_set():
                self._said(f"{exc} The cluster keeps its hosts.")
            return
        finally:
            self._proc = None
            self.runs += 1
        wanted = changes(self._hosts(), found)
        failed = self._apply(wanted) if wanted else {}
        if failed:
            lines = "; ".join(f"{h}: {why}" for h, why in failed.items())
            self._said(f"Discovery could not change {len(failed)} host(s): {lines}")
        else:
            self._said(None)

    def _started(self, proc: subprocess.Popen[str]) -> None:
        self._proc = proc

    def _said(self, problem: str | None) -> None:
        """Keep ``problem``; a new one is a warning in the log, once."""
        if problem == self._problem:
            return
        self._problem = problem
        if problem is not None:
            _log.warning("%s", problem)
        self._changed()
