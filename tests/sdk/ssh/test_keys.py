"""Keys written out by clusterbook itself (:mod:`clusterbook.ssh.keys`): OpenSSH's private key
format, read back by cryptography and by OpenSSH's own ``ssh-keygen``."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from clusterbook.ssh.keys import openssh_private_key, write_host_key
from tests.conftest import require

_RAW = serialization.Encoding.Raw


def _keygen_public(path: Path) -> str:
    """What OpenSSH's ``ssh-keygen -y`` reads as the public key of the private key ``path``."""
    require(shutil.which("ssh-keygen") is not None, "ssh-keygen is not installed (openssh-client)")
    done = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(path)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    return " ".join(done.stdout.split()[:2])


@pytest.mark.parametrize("comment", ["", "clusterbook:c1", "a comment of 21 bytes"])
def test_the_private_key_format_is_openssh_s_own(tmp_path, comment):
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(_RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption())
    public = key.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)
    text = openssh_private_key(seed, public, comment)
    assert text.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----\n")
    assert text.endswith(b"-----END OPENSSH PRIVATE KEY-----\n")
    assert all(len(line) <= 70 for line in text.splitlines())
    again = serialization.load_ssh_private_key(text, password=None)
    assert isinstance(again, Ed25519PrivateKey)
    assert again.private_bytes(_RAW, serialization.PrivateFormat.Raw,
                               serialization.NoEncryption()) == seed  # fmt: skip
    path = tmp_path / "key"
    path.write_bytes(text)
    path.chmod(0o600)  # ssh-keygen refuses a private key others may read
    expected = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    assert _keygen_public(path) == expected.decode()


def test_a_host_key_is_new_each_time_private_and_never_written_over(tmp_path):
    path = tmp_path / "ssh_host_ed25519_key"
    line = write_host_key(path)
    public = path.with_name(path.name + ".pub")
    assert public.read_text() == line + "\n"
    assert line.startswith("ssh-ed25519 ")
    assert len(line.split()) == 2
    assert _keygen_public(path) == line
    for made in (path, public):
        assert made.stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_host_key(path)
    assert _keygen_public(path) == line  # the first key is kept
    assert write_host_key(tmp_path / "other") != line
