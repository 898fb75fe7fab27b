"""Host key checking, secure by default: what a host's key must match before we talk to it.

Three policies, all refusing a key that differs from the one on record:

- :class:`KnownHosts` (default): the key must be in the user's ``~/.ssh/known_hosts`` or a
  given file; an unknown host is refused at once, with its fingerprint and how to trust it.
- :class:`Fingerprints`: the key must have the given SHA256 fingerprint.
- :class:`AcceptNew`: trust on first use: an unknown host's key is recorded in the cluster's
  own known_hosts file and must match from then on (OpenSSH's ``accept-new``).

Pure code over (key type, base64 key) pairs: no paramiko here. known_hosts files are read as
OpenSSH writes them: host lists, ``[host]:port``, hashed names (``|1|salt|hash``), wildcards,
negations and the ``@revoked`` marker. ``@cert-authority`` lines (host certificates signed by a
CA) are not acted on: paramiko does not check host certificates. A host that only such a line
would trust is refused as unknown, the error naming that line, not silently.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import os
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from clusterbook.errors import ConfigError, HostKeyChangedError, HostKeyUnknownError
from clusterbook.paths import accept_new_known_hosts
from clusterbook.wording import spell

__all__ = [
    "AcceptNew",
    "Fingerprints",
    "HostKey",
    "HostKeyPolicy",
    "KnownHosts",
    "fingerprint",
    "host_entry_name",
    "known_hosts_line",
    "make_policy",
]


@dataclass(frozen=True, slots=True)
class HostKey:
    """A host's public key as ssh shows it: type (``ssh-ed25519``) and base64 blob."""

    type: str
    blob: str

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.blob)


