"""``torchrun --rdzv-backend=clusterbook``: torch's ``RendezvousHandler`` contract on
clusterbook's rendezvous.

torchrun loads this module when it makes a handler (the ``torchrun.handlers`` entry point is
:func:`clusterbook.torch.handlers`); it imports torch, so nothing else of clusterbook imports
it. Each torchrun agent joins the
rendezvous of a running cluster (``--rdzv-endpoint``, see :mod:`.endpoint`) as a node of its
own, reporting what its machine is as ``clusterbook worker join`` does, so the cluster's status
shows it. Its connection to the cluster's store tells the head at once when the agent dies.

The stores torch's agents and workers share are torch TCPStores hosted by the agent of
rank 0, as torch's c10d handler hosts them. The agents' store: every agent starts one before
it joins and reports its address with its facts; once a round is complete, the others read
rank 0's report (one read of the state as the head sees it) and use it under the round's
prefix. The workers' store: rank 0's agent starts a new one for each round and says where
through the agents' (:class:`RendezvousStoreInfo`), when ``use_agent_store`` (torch's: true
unless ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``); workers use it through
``MASTER_ADDR``/``MASTER_PORT`` (``init_process_group("gloo")``, ``env://``), or
:func:`clusterbook.torch.store` for ``init_process_group(store=...)``.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

# torch.distributed's own names (it re-exports them without saying so to type checkers).
from torch._C._distributed_c10d import PrefixStore, Store, TCPStore
from torch.distributed.elastic.rendezvous import api as torch_api

from clusterbook.nodes.tasks.cpus import usable_cores_here
from clusterbook.rendezvous import api
from clusterbook.rendezvous.handler import RendezvousHandler as Handler
from clusterbook.rendezvous.host_facts import UsageMeter
from clusterbook.rendezvous.registry import BackendFactory, backend_for, parse_join_url
from clusterbook.rendezvous.report import NodeReport
from clusterbook.rendezvous.state import RendezvousState, decode
from clusterbook.rendezvous.view import decode_answer, fresh
from clusterbook.torch.conf import parse_conf
from clusterbook.torch.endpoint import resolve

__all__ = ["BACKEND", "ClusterbookHandler", "create_handler"]

BACKEND = "clusterbook"
#: Where a node's report says where its torch store listens (``ADDR:PORT``).
STORE_KEY = "torch_store"
_STORE_TIMEOUT = timedelta(seconds=60)  # as torch's c10d handler's store reads (read_timeout)
_HANDLERS = itertools.count()  # handlers made in this process: each is a node of its own
_ERRORS: tuple[tuple[type[api.RendezvousError], type[torch_api.RendezvousError]], ...] = (
    (api.RendezvousClosedError, torch_api.RendezvousClosedError),
    (api.RendezvousTimeoutError, torch_api.RendezvousTimeoutError),
    (api.RendezvousConnectionError, torch_api.RendezvousConnectionError),
    (api.RendezvousStateError, torch_api.RendezvousStateError),
)


def _torch_error(exc: api.RendezvousError) -> torch_api.RendezvousError:
    """The torch error torch's agent expects for ``exc``, with its message."""
    for ours, theirs in _ERRORS:
        if isinstance(exc, ours):
            return theirs(str(exc))
    return torch_api.RendezvousError(str(exc))


