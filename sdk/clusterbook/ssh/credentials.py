"""The keys a head logs in with, as OpenSSH's client finds them: those a running ssh-agent
holds first, then key files (``identity=``, the ``IdentityFile`` lines of the ssh config, else
``~/.ssh/id_ed25519``, ``id_ecdsa``, ``id_rsa``).

A passphrase-protected file is opened with ``passphrase=``, or by asking where someone can
answer (a terminal, a notebook: never echoed); the passphrase is dropped once the key is open,
and the open key lives in this process's memory only. A key nobody could open is named in the
error of a host that refused the others.
"""

from __future__ import annotations

import getpass
import os
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paramiko

from clusterbook.errors import ConfigError
from clusterbook.jupyter import Prompt, notebook_prompt
from clusterbook.ssh.target import Hop
from clusterbook.wording import spell_or

__all__ = ["DEFAULT_IDENTITIES", "Credentials", "Locked", "prompt_where_asked"]

DEFAULT_IDENTITIES = ("~/.ssh/id_ed25519", "~/.ssh/id_ecdsa", "~/.ssh/id_rsa")
_TRIES = 3  # passphrase prompts per key, as ssh-add


@dataclass(frozen=True, slots=True)
class Locked:
    """A passphrase-protected key file that could not be opened (no passphrase to hand)."""

    path: Path


def prompt_where_asked(notebook: Callable[[], Prompt | None] = notebook_prompt) -> Prompt | None:
    """A prompt where someone can answer it: a notebook (``notebook``: the Jupyter layer's,
    which knows whether one watches), or ``getpass`` in a terminal; None otherwise (a script,
    CI)."""
    asked = notebook()
    if asked is not None:
        return asked
    stdin = sys.stdin
    return getpass.getpass if stdin is not None and stdin.isatty() else None


@dataclass
class Credentials:
    """Keys by file (open, or :class:`Locked`) and the agent's; :meth:`for_hop` orders them
    for one host. Agent keys sign one request at a time (:attr:`agent_lock`): the agent's
    connection is shared by every thread."""

    agent_keys: tuple[Any, ...] = ()
    files: dict[Path, Any] = field(default_factory=dict)
    agent_lock: threading.Lock = field(default_factory=threading.Lock)
    _agent: Any = None

    @classmethod
    def gather(
        cls,
        hops: Iterable[Hop],
        *,
        explicit: str | os.PathLike[str] | None = None,
        passphrase: str | None = None,
        prompt: Prompt | None = None,
        use_agent: bool = True,
    ) -> Credentials:
        """Open the keys ``hops`` may need, once each (prompting in this thread, before any
        connection is made: the prompt's answer is not awaited by a worker thread)."""
        agent = None
        agent_keys: tuple[Any, ...] = ()
        if use_agent and os.environ.get("SSH_AUTH_SOCK"):
            try:
                agent = paramiko.Agent()
                agent_keys = tuple(agent.get_keys())
            except (paramiko.SSHException, OSError):
                agent, agent_keys = None, ()  # a stale SSH_AUTH_SOCK: as if there were none
        held = {_blob(k) for k in agent_keys}
        files: dict[Path, Any] = {}
        if explicit is not None and not Path(explicit).expanduser().exists():
            raise ConfigError(
                f"Identity file {str(Path(explicit).expanduser())!r} does not exist; pass the "
                "path of your private key, like '~/.ssh/id_ed25519'."
            )
        for path in _paths(hops):
            if path in files or not path.exists():
                continue  # a missing IdentityFile is skipped, as OpenSSH does
            opened = _open(path, passphrase, prompt, held)
            if opened is not None:
                files[path] = opened
        return cls(agent_keys, files, _agent=agent)

    def for_hop(self, hop: Hop) -> list[tuple[str, Any]]:
        """(label, key) to offer ``hop``, in order: the agent's (unless IdentitiesOnly), then
        its files (its IdentityFile lines, else the default files)."""
        keys: list[tuple[str, Any]] = []
        if not hop.identities_only:
            keys += [(f"ssh-agent key {_comment(k)}", k) for k in self.agent_keys]
        for path in _hop_paths(hop):
            key = self.files.get(path)
            if key is not None and not isinstance(key, Locked):
                keys.append((str(path), key))
        return keys

    def locked_for(self, hop: Hop) -> list[Path]:
        return [p for p in _hop_paths(hop) if isinstance(self.files.get(p), Locked)]

    def refusal(self, hop: Hop, tried: Sequence[str]) -> str:
        """Why ``hop`` could not be logged in to, and what to do."""
        locked = self.locked_for(hop)
        if not tried:
            what = "no key to log in with: no ssh-agent holds one and " + (
                f"no key file of {', '.join(str(p) for p in _hop_paths(hop))} exists"
                if not locked
                else "no passphrase opened " + ", ".join(str(p) for p in locked)
            )
        else:
            what = f"it refused the keys tried ({', '.join(tried)}) for user {hop.user!r}"
        hint = [
            f"add a public key to ~{hop.user}/.ssh/authorized_keys there, or give another user "
            f"or {spell_or('identity', '~/.ssh/id_ed25519', 'identity')}"
        ]
        for path in locked:
            given = spell_or("passphrase", "...", "its passphrase")
            hint.insert(0, f"{path} is passphrase-protected: give {given}, or add it to an "
                        f"ssh-agent (ssh-add {path})")  # fmt: skip
        advice = "; ".join(hint)
        return f"Cannot log in to {hop.where}: {what}. {advice[0].upper()}{advice[1:]}."

    def close(self) -> None:
        agent, self._agent = self._agent, None
        if agent is not None:
            agent.close()


