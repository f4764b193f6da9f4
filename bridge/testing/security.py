"""Security material for servers that require authentication or TLS, made fresh for each use.

* :func:`make_tls` writes a CA, a server certificate (SAN ``IP:127.0.0.1``, ``DNS:localhost``) and a client
  certificate with the ``openssl`` command-line tool (present on any Debian or Ubuntu machine: the
  ``ca-certificates`` package depends on it); the tests that need it are skipped, saying so, when it is absent.
* :func:`new_nkey` makes an NKey pair with the ``nkeys`` package (a runtime dependency of the bridge already).
* :class:`Operator` signs operator, account and user JWTs the way ``nsc`` does (``ed25519-nkey``, JWT v2 claims)
  and writes ``.creds`` files, for a server in operator mode with a memory resolver (:meth:`Operator.server_config`).
* :func:`permissions_block` renders a ``permissions { publish { allow } subscribe { allow } }`` block.

Every secret file is written with mode 0600.

Nothing here needs pytest: a missing ``openssl`` raises :class:`unittest.SkipTest`, which pytest reports as a skip.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import time
import unittest
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nkeys  # type: ignore[import-untyped]

from bridge.testing.servers import conf_str

__all__ = [
    "NKey",
    "Operator",
    "TlsFiles",
    "conf_str",
    "creds_text",
    "make_tls",
    "new_nkey",
    "permissions_block",
    "sign_jwt",
    "write_secret",
]

OPENSSL = shutil.which("openssl")


def write_secret(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(path, 0o600)
    return path


# --- TLS --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a second CA that signed nothing here: verifying the server with it must fail

    def server_block(self, *, verify: bool) -> str:
        """The server's ``tls`` block; ``verify`` demands a client certificate signed by :attr:`ca`."""
        lines = [
            "tls {",
            f"  cert_file: {conf_str(str(self.server_cert))}",
            f"  key_file: {conf_str(str(self.server_key))}",
            f"  ca_file: {conf_str(str(self.ca))}",
            "  timeout: 2",
        ]
        if verify:
            lines.append("  verify: true")
        return "\n".join([*lines, "}"])


def _openssl(*args: str, cwd: Path) -> None:
    assert OPENSSL is not None
    done = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise AssertionError(f"openssl {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")


def _new_ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _openssl(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key.name, "-out", cert.name, "-days", "2", "-subj", f"/CN=nats-bridge test {name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-addext", "subjectKeyIdentifier=hash",
        cwd=directory,
    )  # fmt: skip
    return cert, key


def _new_leaf(directory: Path, name: str, ca: tuple[Path, Path], *, cn: str, extensions: str) -> tuple[Path, Path]:
    cert, key, csr, ext = (directory / f"{name}{suffix}" for suffix in (".pem", "-key.pem", ".csr", ".ext"))
    _openssl(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", key.name, "-out", csr.name, "-subj", f"/CN={cn}",
        cwd=directory,
    )  # fmt: skip
    ext.write_text(
        "basicConstraints=critical,CA:FALSE\n"
        "keyUsage=critical,digitalSignature\n"
        "subjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid\n" + extensions,
        encoding="utf-8",
    )
    _openssl(
        "x509", "-req", "-in", csr.name, "-CA", ca[0].name, "-CAkey", ca[1].name, "-CAcreateserial",
        "-out", cert.name, "-days", "2", "-extfile", ext.name,
        cwd=directory,
    )  # fmt: skip
    os.chmod(key, 0o600)
    return cert, key


