"""Rendezvous speed: clusterbook's elastic rendezvous side by side with torch elastic's (c10d).

Four parts, in one run:

1. Latency of one round for N processes already started (min = max = N): from the release of
   the waiting processes to the moment every one of them holds its rank. clusterbook: a
   ``StoreServer`` here, one ``TcpBackend`` + ``RendezvousHandler`` per process. torch: a
   master ``TCPStore`` here, one c10d ``DynamicRendezvousHandler`` per process. Goals at
   N = 64: clusterbook at least 100x faster than torch, and within 10 ms. Next to them, the
   harness's floor: the same processes, each doing one request and answer with the same
   ``StoreServer`` over the same TLS connection (``TcpBackend.get_state``) and nothing else: no
   rendezvous can take less on this machine, whose 2 cores run the store and every process.
   Beside it, where a round's CPU goes: the store's threads here (the head's share: on real
   machines the nodes' work runs on theirs) and each process's ``next_rendezvous()``.
2. Last-call excess (min 2, max 4, two processes, last call 0.5 s): how long after the end of the
   last call (the moment the second node joined + 0.5 s) every process holds its rank.
   Goal <= 20 ms for clusterbook (torch's figure for information).
3. Failure detection with real agents (``clusterbook worker join``) of an elastic cluster
   (``Cluster.elastic(3, 3)``): SIGKILL one, time until the head's status says ``lost``
   (goal <= 0.5 s); SIGSTOP one, the same (expected: keep-alive 1 s x 3).
4. 1,000, 10,000 and 100,000 simulated nodes complete one round through the head's store, in
   one process: each node's join step as it leaves the node (``Step.to_wire``), the store's work
   as its event loop does it (``Step.from_wire``, steps run in batches of ``tcp_protocol.BATCH``
   on one draft, the held answers checked after each write, each node's answer its own view of
   the state, ``StateStore.view``), then what every node does with the answer (decode, its rank
   and rank 0). Simulated: the nodes and their connections (no network, no TLS: the store
   itself is the real one, without its event loop). The nodes' own work is timed apart: on
   real machines each does its share at the same time. Every node sends an agent's whole report
   (this machine's), and once the round is complete the head reads the whole state as its
   follower does (encoded by the store, sent in parts of 8 MB, joined, decoded, every report
   read). Goals: <= 1 KB per answer at 10,000 nodes; <= 5 s for the store's work, one node's
   and the head's read at 100,000. Beside them, untimed by the goal: after the round a batch
   of nodes heartbeats with new reports, and the head reads what changed since its read
   (``read_state(since=)``), as its follower does from then on.

    python benchmarks/rendezvous.py [--sizes 2,4,8,16,32,64] [--repeat 3] [--no-torch]

Parts 1 and 2 start, per library, one pool of max(sizes) worker processes (this script with
--worker) before any timing, and reuse them: a round uses the first N. Before each round every
process imports nothing more: it makes its store client (connected: clusterbook's ``TcpBackend``
reads the store once, as torch's ``TCPStore`` client connects when made) and its handler, says
it is ready, and blocks on its stdin; the release writes to every stdin. Each process reports
``time.time()`` when ``next_rendezvous()`` returned; a round lasts from the release to the
latest of those. The libraries take turns round by round; both use keep-alive 1 s x 3 and
127.0.0.1 everywhere (no name is ever resolved).

torch is not a dependency of clusterbook: its figures appear when this interpreter can import
torch (for instance a separate venv with torch and clusterbook installed), else a note says
so. The exit status is 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import selectors
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

GOAL_AT = 64  # part 1's goals are for this N
GOAL_SPEEDUP = 100.0
GOAL_LATENCY = 0.010
GOAL_LAST_CALL_EXCESS = 0.020
GOAL_KILL = 0.5
GOAL_SIMULATED = 5.0  # seconds for a round of SIM_GOAL_NODES
GOAL_ANSWER = 1000  # bytes per answer at SIM_ANSWER_NODES
LAST_CALL = 0.5  # part 2
SIM_SIZES = (1_000, 10_000, 100_000)  # part 4
SIM_ANSWER_NODES = 10_000
SIM_GOAL_NODES = 100_000
KEEP_ALIVE_INTERVAL = 1.0  # both libraries: heartbeat every second, dead after 3 missed
KEEP_ALIVE_ATTEMPTS = 3
JOIN_TIMEOUT = 120.0  # of a round; generous: a round that takes this long is a failure
START_TIMEOUT = 600.0  # for a pool of worker processes to import their library
REPLY_TIMEOUT = 120.0  # for a worker to answer a command
SETTLE = 0.1  # pause between "every process is ready" and the release
LOCAL = "127.0.0.1"  # never a host name: nothing may reverse-resolve anything


# --- worker processes ------------------------------------------------------------------------
#
# A worker is this script run with --worker LIB. It imports LIB, then follows JSON-line
# commands on stdin and answers on its original stdout (its own output goes to a log file):
#   {"cmd": "setup", "spec": {...}} -> {"ok": "ready"}   build the store client and the handler
#   {"cmd": "go"}                   -> {"ok": "done", "rank", "world_size", "t"}  (t: time.time())
#   {"cmd": "leave"}                -> {"ok": "left"}    leave the rendezvous, drop the handler
#   {"cmd": "quit"}                 -> exits
# Any failure answers {"error": traceback} and exits.


class Node(Protocol):
    """One node's side of a rendezvous, in a worker process."""

    def setup(self, spec: dict[str, Any]) -> None: ...

    def rendezvous(self) -> tuple[int, int]: ...

    def leave(self) -> None: ...


