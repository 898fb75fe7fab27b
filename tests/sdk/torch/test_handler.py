"""The torchrun handler against a real elastic cluster's store (its head in this process):
torch's registry finds it by the entry point, two agents form a round and share rank 0's
torch store, a lost agent is a node waiting, and the cluster's status shows them."""

from __future__ import annotations

import shlex
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import clusterbook as cb
from clusterbook.errors import ConfigError
from clusterbook.torch.endpoint import resolve

torch_api = pytest.importorskip("torch.distributed.elastic.rendezvous.api")
registry = pytest.importorskip("torch.distributed.elastic.rendezvous.registry")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[cb.Cluster]:
    made = cb.Cluster.elastic(2, 3, run_dir=tmp_path / "c", last_call=0.2)
    try:
        yield made.start()
    finally:
        made.stop()


@pytest.fixture
def handlers() -> Iterator[Callable[..., Any]]:
    """Handlers made as torchrun makes them (torch's registry, our entry point); all shut down
    at teardown."""
    made: list[Any] = []
    registry._register_out_of_tree_handlers()

    def make(endpoint: str, **conf: str) -> Any:
        params = torch_api.RendezvousParameters(
            "clusterbook", endpoint, "job-1", 2, 3, local_addr="127.0.0.1", **conf
        )
        handler = registry.get_rendezvous_handler(params)  # checks get_backend() too
        made.append(handler)
        return handler

    yield make
    for handler in made:
        handler.shutdown()


def join_url(cluster: cb.Cluster) -> str:
    assert cluster.join_command is not None
    return shlex.split(cluster.join_command)[3]  # clusterbook worker join URL --token-file F


def rendezvous(*handlers: Any) -> list[Any]:
    with ThreadPoolExecutor(len(handlers)) as pool:
        return list(pool.map(lambda h: h.next_rendezvous(), handlers))


def test_torch_finds_the_handler_whichever_is_imported_first():
    # torch reads the entry points as its registry is imported, which the handler's module
    # itself may be doing: the entry point must not need that module loaded.
    code = (
        "import clusterbook.torch.handler\n"
        "from torch.distributed.elastic.rendezvous import api, registry\n"
        "print(sorted(api.rendezvous_handler_registry._registry))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert "'clusterbook'" in out.stdout, out.stderr
    assert "Exception while registering" not in out.stderr


def test_two_agents_form_a_round_and_share_rank_0s_store(cluster, handlers):
    a, b = handlers(cluster.id), handlers(join_url(cluster), last_call_timeout="0.2")
    assert (a.get_backend(), a.get_run_id(), a.use_agent_store) == ("clusterbook", "job-1", True)
    got = rendezvous(a, b)
    assert sorted(info.rank for info in got) == [0, 1]
    assert {info.world_size for info in got} == {2}
    first = got[0] if got[0].rank == 0 else got[1]
    other = got[1] if first is got[0] else got[0]
    other.store.set("from-rank-1", b"hello")
    assert first.store.get("from-rank-1") == b"hello"
    # The workers' store is the same, at the address rank 0's agent reported.
    assert first.bootstrap_store_info == other.bootstrap_store_info
    assert first.bootstrap_store_info.master_addr == "127.0.0.1"
    frame = cluster.status()
    assert sorted(frame.node) == sorted(h.node for h in (a, b))
    assert set(frame.state) == {"joined"}
    assert (a.num_nodes_waiting(), a.is_closed()) == (0, False)


def test_a_lost_agent_makes_the_others_rendezvous_again(cluster, handlers):
    a, b = handlers(cluster.id), handlers(cluster.id)
    before = rendezvous(a, b)
    b.shutdown()  # leaves the round
    deadline = threading.Event()
    for _ in range(100):
        if a.num_nodes_waiting() >= 1:
            break
        deadline.wait(0.05)
    assert a.num_nodes_waiting() == 1
    c = handlers(cluster.id)
    again = rendezvous(a, c)
    assert sorted(info.rank for info in again) == [0, 1]
    assert a.num_nodes_waiting() == 0
    # The workers of the new round get a store of their own: the last round's keys (its
    # process group's addresses, under the same restart count) cannot mislead them.
    ports = {info.bootstrap_store_info.master_port for info in (*before, *again)}
    assert len(ports) == 2


def test_set_closed_closes_the_rendezvous(cluster, handlers):
    a = handlers(cluster.id)
    a.set_closed()
    assert a.is_closed()
    with pytest.raises(torch_api.RendezvousClosedError, match="closed"):
        a.next_rendezvous()


def test_an_unknown_conf_key_is_refused(cluster, handlers):
    with pytest.raises(ConfigError, match="read_timeout"):
        handlers(cluster.id, read_timeout="60")


def test_the_endpoint_by_url_takes_the_clusters_token_file(cluster):
    by_url, by_id = resolve(join_url(cluster)), resolve(cluster.id)
    assert by_url == by_id
    assert by_id.token_file.exists()
    assert resolve(join_url(cluster), "/elsewhere/token").token_file == Path("/elsewhere/token")


def test_a_cluster_whose_nodes_do_not_join_is_refused(tmp_path, make_cluster):
    local = make_cluster(sys.executable, workers=1, slots=1)
    with pytest.raises(ConfigError, match="cannot join it"):
        resolve(local.id)
