"""A small OpenID Connect issuer on loopback, for Oxia's ``oidc`` authentication in tests.

Oxia's server (``--auth-provider-name oidc``) builds go-oidc providers for the issuers of
``allowedIssueURLs`` when it starts: it fetches ``<issuer>/.well-known/openid-configuration``
(whose ``issuer`` must equal the URL exactly) and, on the first token, the JWKS at its
``jwks_uri``. A token must be a JWT signed with a key of that set (RS256 unless the document
says otherwise), carry ``iss`` = the issuer, an unexpired ``exp``, an ``aud`` among
``allowedAudiences`` and the user in ``userNameClaim`` (default ``sub``). :class:`OidcIssuer`
serves both documents over HTTPS with a test certificate and signs tokens with an RSA key it
generates (``cryptography``; JWTs are small enough to sign here without a JWT library).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from bklib.testing.sandbox import CertFiles

__all__ = ["OidcIssuer", "sign_jwt"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _int_b64(n: int) -> str:
    return _b64(n.to_bytes((n.bit_length() + 7) // 8, "big"))


def sign_jwt(key: rsa.RSAPrivateKey, kid: str, claims: dict[str, Any]) -> str:
    """``claims`` as a compact JWS signed RS256 with ``key``, ``kid`` in its header."""
    header = {"alg": "RS256", "typ": "JWT", "kid": kid}
    signing_input = (
        _b64(json.dumps(header).encode()) + "." + _b64(json.dumps(claims).encode())
    ).encode()
    signature = key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
    return signing_input.decode() + "." + _b64(signature)


@dataclass
class OidcIssuer:
    """An issuer at ``https://127.0.0.1:PORT`` (``tls``: its certificate, from the test PKI)."""

    tls: CertFiles
    host: str = "127.0.0.1"
    key: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
        repr=False,
    )
    kid: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    requests: list[str] = field(default_factory=list)
    """Paths served, in order (what the Oxia server fetched)."""
    _server: ThreadingHTTPServer | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        """The issuer URL (``iss`` of its tokens, and Oxia's ``allowedIssueURLs``)."""
        assert self._server is not None, "start() first"
        return f"https://{self.host}:{self._server.server_address[1]}"

    def documents(self) -> dict[str, dict[str, Any]]:
        """The discovery document and the JWKS, by path."""
        public = self.key.public_key().public_numbers()
        jwk = {
            "kty": "RSA",
            "use": "sig",
            "alg": "RS256",
            "kid": self.kid,
            "n": _int_b64(public.n),
            "e": _int_b64(public.e),
        }
        return {
            "/.well-known/openid-configuration": {
                "issuer": self.url,
                "jwks_uri": self.url + "/jwks.json",
                "authorization_endpoint": self.url + "/authorize",
                "response_types_supported": ["id_token"],
                "subject_types_supported": ["public"],
                "id_token_signing_alg_values_supported": ["RS256"],
            },
            "/jwks.json": {"keys": [jwk]},
        }

    def token(
        self,
        subject: str = "bkaudit",
        audience: str = "oxia",
        *,
        lifetime: float = 3600.0,
        key: rsa.RSAPrivateKey | None = None,
    ) -> str:
        """A JWT for ``subject`` and ``audience``, valid ``lifetime`` seconds from now,
        signed with the issuer's key (or ``key``: a token the issuer never signed)."""
        now = int(time.time())
        claims = {
            "iss": self.url,
            "sub": subject,
            "aud": audience,
            "iat": now,
            "exp": now + int(lifetime),
        }
        return sign_jwt(key or self.key, self.kid, claims)

    def start(self) -> OidcIssuer:
        """Serve on a free loopback port, in a daemon thread."""
        issuer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                issuer.requests.append(self.path)
                doc = issuer.documents().get(self.path)
                body = json.dumps(doc).encode() if doc is not None else b"{}"
                self.send_response(200 if doc is not None else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        server = ThreadingHTTPServer((self.host, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(self.tls.cert), str(self.tls.key))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True, name="oidc-issuer").start()
        return self

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> OidcIssuer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