class ClusterbookNode:
    """A ``TcpBackend`` to the parent's ``StoreServer`` and a ``RendezvousHandler``."""

    def __init__(self, name: str) -> None:
        from clusterbook.rendezvous.backends.tcp import TcpBackend
        from clusterbook.rendezvous.handler import RendezvousHandler

        self.name = name
        self.handler: RendezvousHandler | None = None
        self.backend: TcpBackend | None = None

    def setup(self, spec: dict[str, Any]) -> None:
        from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
        from clusterbook.rendezvous.backends.tcp import TcpBackend, read_secret
        from clusterbook.rendezvous.handler import RendezvousHandler

        settings = RendezvousSettings(
            run_id=spec["run_id"],
            min_nodes=spec["min_nodes"],
            max_nodes=spec["max_nodes"],
            timeout=RendezvousTimeout(join=JOIN_TIMEOUT, last_call=spec["last_call"]),
            keep_alive_interval=KEEP_ALIVE_INTERVAL,
            keep_alive_max_attempt=KEEP_ALIVE_ATTEMPTS,
        )
        secret = read_secret(spec["secret_file"])
        self.backend = TcpBackend(spec["store"], secret, node=self.name)
        self.backend.get_state()  # connect now, as torch's TCPStore client does when made
        self.handler = RendezvousHandler(self.backend, settings, self.name)

    def rendezvous(self) -> tuple[int, int]:
        assert self.handler is not None
        info = self.handler.next_rendezvous()
        return info.rank, info.world_size

    def leave(self) -> None:
        if self.handler is not None:
            self.handler.shutdown()
        if self.backend is not None:
            self.backend.close()
        self.handler = self.backend = None


class FloorNode(ClusterbookNode):
    """The floor of part 1: a connected ``TcpBackend``, and one request and answer for a round
    (its rank is its index, which a rendezvous would have to agree on)."""

    def __init__(self, name: str, index: int) -> None:
        super().__init__(name)
        self.index = index
        self.size = 0

    def setup(self, spec: dict[str, Any]) -> None:
        from clusterbook.rendezvous.backends.tcp import TcpBackend, read_secret

        self.size = spec["max_nodes"]
        self.backend = TcpBackend(spec["store"], read_secret(spec["secret_file"]), node=self.name)
        self.backend.get_state()

    def rendezvous(self) -> tuple[int, int]:
        assert self.backend is not None
        self.backend.get_state()
        return self.index, self.size


class TorchNode:
    """A c10d backend (a ``TCPStore`` client of the parent's master store) and torch's
    ``DynamicRendezvousHandler``, made as ``create_handler`` makes them, but with timeouts in
    fractions of a second (``create_handler`` reads whole seconds)."""

    def __init__(self, name: str) -> None:
        import torch.distributed.elastic.rendezvous.dynamic_rendezvous  # noqa: F401

        self.name = name
        self.handler: Any = None

    def setup(self, spec: dict[str, Any]) -> None:
        from datetime import timedelta

        from torch.distributed.elastic.rendezvous import RendezvousParameters
        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend
        from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
            DynamicRendezvousHandler,
            RendezvousTimeout,
        )

        params = RendezvousParameters(
            backend="c10d",
            endpoint=spec["store"],
            run_id=spec["run_id"],
            min_nodes=spec["min_nodes"],
            max_nodes=spec["max_nodes"],
            local_addr=LOCAL,
            is_host=False,
            read_timeout=int(JOIN_TIMEOUT),
        )
        backend, store = create_backend(params)
        self.handler = DynamicRendezvousHandler.from_backend(
            run_id=spec["run_id"],
            store=store,
            backend=backend,
            min_nodes=spec["min_nodes"],
            max_nodes=spec["max_nodes"],
            local_addr=LOCAL,
            timeout=RendezvousTimeout(
                join=timedelta(seconds=JOIN_TIMEOUT),
                last_call=timedelta(seconds=spec["last_call"]),
            ),
            keep_alive_interval=KEEP_ALIVE_INTERVAL,
            keep_alive_max_attempt=KEEP_ALIVE_ATTEMPTS,
        )

    def rendezvous(self) -> tuple[int, int]:
        info = self.handler.next_rendezvous()
        return info.rank, info.world_size

    def leave(self) -> None:
        if self.handler is not None:
            self.handler.shutdown()
        self.handler = None


def worker_main(lib: str, index: int, log: str) -> int:
    """The loop of a worker process (see the protocol above)."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(out)

    def answer(**message: Any) -> None:
        answers.write(json.dumps(message) + "\n")

    try:
        t0 = time.perf_counter()
        name = f"node-{index:03d}"
        node: Node
        if lib == "clusterbook":
            node = ClusterbookNode(name)
        elif lib == "floor":
            node = FloorNode(name, index)
        else:
            node = TorchNode(name)
        answer(ok="up", import_s=time.perf_counter() - t0)
        for line in sys.stdin:
            command = json.loads(line)
            cmd = command["cmd"]
            if cmd == "setup":
                node.setup(command["spec"])
                answer(ok="ready")
            elif cmd == "go":
                cpu = time.process_time()
                rank, size = node.rendezvous()
                done = time.time()
                cpu = time.process_time() - cpu
                answer(ok="done", t=done, rank=rank, world_size=size, cpu=cpu)
            elif cmd == "leave":
                node.leave()
                answer(ok="left")
            elif cmd == "quit":
                break
    except BaseException:
        answer(error=traceback.format_exc())
        return 1
    return 0


# --- the parent's side of the workers --------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker failed, died or did not answer in time."""


