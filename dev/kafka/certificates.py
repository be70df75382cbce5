"""Test certificates for the secured listeners of :class:`dev.kafka.broker.SecuredBroker`, made with ``openssl``.

::

    certs = make_certificates(tmp_path / "certs")   # reuses what an earlier call made in that directory
    certs.ca                 # the CA the broker and the clients trust (PEM)
    certs.broker_keystore    # the broker's key and certificate (127.0.0.1, localhost) in one PEM file
    certs.client_certificate, certs.client_key   # a client certificate signed by the CA (mTLS), and its key
    certs.client_keystore    # the same key and certificate in one PEM file (what a Java client reads)
    certs.untrusted_ca       # a second CA nobody trusts
    certs.untrusted_client_certificate, certs.untrusted_client_key   # a client certificate signed by it

Every key is RSA 2048 in unencrypted PKCS#8 (``BEGIN PRIVATE KEY``): what librdkafka, the Kafka broker
(``ssl.keystore.type=PEM``) and the Java client all read. Certificates are valid for 10 days: they are made
for a test session or a developer's afternoon, never for production.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = 10
_KEY = ("-newkey", "rsa:2048", "-nodes")


@dataclass(frozen=True)
class Certificates:
    """The paths of the files :func:`make_certificates` writes (all PEM)."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def broker_keystore(self) -> Path:
        return self.directory / "broker.pem"

    @property
    def client_certificate(self) -> Path:
        return self.directory / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    @property
    def client_keystore(self) -> Path:
        return self.directory / "client.pem"

    @property
    def untrusted_ca(self) -> Path:
        return self.directory / "untrusted-ca.pem"

    @property
    def untrusted_client_certificate(self) -> Path:
        return self.directory / "untrusted-client.crt"

    @property
    def untrusted_client_key(self) -> Path:
        return self.directory / "untrusted-client.key"


def _openssl(*args: str, cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("openssl not found on PATH (needed to make the test certificates)")
    run = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed (exit {run.returncode}):\n{run.stderr}")


def _ca(name: str, subject: str, cwd: Path) -> None:
    """``name``.pem (self-signed CA certificate) and ``name``.key."""
    _openssl(
        "req", "-x509", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", str(DAYS),
        "-subj", f"/CN={subject}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        cwd=cwd,
    )  # fmt: skip


def _leaf(name: str, subject: str, ca: str, extensions: str, cwd: Path) -> None:
    """``name``.crt signed by the CA ``ca``, ``name``.key, and ``name``.pem holding both (key first)."""
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("req", *_KEY, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={subject}", cwd=cwd)
    _openssl(
        "x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
        "-out", f"{name}.crt", "-days", str(DAYS), "-extfile", f"{name}.ext",
        cwd=cwd,
    )  # fmt: skip
    (cwd / f"{name}.pem").write_text((cwd / f"{name}.key").read_text() + (cwd / f"{name}.crt").read_text())


def make_certificates(directory: Path) -> Certificates:
    """Make the CA, the broker's and the clients' certificates in ``directory`` (once: reused when complete)."""
    certs = Certificates(Path(directory).resolve())
    done = certs.directory / ".complete"
    if done.is_file():
        return certs
    tmp = certs.directory.with_name(f".{certs.directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _ca("ca", "kafka2delta test CA", tmp)
    _ca("untrusted-ca", "kafka2delta untrusted test CA", tmp)
    _leaf(
        "broker",
        "localhost",
        "ca",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        tmp,
    )
    _leaf("client", "kafka2delta-client", "ca", "extendedKeyUsage=clientAuth\n", tmp)
    _leaf("untrusted-client", "kafka2delta-untrusted-client", "untrusted-ca", "extendedKeyUsage=clientAuth\n", tmp)
    (tmp / ".complete").write_text("")
    shutil.rmtree(certs.directory, ignore_errors=True)
    tmp.rename(certs.directory)
    return certs
