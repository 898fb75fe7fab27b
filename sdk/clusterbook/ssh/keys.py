"""Per-cluster ssh key pairs, and the authorized_keys lines that carry them.

A cluster's private key is written 0600 in one step (``O_CREAT | O_EXCL`` with the mode, so
it is never readable by others, not even for an instant) and is never printed. Its public key
goes into each node's authorized_keys tagged with the cluster id, so that ``stop()`` removes
exactly the lines it added.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

__all__ = ["KeyPair", "authorized_keys_line", "generate_keypair", "key_tag", "write_private"]

_TAG_RE = re.compile(r"[A-Za-z0-9_.-]+")


def key_tag(cluster_id: str) -> str:
    """The comment that marks a cluster's lines in authorized_keys."""
    if not _TAG_RE.fullmatch(cluster_id):
        raise ValueError(f"cluster id {cluster_id!r} must be letters, digits, '.', '-', '_'")
    return f"clusterbook:{cluster_id}"


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
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    line = f"{public.decode()} {key_tag(cluster_id)}"
    path = directory / "id_ed25519"
    write_private(path, private)
    (directory / "id_ed25519.pub").write_text(line + "\n")
    return KeyPair(path, line)


def authorized_keys_line(pair: KeyPair, *, restrict: bool = False) -> str:
    """The authorized_keys line for ``pair`` (``restrict`` adds OpenSSH's no-forwarding set)."""
    return ("restrict " if restrict else "") + pair.public_line