class BadRound(WorkerError):
    """A round ended with ranks or world sizes that do not add up (the workers have left)."""


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    index: int
    log: Path

    def send(self, **command: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command).encode() + b"\n")
        self.proc.stdin.flush()

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def gather(workers: list[Worker], expect: str, timeout: float) -> dict[int, dict[str, Any]]:
    """One answer ``expect`` from every worker (index -> answer), within ``timeout``."""
    answers: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for w in workers:
            assert w.proc.stdout is not None
            selector.register(w.proc.stdout, selectors.EVENT_READ, w)
        while len(answers) < len(workers):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(w.index for w in workers if w.index not in answers)
                raise WorkerError(f"no {expect!r} within {timeout:g} s from workers {missing}")
            for key, _ in selector.select(left):
                w = key.data
                line = w.proc.stdout.readline()
                selector.unregister(key.fileobj)
                if not line:
                    raise WorkerError(
                        f"worker {w.index} exited ({w.proc.poll()}) before {expect!r}:\n{w.tail()}"
                    )
                message = json.loads(line)
                if "error" in message:
                    raise WorkerError(f"worker {w.index} failed:\n{message['error']}")
                if message.get("ok") != expect:
                    raise WorkerError(f"worker {w.index} answered {message}, not {expect!r}")
                answers[w.index] = message
    return answers


@dataclass
class Round:
    """One rendezvous round: when it was released and when each process held its rank; the
    CPU seconds the store used meanwhile (this process's threads but the harness's), and
    each process's CPU seconds in its ``next_rendezvous()``."""

    released: float
    done: list[float]
    store_cpu: float = 0.0
    node_cpu: list[float] = field(default_factory=list)

    @property
    def latency(self) -> float:
        return max(self.done) - self.released


