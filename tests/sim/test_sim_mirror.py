"""Tests for bootfsm.sim.mirror: a real loopback server with injectable faults."""

from __future__ import annotations

import hashlib
import http.client
import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from bootfsm.sim.mirror import (
    BadRange,
    Corrupt,
    DropMidBody,
    LogEntry,
    Mirror,
    NotFound,
    Stall,
    Status,
    Throttle,
)

PAYLOAD = bytes(range(256)) * 64  # 16 KiB
PATH = "/redist/fabricmanager/linux-sbsa/fm.tar.xz"


class Reply:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


def fetch(
    mirror: Mirror, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> Reply:
    """One request on a fresh connection (http.client: no proxies, no retries)."""
    parts = urlsplit(mirror.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)
    finally:
        conn.close()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    target = tmp_path / PATH.lstrip("/")
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)
    (tmp_path.parent / "secret.txt").write_text("outside docroot")
    with Mirror(tmp_path) as m:
        yield m


def test_serves_file_with_download_headers(mirror: Mirror) -> None:
    """GET returns the exact bytes plus the validators a resumer needs."""
    assert mirror.url.startswith("http://127.0.0.1:")
    reply = fetch(mirror, PATH)
    assert reply.status == 200
    assert hashlib.sha256(reply.body).digest() == hashlib.sha256(PAYLOAD).digest()
    assert reply.headers["content-length"] == str(len(PAYLOAD))
    assert reply.headers["accept-ranges"] == "bytes"
    assert reply.headers["etag"].startswith('"')
    assert reply.headers["last-modified"].endswith("GMT")
    assert mirror.log == [LogEntry("GET", PATH, 200, None, len(PAYLOAD))]
    assert mirror.bytes_sent_total == len(PAYLOAD)


def test_head_has_headers_but_no_body(mirror: Mirror) -> None:
    """HEAD answers the same headers and sends no body."""
    reply = fetch(mirror, PATH, "HEAD")
    assert reply.status == 200
    assert reply.headers["content-length"] == str(len(PAYLOAD))
    assert reply.body == b""


def test_missing_directory_and_traversal_are_404(mirror: Mirror) -> None:
    """Missing files, directories and paths escaping the docroot are all 404."""
    for path in ("/nope", "/redist/", "/../secret.txt", "/redist/%2e%2e/%2e%2e/secret.txt"):
        assert fetch(mirror, path).status == 404, path


def test_not_found_fault(mirror: Mirror) -> None:
    """NotFound turns an existing file into a 404 and is matched by suffix."""
    mirror.add_fault("fm.tar.xz", NotFound())
    assert fetch(mirror, PATH).status == 404
    assert fetch(mirror, PATH).status == 404
    assert mirror.requests("fm.tar.xz") == 2


def test_three_503_then_200_with_retry_after(mirror: Mirror) -> None:
    """Status(503, times=3) answers three 503s carrying Retry-After, then the file."""
    mirror.add_fault(PATH, Status(503, times=3, retry_after=2))
    replies = [fetch(mirror, PATH) for _ in range(4)]
    assert [r.status for r in replies] == [503, 503, 503, 200]
    assert replies[0].headers["retry-after"] == "2"
    assert replies[3].body == PAYLOAD
    assert mirror.requests(PATH) == 4
    assert [e.status for e in mirror.log] == [503, 503, 503, 200]


