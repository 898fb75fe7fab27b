"""Bootstrap of SSH nodes: connect, check, install the cluster's key and files, clean up.

Modelled on the bootstrap_master_node / bootstrap_worker_node / write_status_file_to_workers
steps of managed training services: every host is handled in parallel over one connection
(one handshake per host), each step is one remote command (the login shell starts once per
step, not per file), and failures are gathered per host into one :class:`BootstrapError`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shlex
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from clusterbook.errors import (
    BootstrapError,
    HostNotFoundError,
    SSHConnectError,
    SSHError,
    SSHTimeoutError,
)
from clusterbook.nodes.tasks.common import REPLY
from clusterbook.nodes.tasks.files import FRAME
from clusterbook.nodes.tasks.program import command
from clusterbook.paths import node_cluster_dir
from clusterbook.ssh.hostkeys import HostKey, known_hosts_line
from clusterbook.ssh.keys import KeyPair
from clusterbook.ssh.paramiko_shell import ParamikoShell
from clusterbook.ssh.shell import ProcessStarter, RemoteShell
from clusterbook.ssh.target import Target
from clusterbook.wording import spell

__all__ = [
    "Connection",
    "KeptSession",
    "NodeSession",
    "TaskFailedError",
    "cluster_files",
    "connect",
    "node_ssh_args",
    "run_task",
    "ssh_wrapper",
    "unreached",
]


@dataclass(frozen=True, slots=True)
class Connection:
    """An open connection to a node, with the host key it showed."""

    host: str
    shell: ParamikoShell
    host_key: HostKey
    local_addr: str  # our address as the node sees it


def connect(host: str, dial: Callable[[str, float], ParamikoShell], deadline: float) -> Connection:
    """Connect to ``host`` with ``dial(host, timeout)``, retrying while sshd is not up yet,
    until ``deadline`` (monotonic).

    Host key and authentication failures are final at once; a name that does not resolve too.
    """
    pause = 0.1
    while True:
        left = deadline - time.monotonic()
        try:
            shell = dial(host, max(0.5, min(5.0, left)))
            break
        except HostNotFoundError:
            raise
        except (SSHConnectError, SSHTimeoutError):
            if time.monotonic() + pause >= deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 1.0)
    return Connection(host, shell, shell.server_key(), shell.local_addr)


def unreached(failed: Mapping[str, Exception]) -> BootstrapError:
    """The error for the hosts :func:`connect` failed on, with why."""
    return BootstrapError({h: [_reason(e)] for h, e in failed.items()})


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, SSHError) else f"{type(exc).__name__}: {exc}"


def _missing_python(python: str, host: str) -> str:
    elsewhere = spell("node_python", {host: "/path/bin/python"})
    fix = f", or give its path there with {elsewhere}" if elsewhere else ""
    return (
        f"Python {python!r} is missing on {host}; install the head's environment there at "
        f"the same path{fix}."
    )


def run_task(
    shell: RemoteShell, python: str, task: str, args: Mapping[str, Any], timeout: float = 60.0
) -> dict[str, Any]:
    """Run a node task (:mod:`clusterbook.nodes.tasks`) with ``python`` on the node; return
    its JSON."""
    result = shell.run(command(python, task, "-"), input=json.dumps(args).encode(), timeout=timeout)
    if result.returncode == 127:
        raise SSHError(_missing_python(python, shell.host), host=shell.host)
    if result.returncode != 0:
        tail = " / ".join(result.stderr.strip().splitlines()[-3:])
        raise SSHError(f"The {task} step failed on {shell.host}: {tail}", host=shell.host)
    try:
        reply: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
        return reply
    except (ValueError, IndexError):
        raise SSHError(
            f"The {task} step on {shell.host} printed no result (its shell start-up files may "
            f"print to stdout): {result.stdout[:200]!r}",
            host=shell.host,
        ) from None


def node_ssh_args(cluster_id: str, *, user: str, port: int) -> list[str]:
    """ssh options for head-to-node and node-to-node connections made by the MPI launcher.

    Paths start with ``~`` (expanded by ssh) so the same options work on the head and on every
    node, whatever their home directories. Host keys are checked strictly against the
    cluster's own known_hosts, built from the keys the nodes showed at bootstrap.
    """
    base = node_cluster_dir("~", cluster_id)
    args = [
        "-o",
        f"IdentityFile={base}/id_ed25519",
        "-o",
        "IdentitiesOnly=yes",
        "-o",
        f"UserKnownHostsFile={base}/known_hosts",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "UpdateHostKeys=no",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=10",
        "-o",
        f"User={user}",
    ]
    if port != 22:
        args += ["-o", f"Port={port}"]
    return args


def plain_login(targets: Mapping[str, Target]) -> tuple[str, int] | None:
    """The one (user, port) of ``targets`` when each is reached at its own name, straight:
    then the launcher's ssh needs options only (:func:`node_ssh_args`), and the nodes can
    start each other's daemons (tree spawn). None when a config of hosts is needed."""
    logins = {(t.node.user, t.node.port) for t in targets.values()}
    plain = all(
        not t.jumps and t.node.proxy_command is None and t.node.hostname == alias
        for alias, t in targets.items()
    )
    return next(iter(logins)) if plain and len(logins) == 1 else None