class Pool:
    """``size`` started worker processes of one library, reused round after round."""

    def __init__(self, lib: str, size: int, workdir: Path) -> None:
        self.lib = lib
        self.size = size
        self.workdir = workdir
        self.workers: list[Worker] = []
        self.import_s: float = 0.0

    def start(self) -> float:
        """Start every worker and wait until each imported its library; returns seconds."""
        t0 = time.perf_counter()
        script = str(Path(__file__).resolve())
        for i in range(self.size):
            log = self.workdir / f"{self.lib}-{i:03d}.log"
            argv = [sys.executable, script, "--worker", self.lib, "--index", str(i)]
            proc = subprocess.Popen(
                [*argv, "--log", str(log)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=self.workdir,
                start_new_session=True,  # a Ctrl-C here reaches only this process
            )
            self.workers.append(Worker(proc, i, log))
        answers = gather(self.workers, "up", START_TIMEOUT)
        self.import_s = statistics.median(a["import_s"] for a in answers.values())
        return time.perf_counter() - t0

    def round(self, n: int, spec: dict[str, Any]) -> Round:
        """Set up the first ``n`` workers, release them at once, and time the round."""
        workers = self.workers[:n]
        for w in workers:
            w.send(cmd="setup", spec=spec)
        gather(workers, "ready", REPLY_TIMEOUT)
        time.sleep(SETTLE)
        others0 = time.process_time() - time.thread_time()  # the store's threads, not ours
        released = time.time()
        for w in workers:
            w.send(cmd="go")
        answers = gather(workers, "done", JOIN_TIMEOUT + REPLY_TIMEOUT)
        store_cpu = time.process_time() - time.thread_time() - others0
        for w in workers:  # only once all are done: leaving costs CPU the others would miss
            w.send(cmd="leave")
        gather(workers, "left", REPLY_TIMEOUT)
        ranks = sorted(a["rank"] for a in answers.values())
        sizes = {a["world_size"] for a in answers.values()}
        if ranks != list(range(n)) or sizes != {n}:
            raise BadRound(f"{self.lib}: bad round: ranks {ranks}, world sizes {sizes}")
        return Round(
            released,
            [a["t"] for a in answers.values()],
            store_cpu,
            [a["cpu"] for a in answers.values()],
        )

    def close(self) -> None:
        """Ask every worker to quit; kill those that do not within a few seconds."""
        for w in self.workers:
            with contextlib.suppress(OSError, ValueError):
                w.send(cmd="quit")
                assert w.proc.stdin is not None
                w.proc.stdin.close()
        deadline = time.monotonic() + 10.0
        for w in self.workers:
            try:
                w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait()
            if w.proc.stdout is not None:
                w.proc.stdout.close()
        self.workers = []


# --- the stores, on the parent's side --------------------------------------------------------


class Library(Protocol):
    """How the parent serves one library's rendezvous store and reads its state."""

    name: str

    def store_for(self, run_id: str) -> contextlib.AbstractContextManager[str]: ...

    def deadline_watch(
        self, store: str, run_id: str
    ) -> contextlib.AbstractContextManager[Callable[[], float | None]]: ...


class Clusterbook:
    """A fresh ``StoreServer`` per round, wired like the elastic head's (a node whose connection
    drops is removed at once)."""

    name = "clusterbook"

    def __init__(self, workdir: Path) -> None:
        from clusterbook.rendezvous.backends.tcp import write_secret

        self.secret_file = workdir / f"{self.name}-token"
        self.secret = write_secret(self.secret_file)

    @contextlib.contextmanager
    def store_for(self, run_id: str) -> Iterator[str]:
        from clusterbook.rendezvous.api import RendezvousSettings
        from clusterbook.rendezvous.backends.tcp_server import StoreServer
        from clusterbook.rendezvous.ops import remove_node
        from clusterbook.rendezvous.state import decode, encode

        settings = RendezvousSettings(run_id, 1, 1)  # remove_node reads min_nodes only

        def on_lost(node: str, blob: bytes) -> bytes | None:
            state = decode(blob)
            if node not in state.last_heartbeats:
                return None
            return encode(remove_node(state, node, settings))

        server = StoreServer(LOCAL, 0, secret=self.secret, on_lost=on_lost)
        try:
            server.start()
            yield server.url
        finally:
            server.close()

    @contextlib.contextmanager
    def deadline_watch(self, store: str, run_id: str) -> Iterator[Callable[[], float | None]]:
        from clusterbook.rendezvous.api import RendezvousError
        from clusterbook.rendezvous.backends.tcp import TcpBackend
        from clusterbook.rendezvous.state import decode

        seen: list[float] = []
        stop = threading.Event()
        backend = TcpBackend(store, self.secret)

        def follow() -> None:
            token = None
            while not stop.is_set():
                try:
                    current = backend.watch(token, 0.05)
                except RendezvousError:
                    return
                if current is not None and current[1] != token:
                    token = current[1]
                    deadline = decode(current[0]).deadline
                    if deadline is not None:
                        seen.append(deadline)

        thread = threading.Thread(target=follow, name="deadline-watch", daemon=True)
        thread.start()
        try:
            yield lambda: seen[-1] if seen else None
        finally:
            stop.set()
            thread.join(5.0)
            backend.close()


class Floor(Clusterbook):
    """The store of part 1's floor: clusterbook's, but each process only asks it once."""

    name = "floor"


class Torch:
    """One master ``TCPStore`` here (multi-tenant), one key per run id."""

    name = "torch"

    def __init__(self) -> None:
        from torch.distributed import TCPStore

        self.master = TCPStore(LOCAL, 0, is_master=True, multi_tenant=True, wait_for_workers=False)
        self.endpoint = f"{LOCAL}:{self.master.port}"

    @contextlib.contextmanager
    def store_for(self, run_id: str) -> Iterator[str]:
        yield self.endpoint

    @contextlib.contextmanager
    def deadline_watch(self, store: str, run_id: str) -> Iterator[Callable[[], float | None]]:
        import pickle

        from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import (
            C10dRendezvousBackend,
        )

        seen: list[float] = []
        stop = threading.Event()
        backend = C10dRendezvousBackend(self.master, run_id)

        def poll() -> None:  # torch's store has no watch: read its state every 2 ms
            while not stop.wait(0.002):
                current = backend.get_state()
                if current is not None:
                    state = pickle.loads(current[0])  # noqa: S301 - torch's own state, our store
                    if state.deadline is not None:
                        seen.append(state.deadline.timestamp())

        thread = threading.Thread(target=poll, name="deadline-poll", daemon=True)
        thread.start()
        try:
            yield lambda: seen[-1] if seen else None
        finally:
            stop.set()
            thread.join(5.0)


def spec_for(store: str, run_id: str, lib: Library, **settings: Any) -> dict[str, Any]:
    spec = {"store": store, "run_id": run_id, **settings}
    if isinstance(lib, Clusterbook):  # and Floor
        spec["secret_file"] = str(lib.secret_file)
    return spec


BAD_ROUNDS: dict[str, list[str]] = {}  # library -> what its bad rounds were


def one_round(
    pool: Pool, lib: Library, n: int, min_nodes: int, max_nodes: int, last_call: float
) -> Round:
    """A round of ``n``; torch's is tried again (twice at most) when it ends with world sizes
    that disagree, which it does now and then at N = 64 here: counted and reported. A bad
    round of clusterbook's is an error."""
    for attempt in range(3):
        run_id = f"bench-{n}-{uuid.uuid4().hex[:8]}"
        with lib.store_for(run_id) as store:
            spec = spec_for(
                store, run_id, lib, min_nodes=min_nodes, max_nodes=max_nodes, last_call=last_call
            )
            try:
                return pool.round(n, spec)
            except BadRound as exc:
                if lib.name != "torch" or attempt == 2:
                    raise
                BAD_ROUNDS.setdefault(lib.name, []).append(str(exc).split(": ranks")[0])
    raise AssertionError("unreachable")


def last_call_round(pool: Pool, lib: Library) -> float:
    """Part 2: seconds from the end of the last call to the last process holding its rank."""
    run_id = f"bench-last-call-{uuid.uuid4().hex[:8]}"
    with lib.store_for(run_id) as store, lib.deadline_watch(store, run_id) as deadline:
        spec = spec_for(store, run_id, lib, min_nodes=2, max_nodes=4, last_call=LAST_CALL)
        result = pool.round(2, spec)
        end_of_last_call = deadline()
    if end_of_last_call is None:
        raise WorkerError(f"{lib.name}: the store never showed a last-call deadline")
    return max(result.done) - end_of_last_call


# --- part 3: failure detection with real agents ----------------------------------------------


def detection_trial(
    sig: signal.Signals, workdir: Path, trial: int, timeout: float
) -> tuple[float, float]:
    """Seconds from sending ``sig`` to one of 3 agents until the head's status says lost, and
    the same from the victim's last heartbeat before the signal."""
    import clusterbook as cb

    run_dir = workdir / f"detect-{sig.name}-{trial}"
    cluster = cb.Cluster.elastic(3, 3, run_dir=run_dir, last_call=0.5)
    agents: list[subprocess.Popen[bytes]] = []
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the join command it prints
            cluster.start()
        assert cluster.join_command is not None
        # The join command without its program name: run the CLI with this Python.
        join = [sys.executable, "-m", "clusterbook", *shlex.split(cluster.join_command)[1:]]
        for i in range(3):
            log = (run_dir / f"agent-n{i}.log").open("wb")
            with log:
                agents.append(
                    subprocess.Popen(
                        [*join, "--node-id", f"n{i}", "--slots", "1"],
                        stdout=subprocess.DEVNULL,
                        stderr=log,
                        start_new_session=True,
                    )
                )
        cluster.wait_ready(timeout=60)
        time.sleep(1.5)  # every agent has heartbeated since the round completed

        def victim() -> tuple[str, float]:
            """n1's state and heartbeat age in the head's status."""
            frame = cluster.status().set_index("node")
            return frame.at["n1", "state"], frame.at["n1", "heartbeat_age"].total_seconds()

        state, age = victim()
        if state != "joined":
            raise WorkerError(f"n1 is {state}, not joined, before {sig.name}")
        t0 = time.monotonic()
        agents[1].send_signal(sig)
        while victim()[0] != "lost":
            if time.monotonic() - t0 > timeout:
                raise WorkerError(f"n1 not lost {timeout:g} s after {sig.name}")
            time.sleep(0.002)
        took = time.monotonic() - t0
        return took, took + age
    finally:
        for proc in agents[1:2]:  # the victim first: a stopped agent never leaves by itself
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        cluster.stop()  # closes the rendezvous: the others leave and exit
        for proc in agents:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- part 4: many simulated nodes ------------------------------------------------------------


@dataclass
class Simulated:
    """One simulated round: the store's seconds, one node's, and what the store sent."""

    nodes: int
    store_s: float
    store_cpu: float  # the store's CPU seconds: what a busy shared machine does not inflate
    node_s: float
    writes: int
    answers: int
    answer_bytes: int
    largest: int
    whole: int  # what one answer was before views: the state without the nodes' reports
    head_s: float  # the head's read of the whole state once the round is complete
    state_bytes: int  # the whole state, the nodes' reports with it
    parts: int  # the parts the head read it in
    beat_s: float  # the head's read of what a batch of heartbeats changed, after the round
    beat_bytes: int

    @property
    def seconds(self) -> float:
        return self.store_s + self.node_s + self.head_s


def simulated_report(name: str, index: int) -> dict[str, Any]:
    """What a simulated node reports with its join: an agent's whole report (this machine's),
    with its own hostname and address."""
    address = f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}"
    return {**_REPORT, "hostname": name, "addresses": [address]}


