"""Per-cluster ssh key pairs, and the authorized_keys lines that carry them.

A cluster's private key is written 0600 in one step (``O_CREAT | O_EXCL`` with the mode, so
it is never readable by others, not even for an instant) and is never printed. Its public key
goes into each node's authorized_keys tagged with the cluster id, so that ``stop()`` removes
exactly the lines it added.

Elastic clusters derive their key from the cluster's rendezvous secret instead (HKDF-SHA256):
an agent that holds the token file can authorize the head's key in its own sshd without any
key being sent, and nothing but the token holders (the cluster's nodes) can make it.
"""

from __future__ import annotations

import base64
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from clusterbook.nodes.tasks import common

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = [
    "KeyPair",
    "authorized_keys_line",
    "derive_keypair",
    "derived_public_line",
    "generate_keypair",
    "key_tag",
    "write_private",
]

_DERIVE_INFO = b"clusterbook cluster ssh key v1"
_ED25519 = b"ssh-ed25519"


def key_tag(cluster_id: str) -> str:
    """The comment that marks a cluster's lines in authorized_keys."""
    if not common.is_cluster_id(cluster_id):
        raise ValueError(f"cluster id {cluster_id!r} must be {common.ID_RULE}")
    return common.key_tag(cluster_id)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A private key file and its public key line. ``repr`` never shows key material."""

    private_path: Path
    public_line: str

    def __repr__(self) -> str:
        return f"KeyPair(private_path={str(self.private_path)!r})"


def write_private(path: Path, data: bytes) -> None:
    """Create ``path`` with mode 0600 and ``data``; refuse to overwrite an existing file."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def generate_keypair(directory: Path, cluster_id: str) -> KeyPair:
    """Make an ed25519 key pair in ``directory`` (``id_ed25519`` and ``id_ed25519.pub``)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return _write_keypair(directory, cluster_id, Ed25519PrivateKey.generate())


def derive_keypair(directory: Path, cluster_id: str, secret: bytes) -> KeyPair:
    """Write the key pair derived from ``secret`` in ``directory``, like generate_keypair."""
    return _write_keypair(directory, cluster_id, _derived_key(secret))


def derived_public_line(secret: bytes, cluster_id: str) -> str:
    """The public key line (tagged) of the key pair derived from ``secret``."""
    return _public_line(_derived_key(secret), cluster_id)


def _derived_key(secret: bytes) -> Ed25519PrivateKey:
    # Imported here, as little of cryptography as it takes: every agent with its own sshd
    # derives the public key as it starts, before it joins.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if len(secret) < 16:
        raise ValueError("a secret to derive a key from has at least 16 bytes")
    seed = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_DERIVE_INFO).derive(secret)
    return Ed25519PrivateKey.from_private_bytes(seed)


def _public_line(key: Ed25519PrivateKey, cluster_id: str) -> str:
    """OpenSSH's line for ``key``'s public key: its type and, in base64, the type and the raw
    key as SSH strings (RFC 4253: a 4-byte length, then the bytes), then the cluster's tag.
    (Written out: cryptography's serialization module costs an agent's start ~12 ms.)"""
    blob = b"".join(_ssh_string(part) for part in (_ED25519, key.public_key().public_bytes_raw()))
    return f"{_ED25519.decode()} {base64.b64encode(blob).decode()} {key_tag(cluster_id)}"


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _write_keypair(directory: Path, cluster_id: str, key: Ed25519PrivateKey) -> KeyPair:
    from cryptography.hazmat.primitives import serialization

    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    line = _public_line(key, cluster_id)
    path = directory / "id_ed25519"
    write_private(path, private)
    (directory / "id_ed25519.pub").write_text(line + "\n")
    return KeyPair(path, line)


def authorized_keys_line(pair: KeyPair, *, restrict: bool = False) -> str:
    """The authorized_keys line for ``pair`` (``restrict`` adds OpenSSH's no-forwarding set)."""
    return ("restrict " if restrict else "") + pair.public_line
