"""A running user-level sshd (what :func:`clusterbook.ssh.sshd.start_sshd` returns): where it
listens, its files and pid; stopping it, and the sessions it started, for good."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.ssh.sshd_config import SshdConfig

if TYPE_CHECKING:
    import psutil

__all__ = ["Sshd"]


class Sshd:
    """A running sshd started by :func:`start_sshd`; :meth:`stop` it, or use it in ``with``.

    Attributes
    ----------
    port, listen
        Where it accepts connections.
    host_public_key
        Its host key as ``"ssh-ed25519 AAAA..."``, for a known_hosts line.
    pid
        The sshd listener's pid (our child).
    directory, config_path, log_path, host_key_path
        Its files.
    """

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        cfg: SshdConfig,
        host_public_key: str,
        config_path: Path,
        log_path: Path,
        host_key_path: Path,
    ) -> None:
        self._proc = proc
        self.port = cfg.port
        self.listen = cfg.listen
        self.directory = cfg.directory
        self.authorized_keys: Path = cfg.authorized_keys  # type: ignore[assignment]
        self.host_public_key = host_public_key
        self.pid = proc.pid
        self.config_path = config_path
        self.log_path = log_path
        self.host_key_path = host_key_path

    @property
    def running(self) -> bool:
        """True while the sshd listener has not exited."""
        return self._proc.poll() is None

    def stop(self, timeout: float = 5.0, *, keep_sessions: bool = False) -> None:
        """Stop sshd and the sessions it started; calling it again does nothing.

        Parameters
        ----------
        timeout
            Seconds to wait after SIGTERM before SIGKILL.
        keep_sessions
            Stop the listener only, as a restart of OpenSSH's sshd does: the connections
            made so far (and what runs in them) go on.
        """
        if self._proc.poll() is not None:
            return
        import psutil  # here: an agent's start, which starts an sshd, need not import it

        sessions = []
        if not keep_sessions:
            with contextlib.suppress(psutil.Error):
                sessions = psutil.Process(self.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            self._proc.terminate()
            self._proc.send_signal(signal.SIGCONT)  # a paused sshd would never see SIGTERM
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for p in sessions:
            with contextlib.suppress(psutil.Error):
                p.kill()
        _wait_ended(sessions, timeout)  # ended when stop() returns, not dying

    def __enter__(self) -> Sshd:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<Sshd {self.listen}:{self.port} pid={self.pid} {state} dir={self.directory}>"


def _wait_ended(procs: list[psutil.Process], timeout: float) -> None:
    """Wait up to ``timeout`` s for ``procs`` to end (a zombie has: only its parent's wait
    is left, which is not ours to make)."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        running = []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                if p.status() != psutil.STATUS_ZOMBIE:
                    running.append(p)
        if not running:
            return
        procs = running
        time.sleep(0.01)