def head_read(store: Any) -> tuple[float, int, int]:
    """The head's read of the whole state, as its follower does it: the store encodes it (once
    a state) and sends it in parts (``tcp_protocol``'s ``R`` and ``N``), the head joins them,
    decodes the state and reads every node's report (``RendezvousHead._observe``). Seconds,
    the state's bytes, and the parts."""
    from clusterbook.rendezvous.backends.wire import PART_SIZE
    from clusterbook.rendezvous.report import NodeReport
    from clusterbook.rendezvous.state import decode

    t0 = time.perf_counter()
    current = store.current()
    blob = current[0]
    parts = [blob[at : at + PART_SIZE] for at in range(0, len(blob), PART_SIZE)]
    state = decode(b"".join(parts))
    reports = {node: NodeReport.from_text(r.text) for node, r in state.node_info.items()}
    if len(reports) != len(state.participants):
        raise AssertionError("the head's read did not find every node's report")
    return time.perf_counter() - t0, len(blob), len(parts)


_REPORT: dict[str, Any] = {}


def simulate(nodes: int) -> Simulated:
    """``nodes`` join one round (min = max = nodes) through a ``StateStore`` as the TCP store's
    event loop drives it (``tcp_protocol.StoreProtocol._run_steps``): their join steps arrive
    together, run in batches of ``BATCH``; after a decisive write every held answer it settles
    goes out, each node's view of the state (``StateStore.view``, as the server answers a node);
    each step's answer is otherwise held for as long as :meth:`Step.hold` says. A node whose
    answer goes out decodes it and finds its rank and rank 0."""
    from clusterbook.rendezvous.api import RendezvousSettings, RendezvousTimeout
    from clusterbook.rendezvous.backends._store import DECISIONS, StateStore
    from clusterbook.rendezvous.backends.tcp_protocol import BATCH
    from clusterbook.rendezvous.backends.wire import HEAD, TOKEN_INT
    from clusterbook.rendezvous.report import NodeReport
    from clusterbook.rendezvous.step import Operation, Step
    from clusterbook.rendezvous.view import NodeView, decode_answer

    if not _REPORT:
        _REPORT.update(NodeReport.here(1).to_json())
    settings = RendezvousSettings(
        "simulated",
        nodes,
        nodes,
        timeout=RendezvousTimeout(join=600.0, last_call=600.0),
        keep_alive_interval=600.0,  # the round takes seconds: no heartbeat falls due
        keep_alive_max_attempt=3,
    )
    now = time.time()
    names = [f"node-{i:06d}" for i in range(nodes)]
    sent = [  # what each node sends: its join, with its report, ready to wait 30 s
        Step(
            (Operation.JOIN,),
            name,
            settings,
            now,
            now + 600.0,
            simulated_report(name, i),
            30.0,
        ).to_wire()
        for i, name in enumerate(names)
    ]

    store = StateStore()
    answers: dict[str, bytes] = {}
    waiting: dict[str, int] = {}  # node -> the token its answer waits past
    writes = 0
    t0, cpu0 = time.perf_counter(), time.thread_time()

    def reply(node: str) -> bytes:  # as ``_reply_state`` answers a node's held step
        current = store.view(node)
        assert current is not None
        return b"s" + HEAD.pack(1, current[1]) + current[0]

    for first in range(0, nodes, BATCH):
        blobs = sent[first : first + BATCH]
        batch = [Step.from_wire(blob) for blob in blobs]
        holds, decisive = store.run(
            [(step, len(blob)) for step, blob in zip(batch, blobs, strict=True)]
        )
        writes += decisive is not None
        if decisive:  # as ``_changed``: held steps wait for a decision, which only it may settle
            for node, token in list(waiting.items()):
                if store.settled(TOKEN_INT, token, level=DECISIONS):
                    del waiting[node]
                    answers[node] = reply(node)
        for step, hold in zip(batch, holds, strict=True):
            if hold <= 0 or store.settled(TOKEN_INT, store.token, level=DECISIONS):
                answers[step.node] = reply(step.node)
            else:
                waiting[step.node] = store.token
    store_s, store_cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    if waiting:
        raise AssertionError(f"{len(waiting)} of {nodes} simulated nodes still wait")

    # Each node decodes its own answer, all at once on their machines: time one of them, and
    # check every node's rank and rank 0 on the answers as they went out.
    views = {node: decode_answer(blob[1 + HEAD.size :]) for node, blob in answers.items()}
    ranks = sorted(v.rank for v in views.values() if isinstance(v, NodeView) and v.complete)
    if ranks != list(range(nodes)) or {
        v.leader for v in views.values() if isinstance(v, NodeView)
    } != {names[0]}:
        raise AssertionError("the simulated round did not give every node one rank and rank 0")
    last = answers[names[-1]]
    t1 = time.perf_counter()
    view = decode_answer(last[1 + HEAD.size :])
    node_s = time.perf_counter() - t1
    if not isinstance(view, NodeView) or (view.rank, view.leader) != (nodes - 1, names[0]):
        raise AssertionError(f"the last node's answer is not its view: {view!r}")
    del views  # the nodes' answers are not in the head's process
    head_s, state_bytes, parts = head_read(store)  # first: it encodes the state
    whole = store.current(reports=False)
    assert whole is not None
    beat_s, beat_bytes = heartbeats_read(store, names[:BATCH], settings, now + 601.0)
    return Simulated(
        nodes,
        store_s,
        store_cpu,
        node_s,
        writes,
        len(answers),
        sum(len(blob) for blob in answers.values()),
        max(len(blob) for blob in answers.values()),
        len(whole[0]) + 1 + HEAD.size,
        head_s,
        state_bytes,
        parts,
        beat_s,
        beat_bytes,
    )


