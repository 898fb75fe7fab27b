"""A torch ``Store`` for the ranks of a job: ``init_process_group(store=clusterbook.torch.store(),
rank=..., world_size=...)``.

Under ``cluster.mpirun`` rank 0 hosts a ``TCPStore`` at the ``MASTER_ADDR``/``MASTER_PORT``
the job sets (a port free on rank 0's node) and the others connect to it, as ``env://`` does.
Under ``torchrun`` (``TORCHELASTIC_USE_AGENT_STORE=True``) every worker connects to the store
its agents share, under a prefix of its restart, as ``env://`` does there too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from clusterbook.errors import ConfigError

if TYPE_CHECKING:
    from torch._C._distributed_c10d import Store

__all__ = ["store"]

_NEEDED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")


def store(timeout: float = 300.0, *, env: Mapping[str, str] | None = None) -> Store:
    """The job's torch store, from its environment (``env``: ``os.environ`` by default).

    Parameters
    ----------
    timeout
        Seconds a read waits for a key, and the others for rank 0's store.

    Raises
    ------
    ConfigError
        Outside a job: a variable of ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and
        ``WORLD_SIZE`` is missing or not a number.
    """
    # torch.distributed's own names (it re-exports them without saying so to type checkers).
    from torch._C._distributed_c10d import PrefixStore, TCPStore

    env = os.environ if env is None else env
    missing = [name for name in _NEEDED if not env.get(name)]
    if missing:
        raise ConfigError(
            f"clusterbook.torch.store() needs {', '.join(missing)} in the environment, which "
            "cluster.mpirun and torchrun set for every rank; call it in a rank of a job."
        )
    try:
        port, rank, world = (int(env[n]) for n in ("MASTER_PORT", "RANK", "WORLD_SIZE"))
    except ValueError:
        got = ", ".join(f"{n}={env[n]!r}" for n in _NEEDED)
        raise ConfigError(f"clusterbook.torch.store(): {got}: not whole numbers.") from None
    agents = env.get("TORCHELASTIC_USE_AGENT_STORE") == str(True)
    tcp = TCPStore(
        env["MASTER_ADDR"],
        port,
        world,
        is_master=rank == 0 and not agents,
        timeout=timedelta(seconds=timeout),
        wait_for_workers=False,
    )
    if agents:  # keys of an earlier attempt stay in the agents' store
        return PrefixStore(f"/worker/attempt_{env.get('TORCHELASTIC_RESTART_COUNT', 0)}", tcp)
    return tcp
