"""A sweep's pool: ranks that stay up between items, one MPI job of as many ranks as a sweep
runs at once, each connected back to the head over TLS.

The pool starts at a cluster's first ``map`` and stays up for the next; it stops with the
cluster (its stop hooks, ``on_stop``), after :data:`IDLE_TIMEOUT` seconds without a sweep, or
when a sweep needs more ranks than it has (a new one starts). Its ranks run
:mod:`clusterbook.functions.worker`, sent as source in the job's environment. They reach a
listener of this process at the head's address towards their nodes; the job's environment
carries the listener's addresses, the SHA-256 fingerprint of a certificate made for this pool
alone, and a secret made for it alone, as the engines' connection information does (a rank's
environment is its user's only). TLS proves the head to the ranks and hides the items and
values on the way; the HMAC of a fresh nonce proves a rank to the head
(:func:`~clusterbook.functions.worker.proof`). Nothing of an item goes through the logs or the
job's files, and another user, who can connect, can neither take an item nor hand back a value.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import secrets
import socket
import ssl
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from clusterbook.cluster.handle import ClusterHandle, JobHandle
from clusterbook.errors import JobTimeoutError, PoolError
from clusterbook.functions.schedule import idle_expired
from clusterbook.functions.worker import (
    BOOT,
    NONCE,
    POOL_ENV,
    PROGRAM_ENV,
    loads,
    packed_source,
    proof,
    recv_frame,
    send_frame,
)
from clusterbook.providers.elastic.far import head_address_towards
from clusterbook.rendezvous.backends._tls import make_certificate, server_context
from clusterbook.spec import NodeSpec

__all__ = [
    "IDLE_TIMEOUT",
    "KEEPALIVE",
    "START_TIMEOUT",
    "Pool",
    "PoolHost",
    "PoolRank",
    "head_addresses",
    "keep_alive",
]

#: Seconds a pool stays up without a sweep before it stops (its ranks free their slots).
IDLE_TIMEOUT = 600.0
#: Seconds a pool's ranks have to connect back once its job has started.
START_TIMEOUT = 120.0
_HANDSHAKE = 10.0  # seconds a connection has to prove it is a rank of the pool
_WATCH = 0.5  # seconds between looks at the pool's job and its idle time
_HANDSHAKES = 64  # connections at most in their handshake at once: the rest wait to be accepted


class PoolHost(ClusterHandle, Protocol):
    """What a pool needs of its cluster: a cluster whose head runs in this process (the pool's
    listener must live as long as its ranks), which stops the pool with itself."""

    def on_stop(self, stop: Callable[[], None]) -> None: ...


class _Hidden(str):
    """A string whose repr hides it: the pool's job's environment is part of its plan, which
    a user may print; the value reaches the ranks unchanged."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'<hidden>'"


@dataclass(eq=False)
class PoolRank:
    """One rank of the pool, connected and proven: where it runs, and its connection."""

    rank: int
    host: str
    pid: int
    sock: ssl.SSLSocket = field(repr=False)
    known: set[str] = field(default_factory=set, repr=False)  # functions it holds, by key

    def run(self, key: str, function: bytes, task: int, argument: bytes) -> tuple[Any, ...]:
        """Run one task (sending the function first if this rank does not hold it) and
        return its answer; ``OSError`` (a ``ConnectionError``) when the rank has gone."""
        if key not in self.known:
            send_frame(self.sock, pickle.dumps(("fn", key, function)))
            self.known.add(key)
        send_frame(self.sock, pickle.dumps(("task", task, key, argument)))
        answer: tuple[Any, ...] = loads(recv_frame(self.sock))
        return answer

    def close(self, say_stop: bool) -> None:
        """Close the connection (the rank's loop then ends), telling it to stop if asked."""
        if say_stop:
            with contextlib.suppress(OSError, ValueError):
                self.sock.settimeout(1.0)
                send_frame(self.sock, pickle.dumps(("stop",)))
        with contextlib.suppress(OSError):
            # shutdown wakes a thread blocked reading this socket; close alone would not
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.sock.close()


