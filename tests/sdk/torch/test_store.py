"""clusterbook.torch.store(): a job's torch store from its environment."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

from clusterbook.errors import ConfigError
from clusterbook.torch import store

pytest.importorskip("torch.distributed")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_rank_0_hosts_and_the_others_reach_it():
    job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    first = store(10, env={**job, "RANK": "0"})
    second = store(10, env={**job, "RANK": "1"})
    second.set("k", b"from rank 1")
    assert first.get("k") == b"from rank 1"


def test_under_torchrun_every_worker_reaches_the_agents_store_under_its_restart():
    from torch._C._distributed_c10d import TCPStore

    agents = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    job = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(agents.port),
        "WORLD_SIZE": "2",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "3",
    }
    with ThreadPoolExecutor(2) as pool:  # rank 0 too connects, hosting nothing
        got = list(pool.map(lambda r: store(10, env={**job, "RANK": str(r)}), range(2)))
    got[1].set("k", b"v")
    assert got[0].get("k") == b"v"
    assert agents.get("/worker/attempt_3/k") == b"v"


def test_outside_a_job_it_names_what_is_missing():
    with pytest.raises(ConfigError, match="MASTER_PORT, RANK"):
        store(env={"MASTER_ADDR": "h", "WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="not whole numbers"):
        store(env={"MASTER_ADDR": "h", "MASTER_PORT": "x", "RANK": "0", "WORLD_SIZE": "2"})
