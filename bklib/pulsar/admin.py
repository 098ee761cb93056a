"""A small client of Pulsar's admin REST API: only what bkaudit asks of a broker.

A topic is unloaded with ``PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/unload``
(``PersistentTopicsBase.internalUnloadTopic``): its owner closes it and the next client opens
it afresh, with fresh ledger handles. A broker that does not own the topic answers 307 with
the owner's address; the redirect is followed here with the same method and credentials
(``Authorization: Bearer <token>``, as Pulsar's ``AuthenticationToken`` sends it), which
generic HTTP clients drop on a cross-host redirect.

The standard library's ``http.client`` is enough for one PUT at a time and keeps this free of
an HTTP dependency. See docs/pulsar.md.
"""

from __future__ import annotations

import http.client
import json
import ssl
from dataclasses import dataclass
from urllib.parse import urljoin, urlsplit

from bklib.pulsar.topics import TopicName

__all__ = ["AdminSettings", "PulsarAdmin", "PulsarAdminError", "PulsarAdminUnreachable"]

MAX_REDIRECTS = 3


class PulsarAdminError(Exception):
    """The admin API refused a request: ``status`` is the HTTP status (0: no answer)."""

    def __init__(self, what: str, status: int, reason: str) -> None:
        super().__init__(f"{what}: {reason}" + (f" (HTTP {status})" if status else ""))
        self.status = status
        self.reason = reason


class PulsarAdminUnreachable(PulsarAdminError):
    """No answer at all: refused, timed out, TLS handshake failed, name did not resolve."""


@dataclass(frozen=True)
class AdminSettings:
    """Where the admin API is and how to authenticate (``--pulsar-admin-*`` flags)."""

    url: str
    token: str | None = None
    """A JWT for Pulsar's token authentication (``Authorization: Bearer``)."""
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    timeout: float = 30.0


class PulsarAdmin:
    """Requests to one broker's admin API (following redirects to a topic's owner)."""

    def __init__(self, settings: AdminSettings) -> None:
        parts = urlsplit(settings.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(
                f"--pulsar-admin-url {settings.url!r}: expected http(s)://HOST:PORT, "
                "a broker's webServicePort"
            )
        self.settings = settings
        self._ssl: ssl.SSLContext | None = None
        if parts.scheme == "https" or settings.tls_ca or settings.tls_cert:
            ctx = ssl.create_default_context(cafile=settings.tls_ca)
            if settings.tls_cert:
                ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
            self._ssl = ctx

    def unload(self, topic: TopicName) -> None:
        """Unload ``topic`` on its owning broker. Raises :class:`PulsarAdminError` (404: no
        such topic) or :class:`PulsarAdminUnreachable`."""
        self._request("PUT", topic.admin_path("unload"), f"unload {topic}")

    def _request(self, method: str, path: str, what: str) -> bytes:
        base = urljoin(self.settings.url.rstrip("/") + "/", path.lstrip("/"))
        url = base
        for _ in range(MAX_REDIRECTS + 1):
            try:
                status, location, body = self._once(method, url, what)
            except PulsarAdminUnreachable as exc:
                if url == base:
                    raise
                # The owner the broker redirected to is unreachable, not the admin API: other
                # topics may live on reachable brokers.
                raise PulsarAdminError(what, 0, exc.reason) from exc
            if status in (301, 302, 303, 307, 308) and location:
                target = urljoin(url, location)
                if urlsplit(url).scheme == "https" and urlsplit(target).scheme != "https":
                    # Never send the token in the clear.
                    raise PulsarAdminError(what, status, f"refusing redirect to {target}")
                url = target
                continue
            if 200 <= status < 300:
                return body
            reason = _reason(body) or http.client.responses.get(status, "error")
            raise PulsarAdminError(what, status, reason)
        raise PulsarAdminError(what, 0, f"more than {MAX_REDIRECTS} redirects, last to {url}")

    def _once(self, method: str, url: str, what: str) -> tuple[int, str | None, bytes]:
        parts = urlsplit(url)
        host = parts.hostname or ""
        conn: http.client.HTTPConnection
        if parts.scheme == "https":
            conn = http.client.HTTPSConnection(
                host, parts.port, timeout=self.settings.timeout, context=self._ssl
            )
        else:
            conn = http.client.HTTPConnection(host, parts.port, timeout=self.settings.timeout)
        headers = {"Accept": "application/json", "Content-Length": "0"}
        if self.settings.token:
            headers["Authorization"] = f"Bearer {self.settings.token}"
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        try:
            conn.request(method, target, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.getheader("Location"), resp.read()
        except (OSError, http.client.HTTPException) as exc:
            raise PulsarAdminUnreachable(
                what, 0, f"admin API {parts.scheme}://{parts.netloc} unreachable: {exc}"
            ) from exc
        finally:
            conn.close()


def _reason(body: bytes) -> str:
    """Pulsar's error answer is ``{"reason": "..."}``; anything else is shown trimmed."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        doc = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(doc, dict) and isinstance(doc.get("reason"), str):
        return str(doc["reason"])
    return text[:200]