def heartbeats_read(store: Any, beating: list[str], settings: Any, now: float) -> tuple[float, int]:
    """After the round, ``beating`` nodes heartbeat with a new report (one batch), and the head
    reads what changed since the state it read (``read_state(since=)``, the store's
    ``current(since=)``): seconds (the store's encoding, the head's decoding and reading of
    the reports in it) and bytes."""
    from clusterbook.rendezvous.report import NodeReport
    from clusterbook.rendezvous.state import decode
    from clusterbook.rendezvous.step import Operation, Step

    read = store.token
    beats = [
        Step((Operation.KEEP_ALIVE,), name, settings, now, now + 5.0, {**_REPORT, "load": 1.5})
        for name in beating
    ]
    store.run([(step, len(step.to_wire())) for step in beats])
    t0 = time.perf_counter()
    current = store.current(since=read)
    state = decode(current[0])
    reports = {node: NodeReport.from_text(r.text) for node, r in state.node_info.items()}
    if len(reports) != len(beating):
        raise AssertionError(f"the head read {len(reports)} reports, not {len(beating)}")
    return time.perf_counter() - t0, len(current[0])


# --- reporting -------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f}"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


@dataclass
class Results:
    ok: bool = True
    notes: list[str] = field(default_factory=list)

    def check(self, ok: bool) -> str:
        self.ok &= ok
        return verdict(ok)