def fingerprint(blob: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 key blob (``SHA256:...``, no padding)."""
    digest = hashlib.sha256(base64.b64decode(blob)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def host_entry_name(host: str, port: int) -> str:
    """How known_hosts names a host: ``host`` on port 22, ``[host]:port`` otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


def known_hosts_line(names: Iterable[str], key: HostKey) -> str:
    """A known_hosts line for ``names`` (already in :func:`host_entry_name` form)."""
    return f"{','.join(names)} {key.type} {key.blob}\n"


@dataclass(frozen=True, slots=True)
class _Entry:
    patterns: tuple[str, ...]
    key: HostKey
    revoked: bool
    where: str
    authority: bool = False  # @cert-authority: trusts certificates, which are not checked here


@functools.lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern[str] | str:
    """A pattern as a regex, or lower-cased when it has no wildcard (then it is a name)."""
    if "*" not in pattern and "?" not in pattern:
        return pattern.lower()
    # OpenSSH patterns know only * and ?; "[host]:port" brackets are literal.
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(regex, re.IGNORECASE)


def _glob(pattern: str, name: str) -> bool:
    compiled = _compiled(pattern)
    if isinstance(compiled, str):
        return compiled == name.lower()
    return compiled.fullmatch(name) is not None


def _matches(patterns: tuple[str, ...], name: str) -> bool:
    hit = False
    for pattern in patterns:
        if pattern.startswith("|1|"):
            try:
                _, _, salt, digest = pattern.split("|", 3)
                mac = hmac.new(base64.b64decode(salt), name.encode(), hashlib.sha1).digest()
            except ValueError:
                continue
            if hmac.compare_digest(base64.b64encode(mac).decode(), digest):
                hit = True
        elif pattern.startswith("!"):
            if _glob(pattern[1:], name):
                return False
        elif _glob(pattern, name):
            hit = True
    return hit


_parsed: dict[Path, tuple[tuple[int, int, int, int], list[_Entry]]] = {}


def _read(path: Path) -> list[_Entry]:
    """The entries of a known_hosts file, parsed again only when the file changed."""
    try:
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            signature = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            cached = _parsed.get(path)
            if cached is not None and cached[0] == signature:
                return cached[1]
            text = f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    entries = _parse(path, text)
    if len(_parsed) >= 64:  # one file a cluster: a long-lived kernel makes many
        _parsed.clear()
    _parsed[path] = (signature, entries)
    return entries


def _parse(path: Path, text: str) -> list[_Entry]:
    entries = []
    for number, raw in enumerate(text.splitlines(), 1):
        fields = raw.split()
        if not fields or fields[0].startswith("#"):
            continue
        marker = fields[0] if fields[0].startswith("@") else ""
        if marker:
            if marker not in ("@revoked", "@cert-authority"):
                continue  # OpenSSH skips a marker it does not know, too
            fields = fields[1:]
        if len(fields) < 3:
            continue
        entries.append(
            _Entry(
                tuple(fields[0].split(",")),
                HostKey(fields[1], fields[2]),
                revoked=marker == "@revoked",
                where=f"{path}:{number}",
                authority=marker == "@cert-authority",
            )
        )
    return entries


class HostKeyPolicy(ABC):
    """Decides whether a host's key is trusted; raises if not."""

    @abstractmethod
    def check(self, host: str, port: int, key: HostKey) -> None:
        """Return if ``key`` is trusted for ``host:port``, else raise an SSHError."""

    def preferred_types(self, host: str, port: int) -> list[str]:
        """Key types on record for the host, to ask the server for those first."""
        return []


def _unknown(host: str, port: int, key: HostKey, where: str) -> HostKeyUnknownError:
    name = host_entry_name(host, port)
    flag = spell("host_keys", "accept-new")
    return HostKeyUnknownError(
        f"Host {name} is not known ({where}); it shows a {key.type} key with fingerprint "
        f"{key.fingerprint}. Check that fingerprint with the host's owner, then add the key "
        f"(ssh-keyscan -p {port} {host} >> ~/.ssh/known_hosts)"
        + (f", or pass {flag} to trust hosts on first use." if flag else "."),
        host=host,
        fingerprint=key.fingerprint,
    )


def _changed(host: str, port: int, key: HostKey, old: str, where: str) -> HostKeyChangedError:
    name = host_entry_name(host, port)
    return HostKeyChangedError(
        f"Host key of {name} has CHANGED: it shows {key.type} {key.fingerprint}, but {where} "
        f"records {old}. Someone may be intercepting the connection; it is refused. If the host "
        f"was reinstalled, remove the old key (ssh-keygen -R '{name}') and connect again.",
        host=host,
        fingerprint=key.fingerprint,
    )


class KnownHosts(HostKeyPolicy):
    """Trust keys recorded in known_hosts files (default: ``~/.ssh/known_hosts``)."""

    def __init__(self, *paths: str | os.PathLike[str]) -> None:
        chosen = paths or ("~/.ssh/known_hosts",)
        self.paths = [Path(p).expanduser() for p in chosen]

    def _entries(self) -> list[_Entry]:
        return [e for path in self.paths for e in _read(path)]

    def _lookup(self, host: str, port: int) -> list[_Entry]:
        """The entries for ``host:port`` that name a key of its own (not a CA's)."""
        return [e for e in self._matching(host, port) if not e.authority]

    def _matching(self, host: str, port: int) -> list[_Entry]:
        name = host_entry_name(host, port)
        return [e for e in self._entries() if _matches(e.patterns, name)]

    def check(self, host: str, port: int, key: HostKey) -> None:
        matching = self._matching(host, port)
        entries = [e for e in matching if not e.authority]
        for e in entries:
            if e.revoked and e.key == key:
                raise _changed(host, port, key, "it as REVOKED", e.where)
        same_type = [e for e in entries if not e.revoked and e.key.type == key.type]
        if any(e.key == key for e in same_type):
            return
        if same_type:
            old = same_type[0]
            raise _changed(host, port, key, f"{old.key.type} {old.key.fingerprint}", old.where)
        others = [e for e in entries if not e.revoked]
        if others:  # a key of another type is on record: treat like OpenSSH, as a change
            old = others[0]
            raise _changed(host, port, key, f"{old.key.type} {old.key.fingerprint}", old.where)
        authorities = [e.where for e in matching if e.authority]
        if authorities:
            raise _unknown(
                host,
                port,
                key,
                f"only {', '.join(authorities)} names it, a @cert-authority line, and "
                "clusterbook does not support those: it checks host keys, not host certificates",
            )
        raise _unknown(host, port, key, "in none of " + ", ".join(map(str, self.paths)))

    def preferred_types(self, host: str, port: int) -> list[str]:
        types = [e.key.type for e in self._lookup(host, port) if not e.revoked]
        return list(dict.fromkeys(types))


class AcceptNew(KnownHosts):
    """Trust on first use: record an unknown host's key in ``path``; refuse any change."""

    def __init__(self, path: str | os.PathLike[str], *also: str | os.PathLike[str]) -> None:
        super().__init__(path, *also)
        self.record = self.paths[0]

    def check(self, host: str, port: int, key: HostKey) -> None:
        try:
            super().check(host, port, key)
        except HostKeyUnknownError:
            self.record.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(self.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as f:
                f.write(known_hosts_line([host_entry_name(host, port)], key))


class Fingerprints(HostKeyPolicy):
    """Trust exactly the given SHA256 fingerprints, by host (``host`` or ``host:port``)."""

    def __init__(self, fingerprints: Mapping[str, str]) -> None:
        for name, value in fingerprints.items():
            if not isinstance(value, str) or not value.startswith("SHA256:"):
                raise ConfigError(
                    f"Fingerprint {value!r} for host {name!r} is not a SHA256 fingerprint; "
                    "copy it as ssh-keygen -lf prints it, like 'SHA256:abc...'."
                )
        self.fingerprints = dict(fingerprints)

    def check(self, host: str, port: int, key: HostKey) -> None:
        expected = self.fingerprints.get(f"{host}:{port}", self.fingerprints.get(host))
        if expected is None:
            raise _unknown(host, port, key, "no fingerprint given for it")
        if not hmac.compare_digest(expected, key.fingerprint):
            raise _changed(host, port, key, expected, "the fingerprints given")


def make_policy(
    host_keys: str | HostKeyPolicy | Mapping[str, str] | None,
    known_hosts: str | os.PathLike[str] | None,
    record: Path | None = None,
) -> HostKeyPolicy:
    """The policy for ``Cluster.ssh(host_keys=..., known_hosts=...)``.

    ``None`` / ``"known-hosts"``: the given known_hosts file (default the user's);
    ``"accept-new"``: trust on first use, recorded in the given known_hosts file, else in
    ``record`` (default ``~/.clusterbook/known_hosts``), so that a later change is caught;
    a mapping: fingerprints by host; a :class:`HostKeyPolicy`: used as it is.
    """
    if isinstance(host_keys, HostKeyPolicy):
        return host_keys
    if isinstance(host_keys, Mapping):
        return Fingerprints(host_keys)
    files = [known_hosts] if known_hosts is not None else []
    if host_keys in (None, "known-hosts"):
        return KnownHosts(*files)
    if host_keys == "accept-new":
        return AcceptNew(known_hosts or record or accept_new_known_hosts())
    raise ConfigError(
        f"host_keys={host_keys!r} is not a policy; use 'known-hosts' (the default), "
        "'accept-new' (trust on first use) or a mapping of host to 'SHA256:...' fingerprint. "
        "There is no policy that accepts any key."
    )
