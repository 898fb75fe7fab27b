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
    "write_host_key",
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
    """OpenSSH's line for ``key``'s public key: its type, its wire format in base64, then the
    cluster's tag. (Written out: cryptography's serialization module costs ~12 ms.)"""
    return f"{_public_text(key.public_key().public_bytes_raw())} {key_tag(cluster_id)}"


def write_host_key(path: Path) -> str:
    """Make a new ed25519 key at ``path`` (0600, never over an existing file) and its public
    line at ``path.pub``, as ``ssh-keygen -t ed25519 -N '' -C ''`` would; returns that line.
    (Made here: an agent's sshd needs one at each start, and ssh-keygen's run took ~10 ms.)"""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    seed, public = key.private_bytes_raw(), key.public_key().public_bytes_raw()
    write_private(path, openssh_private_key(seed, public))
    line = _public_text(public)
    write_private(path.with_name(path.name + ".pub"), (line + "\n").encode())
    return line


def openssh_private_key(seed: bytes, public: bytes, comment: str = "") -> bytes:
    """The ed25519 key of ``seed`` (and its ``public`` key) in OpenSSH's own private key
    format, unencrypted (OpenSSH's PROTOCOL.key): what ``ssh-keygen`` writes, and
    cryptography's ``PrivateFormat.OpenSSH``, whose module costs ~12 ms to import."""
    check = os.urandom(4)  # the same twice: a decryption's check, here none
    private = b"".join(
        [
            check,
            check,
            _ssh_string(_ED25519),
            _ssh_string(public),
            _ssh_string(seed + public),
            _ssh_string(comment.encode()),
        ]
    )
    private += bytes(range(1, 1 + (-len(private) % 8)))  # padded to the cipher's block: 8
    none = _ssh_string(b"none")
    head = b"openssh-key-v1\0" + none + none + _ssh_string(b"") + struct.pack(">I", 1)
    body = base64.b64encode(head + _ssh_string(_public_blob(public)) + _ssh_string(private))
    lines = [body[i : i + 70] for i in range(0, len(body), 70)]
    armour = b"-----%s OPENSSH PRIVATE KEY-----\n"
    return armour % b"BEGIN" + b"\n".join(lines) + b"\n" + armour % b"END"


def _public_text(public: bytes) -> str:
    """``ssh-ed25519 BASE64``: an ed25519 public key as OpenSSH writes it, untagged."""
    return f"{_ED25519.decode()} {base64.b64encode(_public_blob(public)).decode()}"


def _public_blob(public: bytes) -> bytes:
    """An ed25519 public key as SSH's wire format: the type and the raw key, each an SSH
    string (RFC 4253: a 4-byte length, then the bytes)."""
    return _ssh_string(_ED25519) + _ssh_string(public)


def _ssh_string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _write_keypair(directory: Path, cluster_id: str, key: Ed25519PrivateKey) -> KeyPair:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = openssh_private_key(key.private_bytes_raw(), key.public_key().public_bytes_raw())
    line = _public_line(key, cluster_id)
    path = directory / "id_ed25519"
    write_private(path, private)
    (directory / "id_ed25519.pub").write_text(line + "\n")
    return KeyPair(path, line)


def authorized_keys_line(pair: KeyPair, *, restrict: bool = False) -> str:
    """The authorized_keys line for ``pair`` (``restrict`` adds OpenSSH's no-forwarding set)."""
    return ("restrict " if restrict else "") + pair.public_line