def _paths(hops: Iterable[Hop]) -> list[Path]:
    out: list[Path] = []
    for hop in hops:
        out += [p for p in _hop_paths(hop) if p not in out]
    return out


def _hop_paths(hop: Hop) -> tuple[Path, ...]:
    if hop.identities:
        return hop.identities
    return tuple(Path(p).expanduser() for p in DEFAULT_IDENTITIES)


def _open(path: Path, passphrase: str | None, prompt: Prompt | None, held: set[bytes]) -> Any:
    """The key in ``path``: open, :class:`Locked`, or None (not a key paramiko reads, or the
    agent holds it already)."""
    try:
        return paramiko.PKey.from_path(path)
    except paramiko.PasswordRequiredException:
        pass
    except TypeError as exc:  # an OpenSSH-format key read without its passphrase
        if "password" not in str(exc):
            raise
    except (paramiko.SSHException, ValueError, OSError) as exc:
        raise ConfigError(
            f"Identity file {str(path)!r} is not a usable private key ({exc}); give an OpenSSH "
            "private key."
        ) from exc
    if _public_blob(path) in held:
        return None  # the agent signs with it: no passphrase needed
    if passphrase is not None:
        try:
            return _unlock(path, passphrase)
        except (paramiko.SSHException, ValueError, TypeError) as exc:
            raise ConfigError(
                f"The passphrase given does not open {str(path)!r} ({exc}); give that key's "
                "passphrase."
            ) from None
    if prompt is None:
        return Locked(path)
    for _ in range(_TRIES):
        try:
            answer = prompt(f"Passphrase for {path}: ")
        except Exception:  # a front end that takes no input, EOF: as if there were no prompt
            return Locked(path)
        if not answer:
            return Locked(path)
        try:
            return _unlock(path, answer)
        except (paramiko.SSHException, ValueError, TypeError):
            continue
    return Locked(path)


def _unlock(path: Path, passphrase: str) -> Any:
    # The stubs say str; paramiko hands it to cryptography, which wants bytes.
    return paramiko.PKey.from_path(path, passphrase.encode())  # type: ignore[arg-type]


def _blob(key: Any) -> bytes:
    return bytes(key.asbytes())


def _public_blob(path: Path) -> bytes | None:
    """The public key of ``path`` from ``path.pub`` (an encrypted file does not give it)."""
    import base64
    import binascii

    try:
        fields = Path(f"{path}.pub").read_text().split()
        return base64.b64decode(fields[1]) if len(fields) >= 2 else None
    except (OSError, binascii.Error, ValueError):
        return None


def _comment(key: Any) -> str:
    comment = getattr(key, "comment", b"") or b""
    text = comment.decode(errors="replace") if isinstance(comment, bytes) else str(comment)
    return text or key.fingerprint