def launcher_ssh_config(
    cluster_dir: str | Path, targets: Mapping[str, Target], proxy_command: str | None
) -> str:
    """The head's ssh config for the MPI launcher: each node's address, port and user (and,
    behind jump hosts, ``proxy_command``: the relay over the head's own connections; a node's
    own ProxyCommand from the user's ssh config, run on the head as the user's ssh would), with
    the cluster's key and known_hosts in ``cluster_dir`` (the head's, absolute: ssh reads
    ``~`` as the passwd home, which need not be ``$HOME``) and strict host key checks, as
    :func:`node_ssh_args`."""
    base = str(cluster_dir)
    lines = [f"# The MPI launcher's ssh for the cluster in {base} (removed at stop)."]
    for alias, target in sorted(targets.items()):
        node = target.node
        lines += [f"Host {alias}", f"  HostName {node.hostname}", f"  Port {node.port}"]
        lines.append(f"  User {node.user}")
        if target.jumps:
            if proxy_command is None:
                raise ValueError(f"{alias} is behind jump hosts: a proxy command is needed")
            lines.append(f"  ProxyCommand {proxy_command}")
        elif node.proxy_command is not None:
            # Its tokens are filled in already: a % left in it is a literal one for ssh.
            lines.append(f"  ProxyCommand {node.proxy_command.replace('%', '%%')}")
    lines += [
        "Host *",
        f"  IdentityFile {base}/id_ed25519",
        "  IdentitiesOnly yes",
        f"  UserKnownHostsFile {base}/known_hosts",
        "  StrictHostKeyChecking yes",
        "  UpdateHostKeys no",
        "  BatchMode yes",
        "  ConnectTimeout 10",
    ]
    return "\n".join(lines) + "\n"


def ssh_wrapper(ssh_args: Sequence[str]) -> str:
    """A script that runs ssh with ``ssh_args`` (MPICH's launcher takes one program)."""
    return "#!/bin/sh\nexec ssh " + shlex.join(ssh_args) + ' "$@"\n'


def cluster_files(
    cluster_id: str,
    keys: KeyPair,
    connections: Mapping[str, Connection],
    names: Mapping[str, Sequence[str]],
    *,
    ssh_args: Sequence[str],
) -> dict[str, tuple[str, bytes]]:
    """The files every node (and the head) gets: name -> (octal mode, content). ``names``:
    the names each connection's host key is known by (``host``, ``[host]:port``)."""
    known = "".join(
        known_hosts_line(dict.fromkeys(names[h]), c.host_key) for h, c in connections.items()
    )
    wrapper = ssh_wrapper(ssh_args)
    return {
        "id_ed25519": ("600", keys.private_path.read_bytes()),
        "id_ed25519.pub": ("644", (keys.public_line + "\n").encode()),
        "known_hosts": ("644", known.encode()),
        "ssh": ("755", wrapper.encode()),
    }


def encode_files(files: Mapping[str, tuple[str, bytes]]) -> dict[str, list[str]]:
    """Files as the install task takes them (base64 content)."""
    return {name: [mode, base64.b64encode(data).decode()] for name, (mode, data) in files.items()}


class TaskFailedError(SSHError):
    """A node task raised; the session that ran it is fine and takes the next one."""