def address_towards(host: str, port: int) -> str:
    """This machine's address on the way to ``host`` (no packet is sent): where the others of
    the cluster, which reach the same store, may reach this one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))
        address: str = probe.getsockname()[0]
    return address


class ClusterbookHandler(torch_api.RendezvousHandler):
    """One torchrun agent in a cluster's rendezvous.

    Parameters
    ----------
    run_id
        torchrun's ``--rdzv-id``: the prefix of the keys its agents share.
    backend
        The cluster's store, made for the node ``node``.
    settings
        The rendezvous settings (the cluster's run id, torchrun's bounds and timeouts).
    node
        This agent's node id.
    local_addr
        Where this agent's torch store listens for the others.
    report
        What this node says of itself at join and with each heartbeat.
    """

    def __init__(
        self,
        run_id: str,
        backend: api.RendezvousBackend,
        settings: api.RendezvousSettings,
        node: str,
        local_addr: str,
        report: Callable[[], dict[str, Any]],
    ) -> None:
        self._run_id = run_id
        self._backend = backend
        self._addr = local_addr
        self._report = report
        self._server: TCPStore | None = None  # the agents' store here (theirs if rank 0)
        self._workers: TCPStore | None = None  # the workers' store of this round, if rank 0
        self._rdzv = Handler(backend, settings, node, info=self._info)
        self._round: tuple[int, int] | None = None

    @property
    def node(self) -> str:
        """This agent's node id in the cluster (``HOST-PID``): its name in status."""
        return self._rdzv.node

    def get_backend(self) -> str:
        return BACKEND

    def get_run_id(self) -> str:
        return self._run_id

    @property
    def use_agent_store(self) -> bool:
        return os.getenv("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "0") != "1"

    def _info(self) -> dict[str, Any]:
        info = self._report()
        if self._server is not None:
            info[STORE_KEY] = f"{self._addr}:{self._server.port}"
        return info

    def next_rendezvous(self) -> torch_api.RendezvousInfo:
        if self._server is None:  # before joining: its address goes with the join
            self._server = TCPStore(
                self._addr, 0, is_master=True, multi_tenant=True, wait_for_workers=False
            )
        try:
            got = self._rdzv.next_rendezvous()
        except api.RendezvousError as exc:
            raise _torch_error(exc) from exc
        # A complete round only ever loses members (newcomers wait): its size says whether
        # it is still the same round of the same nodes.
        self._round = (got.round, got.world_size)
        if got.leader is None:
            raise torch_api.RendezvousStateError(
                f"Round {got.round} completed without a rank 0 to name: it left at once; "
                "torchrun starts a new round."
            )
        where = self._store_of(got.leader, got.round)
        addr, _, port = where.rpartition(":")
        base: Store = self._server
        if got.rank != 0:
            base = TCPStore(addr, int(port), is_master=False, timeout=_STORE_TIMEOUT)
        return self._info_for(
            got.rank,
            got.world_size,
            PrefixStore(f"torch.rendezvous.{self._run_id}.{got.round}", base),
        )

    def _info_for(self, rank: int, world_size: int, store: Store) -> torch_api.RendezvousInfo:
        # The workers' store: a new one each round (rank 0's agent hosts it, as torch's c10d
        # handler does), so that no key of the last round's workers (their process group's
        # addresses) misleads the next, which a change of members restarts with the same
        # TORCHELASTIC_RESTART_COUNT, hence the same prefix. It is made before the last one
        # goes (never the same port), and its address goes through the round's store, as
        # torch's handlers say it. Without use_agent_store, the workers' rank 0 hosts one.
        workers = None
        if rank == 0 and self.use_agent_store:
            workers = TCPStore(
                self._addr, 0, is_master=True, multi_tenant=True, wait_for_workers=False
            )
        self._workers = workers
        served = workers.port if workers is not None else None
        bootstrap = torch_api.RendezvousStoreInfo.build(rank, store, self._addr, served)
        return torch_api.RendezvousInfo(store, rank, world_size, bootstrap)

    def _store_of(self, node: str, round_: int) -> str:
        """Where the torch store of ``node`` listens, from its report: the state as the head
        reads it (a node's own answers leave the reports out), once a round."""
        if node == self._rdzv.node and self._server is not None:
            return f"{self._addr}:{self._server.port}"
        try:
            current = self._backend.read_state(None, 0.0)  # whole: it may outgrow a frame
            reports = decode(current[0]).node_info if current is not None else {}
        except api.RendezvousError as exc:
            raise _torch_error(exc) from exc
        report = reports.get(node)
        where = None if report is None else report.get(STORE_KEY)
        if not isinstance(where, str):
            raise torch_api.RendezvousStateError(
                f"Node {node!r}, rank 0 of round {round_}, did not say where its torch store "
                "is: it left since, or it is no torchrun agent. torchrun joins a cluster of "
                "torchrun agents only (an elastic cluster of its own)."
            )
        return where

    def is_closed(self) -> bool:
        try:
            return self._rdzv.is_closed()
        except api.RendezvousError as exc:
            raise _torch_error(exc) from exc

    def set_closed(self) -> None:
        """Close the rendezvous: that of the cluster, whose own agents then leave too."""
        try:
            self._rdzv.set_closed()
        except api.RendezvousError as exc:
            raise _torch_error(exc) from exc

    def num_nodes_waiting(self) -> int:
        """Nodes waiting for the next round; at least 1 once this node's round lost a node
        (its connection dropped or its heartbeat expired): torch's agent then restarts its
        workers on a new round at once, without waiting for them to fail. torch asks every
        monitor interval (0.1 s): this node's view of the state is read (its size does not grow
        with the cluster: a watch of the members that returns at once)."""
        try:
            current = self._backend.watch_members(None, 0.0)
            observed = decode_answer(current[0]) if current is not None else RendezvousState()
        except api.RendezvousError as exc:
            raise _torch_error(exc) from exc
        state = fresh(observed, self._rdzv.settings, time.time())
        if state is None:  # a member's heartbeat expired: the round lost it
            return max(observed.waiting, 1) if self._round is not None else observed.waiting
        now = (state.round, state.joined)
        if self._round is not None and state.complete and now != self._round:
            return max(state.waiting, 1)
        return state.waiting

    def shutdown(self) -> bool:
        left = self._rdzv.shutdown()
        self._backend.close()
        return left


def create_handler(
    params: torch_api.RendezvousParameters, *, backends: BackendFactory = backend_for
) -> ClusterbookHandler:
    """The handler for torchrun's parameters (``--rdzv-endpoint``, ``--nnodes``,
    ``--rdzv-conf``, ``--local-addr``)."""
    from clusterbook.rendezvous.backends.tcp import read_secret

    token = params.config.get("token_file")
    where = resolve(params.endpoint, None if token is None else str(token))
    store_url, cluster = parse_join_url(where.join_url)
    conf = parse_conf(params.config, cluster, params.min_nodes, params.max_nodes)
    secret = read_secret(where.token_file)
    nth = next(_HANDLERS)  # as torch's own handlers tell apart those of one process
    node = f"{socket.gethostname()}-{os.getpid()}" + (f"-{nth}" if nth else "")
    backend = backends(store_url, secret, node=node, timeout=5.0)
    addr = params.local_addr or _address_of(store_url)
    facts = NodeReport.here(usable_cores_here())
    meter = UsageMeter(facts.gpus)  # a run of nvidia-smi left at exit ends by itself
    return ClusterbookHandler(
        params.run_id,
        backend,
        conf.settings,
        node,
        addr,
        lambda: facts.with_load(meter).to_json(),
    )


def _address_of(store_url: str) -> str:
    from clusterbook.errors import ConfigError
    from clusterbook.rendezvous.backends.url import parse_store_url

    try:
        host, port, _ = parse_store_url(store_url)
    except ConfigError:  # a store that is no host's (file://): as torch's handlers say
        return socket.getfqdn()
    return address_towards(host, port)