#: How a rank's connection notices that its node went silent (no FIN: a cable pulled, a host
#: frozen): TCP keep-alive probes after this many seconds idle, this often, this many times.
#: The rank's kernel answers them however long its item runs.
KEEPALIVE = (10, 5, 3)


def keep_alive(sock: socket.socket, idle: int, interval: int, count: int) -> None:
    """Have the kernel probe ``sock``'s peer: a read on it fails once the peer has been
    silent for ``idle + interval * count`` seconds, instead of waiting forever."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", count),
    ):
        if hasattr(socket, name):  # Linux; elsewhere the system's defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def head_addresses(nodes: Sequence[NodeSpec]) -> list[str]:
    """The addresses of this machine the nodes reach it at: loopback for the nodes that are this
    machine, the address on the route to each other node (asked of this machine's routes)."""
    found: list[str] = []
    for node in nodes:
        try:
            addr = (
                "127.0.0.1" if node.here else head_address_towards(socket.gethostbyname(node.host))
            )
        except OSError as exc:
            raise PoolError(
                f"No route from this machine to node {node.name} at {node.host!r} ({exc}): the "
                "pool's ranks there could not connect back to it."
            ) from exc
        if addr not in found:
            found.append(addr)
    return found or ["127.0.0.1"]


class Pool:
    """``size`` ranks of ``host`` running items, until :meth:`stop` (idempotent).

    :meth:`start` starts the job and waits until every rank has connected back (or raises
    :class:`~clusterbook.errors.PoolError` saying why not, with nothing left running);
    :meth:`lease` hands a sweep the ranks alive, :meth:`release` takes them back, a rank that
    died is :meth:`drop`\\ ped.
    """

    def __init__(
        self,
        host: PoolHost,
        size: int,
        *,
        idle_timeout: float = IDLE_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host, self.size = host, size
        self.idle_timeout, self.start_timeout, self._clock = idle_timeout, start_timeout, clock
        self.job: JobHandle | None = None
        self._ranks: list[PoolRank] = []
        self._cond = threading.Condition()
        self._busy = False
        self._stopped = False
        self._last_used = clock()
        self._listener: socket.socket | None = None
        self._slots = threading.BoundedSemaphore(_HANDSHAKES)
        self._secret = secrets.token_bytes(32)

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def alive(self) -> int:
        """Ranks connected now."""
        with self._cond:
            return len(self._ranks)

    @property
    def ranks(self) -> tuple[PoolRank, ...]:
        """The ranks connected now, by rank."""
        with self._cond:
            return tuple(self._ranks)

    @property
    def port(self) -> int | None:
        """The port the ranks connect to (None before :meth:`start`)."""
        return self._listener.getsockname()[1] if self._listener is not None else None

    def start(self) -> None:
        """Start the job and wait for its ranks; :class:`PoolError` (everything stopped) if they
        do not all connect back within :attr:`start_timeout` seconds or the job ends first."""
        certificate = make_certificate("clusterbook pool")
        context = server_context(certificate)
        addresses = head_addresses(self.host.nodes)
        bind = addresses[0] if len(addresses) == 1 else ""
        self._listener = socket.create_server((bind, 0), backlog=max(self.size, 128))
        self._listener.settimeout(0.2)
        port = self._listener.getsockname()[1]
        info = {
            "addresses": addresses,
            "port": port,
            "fingerprint": certificate.fingerprint,
            "secret": self._secret.hex(),
            "timeout": self.start_timeout,
        }
        threading.Thread(
            target=self._accept, args=(context,), name="clusterbook-pool-accept", daemon=True
        ).start()
        try:
            self.job = self.host.mpirun(
                ["python", "-c", BOOT, "clusterbook-pool"],
                np=self.size,
                env={POOL_ENV: _Hidden(json.dumps(info)), PROGRAM_ENV: packed_source()},
                abort_on_error=False,  # a worker catches what an item raises
            )
            self._wait_for_ranks()
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=self._watch, name="clusterbook-pool-watch", daemon=True).start()

    def _wait_for_ranks(self) -> None:
        deadline = self._clock() + self.start_timeout
        job = self.job
        assert job is not None
        with self._cond:
            while len(self._ranks) < self.size:
                if job.done():
                    result = job.outcome
                    said = result.summary() if result is not None else "it ended"
                    raise PoolError(
                        f"The pool's job {job.id} ended before its {self.size} ranks connected "
                        f"back to this machine ({len(self._ranks)} did): {said}. Its output: "
                        f"cluster.job({job.id!r}).logs(). The nodes must reach this machine "
                        f"at {', '.join(head_addresses(self.host.nodes))}."
                    )
                left = deadline - self._clock()
                if left <= 0:
                    raise PoolError(
                        f"{len(self._ranks)} of the pool's {self.size} ranks (job {job.id}) "
                        f"connected back within {self.start_timeout:g} s. Check that the "
                        f"nodes reach this machine at {', '.join(head_addresses(self.host.nodes))}"
                        f" (a firewall?); the job's output: cluster.job({job.id!r}).logs()."
                    )
                self._cond.wait(min(left, 0.1))

    def _accept(self, context: ssl.SSLContext) -> None:
        listener = self._listener
        assert listener is not None
        while not self._stopped:
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed by stop()
            if not self._slots.acquire(timeout=_HANDSHAKE):
                conn.close()
                continue
            threading.Thread(
                target=self._handshake,
                args=(conn, context),
                name="clusterbook-pool-handshake",
                daemon=True,
            ).start()

    def _handshake(self, conn: socket.socket, context: ssl.SSLContext) -> None:
        """Admit ``conn`` as a rank once it proves the pool's secret; else close it."""
        try:
            conn.settimeout(_HANDSHAKE)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(conn, *KEEPALIVE)
            sock = context.wrap_socket(conn, server_side=True)
            nonce = secrets.token_bytes(NONCE)
            send_frame(sock, nonce)
            answer = recv_frame(sock)
            shown, hello = answer[:32], answer[32:]
            if not secrets.compare_digest(shown, proof(self._secret, nonce, hello)):
                sock.close()
                return
            said = json.loads(hello)
            sock.settimeout(None)
            rank = PoolRank(int(said["rank"]), str(said["host"]), int(said["pid"]), sock)
        except (OSError, ValueError, KeyError, TypeError):
            conn.close()
            return
        finally:
            self._slots.release()
        with self._cond:
            if self._stopped or len(self._ranks) >= self.size:
                rank.close(say_stop=True)
                return
            self._ranks.append(rank)
            self._ranks.sort(key=lambda r: r.rank)
            self._cond.notify_all()

    def lease(self, count: int) -> list[PoolRank]:
        """Up to ``count`` ranks for one sweep (the pool is busy until :meth:`release`)."""
        with self._cond:
            if self._stopped:
                return []
            self._busy = True
            return self._ranks[:count]

    def release(self) -> None:
        """The sweep is over: the pool counts as idle from now."""
        with self._cond:
            self._busy = False
            self._last_used = self._clock()

    def drop(self, rank: PoolRank) -> None:
        """``rank`` has gone (its connection broke): it takes no more items."""
        with self._cond:
            if rank in self._ranks:
                self._ranks.remove(rank)
        rank.close(say_stop=False)

    def _watch(self) -> None:
        """Stop the pool once it has been idle for its time, or once its job has ended (the
        cluster failed it: a node lost; its ranks' connections may not say so for a while)."""
        job = self.job
        while True:
            with self._cond:
                if self._stopped:
                    return
                if idle_expired(self._last_used, self._clock(), self.idle_timeout, self._busy):
                    break
                if job is not None and job.done():
                    break
                self._cond.wait(min(self.idle_timeout, _WATCH))
        self.stop()

    def stop(self) -> None:
        """Tell every rank to stop, close the listener, and end the job (waiting for its end,
        then cancelling it if its ranks have not all gone within a few seconds)."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            ranks, self._ranks = self._ranks, []
            self._cond.notify_all()
        if self._listener is not None:
            self._listener.close()
        for rank in ranks:
            rank.close(say_stop=True)
        job = self.job
        if job is not None and not job.done():
            try:
                job.wait(timeout=5.0)
            except JobTimeoutError:
                job.cancel()