def make_tls(directory: Path) -> TlsFiles:
    """A test CA, a server certificate for 127.0.0.1 and a client certificate, all signed by that CA.

    Raises:
        unittest.SkipTest: the ``openssl`` tool is not installed (pytest skips the calling test).
    """
    if OPENSSL is None:
        raise unittest.SkipTest(
            "the openssl command-line tool is not installed (apt-get install openssl): no certificates"
        )
    directory.mkdir(parents=True, exist_ok=True)
    ca = _new_ca(directory, "ca")
    other = _new_ca(directory, "other-ca")
    server = _new_leaf(
        directory,
        "server",
        ca,
        cn="localhost",
        extensions="subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _new_leaf(directory, "client", ca, cn="nats-bridge", extensions="extendedKeyUsage=clientAuth\n")
    return TlsFiles(ca[0], server[0], server[1], client[0], client[1], other[0])


# --- NKeys and JWTs ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NKey:
    seed: str
    public: str

    def sign(self, data: bytes) -> bytes:
        kp = nkeys.from_seed(bytearray(self.seed.encode()))
        try:
            return bytes(kp.sign(data))
        finally:
            kp.wipe()


def new_nkey(prefix: int = nkeys.PREFIX_BYTE_USER) -> NKey:
    """A fresh NKey pair of the given role (``nkeys.PREFIX_BYTE_USER``, ``_ACCOUNT``, ``_OPERATOR``)."""
    seed = nkeys.encode_seed(os.urandom(32), prefix).decode()
    kp = nkeys.from_seed(bytearray(seed.encode()))
    try:
        return NKey(seed, kp.public_key.decode())
    finally:
        kp.wipe()


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def sign_jwt(issuer: NKey, subject: str, name: str, nats: Mapping[str, Any]) -> str:
    """A NATS JWT (v2 claims, ``ed25519-nkey``) for ``subject`` signed by ``issuer``."""
    claims: dict[str, Any] = {
        "jti": "",
        "iat": int(time.time()),
        "iss": issuer.public,
        "name": name,
        "sub": subject,
        "nats": dict(nats),
    }
    digest = hashlib.sha256(json.dumps(claims, separators=(",", ":")).encode()).digest()
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    header = _b64url(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64url(json.dumps(claims, separators=(",", ":")).encode())
    signature = issuer.sign(f"{header}.{payload}".encode())
    return f"{header}.{payload}.{_b64url(signature)}"


def creds_text(jwt: str, seed: str) -> str:
    """The ``.creds`` file format (as ``nsc generate creds`` writes it)."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{jwt}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


_UNLIMITED_ACCOUNT = {
    "subs": -1,
    "data": -1,
    "payload": -1,
    "imports": -1,
    "exports": -1,
    "wildcards": True,
    "conn": -1,
    "leaf": -1,
    "mem_storage": -1,
    "disk_storage": -1,
    "streams": -1,
    "consumer": -1,
}


@dataclass
class Operator:
    """An operator with a system account and one JetStream-enabled account ``APP``, for operator mode."""

    key: NKey = field(default_factory=lambda: new_nkey(nkeys.PREFIX_BYTE_OPERATOR))
    system: NKey = field(default_factory=lambda: new_nkey(nkeys.PREFIX_BYTE_ACCOUNT))
    account: NKey = field(default_factory=lambda: new_nkey(nkeys.PREFIX_BYTE_ACCOUNT))

    def server_config(self) -> str:
        """Operator mode with every account JWT preloaded into a memory resolver."""
        operator_jwt = sign_jwt(
            self.key,
            self.key.public,
            "test-operator",
            {"type": "operator", "version": 2, "system_account": self.system.public},
        )
        sys_jwt = sign_jwt(
            self.key,
            self.system.public,
            "SYS",
            {"limits": {**_UNLIMITED_ACCOUNT, "mem_storage": 0, "disk_storage": 0}, "type": "account", "version": 2},
        )
        app_jwt = sign_jwt(
            self.key, self.account.public, "APP", {"limits": _UNLIMITED_ACCOUNT, "type": "account", "version": 2}
        )
        return "\n".join(
            [
                f"operator: {conf_str(operator_jwt)}",
                f"system_account: {conf_str(self.system.public)}",
                "resolver: MEMORY",
                "resolver_preload: {",
                f"  {self.system.public}: {conf_str(sys_jwt)}",
                f"  {self.account.public}: {conf_str(app_jwt)}",
                "}",
            ]
        )

    def user_creds(self, path: Path, name: str, *, pub: Sequence[str] = (), sub: Sequence[str] = ()) -> Path:
        """A user of ``APP`` (allowed everything unless ``pub``/``sub`` allow-lists are given) as a creds file."""
        user = new_nkey(nkeys.PREFIX_BYTE_USER)
        claims: dict[str, Any] = {
            "pub": {"allow": list(pub)} if pub else {},
            "sub": {"allow": list(sub)} if sub else {},
            "subs": -1,
            "data": -1,
            "payload": -1,
            "type": "user",
            "version": 2,
        }
        return write_secret(path, creds_text(sign_jwt(self.account, user.public, name, claims), user.seed))


# --- server config ----------------------------------------------------------------------------------------


def permissions_block(publish: Sequence[str], subscribe: Sequence[str]) -> str:
    """``permissions: { publish: { allow: [...] }, subscribe: { allow: [...] } }`` on one line."""

    def allow(subjects: Sequence[str]) -> str:
        return "{ allow: [" + ", ".join(conf_str(s) for s in subjects) + "] }"

    return f"permissions: {{ publish: {allow(publish)}, subscribe: {allow(subscribe)} }}"
