"""Rendezvous stores by URL scheme, and the join URL agents are given.

A join URL is the store's URL, the rendezvous' run id and its settings:
``tcp://10.0.0.1:29400/my-cluster?min=2&max=8&fingerprint=sha256:HEX`` (the head's TCP store,
whose certificate has that fingerprint), or
``file:///shared/rdzv/my-cluster?min=2&max=8`` (a directory every node can write). An agent
makes the store its URL names with :func:`backend_for`, chosen by scheme, the way torchrun
finds rendezvous handlers by backend name. Third parties add schemes through the
``clusterbook.rendezvous_backends`` entry point group: each entry's name is the scheme, its
object a factory ``(url, secret, *, node, timeout) -> RendezvousBackend``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.api import RendezvousBackend, RendezvousSettings, RendezvousTimeout

__all__ = [
    "ENTRY_POINTS",
    "BackendFactory",
    "backend_for",
    "channel_port",
    "join_url",
    "parse_join_url",
    "register_backend",
    "schemes",
]

ENTRY_POINTS = "clusterbook.rendezvous_backends"


class BackendFactory(Protocol):
    """Makes the store at ``url`` (its scheme's): ``node`` is the node that will use it (None:
    an observer), ``timeout`` bounds each call."""

    def __call__(
        self, url: str, secret: bytes, *, node: str | None, timeout: float
    ) -> RendezvousBackend: ...


def _tcp(url: str, secret: bytes, *, node: str | None, timeout: float) -> RendezvousBackend:
    from clusterbook.rendezvous.backends.tcp import TcpBackend

    return TcpBackend(url, secret, node=node, timeout=timeout)


def _file(url: str, secret: bytes, *, node: str | None, timeout: float) -> RendezvousBackend:
    from clusterbook.rendezvous.backends.file import FileBackend

    return FileBackend(url, timeout=max(timeout, 1.0))


_FACTORIES: dict[str, BackendFactory] = {"tcp": _tcp, "file": _file}
_LOADED = False


def register_backend(scheme: str, factory: BackendFactory) -> None:
    """Make ``scheme://`` URLs use ``factory`` (replacing the one there was)."""
    if not scheme.isidentifier():
        raise ConfigError(f"A URL scheme is letters, digits and '_', got {scheme!r}.")
    _FACTORIES[scheme] = factory


def _load_entry_points() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    from importlib.metadata import entry_points  # imported when needed: agents start faster

    for entry in entry_points(group=ENTRY_POINTS):
        if entry.name not in _FACTORIES:
            factory: Callable[..., RendezvousBackend] = entry.load()
            _FACTORIES[entry.name] = factory


def schemes() -> list[str]:
    """The URL schemes of every registered store."""
    _load_entry_points()
    return sorted(_FACTORIES)


def backend_for(
    url: str, secret: bytes, *, node: str | None = None, timeout: float = 5.0
) -> RendezvousBackend:
    """The store at ``url``, by its scheme."""
    scheme = urlsplit(url).scheme
    if scheme not in _FACTORIES:  # entry points add schemes, never replace one
        _load_entry_points()
    factory = _FACTORIES.get(scheme)
    if factory is None:
        raise ConfigError(
            f"No rendezvous store serves {scheme or 'scheme-less'} URLs like {url!r}; the known "
            f"schemes are {', '.join(s + '://' for s in sorted(_FACTORIES))}."
        )
    return factory(url, secret, node=node, timeout=timeout)


_SETTINGS = ("min", "max", "last_call", "join", "interval", "attempts", "channel")


def join_url(store_url: str, settings: RendezvousSettings, *, channel: int | None = None) -> str:
    """The URL agents join with: the store's URL, the run id and the settings, and the port of
    the head's channel server where it has one (:mod:`clusterbook.rendezvous.channels`). What
    the store's URL has in its query (the TCP store's certificate fingerprint) joins the
    settings there."""
    parts = urlsplit(store_url)
    query = urlencode(
        [
            ("min", settings.min_nodes),
            ("max", settings.max_nodes),
            ("last_call", settings.timeout.last_call),
            ("join", settings.timeout.join),
            ("interval", settings.keep_alive_interval),
            ("attempts", settings.keep_alive_max_attempt),
            *([] if channel is None else [("channel", channel)]),
            *parse_qsl(parts.query, keep_blank_values=True),
        ],
        safe=":",
    )
    base = urlunsplit(parts._replace(query="", fragment="")).rstrip("/")
    return f"{base}/{settings.run_id}?{query}"


def channel_port(url: str) -> int | None:
    """The port of the head's channel server that a join URL names (None where it names
    none); ConfigError where it is not a port."""
    given = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True)).get("channel")
    if given is None:
        return None
    if not given.isdigit() or not 0 < int(given) < 65536:
        raise ConfigError(
            f"Join URL {url!r} names {given!r} as the port of the head's channel, which is "
            "not a port; copy the whole URL the head printed."
        )
    return int(given)


def parse_join_url(url: str) -> tuple[str, RendezvousSettings]:
    """Split a join URL into the store's URL and the rendezvous settings."""
    parts = urlsplit(url) if isinstance(url, str) else None
    store, _, run_id = parts.path.rpartition("/") if parts else ("", "", "")
    scheme = parts.scheme if parts else ""
    if scheme not in _FACTORIES:  # entry points add schemes: read them only for another one
        _load_entry_points()
    usable = scheme in _FACTORIES and run_id and (parts and (parts.netloc or scheme == "file"))
    if not usable:
        raise ConfigError(
            f"Join URL {url!r} is not a clusterbook join URL; copy the whole URL the head "
            "printed, like tcp://10.0.0.1:29400/my-cluster?min=2&max=8&fingerprint=sha256:... "
            f"(stores: {', '.join(s + '://' for s in sorted(_FACTORIES))})."
        )
    assert parts is not None
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    query = dict(pairs)
    try:
        settings = RendezvousSettings(
            run_id=run_id,
            min_nodes=int(query.get("min", "1")),
            max_nodes=int(query.get("max", query.get("min", "1"))),
            timeout=RendezvousTimeout(
                join=float(query.get("join", "600")),
                last_call=float(query.get("last_call", "1")),
                close=3.0,  # leaving must not hold up an agent that is told to stop
            ),
            keep_alive_interval=float(query.get("interval", "1")),
            keep_alive_max_attempt=int(query.get("attempts", "3")),
        )
    except ValueError as exc:
        raise ConfigError(f"Join URL {url!r} has a bad setting ({exc}).") from None
    rest = urlencode([(k, v) for k, v in pairs if k not in _SETTINGS], safe=":")
    return f"{scheme}://{parts.netloc}{store}" + (f"?{rest}" if rest else ""), settings
