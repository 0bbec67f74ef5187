"""A server-side TLS context with a self-signed certificate, for local ports that speak TLS as a
hosted Redis does (the test Redis is built without TLS)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest


def self_signed_server_context(folder: Path) -> ssl.SSLContext:
    """A certificate for 127.0.0.1 made with openssl in `folder`; the test is skipped where
    openssl is not installed."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a certificate")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
         "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
