"""The secret a cluster's head and nodes share: the token file, created 0600 in one step.

The rendezvous store (:mod:`.wire`) and the head's control channel
(:mod:`clusterbook.head.control`) prove with it that a peer belongs to the cluster; it never crosses
the wire.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

from clusterbook.errors import ConfigError

__all__ = ["check_secret", "read_secret", "remove_secret", "write_secret"]

_MIN_SECRET = 16


def check_secret(secret: object) -> bytes:
    """``secret``, if it is bytes of at least 16; else a :class:`ConfigError` saying so."""
    if not isinstance(secret, bytes):
        raise ConfigError(
            f"The rendezvous secret must be bytes, got {type(secret).__name__}; use "
            "read_secret(path) on the cluster's token file."
        )
    if len(secret) < _MIN_SECRET:
        raise ConfigError(
            f"The rendezvous secret is {len(secret)} bytes; it must have at least {_MIN_SECRET} "
            "(write_secret() makes a random 32-byte one)."
        )
    return secret


def write_secret(path: str | os.PathLike[str], secret: bytes | None = None) -> bytes:
    """Create the token file ``path`` holding ``secret`` (random 32 bytes if None) in hex.

    The file is created with mode 0600 in one step, so it is never readable by others, not even
    for a moment; an existing file is never overwritten. Returns the secret.
    """
    if secret is None:
        import secrets  # here: an agent, which reads the file only, need not import it

        secret = secrets.token_bytes(32)
    secret = check_secret(secret)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(
            f"Refusing to overwrite the secret file {os.fspath(path)}: it exists. Read it with "
            "read_secret(), or delete it first to give the cluster a new secret (every node "
            "must then use the new one)."
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"Cannot create the secret file {os.fspath(path)}: {exc.strerror or exc}."
        ) from exc
    try:
        data = memoryview(secret.hex().encode() + b"\n")
        while data:
            data = data[os.write(fd, data) :]
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return secret


def remove_secret(path: str | os.PathLike[str]) -> None:
    """Remove the token file ``path``, and its directory if nothing else is left in it (what
    is, a record or a job's output, keeps it)."""
    Path(path).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        Path(path).parent.rmdir()


def read_secret(path: str | os.PathLike[str]) -> bytes:
    """The secret in the token file ``path`` (see :func:`write_secret`).

    Refuses a file that its group or other users may access: a secret others can read is no
    secret.
    """
    name = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(
            f"There is no secret file at {name}; the head writes it with write_secret()."
        ) from None
    except OSError as exc:
        raise ConfigError(f"Cannot read the secret file {name}: {exc.strerror or exc}.") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"The secret file {name} is not a regular file.")
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o077:
            raise ConfigError(
                f"The secret file {name} is open to its group or other users (mode "
                f"{mode:04o}); run `chmod 600 {name}` so only its owner can read it."
            )
        text = os.read(fd, 4096)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(text.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        raise ConfigError(
            f"The secret file {name} does not hold a hex secret; write it with write_secret()."
        ) from None
    return check_secret(secret)