class NodeSession:
    """One Python process on a node running the bootstrap tasks one after another (one login
    shell and one interpreter start for the whole bootstrap, instead of one per step)."""

    def __init__(
        self,
        shell: ProcessStarter,
        python: str,
        *,
        owns_shell: bool = False,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = shell.host
        self._python = python
        # A connection opened for this session alone is closed with it: else its sshd
        # session process stays on the node until the connection is garbage-collected.
        self._shell = shell if owns_shell else None
        # ``env``: what the process starts with (a session started with the agents' tag
        # starts the node's agent as a fork of itself: see ``nodes.tasks.commands.spawn``).
        self._proc = shell.start(command(python, "session"), env=env)

    def call(
        self,
        task: str,
        args: Mapping[str, Any],
        timeout: float = 60.0,
        *,
        frames: Iterable[bytes] | None = None,
        on_frame: Callable[[bytes, bytes], None] | None = None,
        then_import: Sequence[str] = (),
    ) -> dict[str, Any]:
        """Run ``task`` on the node and return its result: with ``frames`` (encoded, see
        :func:`clusterbook.nodes.tasks.files.frame`) sent after the request, as they come, and
        ``on_frame(kind, payload)`` told each frame the task sends before its reply, up to
        the ``Z`` that ends them. ``timeout`` bounds each wait for the node, not the whole.
        ``then_import``: modules the session imports once its reply is out (see
        :func:`clusterbook.nodes.tasks.session.warm`); the next call waits for that."""
        request: dict[str, Any] = {"task": task, "args": args}
        if then_import:
            request["then_import"] = list(then_import)
        self._proc.send(json.dumps(request).encode() + b"\n")
        for piece in frames or ():
            self._proc.send(piece, timeout)
        while True:
            reply = self._reply(task, timeout)
            if "frames" not in reply:
                break
            while True:
                kind, payload = self._frame(task, timeout)
                if kind == b"Z":
                    break
                if on_frame is not None:
                    on_frame(kind, payload)
        if "error" in reply:
            raise TaskFailedError(
                f"The {task} step failed on {self.host}: {reply['error']}", host=self.host
            )
        answer: dict[str, Any] = reply["ok"]
        return answer

    def call_each(
        self, calls: Sequence[tuple[str, Mapping[str, Any]]], timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Run several tasks one after the other on the node, with one wait for them all: the
        requests go out together and the replies are read in their order (the first task
        that failed raises, once every reply is in). Once one fails, the tasks after it are
        not run. No frames either way."""
        requests = (
            json.dumps({"task": t, "args": a, **({"if_ok": True} if i else {})}).encode() + b"\n"
            for i, (t, a) in enumerate(calls)
        )
        self._proc.send(b"".join(requests))
        replies = [self._reply(task, timeout) for task, _ in calls]
        for (task, _), reply in zip(calls, replies, strict=True):
            if "error" in reply:
                raise TaskFailedError(
                    f"The {task} step failed on {self.host}: {reply['error']}", host=self.host
                )
        return [reply["ok"] for reply in replies]

    def _reply(self, task: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            line = self._proc.readline(max(0.0, deadline - time.monotonic()))
            if not line:
                self._ended(task)
            text = line.decode(errors="replace")
            if text.startswith(REPLY):  # anything else is noise from shell start-up files
                reply: dict[str, Any] = json.loads(text[len(REPLY) :])
                return reply

    def _frame(self, task: str, timeout: float) -> tuple[bytes, bytes]:
        head = self._proc.read(FRAME.size, timeout)
        if len(head) < FRAME.size:
            self._ended(task)
        kind, size = FRAME.unpack(head)
        payload = self._proc.read(size, timeout) if size else b""
        if len(payload) < size:
            self._ended(task)
        return kind, payload

    def _ended(self, task: str) -> NoReturn:
        code, err = self._proc.close(timeout=5)
        if code == 127:
            raise SSHError(_missing_python(self._python, self.host), host=self.host)
        tail = " / ".join(err.strip().splitlines()[-3:]) or f"exit code {code}"
        raise SSHError(f"The {task} step ended on {self.host}: {tail}", host=self.host)

    def close(self) -> None:
        try:
            self._proc.close(timeout=10)
        finally:
            if self._shell is not None:
                self._shell.close()


class KeptSession:
    """A node's session kept for the cluster's later steps (files, job kills, clean-up), so
    each is a round trip instead of a login; when it is lost, a new one is started (once a
    call) with ``start``. One step at a time."""

    def __init__(self, start: Callable[[], NodeSession], session: NodeSession | None = None):
        self._start = start
        self._session = session
        self._lock = threading.Lock()

    def call(
        self,
        task: str,
        args: Mapping[str, Any],
        timeout: float = 60.0,
        **streams: Any,
    ) -> Any:
        """``NodeSession.call`` in the kept session; a call with ``frames`` or ``on_frame``
        (see there) is tried again in a new session only if none of its frames went or came
        (a session lost while it was idle)."""
        moved = False

        def sent(frames: Iterable[bytes]) -> Iterator[bytes]:
            nonlocal moved
            for piece in frames:
                moved = True
                yield piece

        def told(kind: bytes, payload: bytes) -> None:
            nonlocal moved
            moved = True
            streams["on_frame"](kind, payload)

        wrapped = dict(streams)
        if streams.get("frames") is not None:
            wrapped["frames"] = sent(streams["frames"])
        if streams.get("on_frame") is not None:
            wrapped["on_frame"] = told
        with self._lock:
            try:
                return self._call(task, args, timeout, wrapped)
            except TaskFailedError:
                raise
            except SSHError:
                if moved:
                    raise
                return self._call(task, args, timeout, wrapped)  # in a new session, once

    def _call(
        self, task: str, args: Mapping[str, Any], timeout: float, streams: dict[str, Any]
    ) -> Any:
        if self._session is None:
            self._session = self._start()
        try:
            return self._session.call(task, args, timeout=timeout, **streams)
        except TaskFailedError:
            raise
        except BaseException as exc:
            # Gone, or out of step after a timeout or a stream cut short here: not used again.
            if isinstance(exc, SSHError) or streams:
                lost, self._session = self._session, None
                with contextlib.suppress(Exception):
                    lost.close()
            raise

    def close(self) -> None:
        with self._lock:
            lost, self._session = self._session, None
            if lost is not None:
                with contextlib.suppress(Exception):
                    lost.close()