def table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    print(f"\n{title}")
    print("  " + "  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    print("  " + "  ".join("-" * w for w in widths))
    for row in rows:
        print("  " + "  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def spread(times: list[float]) -> str:
    return f"{ms(min(times))}-{ms(max(times))}"


# --- the run ---------------------------------------------------------------------------------


def torch_status(wanted: bool) -> tuple[bool, str]:
    if not wanted:
        return False, "torch skipped (--no-torch)"
    if importlib.util.find_spec("torch") is None:
        return False, f"torch is not installed for {sys.executable}: clusterbook figures only"
    import torch

    return True, f"torch {torch.__version__}"


def part1_and_2(
    sizes: list[int], torch_sizes: list[int], repeat: int, warmup: int, workdir: Path, res: Results
) -> None:
    libs: list[tuple[Library, Pool]] = []
    try:
        cb_lib = Clusterbook(workdir)
        cb_pool = Pool("clusterbook", max(sizes), workdir)
        libs.append((cb_lib, cb_pool))
        took = cb_pool.start()
        print(
            f"\nclusterbook: {cb_pool.size} worker processes up in {took:.1f} s "
            f"(import {ms(cb_pool.import_s)} ms each)"
        )
        floor_pool = Pool("floor", max(sizes), workdir)
        libs.append((Floor(workdir), floor_pool))
        took = floor_pool.start()
        print(f"floor: {floor_pool.size} worker processes up in {took:.1f} s")
        if torch_sizes:
            torch_lib = Torch()
            torch_pool = Pool("torch", max(torch_sizes), workdir)
            libs.append((torch_lib, torch_pool))
            took = torch_pool.start()
            print(
                f"torch: {torch_pool.size} worker processes up in {took:.1f} s "
                f"(import {ms(torch_pool.import_s)} ms each)"
            )

        # Part 1. Warm-up rounds with the whole pool (first calls import and allocate), then,
        # per N, the libraries take turns round after round.
        for lib, pool in libs:
            for _ in range(warmup):
                one_round(pool, lib, pool.size, pool.size, pool.size, 1.0)
        latencies: dict[str, dict[int, list[float]]] = {lib.name: {} for lib, _ in libs}
        rounds: dict[tuple[str, int], list[Round]] = {}
        for n in sizes:
            for r in range(repeat):
                turn = libs if r % 2 == 0 else libs[::-1]
                for lib, pool in turn:
                    if lib.name == "torch" and n not in torch_sizes:
                        continue
                    result = one_round(pool, lib, n, n, n, 1.0)
                    latencies[lib.name].setdefault(n, []).append(result.latency)
                    rounds.setdefault((lib.name, n), []).append(result)
            cb_times = latencies["clusterbook"][n]
            line = f"  N={n:<3} clusterbook {ms(statistics.median(cb_times))} ms"
            line += f", floor {ms(statistics.median(latencies['floor'][n]))} ms"
            if n in latencies.get("torch", {}):
                line += f", torch {ms(statistics.median(latencies['torch'][n]))} ms"
            print(line, flush=True)

        rows = []
        for n in sizes:
            cb_times = latencies["clusterbook"][n]
            cb_median = statistics.median(cb_times)
            floor_median = statistics.median(latencies["floor"][n])
            row = [str(n), ms(cb_median), spread(cb_times), ms(floor_median)]
            row.append(f"{cb_median / floor_median:.2f}")
            torch_times = latencies.get("torch", {}).get(n)
            speedup = None
            if torch_times:
                torch_median = statistics.median(torch_times)
                speedup = torch_median / cb_median
                row += [ms(torch_median), spread(torch_times), f"{speedup:.1f}x"]
            else:
                row += ["-", "-", "-"]
            if n == GOAL_AT:
                fast = res.check(cb_median <= GOAL_LATENCY)
                ahead = "n/a" if speedup is None else res.check(speedup >= GOAL_SPEEDUP)
                row.append(f"{fast} / {ahead}")
            else:
                row.append("(info)")
            rows.append(row)
        table(
            f"Part 1. Rendezvous latency, N processes already started, min = max = N "
            f"(median of {repeat}; ms from release until every process holds its rank; "
            f"floor: one request and answer each, same store and harness; goals at "
            f"N = {GOAL_AT}: <= {ms(GOAL_LATENCY)} ms / torch/clusterbook >= {GOAL_SPEEDUP:g}x)",
            [
                "N",
                "clusterbook",
                "(min-max)",
                "floor",
                "clusterbook/floor",
                "torch",
                "(min-max)",
                "torch/clusterbook",
                "goals",
            ],
            rows,
        )
        if GOAL_AT not in sizes:
            print(f"  the goals are for N = {GOAL_AT}, not among --sizes: not checked")
        cpu_rows = []
        for (name, n), done in sorted(rounds.items(), key=lambda item: (item[0][1], item[0][0])):
            store = statistics.median(r.store_cpu for r in done)
            per_node = statistics.median(statistics.mean(r.node_cpu) for r in done)
            total = statistics.median(sum(r.node_cpu) for r in done)
            cpu_rows.append([str(n), name, ms(store), f"{per_node * 1e3:.2f}", ms(total)])
        table(
            f"Part 1, CPU: where a round's work is (median of {repeat}; ms). store: the store's "
            "threads in this process during the round, the head's share (on real machines it is "
            "the head's alone, the nodes' work runs on theirs); node: what each process spent in "
            "its next_rendezvous(), and all of them together (here 2 cores run them all)",
            ["N", "library", "store", "node, each", "nodes, all"],
            cpu_rows,
        )
        skipped = [n for n in sizes if n not in torch_sizes]
        if torch_sizes and skipped:
            print(f"  torch not run at N = {', '.join(map(str, skipped))} (--torch-max-size)")

        # Part 2.
        excess: dict[str, list[float]] = {lib.name: [] for lib, _ in libs}
        rivals = [(lib, pool) for lib, pool in libs if lib.name != "floor"]
        for r in range(repeat):
            for lib, pool in rivals if r % 2 == 0 else rivals[::-1]:
                excess[lib.name].append(last_call_round(pool, lib))
        rows = []
        for lib, _ in rivals:
            times = excess[lib.name]
            median = statistics.median(times)
            if lib.name == "clusterbook":
                goal = f"<= {ms(GOAL_LAST_CALL_EXCESS)}"
                result = res.check(median <= GOAL_LAST_CALL_EXCESS)
            else:
                goal, result = "(info)", ""
            rows.append([lib.name, ms(median), spread(times), goal, result])
        table(
            f"Part 2. Last-call excess: min 2, max 4, 2 processes, last call {LAST_CALL:g} s "
            f"(median of {repeat}; ms from the end of the last call until both hold their rank)",
            ["library", "excess", "(min-max)", "goal", "result"],
            rows,
        )
    finally:
        for _, pool in libs:
            pool.close()


def part3(repeat: int, workdir: Path, res: Results) -> None:
    import clusterbook as cb

    trials: dict[signal.Signals, list[tuple[float, float]]] = {}
    try:
        for sig in (signal.SIGKILL, signal.SIGSTOP):
            trials[sig] = [detection_trial(sig, workdir, i, timeout=30.0) for i in range(repeat)]
    except cb.LauncherNotFoundError as exc:
        print(f"\nPart 3 skipped: Cluster.start() needs an MPI launcher here ({exc})")
        res.notes.append("part 3 not run: no MPI launcher")
        return
    dead_after = KEEP_ALIVE_INTERVAL * KEEP_ALIVE_ATTEMPTS
    rows = []
    for sig, label in (
        (signal.SIGKILL, "SIGKILL (connection lost)"),
        (signal.SIGSTOP, "SIGSTOP (heartbeats stop)"),
    ):
        took = [t for t, _ in trials[sig]]
        since_beat = [t for _, t in trials[sig]]
        median = statistics.median(took)
        if sig is signal.SIGKILL:
            goal, result = f"<= {ms(GOAL_KILL)}", res.check(median <= GOAL_KILL)
        else:
            goal, result = f"~{ms(dead_after)} (info)", ""
        rows.append(
            [
                label,
                ms(median),
                spread(took),
                "-" if sig is signal.SIGKILL else ms(statistics.median(since_beat)),
                goal,
                result,
            ]
        )
    table(
        f"Part 3. Failure detection: 3 agents of Cluster.elastic(3, 3), keep-alive "
        f"{KEEP_ALIVE_INTERVAL:g} s x {KEEP_ALIVE_ATTEMPTS} (median of {repeat}; ms from the "
        "signal, and from the victim's last heartbeat, until the head's status says lost)",
        ["signal", "detected", "(min-max)", "after last beat", "goal", "result"],
        rows,
    )


def part4(repeat: int, res: Results, sizes: tuple[int, ...] = SIM_SIZES) -> None:
    from clusterbook.rendezvous.backends.tcp_protocol import BATCH

    rows = []
    for nodes in sizes:
        runs = [simulate(nodes) for _ in range(repeat)]
        times = [r.seconds for r in runs]
        median = statistics.median(times)
        last = runs[-1]
        per_answer = last.answer_bytes / last.answers
        goals = []
        if nodes == SIM_ANSWER_NODES:
            goals.append((f"<= {GOAL_ANSWER:,} B/answer", per_answer <= GOAL_ANSWER))
        if nodes == SIM_GOAL_NODES:
            goals.append((f"<= {GOAL_SIMULATED:g} s", median <= GOAL_SIMULATED))
        rows.append(
            [
                f"{nodes:,}",
                f"{median:.3f}",
                f"{min(times):.3f}-{max(times):.3f}",
                f"{statistics.median(r.store_s for r in runs):.3f}",
                f"{statistics.median(r.store_cpu for r in runs):.3f}",
                f"{statistics.median(r.node_s for r in runs) * 1e6:.0f} us",
                str(last.writes),
                f"{per_answer:.0f} B",
                f"{last.largest:,} B",
                f"{last.whole / 1e6:.2f} MB",
                f"{last.answer_bytes / 1e6:.1f} MB",
                f"{statistics.median(r.head_s for r in runs):.3f}",
                f"{last.state_bytes / 1e6:.1f} MB / {last.parts}",
                f"{statistics.median(r.beat_s for r in runs):.3f} / {last.beat_bytes / 1e6:.1f} MB",
                ", ".join(goal for goal, _ in goals) or "-",
                " ".join(res.check(ok) for _, ok in goals) or "-",
            ]
        )
    table(
        "Part 4. Simulated nodes complete one round through the head's store, in one process "
        f"(median of {repeat}; store: every join step decoded and run, each node's held answer, "
        "its view of the state, encoded; node: one answer decoded, its rank and rank 0 found; "
        "head read: the whole state, every node's full report in it, encoded, read in parts, "
        "decoded and its reports read, once the round is complete; seconds: all three)",
        [
            "nodes",
            "seconds",
            "(min-max)",
            "store",
            "store CPU",
            "node",
            "writes",
            "per answer",
            "largest",
            "before: per answer",
            "round: all answers",
            "head read",
            "state / parts",
            f"head: {BATCH:,} beats",
            "goal",
            "result",
        ],
        rows,
    )
    print(
        "  'before: per answer' is what each node was answered before views: the whole state "
        "without the nodes' reports. Every node sends an agent's whole report. Not timed: "
        f"network and TLS. 'head: {BATCH:,} beats': after the round, that many nodes heartbeat "
        "with a new report and the head reads what changed since its read (seconds / bytes)."
    )


def leftover_children() -> list[str]:
    """Kill and name any child process still alive (there should be none)."""
    import psutil

    left = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            left.append(f"{child.pid} {' '.join(child.cmdline())[:80]}")
            child.kill()
    return left


def sizes_arg(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of numbers: {text!r}"
        ) from None
    if not sizes or min(sizes) < 2:
        raise argparse.ArgumentTypeError("every size must be >= 2")
    return sorted(set(sizes))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Parts: 1 latency at N, 2 last-call excess, 3 failure detection, "
        "4 10,000 simulated nodes.",
    )
    parser.add_argument(
        "--sizes",
        type=sizes_arg,
        default=sizes_arg("2,4,8,16,32,64"),
        help="process counts of part 1 (default 2,4,8,16,32,64)",
    )
    parser.add_argument("--repeat", type=int, default=3, help="rounds per figure (default 3)")
    parser.add_argument(
        "--warmup", type=int, default=1, help="uncounted rounds per library first (default 1)"
    )
    parser.add_argument(
        "--torch",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure torch elastic, when importable (default: yes)",
    )
    parser.add_argument(
        "--torch-max-size",
        type=int,
        default=None,
        help="run torch only at sizes up to this (its processes are heavy); default: all",
    )
    parser.add_argument("--parts", default="1,2,3,4", help="which parts to run (default 1,2,3,4)")
    parser.add_argument(
        "--worker", choices=["clusterbook", "floor", "torch"], help=argparse.SUPPRESS
    )
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--log", default=os.devnull, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker, args.index, args.log)
    if args.repeat < 1 or args.warmup < 0:
        parser.error("--repeat must be >= 1 and --warmup >= 0")
    parts = {p.strip() for p in args.parts.split(",")}
    if not parts <= {"1", "2", "3", "4"}:
        parser.error("--parts takes numbers among 1,2,3,4")

    import clusterbook

    has_torch, torch_note = torch_status(args.torch)
    torch_sizes = [
        n
        for n in args.sizes
        if has_torch and (args.torch_max_size is None or n <= args.torch_max_size)
    ]
    started = time.perf_counter()
    print(
        f"clusterbook {clusterbook.__version__}, {torch_note}; Python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs; sizes {','.join(map(str, args.sizes))}, repeat {args.repeat}"
    )
    res = Results()
    left: list[str] = []
    try:
        with tempfile.TemporaryDirectory(prefix="cb-rendezvous-") as tmp:
            workdir = Path(tmp)
            if parts & {"1", "2"}:
                part1_and_2(args.sizes, torch_sizes, args.repeat, args.warmup, workdir, res)
            if "3" in parts:
                part3(args.repeat, workdir, res)
            if "4" in parts:
                part4(args.repeat, res)
    finally:
        left = leftover_children()
    if not has_torch:
        print(f"\nNote: {torch_note}. Part 1 has no torch/clusterbook ratio without torch.")
    for name, bad in BAD_ROUNDS.items():
        print(
            f"Note: {len(bad)} round(s) of {name} ended with world sizes that disagree "
            "(tried again, not counted)"
        )
    for note in res.notes:
        print(f"Note: {note}")
    if left:
        print(f"\nChild processes left behind (now killed): {'; '.join(left)}")
        res.ok = False
    else:
        print("\nNo child process left behind.")
    print(f"Total {time.perf_counter() - started:.0f} s: {'every goal met' if res.ok else 'MISS'}")
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