def test_drop_mid_body_then_normal(mirror: Mirror, capfd: pytest.CaptureFixture[str]) -> None:
    """DropMidBody gives a short read once (HEAD does not use it up); then the full file."""
    mirror.add_fault(PATH, DropMidBody(times=1, fraction=0.25))
    assert fetch(mirror, PATH, "HEAD").status == 200
    with pytest.raises(http.client.IncompleteRead) as excinfo:
        fetch(mirror, PATH)
    assert len(excinfo.value.partial) == len(PAYLOAD) // 4
    assert fetch(mirror, PATH).body == PAYLOAD
    assert [e.bytes_sent for e in mirror.log] == [0, len(PAYLOAD) // 4, len(PAYLOAD)]
    assert capfd.readouterr().err == ""  # quiet unless verbose


def test_range_gives_206_with_content_range(mirror: Mirror) -> None:
    """Single byte ranges (N-M, N-, -S) give 206 with the right slice and header."""
    size = len(PAYLOAD)
    cases = {
        "bytes=100-199": (100, 199),
        "bytes=1000-": (1000, size - 1),
        "bytes=-10": (size - 10, size - 1),
        "bytes=10-999999": (10, size - 1),
    }
    for header, (start, end) in cases.items():
        reply = fetch(mirror, PATH, headers={"Range": header})
        assert reply.status == 206, header
        assert reply.body == PAYLOAD[start : end + 1]
        assert reply.headers["content-range"] == f"bytes {start}-{end}/{size}"
        assert reply.headers["content-length"] == str(end - start + 1)
    assert mirror.log[0].range_header == "bytes=100-199"


def test_bad_range_answers_a_resume_with_other_bytes_framed_honestly(mirror: Mirror) -> None:
    """A resume (``bytes=N-``, N > 0) gets a 206 whose range starts ``shift`` early or
    whose total claims ``extra`` bytes; the body is exactly the bytes its Content-Range
    names, counted by Content-Length. A request from byte 0 or without a range is
    served as usual and leaves the fault for the resume."""
    size = len(PAYLOAD)
    mirror.add_fault(PATH, BadRange(shift=100))
    mirror.add_fault(PATH, BadRange(extra=7))
    assert fetch(mirror, PATH).body == PAYLOAD
    assert fetch(mirror, PATH, headers={"Range": "bytes=0-"}).status == 206
    early = fetch(mirror, PATH, headers={"Range": "bytes=1000-"})
    assert early.status == 206 and early.headers["content-range"] == f"bytes 900-{size - 1}/{size}"
    assert early.body == PAYLOAD[900:] and early.headers["content-length"] == str(size - 900)
    longer = fetch(mirror, PATH, headers={"Range": "bytes=1000-"})
    assert longer.headers["content-range"] == f"bytes 1000-{size - 1}/{size + 7}"
    assert longer.body == PAYLOAD[1000:]
    honest = fetch(mirror, PATH, headers={"Range": "bytes=1000-"})
    assert honest.headers["content-range"] == f"bytes 1000-{size - 1}/{size}"


def test_unsatisfiable_range_is_416(mirror: Mirror) -> None:
    """A start at or past the end gives 416 with Content-Range bytes */size."""
    reply = fetch(mirror, PATH, headers={"Range": f"bytes={len(PAYLOAD)}-"})
    assert reply.status == 416
    assert reply.headers["content-range"] == f"bytes */{len(PAYLOAD)}"


def test_malformed_or_multi_range_is_ignored(mirror: Mirror) -> None:
    """Ranges the mirror does not serve fall back to a full 200."""
    for header in ("bytes=0-1,5-6", "items=0-1", "bytes=9-3"):
        reply = fetch(mirror, PATH, headers={"Range": header})
        assert (reply.status, reply.body) == (200, PAYLOAD), header


def test_if_range(mirror: Mirror) -> None:
    """If-Range with the current ETag honours Range; a stale one gets the full 200."""
    etag = fetch(mirror, PATH, "HEAD").headers["etag"]
    fresh = fetch(mirror, PATH, headers={"Range": "bytes=5-", "If-Range": etag})
    assert (fresh.status, fresh.body) == (206, PAYLOAD[5:])
    stale = fetch(mirror, PATH, headers={"Range": "bytes=5-", "If-Range": '"0-0"'})
    assert (stale.status, stale.body) == (200, PAYLOAD)
    assert "content-range" not in stale.headers


def test_corrupt_changes_sha256_not_length(mirror: Mirror) -> None:
    """Corrupt keeps the length but not the checksum, also across a ranged resume."""
    mirror.add_fault(PATH, Corrupt())
    reply = fetch(mirror, PATH)
    assert len(reply.body) == len(PAYLOAD)
    assert hashlib.sha256(reply.body).hexdigest() != hashlib.sha256(PAYLOAD).hexdigest()
    head = fetch(mirror, PATH, headers={"Range": f"bytes=0-{len(PAYLOAD) // 2 - 1}"})
    tail = fetch(mirror, PATH, headers={"Range": f"bytes={len(PAYLOAD) // 2}-"})
    assert head.body + tail.body == reply.body


def test_stall_delays_body(mirror: Mirror) -> None:
    """Stall sends headers, then waits before the body."""
    mirror.add_fault(PATH, Stall(0.3, times=1))
    began = time.monotonic()
    assert fetch(mirror, PATH).body == PAYLOAD
    assert time.monotonic() - began >= 0.25


def test_throttle_bounds_rate(mirror: Mirror) -> None:
    """Throttle(32 KiB/s) makes a 16 KiB body take at least ~0.4 s."""
    mirror.add_fault(PATH, Throttle(32 * 1024))
    began = time.monotonic()
    assert fetch(mirror, PATH).body == PAYLOAD
    assert time.monotonic() - began >= 0.4


def test_dynamic_routes_and_faults_on_routes(mirror: Mirror) -> None:
    """add_route answers JSON/health callables; query strings are ignored; faults apply."""
    doc = {"compute": {"vmSize": "Standard_ND96isr_H100_v5"}}
    mirror.add_route(
        "/metadata/instance",
        lambda: (200, {"Content-Type": "application/json"}, json.dumps(doc).encode()),
    )
    healthy = {"ok": False}
    mirror.add_route(
        "/healthz", lambda: (200, {}, b"ok") if healthy["ok"] else (500, {}, b"not ready")
    )
    mirror.add_fault("/metadata/instance", Status(503, times=1))
    assert fetch(mirror, "/metadata/instance?api-version=2021-02-01").status == 503
    reply = fetch(mirror, "/metadata/instance?api-version=2021-02-01", headers={"Metadata": "true"})
    assert (reply.status, json.loads(reply.body)) == (200, doc)
    assert reply.headers["content-type"] == "application/json"
    assert fetch(mirror, "/healthz").status == 500
    healthy["ok"] = True
    assert (fetch(mirror, "/healthz").status, fetch(mirror, "/healthz").body) == (200, b"ok")
    assert mirror.requests("/metadata/instance") == 2


def test_broken_route_is_500_and_server_survives(mirror: Mirror) -> None:
    """A route that raises becomes a 500; the mirror keeps serving."""

    def boom() -> tuple[int, dict[str, str], bytes]:
        raise RuntimeError("boom")

    mirror.add_route("/boom", boom)
    assert fetch(mirror, "/boom").status == 500
    assert fetch(mirror, PATH).status == 200


def test_stop_releases_port_and_is_idempotent(tmp_path: Path) -> None:
    """stop() twice is fine; a stopped mirror refuses connections."""
    mirror = Mirror(tmp_path).start()
    url = mirror.url
    mirror.stop()
    mirror.stop()
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=2)
    with pytest.raises(OSError):
        conn.request("GET", "/")
    conn.close()


def test_refuses_non_loopback_host(tmp_path: Path) -> None:
    """The mirror never binds a routable address."""
    with pytest.raises(ValueError):
        Mirror(tmp_path, host="0.0.0.0")
