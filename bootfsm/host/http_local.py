"""Plain-HTTP GETs to this node's own endpoints (IMDS, kubelet healthz), without requests.

A link-local or loopback ``http://`` URL is never proxied, never TLS and never
redirected elsewhere, so it needs none of what ``requests`` adds, and importing
``requests`` (with urllib3, idna, charset_normalizer) costs about 70 ms a process:
most of a rerun's own time when nothing is downloaded. The standard library's
``http.client`` reads these few hundred bytes directly, under the same bounds as every
other request: connect and read timeouts, a total-time watch that shuts the socket, a
body cap; the caller (``Http.get``) classifies its errors as it does every request's.
A redirect is not followed.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from urllib.parse import urlsplit

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.core.redact import redact_url
from bootfsm.host.http_wire import Watch, too_slow

__all__ = ["get_direct"]


def get_direct(
    url: str,
    *,
    headers: Mapping[str, str],
    connect_timeout: float,
    read_timeout: float,
    watch: Watch,
    max_bytes: int,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of one GET to a plain-HTTP local ``url``, read whole.

    Raises what the connection raises (``OSError``, ``http.client.HTTPException``, or
    ``ValueError`` for a bad port: ``Http._classify`` turns them into TransientError),
    ``too_slow`` past the watch, ``BootError`` (``INDEX_INVALID``) for a body over
    ``max_bytes`` and (``ARTIFACT_NOT_FOUND``) for a redirect, which a node-local
    endpoint has no reason to send."""
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    conn: http.client.HTTPConnection | None = None
    r: http.client.HTTPResponse | None = None
    try:
        conn = http.client.HTTPConnection(
            parts.hostname or "", parts.port or 80, timeout=max(connect_timeout, 0.05)
        )
        conn.connect()
        watch.add(conn)
        if conn.sock is not None:
            conn.sock.settimeout(max(read_timeout, 0.05))
        conn.request("GET", path, headers={"User-Agent": "bootfsm", **headers})
        r = conn.getresponse()
        body = r.read(max_bytes + 1)
        if len(body) > max_bytes:
            raise BootError(Code.INDEX_INVALID, f"{redact_url(url)} is larger than {max_bytes} B")
        if watch.fired:
            raise too_slow(url, watch)
        if 300 <= r.status < 400:
            raise BootError(
                Code.ARTIFACT_NOT_FOUND,
                f"HTTP {r.status} from {redact_url(url)}: a node-local endpoint is read "
                "directly and its redirects are not followed",
                status=r.status,
            )
        return r.status, dict(r.getheaders()), body
    finally:
        if r is not None:
            r.close()  # with "Connection: close" the response alone holds the socket
        if conn is not None:
            conn.close()
