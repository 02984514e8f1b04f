"""The worker link's TLS, keyed by the shared secret (GREENROOM_WORKER_TOKEN).

Both sides derive the same Ed25519 key from the token (scrypt, so a guessed token costs
work) and the same self-signed certificate from it (Ed25519 signs deterministically), and
trust that certificate alone. Each side presents it: a peer without the token can neither
complete the handshake nor pose as the other side. Standard TLS 1.3 then encrypts the link;
nothing here is home-made cryptography."""

from __future__ import annotations

import datetime
import functools
import hashlib
import os
import ssl
import tempfile

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

TOKEN_ENV = "GREENROOM_WORKER_TOKEN"
MIN_TOKEN_CHARS = 16
_SALT = b"greenroom worker link v1"


class TokenError(ValueError):
    """The worker token is missing or too short to be a secret."""


def token_from_env() -> str:
    token = os.environ.get(TOKEN_ENV, "")
    if not token:
        raise TokenError(f"{TOKEN_ENV} is not set: a worker link needs the shared secret on both hosts")
    if len(token) < MIN_TOKEN_CHARS:
        raise TokenError(
            f"{TOKEN_ENV} has {len(token)} characters; use at least {MIN_TOKEN_CHARS} random ones "
            "(python -c 'import secrets; print(secrets.token_hex(32))')"
        )
    return token


@functools.cache
def _credentials(token: str) -> tuple[bytes, bytes]:
    """(private key PEM, certificate PEM), the same on every host holding `token`."""
    seed = hashlib.scrypt(token.encode(), salt=_SALT, n=2**14, r=8, p=1, dklen=32)
    key = Ed25519PrivateKey.from_private_bytes(seed)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "greenroom worker link")])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC))
        .not_valid_after(datetime.datetime(9999, 12, 31, tzinfo=datetime.UTC))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, None)
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def context(token: str, server: bool) -> ssl.SSLContext:
    """A TLS 1.3 context that presents the token's certificate and accepts only a peer presenting it."""
    key_pem, cert_pem = _credentials(token)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False  # the peer is identified by the certificate alone
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=cert_pem.decode())
    with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only; 0700 directory
        key_path, cert_path = os.path.join(tmp, "key.pem"), os.path.join(tmp, "cert.pem")
        for path, data in ((key_path, key_pem), (cert_path, cert_pem)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)
    return ctx
