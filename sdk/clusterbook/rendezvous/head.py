"""The head side of a rendezvous, which every provider whose nodes run agents composes.

:class:`RendezvousHead` serves the store (a TCP :class:`StoreServer` with the cluster's secret
in a 0600 token file, its traffic TLS with a certificate of its own, pinned by the fingerprint
in the join URL), follows its state on a thread of its own, and answers what the cluster asks
of its nodes: are they ready, who is in the round and what did they report, which are lost
(and how often), their status. It writes the state only through ``RendezvousBackend.update()``
to drop nodes whose heartbeat is overdue (a node cut off says nothing, and with no other node
left to notice, the head must), to ask the agents to stop a job, and to close the rendezvous.

A node whose connection to the store breaks is removed at once (the store's connection-loss
fast path); one that stops heartbeating, after ``keep_alive_interval x keep_alive_max_attempt``
seconds. A state that cannot be decoded never kills the follower: it is reported
(:meth:`problem`) until a good one comes, and closing replaces it with a closed one.

A head that started its agents knows their lease, so when a node gone has given up for good
(its agent stops once it lost the store that long: :func:`.agent.gives_up_after`)."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import replace
from pathlib import Path

from clusterbook.errors import ClusterStateError, ReadyTimeoutError
from clusterbook.paths import cluster_dir
from clusterbook.rendezvous.agent import gives_up_after
from clusterbook.rendezvous.api import (
    RendezvousConnectionError,
    RendezvousError,
    RendezvousSettings,
    RendezvousStateError,
)
from clusterbook.rendezvous.backends._secret import remove_secret
from clusterbook.rendezvous.backends.tcp import TcpBackend, write_secret
from clusterbook.rendezvous.backends.tcp_server import StoreServer
from clusterbook.rendezvous.channels import ChannelServer
from clusterbook.rendezvous.node_status import node_statuses, unreachable
from clusterbook.rendezvous.ops import Action, apply, next_expiry, remove_node, sanitize
from clusterbook.rendezvous.registry import join_url
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import RendezvousState, decode, encode
from clusterbook.rendezvous.step import WAKE_SLACK
from clusterbook.resources import HISTORY_SPAN, ResourceHistory
from clusterbook.status import NodeStatus

__all__ = ["RendezvousHead", "watch_wait"]

_log = logging.getLogger("clusterbook.rendezvous")
_KEEP_STOPS = 16  # stop requests kept in the state (agents act on the ones they have not seen)
_LEAVE_WAIT = 3.0  # seconds the agents get to leave cleanly once the rendezvous is closed
_WATCH_CAP = 1.0  # longest watch of the follower
_WATCH_FLOOR = 0.05  # shortest: a node that cannot be dropped (a corrupt state) costs no spin
_GIVE_UP_CHECK = 0.25  # how often wait_ready() asks whether the nodes are gone for good


def watch_wait(state: RendezvousState, settings: RendezvousSettings, now: float) -> float:
    """How long the follower may watch the store from ``state`` at ``now``: until the oldest
    heartbeat expires (a hair past it), a second at most; so a node that stops heartbeating
    is dropped on time even when no other node's write wakes the follower."""
    until = next_expiry(state, settings) - now + WAKE_SLACK
    return min(_WATCH_CAP, max(_WATCH_FLOOR, until))


