"""Host key policies and known_hosts reading (pure)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import shlex
import stat

import pytest

import clusterbook as cb
from clusterbook.ssh.hostkeys import (
    AcceptNew,
    Fingerprints,
    HostKey,
    KnownHosts,
    fingerprint,
    host_entry_name,
    make_policy,
)
from clusterbook.ssh.shell import command_line, write_file_argv

A = HostKey("ssh-ed25519", base64.b64encode(b"key-a" * 8).decode())
B = HostKey("ssh-ed25519", base64.b64encode(b"key-b" * 8).decode())
R = HostKey("ssh-rsa", base64.b64encode(b"key-r" * 8).decode())


def hashed(name: str, salt: bytes = b"0123456789abcdef0123") -> str:
    mac = hmac.new(salt, name.encode(), hashlib.sha1).digest()
    return f"|1|{base64.b64encode(salt).decode()}|{base64.b64encode(mac).decode()}"


def test_fingerprint_is_openssh_sha256():
    digest = hashlib.sha256(b"key-a" * 8).digest()
    assert fingerprint(A.blob) == "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    assert A.fingerprint == fingerprint(A.blob)


def test_entry_names():
    assert host_entry_name("node1", 22) == "node1"
    assert host_entry_name("node1", 2222) == "[node1]:2222"


@pytest.mark.parametrize(
    ("line", "host", "port"),
    [
        ("node1 {k}", "node1", 22),
        ("other,node1 {k}", "node1", 22),
        ("[node1]:2222 {k}", "node1", 2222),
        ("NODE1 {k}", "node1", 22),  # names are case-insensitive
        ("node* {k}", "node7", 22),
        ("node? {k}", "node7", 22),
        ("10.0.0.* {k}", "10.0.0.9", 22),
        (hashed("node1") + " {k}", "node1", 22),
        (hashed("[node1]:2200") + " {k}", "node1", 2200),
    ],
)
def test_known_hosts_matches(tmp_path, line, host, port):
    path = tmp_path / "kh"
    path.write_text("# comment\n\n" + line.format(k=f"{A.type} {A.blob}") + " some comment\n")
    policy = KnownHosts(path)
    policy.check(host, port, A)
    assert policy.preferred_types(host, port) == ["ssh-ed25519"]


@pytest.mark.parametrize(
    "line",
    [
        "node1 {k}",  # other port
        "node* ,!node7 {k}".replace(" ,", ","),  # negated
        hashed("node2") + " {k}",
        "[node7]:22 {k}",  # port 22 is written without brackets
    ],
)
def test_known_hosts_non_matches_are_unknown(tmp_path, line):
    path = tmp_path / "kh"
    path.write_text(line.format(k=f"{A.type} {A.blob}") + "\n")
    with pytest.raises(cb.HostKeyUnknownError, match=r"not known \(in none of"):
        KnownHosts(path).check("node7", 2222 if line.startswith("node1") else 22, A)


def test_changed_key_of_same_or_other_type_is_refused(tmp_path):
    path = tmp_path / "kh"
    path.write_text(f"node1 {A.type} {A.blob}\n")
    with pytest.raises(cb.HostKeyChangedError, match=f"records ssh-ed25519 {A.fingerprint}"):
        KnownHosts(path).check("node1", 22, B)
    with pytest.raises(cb.HostKeyChangedError, match=r"kh:1"):
        KnownHosts(path).check("node1", 22, R)


def test_a_known_hosts_file_is_read_again_once_it_changed(tmp_path):
    # Parsed files are kept while unchanged: a rewrite of the same size, even within the same
    # second, is still seen.
    kh = tmp_path / "known_hosts"
    kh.write_text(f"node1 {A.type} {A.blob}\n")
    policy = KnownHosts(kh)
    policy.check("node1", 22, A)
    kh.write_text(f"node1 {B.type} {B.blob}\n")
    with pytest.raises(cb.HostKeyChangedError):
        policy.check("node1", 22, A)
    policy.check("node1", 22, B)
    kh.unlink()
    with pytest.raises(cb.HostKeyUnknownError):
        policy.check("node1", 22, B)


def test_revoked_key_is_refused_even_if_also_listed(tmp_path):
    path = tmp_path / "kh"
    path.write_text(f"@revoked node1 {A.type} {A.blob}\nnode1 {A.type} {A.blob}\n")
    with pytest.raises(cb.HostKeyChangedError, match="REVOKED"):
        KnownHosts(path).check("node1", 22, A)


def test_a_cert_authority_line_is_named_as_unsupported_not_skipped(tmp_path):
    path = tmp_path / "kh"
    path.write_text(f"# site CA\n@cert-authority *.lab,node1 {R.type} {R.blob}\n")
    with pytest.raises(cb.HostKeyUnknownError) as info:
        KnownHosts(path).check("node1", 22, A)
    said = str(info.value)
    assert f"only {path}:2 names it, a @cert-authority line" in said
    assert "clusterbook does not support those: it checks host keys, not host certificates" in said
    assert A.fingerprint in said  # and how to trust the host's own key instead
    # A host the authority line does not name is unknown as before; the CA's key is no
    # host's key, whatever host shows it.
    with pytest.raises(cb.HostKeyUnknownError, match=r"in none of") as other:
        KnownHosts(path).check("elsewhere", 22, R)
    assert "@cert-authority" not in str(other.value)
    with pytest.raises(cb.HostKeyUnknownError, match="@cert-authority"):
        KnownHosts(path).check("gpu1.lab", 22, R)
    # The host's own key beside the authority line: trusted, as OpenSSH would.
    path.write_text(path.read_text() + f"node1 {A.type} {A.blob}\n")
    KnownHosts(path).check("node1", 22, A)
    assert KnownHosts(path).preferred_types("node1", 22) == [A.type]


def test_accept_new_records_once_and_refuses_changes(tmp_path):
    record = tmp_path / "cluster" / "known_hosts"
    policy = AcceptNew(record)
    policy.check("node1", 2222, A)
    policy.check("node1", 2222, A)
    assert record.read_text() == f"[node1]:2222 {A.type} {A.blob}\n"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    with pytest.raises(cb.HostKeyChangedError):
        policy.check("node1", 2222, B)


def test_fingerprints_policy():
    policy = Fingerprints({"node1": A.fingerprint, "node2:2222": B.fingerprint})
    policy.check("node1", 22, A)
    policy.check("node2", 2222, B)
    with pytest.raises(cb.HostKeyChangedError):
        policy.check("node1", 22, B)
    with pytest.raises(cb.HostKeyUnknownError, match="no fingerprint given"):
        policy.check("node3", 22, A)
    with pytest.raises(cb.ConfigError, match="'abc' for host 'node1' is not a SHA256"):
        Fingerprints({"node1": "abc"})


def test_make_policy(tmp_path):
    assert isinstance(make_policy(None, None, tmp_path / "k"), KnownHosts)
    assert not isinstance(make_policy(None, None, tmp_path / "k"), AcceptNew)
    tofu = make_policy("accept-new", None, tmp_path / "k")
    assert isinstance(tofu, AcceptNew)
    assert tofu.record == tmp_path / "k"
    assert make_policy("accept-new", tmp_path / "given").record == tmp_path / "given"
    assert isinstance(make_policy({"n": A.fingerprint}, None, tmp_path / "k"), Fingerprints)
    with pytest.raises(cb.ConfigError, match="no policy that accepts any key"):
        make_policy("auto-add", None, tmp_path / "k")


def test_command_line_quotes_every_word():
    line = command_line(["echo", "a b", "$HOME", "'q'", "; rm -rf /"], {"V": "x y\n$z"})
    assert shlex.split(line) == ["env", "V=x y\n$z", "echo", "a b", "$HOME", "'q'", "; rm -rf /"]
    with pytest.raises(cb.ConfigError, match="'1X' is invalid"):
        command_line(["true"], {"1X": "v"})


def test_write_file_argv_passes_path_as_data():
    argv = write_file_argv("/tmp/a b; touch x", 0o600)
    assert argv[:2] == ["sh", "-c"]
    assert argv[-2:] == ["/tmp/a b; touch x", "600"]
    assert "umask 077" in argv[2]
