"""TLS for the TCP rendezvous store: the head's self-signed certificate, pinned by its fingerprint.

The store server makes a fresh key pair and a self-signed certificate when it is made (one per
cluster). The ``ssl`` module loads them from an anonymous in-memory file on Linux; elsewhere
they touch the disk only for that moment, in a private temporary directory. Its store URL
carries the certificate's SHA-256 fingerprint (``tcp://host:port?fingerprint=sha256:HEX``, HEX
the 64 lowercase hex digits of the SHA-256 of the certificate's DER bytes, as ``openssl x509
-fingerprint -sha256`` shows it), and so does the join URL the head prints. A client trusts no
certificate authority: it completes the TLS handshake, then compares the fingerprint of the
certificate the peer showed with the one in its URL, and hangs up before sending anything on a
mismatch. TLS 1.3 only: both ends are clusterbook.

TLS encrypts and protects the traffic and proves the server is the head; the cluster's secret
(the token file) still proves, inside TLS, that the client is a node of the cluster (see
:mod:`.wire`): knowing the fingerprint, which is no secret, lets nobody in.
"""

from __future__ import annotations

import hmac
import os
import re
import socket
import ssl
import time
from dataclasses import dataclass, field
from hashlib import sha256

from clusterbook.errors import ConfigError

__all__ = ["FINGERPRINT_PREFIX", "Certificate", "fingerprint_of", "make_certificate"]

FINGERPRINT_PREFIX = "sha256:"
_HEX = re.compile(r"[0-9a-f]{64}")


class _WrongCertificate(Exception):
    """The peer showed a certificate whose fingerprint is not the pinned one."""

    def __init__(self, expected: str, shown: str) -> None:
        super().__init__(f"it showed a certificate with fingerprint {shown}, not {expected}")
        self.expected = expected
        self.shown = shown


@dataclass(frozen=True)
class Certificate:
    """A store server's certificate and private key (PEM), and the certificate's fingerprint."""

    cert_pem: bytes
    key_pem: bytes = field(repr=False)
    fingerprint: str


def fingerprint_of(der: bytes) -> str:
    """``sha256:HEX`` of a certificate's DER bytes."""
    return FINGERPRINT_PREFIX + sha256(der).hexdigest()


def check_fingerprint(value: object, where: str) -> str:
    """``value`` as a canonical ``sha256:HEX`` fingerprint (hex digits in any case, with or
    without colons between the bytes), or a :class:`ConfigError` naming ``where``."""
    text = value.strip().lower() if isinstance(value, str) else ""
    digits = text[len(FINGERPRINT_PREFIX) :].replace(":", "")
    if not text.startswith(FINGERPRINT_PREFIX) or not _HEX.fullmatch(digits):
        raise ConfigError(
            f"The certificate fingerprint {value!r} in {where} is not of the form sha256:HEX "
            "(the 64 hex digits of the SHA-256 of the head's certificate); copy the whole URL "
            "the head printed."
        )
    return FINGERPRINT_PREFIX + digits


def make_certificate(name: str = "clusterbook rendezvous store") -> Certificate:
    """A new ECDSA P-256 key and a self-signed certificate for it, named ``name``."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        # Pinned, not validated: the dates matter to no client; a long life keeps strict
        # tools quiet about a long-lived cluster.
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(key, hashes.SHA256())
    )
    return Certificate(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        fingerprint=fingerprint_of(cert.public_bytes(serialization.Encoding.DER)),
    )


def server_context(certificate: Certificate) -> ssl.SSLContext:
    """The server's TLS context, serving ``certificate``."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.num_tickets = 0  # no resumption: nothing arrives unasked after the handshake
    # The ssl module loads keys from files only: the key and certificate go in one anonymous
    # in-memory file where Linux has them (nothing on any disk, nothing to remove), else in
    # a private temporary directory, removed at once.
    pem = certificate.key_pem + certificate.cert_pem
    try:
        fd = os.memfd_create("clusterbook-tls", os.MFD_CLOEXEC)
    except (AttributeError, OSError):
        fd = -1
    if fd >= 0:
        try:
            with open(fd, "wb", closefd=False) as f:
                f.write(pem)
            context.load_cert_chain(f"/proc/self/fd/{fd}")
            return context
        except FileNotFoundError:
            pass  # no /proc here
        finally:
            os.close(fd)
    import tempfile  # the server's only: not imported by every node's agent

    with tempfile.TemporaryDirectory(prefix="clusterbook-tls-") as directory:
        path = os.path.join(directory, "server.pem")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(fd, "wb") as f:
            f.write(pem)
        context.load_cert_chain(path)
    return context


_CLIENT: ssl.SSLContext | None = None


def _client_context() -> ssl.SSLContext:
    global _CLIENT
    if _CLIENT is None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        # No authority vouches for the head: its certificate is pinned by fingerprint instead
        # (checked in client_tls, before anything is sent).
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        _CLIENT = context
    return _CLIENT


def _handshake(sock: ssl.SSLSocket, deadline: float | None) -> None:
    if deadline is not None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        sock.settimeout(left)
    sock.do_handshake()


def client_tls(
    sock: socket.socket,
    fingerprint: str,
    deadline: float | None,
    *,
    context: ssl.SSLContext | None = None,
) -> ssl.SSLSocket:
    """``sock`` (connected) wrapped in TLS (``context``: the clients' by default), once the
    server's certificate has the pinned ``fingerprint``; raises :class:`_WrongCertificate` if
    it has not (and closes it)."""
    tls = (context or _client_context()).wrap_socket(sock, do_handshake_on_connect=False)
    try:
        _handshake(tls, deadline)
        der = tls.getpeercert(binary_form=True)
        shown = fingerprint_of(der) if der else "(none)"
        if not hmac.compare_digest(shown, fingerprint):
            raise _WrongCertificate(fingerprint, shown)
    except BaseException:
        tls.close()
        raise
    return tls
