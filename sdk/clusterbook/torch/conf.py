"""What ``torchrun --rdzv-conf`` may say to clusterbook's handler, and the rendezvous settings
it makes with ``--nnodes`` and the cluster's own (pure).

The keys are those of torch's dynamic handler (``join_timeout``, ``last_call_timeout``,
``close_timeout``, ``keep_alive_interval``, ``keep_alive_max_attempt``), plus ``token_file``
(where the cluster's secret is, for a join URL of a cluster whose directory is not on this
machine). A key not given takes the cluster's value. Any other key is refused: a setting that
silently does nothing is worse than an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousSettings

__all__ = ["KEYS", "HandlerConf", "parse_conf"]

#: torch's dynamic handler's keys, and the settings of clusterbook's they set.
_TIMEOUTS = {"join_timeout": "join", "last_call_timeout": "last_call", "close_timeout": "close"}
_KEEP_ALIVE = ("keep_alive_interval", "keep_alive_max_attempt")
KEYS = (*_TIMEOUTS, *_KEEP_ALIVE, "token_file")
#: Keys torchrun adds to every handler's configuration by itself (``--rdzv-timeout``'s).
_FROM_TORCHRUN = frozenset({"timeout"})


@dataclass(frozen=True, slots=True)
class HandlerConf:
    """The handler's configuration: the rendezvous settings, and the token file if given."""

    settings: RendezvousSettings
    token_file: str | None = None


def _number(key: str, value: object, *, whole: bool = False) -> float:
    try:
        number = int(str(value)) if whole else float(str(value))
    except ValueError:
        kind = "a whole number" if whole else "a number of seconds"
        raise ConfigError(
            f"--rdzv-conf {key}={value} is not {kind}; give one, like {key}=3."
        ) from None
    if number <= 0:
        raise ConfigError(f"--rdzv-conf {key}={value} must be greater than zero.")
    return number


def parse_conf(
    config: Mapping[str, object], cluster: RendezvousSettings, min_nodes: int, max_nodes: int
) -> HandlerConf:
    """The settings of a torchrun agent joining the rendezvous of ``cluster`` (its settings,
    from its join URL): ``--nnodes=MIN:MAX`` and ``config`` (``--rdzv-conf``) over the
    cluster's. :class:`ConfigError` names a key that is not one of :data:`KEYS`, a value that
    is not a positive number, and a keep-alive the cluster's head would take for a dead node.
    """
    unknown = sorted(k for k in config if k not in KEYS and k not in _FROM_TORCHRUN)
    if unknown:
        raise ConfigError(
            f"--rdzv-conf {', '.join(unknown)}: not a setting of the clusterbook rendezvous "
            f"backend; it takes {', '.join(KEYS)}."
        )
    timeout = cluster.timeout
    for key, name in _TIMEOUTS.items():
        if key in config:
            timeout = replace(timeout, **{name: _number(key, config[key])})
    interval = cluster.keep_alive_interval
    if "keep_alive_interval" in config:
        interval = _number("keep_alive_interval", config["keep_alive_interval"])
    attempts = cluster.keep_alive_max_attempt
    if "keep_alive_max_attempt" in config:
        got = config["keep_alive_max_attempt"]
        attempts = int(_number("keep_alive_max_attempt", got, whole=True))
    if interval * attempts > cluster.dead_after:
        raise ConfigError(
            f"--rdzv-conf keep_alive_interval={interval:g},keep_alive_max_attempt={attempts}: "
            f"a node that beats that seldom would be dropped by the cluster's head, which "
            f"drops a node silent for {cluster.dead_after:g} s "
            f"({cluster.keep_alive_interval:g} s x {cluster.keep_alive_max_attempt}). Beat at "
            "least as often, or make the cluster with a longer keep_alive_interval."
        )
    settings = replace(
        cluster,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        timeout=timeout,
        keep_alive_interval=interval,
        keep_alive_max_attempt=attempts,
    )
    token = config.get("token_file")
    return HandlerConf(settings, None if token is None else str(token))