class RendezvousHead:
    """Serves and follows one cluster's rendezvous (see the module docstring). ``settings``
    are checked when this is made; their run id is set to the cluster's at :meth:`start`.
    ``listen``, ``port``: where the store listens (0: any free port); ``lease``: the agents',
    when the head started them itself (:meth:`given_up`); ``channel_port``: that of
    :attr:`channels` (0: any free one; None: none)."""

    def __init__(
        self,
        settings: RendezvousSettings,
        *,
        listen: str = "127.0.0.1",
        port: int = 0,
        lease: float | None = None,
        channel_port: int | None = None,
    ) -> None:
        self._settings, self._lease = settings, lease
        self._listen, self._port, self._channel_port = listen, port, channel_port
        self._cond = threading.Condition()
        self._state = RendezvousState()
        self._seen: dict[str, NodeReport] = {}  # every node ever seen: its last report
        self._texts: dict[str, str] = {}  # ... as the text it came as
        self._gone: dict[str, str] = {}  # node -> "lost" | "left"
        self._losses: Counter[str] = Counter()  # node -> times it was lost
        self._heard: dict[str, float] = {}  # node -> its last heartbeat seen (wall time)
        self._observed = 0  # states observed so far
        self._dropped: dict[str, int] = {}  # node -> states observed when the store dropped it
        self._given_up: set[str] = set()  # as last told
        beat = settings.keep_alive_interval  # use reported: a sample a beat, 10 min or beats
        self.history = ResourceHistory(beat, max(HISTORY_SPAN, 10 * beat))
        self._server: StoreServer | None = None
        self._watcher: TcpBackend | None = None
        self._writer: TcpBackend | None = None
        self._stop = threading.Event()
        self._changed: Callable[[], None] = lambda: None
        self._problem: str | None = None
        self.join_url: str | None = None
        self.token_file: Path | None = None
        self.secret: bytes | None = None
        self.channels: ChannelServer | None = None

    @property
    def settings(self) -> RendezvousSettings:
        return self._settings

    # -- lifecycle ----------------------------------------------------------------------

    def start(
        self, cluster_id: str, changed: Callable[[], None], *, listen: str | None = None
    ) -> None:
        """Write the token file, serve the store (on ``listen``, where only the start tells
        where the nodes reach the head) and follow it; ``changed()`` is called on every change
        of the nodes (from the follower's thread)."""
        self._listen = listen or self._listen
        self._settings = replace(self._settings, run_id=cluster_id)
        self._changed = changed
        directory = cluster_dir(cluster_id)
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.token_file = directory / "token"
        self.token_file.unlink(missing_ok=True)
        self.secret = secret = write_secret(self.token_file)
        self._server = StoreServer(self._listen, self._port, secret=secret, on_lost=self._lost)
        self._server.start()
        if (at := self._channel_port) is not None:  # agents dial it: daemons with no login
            self.channels = ChannelServer(self._listen, self._server.certificate, secret, port=at)
        port = self.channels.start() if self.channels is not None else None
        self.join_url = join_url(self._server.url, self._settings, channel=port)
        # In-process connections (no TLS); writes on their own: the watcher's is held by a
        # long-poll most of the time, and a write queued behind it would wait up to a second.
        self._watcher = self._server.local_client()
        self._writer = self._server.local_client()
        threading.Thread(target=self._follow, name="clusterbook-rendezvous", daemon=True).start()

    def close(self) -> None:
        """Close the rendezvous (the agents leave), give them a moment, stop serving, remove
        the token file (its directory too, if that empties it). Safe to call again."""
        server, self._server = self._server, None
        if server is None:
            return
        watcher, writer = self._watcher, self._writer
        try:
            if writer is not None:
                try:
                    writer.update(self._closed_state)
                except RendezvousError as exc:
                    run = self._settings.run_id
                    _log.warning("Could not close the rendezvous %r: %s", run, exc)
                else:
                    with self._cond:
                        self._cond.wait_for(
                            lambda: not (self._state.participants or self._state.wait_list),
                            _LEAVE_WAIT,
                        )
        finally:
            self._stop.set()
            for closing in (watcher, writer, server, self.channels):
                if closing is not None:
                    closing.close()
            if self.token_file is not None:
                remove_secret(self.token_file)

    def _closed_state(self, blob: bytes | None) -> bytes | None:
        """The stored state, closed: no node may join any more, the agents leave. A state that
        does not decode is replaced by a closed one (the agents see that too)."""
        try:
            state = RendezvousState() if blob is None else decode(blob)
        except RendezvousStateError:
            state = RendezvousState()
        if state.closed:
            return None
        closed = apply(Action.MARK_RENDEZVOUS_CLOSED, state, "head", self._settings, time.time())
        return encode(closed)

    # -- following the state ------------------------------------------------------------

    def _lost(self, node: str, blob: bytes) -> bytes | None:
        """The store's connection-loss fast path: drop ``node`` from ``blob`` at once."""
        state = decode(blob)
        if node not in state.last_heartbeats:
            return None
        with self._cond:
            self._gone[node] = "lost"
            self._losses[node] += 1
            self._dropped[node] = self._observed
        return encode(remove_node(state, node, self._settings))

    def _follow(self) -> None:
        token = None
        assert self._watcher is not None
        while not self._stop.is_set():
            try:
                with self._cond:
                    state = self._state
                # The state in parts (with the nodes' reports it outgrows one frame), with the
                # reports written since the last one read only: the others are in _seen.
                wait = watch_wait(state, self._settings, time.time())
                current = self._watcher.read_state(token, wait, since=token)
                if current is not None and current[1] != token:
                    token = current[1]
                    self._observe(decode(current[0]))
                    self._set_problem(None)
                self._expire()
                self._note_given_up()
            except RendezvousConnectionError:
                if self._stop.wait(0.1):
                    return
            except RendezvousStateError as exc:
                self._set_problem(
                    f"The rendezvous state cannot be read ({exc}); node status is stale. "
                    "Stop the cluster (it cleans up every node it can reach)."
                )
            except Exception as exc:
                _log.exception("Following the rendezvous of %r failed.", self._settings.run_id)
                self._set_problem(f"Following the rendezvous failed: {type(exc).__name__}: {exc}")
                if self._stop.wait(0.5):
                    return

    def _set_problem(self, problem: str | None) -> None:
        if problem != self._problem:
            self._problem = problem
            self._tell()

    def _tell(self) -> None:
        """Call the change callback; its own failure is logged, never the follower's end."""
        try:
            self._changed()
        except Exception:
            _log.exception("A change callback of the rendezvous %r failed.", self._settings.run_id)

    def _expire(self) -> None:
        writer = self._writer
        with self._cond:
            state = self._state
        if writer is None or sanitize(state, self._settings, time.time()) is state:
            return

        def expire(blob: bytes | None) -> bytes | None:
            if blob is None:
                return None
            current = decode(blob)
            fresh = sanitize(current, self._settings, time.time())
            return None if fresh is current else encode(fresh)

        writer.update(expire)

    def _note_given_up(self) -> None:
        """Tell when the nodes given up change: only time passing makes a node given up."""
        if self._lease is None:
            return
        now = set(self.given_up())
        if now != self._given_up:
            self._given_up = now
            self._tell()

    def _observe(self, state: RendezvousState) -> None:
        now = time.time()
        with self._cond:
            self._observed += 1
            before = set(self._state.last_heartbeats)
            beats = state.last_heartbeats
            fresh = [n for n, t in beats.items() if self._heard.get(n) != t]
            self._heard.update(beats)
            for node, report in state.node_info.items():
                # Read again only what changed: a round of many nodes sends each one once.
                if self._texts.get(node) != report.text:
                    self._texts[node] = report.text
                    self._seen[node] = NodeReport.from_text(report.text)
                # Back, unless this state was read just before the store dropped the node (as
                # its connection broke): the next one has it only if it joined again.
                if node not in before or self._observed > self._dropped.get(node, -2) + 1:
                    self._gone.pop(node, None)
            for node in before - set(state.last_heartbeats):
                if node not in self._gone:
                    last = self._state.last_heartbeats.get(node, 0.0)
                    dead = now - last > self._settings.keep_alive_interval * 1.5
                    self._gone[node] = "lost" if dead else "left"
                    self._losses[node] += dead
            self._state = state
            self._cond.notify_all()
            for node in fresh:  # a heartbeat (or join) since the state before: a sample
                if node in state.node_info:
                    self.history.add(node, beats[node], **self._seen[node].usage())
        self._tell()

    # -- what the cluster asks ----------------------------------------------------------

    def problem(self) -> str | None:
        """What keeps the head from following the rendezvous now (a corrupt state)."""
        return self._problem

    def participants(self) -> list[tuple[str, NodeReport]]:
        """The nodes of the last complete round, by rank, with their reports (or none)."""
        with self._cond:
            state, seen = self._state, dict(self._seen)
        if not state.complete:
            return []
        ranked = sorted(state.participants.items(), key=lambda kv: kv[1])
        return [(node, seen.get(node, NodeReport())) for node, _ in ranked]

    def reports(self) -> dict[str, NodeReport]:
        """The last report of every node seen."""
        with self._cond:
            return dict(self._seen)

    def set_report(self, node: str, report: NodeReport) -> None:
        """Take ``report`` as ``node``'s last one (until the node reports again)."""
        with self._cond:
            self._seen[node] = report

    def given_up(self) -> dict[str, float]:
        """The nodes gone that will not come back by themselves, each with the wall time it was
        last heard from: longer ago than their agent tries without the head (none if no lease)."""
        if self._lease is None:
            return {}
        after = gives_up_after(self._lease, self._settings.keep_alive_interval)
        now = time.time()
        with self._cond:
            gone = [n for n in self._gone if n not in self._state.last_heartbeats]
            heard = dict(self._heard)
        return {n: heard[n] for n in gone if n in heard and now - heard[n] > after}

    def wait_ready(
        self, timeout: float, hint: str = "", give_up: Callable[[], str | None] | None = None
    ) -> None:
        """Return once a round of at least ``min_nodes`` is complete; raise
        :class:`ReadyTimeoutError` after ``timeout`` seconds saying who joined (``hint``: how
        to start more nodes), and :class:`ClusterStateError` with what ``give_up()`` says as
        soon as it says something (why the nodes cannot come back)."""
        deadline = time.monotonic() + timeout
        least = self._settings.min_nodes
        while True:
            # Asked outside the lock: it may ask the provider, whose threads take ours.
            if give_up is not None and (why := give_up()):
                raise ClusterStateError(why)
            with self._cond:
                state = self._state
                if state.complete and len(state.participants) >= least:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    joined = sorted(state.participants)
                    reason = f"{len(joined)} of at least {least} nodes joined "
                    reason += f"({', '.join(joined) or 'none'})"
                    said = f"The cluster is not ready after {timeout:g} s: {reason}."
                    said += f" {hint}" if hint else ""
                    raise ReadyTimeoutError(said, timeout=timeout, reason=reason)
                # Time passing alone can make give_up() say something: ask it now and then.
                self._cond.wait(left if give_up is None else min(left, _GIVE_UP_CHECK))

    def stop_job(self, token: str) -> None:
        """Ask every agent to stop the processes of job ``token`` on its node."""
        writer = self._writer
        if writer is None:
            return

        def ask(blob: bytes | None) -> bytes | None:
            if blob is None:
                return None
            state = decode(blob)
            return encode(replace(state, stop_jobs=(*state.stop_jobs, token)[-_KEEP_STOPS:]))

        writer.update(ask)

    def node_statuses(self) -> list[NodeStatus]:
        """Every node seen: pending (waiting), joined, lost or left, with heartbeat and load."""
        with self._cond:
            state, seen, gone = self._state, dict(self._seen), dict(self._gone)
        return node_statuses(state, seen, gone, time.time())

    def wait_observed(self, count: int, timeout: float) -> int:
        """The count of states seen, once over ``count`` (-1: now) or after ``timeout`` s."""
        with self._cond:
            self._cond.wait_for(lambda: self._observed > count, timeout)
            return self._observed

    def losses(self) -> dict[str, int]:
        """How many times each node was lost, joined again since or not (never: absent)."""
        with self._cond:
            return dict(self._losses)

    def unreachable(
        self, names: Collection[str], *, lost_only: bool = False, ended: bool = False
    ) -> dict[str, str]:
        """Of the nodes ``names``, those lost (and, unless ``lost_only``, those not heard from
        for over 1.5 heartbeat intervals), each with a sentence saying so. ``ended``: the
        caller's work on them ended unexplained (MPI lost its daemons there), so a node whose
        connection dropped is lost now: the grace in which it could come back (a transient
        drop of a live node) could not save that work, and is not waited for."""
        server = self._server
        if ended and server is not None:
            server.lose_now(names)
        return unreachable(self.node_statuses(), names, self._settings, lost_only=lost_only)
