"""The rendezvous store's URL: ``tcp://host:port?fingerprint=sha256:HEX``, read and written.

The host and port are where the head's store listens (an IPv6 host in brackets); the
fingerprint is that of the certificate the store shows (:mod:`._tls`), which clients pin.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

from clusterbook.errors import ConfigError
from clusterbook.rendezvous.backends._tls import check_fingerprint

__all__ = ["format_url", "parse_store_url", "parse_url"]


def parse_url(url: object) -> tuple[str, int]:
    """``(host, port)`` of a ``tcp://host:port`` URL (IPv6 hosts in brackets), which may name
    the store's certificate (``?fingerprint=sha256:HEX``)."""
    host, port, _ = parse_store_url(url)
    return host, port


def parse_store_url(url: object) -> tuple[str, int, str | None]:
    """``(host, port, fingerprint)`` of a store URL, the fingerprint None when it names none."""
    example = "tcp://host:port, for example tcp://10.0.0.1:29400"
    if not isinstance(url, str):
        raise ConfigError(f"The rendezvous store URL must be a string like {example}; got {url!r}.")
    try:
        parts = urlsplit(url)
        port = parts.port
        query = parse_qs(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise ConfigError(
            f"The rendezvous store URL {url!r} is not valid ({exc}); use {example}."
        ) from None
    if (
        url != url.strip()
        or parts.scheme != "tcp"
        or not parts.hostname
        or port is None
        or port == 0
        or parts.path not in ("", "/")
        or set(query) - {"fingerprint"}
        or len(query.get("fingerprint", ())) > 1
        or parts.fragment
        or parts.username is not None
        or parts.password is not None
    ):
        raise ConfigError(f"The rendezvous store URL {url!r} is not of the form {example}.")
    fingerprint = None
    if "fingerprint" in query:
        fingerprint = check_fingerprint(query["fingerprint"][0], f"the URL {url!r}")
    return parts.hostname, port, fingerprint


def format_url(host: str, port: int, fingerprint: str | None = None) -> str:
    """The store's URL: ``tcp://host:port``, then ``?fingerprint=...`` when given one."""
    url = f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"
    return url if fingerprint is None else f"{url}?fingerprint={fingerprint}"
