"""The keys a head logs in with: files opened once (a passphrase given, asked, or missing),
the agent's first, and what a refusal says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

import clusterbook as cb
from clusterbook.ssh.credentials import Credentials, Locked
from clusterbook.ssh.target import Hop
from clusterbook.wording import speaking
from tests.conftest import require

SECRET = "s3cret pass"  # noqa: S105 - the test keys' passphrase


def keygen(path: Path, passphrase: str = "") -> Path:
    require(shutil.which("ssh-keygen") is not None, "ssh-keygen is not installed (openssh-client)")
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-C", "k", "-f", str(path)],
        check=True,
    )
    return path


def hop(*keys: Path, only: bool = False) -> Hop:
    return Hop("n1", "10.0.0.1", 22, "me", tuple(keys), identities_only=only)


def test_a_plain_key_is_opened_and_offered(tmp_path: Path) -> None:
    key = keygen(tmp_path / "plain")
    credentials = Credentials.gather([hop(key)], use_agent=False)
    assert [label for label, _ in credentials.for_hop(hop(key))] == [str(key)]


def test_a_protected_key_opens_with_its_passphrase_only(tmp_path: Path) -> None:
    key = keygen(tmp_path / "locked", SECRET)
    opened = Credentials.gather([hop(key)], passphrase=SECRET, use_agent=False)
    assert [label for label, _ in opened.for_hop(hop(key))] == [str(key)]
    with pytest.raises(cb.ConfigError, match=f"does not open '{key}'"):
        Credentials.gather([hop(key)], passphrase=SECRET.upper(), use_agent=False)


def test_a_protected_key_is_asked_for_once_where_someone_can_answer(tmp_path: Path) -> None:
    key = keygen(tmp_path / "locked", SECRET)
    asked: list[str] = []
    answers = iter(["typo", SECRET])

    def prompt(text: str) -> str:
        asked.append(text)
        return next(answers)

    # Two hosts with the same key: opened once, on the second try.
    credentials = Credentials.gather([hop(key), hop(key)], prompt=prompt, use_agent=False)
    assert asked == [f"Passphrase for {key}: "] * 2
    assert len(credentials.for_hop(hop(key))) == 1


def test_a_key_nobody_could_open_is_named_with_the_ways_to_open_it(tmp_path: Path) -> None:
    key = keygen(tmp_path / "locked", SECRET)

    def no_input(text: str) -> str:
        raise EOFError

    for prompt in (None, no_input):
        credentials = Credentials.gather([hop(key)], prompt=prompt, use_agent=False)
        assert credentials.files == {key: Locked(key)}
        assert credentials.for_hop(hop(key)) == []
        said = credentials.refusal(hop(key), [])
        assert said.startswith("Cannot log in to n1 (me@10.0.0.1:22): no key to log in with")
        assert f"{key} is passphrase-protected: give passphrase='...'" in said
        assert f"ssh-add {key}" in said
    with speaking("cli"):  # the command line has no passphrase option
        assert "give its passphrase, or add it" in credentials.refusal(hop(key), [])


def test_the_agents_keys_come_first_unless_identities_only(tmp_path: Path) -> None:
    key = keygen(tmp_path / "plain")

    class AgentKey:
        comment = b"me@laptop"
        fingerprint = "SHA256:x"

    credentials = Credentials.gather([hop(key)], use_agent=False)
    credentials.agent_keys = (AgentKey(),)
    labels = [label for label, _ in credentials.for_hop(hop(key))]
    assert labels == ["ssh-agent key me@laptop", str(key)]
    assert [label for label, _ in credentials.for_hop(hop(key, only=True))] == [str(key)]
    said = credentials.refusal(hop(key), labels)
    assert "it refused the keys tried (ssh-agent key me@laptop, " in said


def test_a_missing_or_unreadable_key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(cb.ConfigError, match=r"Identity file '.*/nope' does not exist"):
        Credentials.gather([hop(tmp_path / "nope")], explicit=tmp_path / "nope", use_agent=False)
    # A missing IdentityFile of the config is skipped, as OpenSSH does; no key at all is said.
    monkeypatch.setenv("HOME", str(tmp_path))
    credentials = Credentials.gather([hop(tmp_path / "gone")], use_agent=False)
    assert "no key file of " in credentials.refusal(hop(tmp_path / "gone"), [])
    (tmp_path / "junk").write_text("not a key")
    with pytest.raises(cb.ConfigError, match=r"'.*/junk' is not a usable private key"):
        Credentials.gather([hop(tmp_path / "junk")], use_agent=False)


def test_a_passphrase_is_asked_only_where_someone_can_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import getpass
    import sys

    from clusterbook.ssh.credentials import prompt_where_asked

    assert prompt_where_asked() is None  # pytest: no terminal on stdin, no notebook

    def in_notebook(text: str) -> str:  # what the Jupyter layer hands while a notebook can answer
        return "secret"

    assert prompt_where_asked(notebook=lambda: in_notebook) is in_notebook
    assert prompt_where_asked(notebook=lambda: None) is None

    class Tty:
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Tty())
    assert prompt_where_asked(notebook=lambda: None) is getpass.getpass
