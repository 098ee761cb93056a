"""A GET of a watch's HTTP endpoints (/metrics, /healthz, /readyz) on loopback, for the tests
that run a watch: as a process, in a container, or from the rendered chart."""

from __future__ import annotations

import urllib.error
import urllib.request


def http_get(port: int, path: str) -> tuple[int, str]:
    """(status, body) of ``GET http://127.0.0.1:PORT/PATH``; status 0 and the reason when
    nothing answered (not yet listening, refused, timed out after 5 s)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError as exc:
        return 0, str(exc)
