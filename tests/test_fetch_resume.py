"""Resumable downloads against real loopback servers: never a spliced file, never a leak.

The sim Mirror serves real Range/If-Range/ETag semantics with injected faults;
pytest-httpserver plays the non-conforming servers (Range ignored, a 206 for another
entity); a small loopback forwarding proxy checks the proxy policy.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.http import Http, partial_source, url_id
from bootfsm.host.segment_meta import bytes_on_disk
from bootfsm.host.segments import stream_segmented
from bootfsm.sim.mirror import BadRange, DropMidBody, Mirror, Stall, Status, Throttle

SIZE = 4 << 20
BODY = os.urandom(SIZE)
SHA = hashlib.sha256(BODY).hexdigest()


@pytest.fixture
def mirror(tmp_path: Path) -> Iterator[Mirror]:
    doc = tmp_path / "doc"
    doc.mkdir()
    (doc / "f.bin").write_bytes(BODY)
    with Mirror(doc) as m:
        yield m


def _part(tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    d.mkdir(exist_ok=True)
    return d / "f.bin.part"


def test_drop_at_half_resumes_and_transfers_only_the_rest(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", DropMidBody(times=1, fraction=0.5))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError):
        Http().stream_to(url, part)
    have = part.stat().st_size
    assert 0 < have <= SIZE // 2 and part.read_bytes() == BODY[:have]
    assert partial_source(part) == url_id(url)
    res = Http().stream_to(url, part)
    assert (res.resumed_bytes, res.transferred, res.size) == (have, SIZE - have, SIZE)
    assert res.sha256 == SHA and part.read_bytes() == BODY
    assert mirror.bytes_sent_total == SIZE  # the first half was never sent twice
    second = [e for e in mirror.log if e.path == "/f.bin"][-1]
    assert second.status == 206 and second.range_header == f"bytes={have}-"


def test_server_ignoring_range_restarts_instead_of_appending(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    seen: list[str | None] = []

    def handler(request: Request) -> Response:
        seen.append(request.headers.get("Range"))
        return Response(BODY, status=200, headers={"ETag": '"v1"'})  # like python -m http.server

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    part.write_bytes(b"\0" * 1000)  # same validator, wrong bytes: appending would corrupt
    part.with_name(part.name + ".meta").write_text(json.dumps({"etag": '"v1"', "size": SIZE}))
    res = Http().stream_to(httpserver.url_for("/f"), part)
    assert seen == ["bytes=1000-"]
    assert res.resumed_bytes == 0 and res.sha256 == SHA and part.read_bytes() == BODY


def test_416_keeps_a_whole_file_and_discards_an_oversized_one(
    mirror: Mirror, tmp_path: Path
) -> None:
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    Http().stream_to(url, part)  # whole, but (a crash) never renamed
    before = mirror.bytes_sent_total
    res = Http().stream_to(url, part)
    assert (res.transferred, res.resumed_bytes, res.sha256) == (0, SIZE, SHA)
    assert mirror.log[-1].status == 416 and mirror.bytes_sent_total == before
    with part.open("ab") as fh:
        fh.write(b"junk")  # larger than the file: nothing on disk can be trusted
    with pytest.raises(TransientError, match="416"):
        Http().stream_to(url, part)
    assert not part.exists() and not part.with_name(part.name + ".meta").exists()


def test_changed_artifact_restarts_instead_of_splicing(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", DropMidBody(times=1, fraction=0.5))
    part, url = _part(tmp_path), mirror.url + "/f.bin"
    with pytest.raises(TransientError):
        Http().stream_to(url, part)
    new = os.urandom(SIZE)  # same size, new content, new mtime: a new ETag
    target = mirror.docroot / "f.bin"
    target.write_bytes(new)
    os.utime(target, ns=(1, 1))
    res = Http().stream_to(url, part)
    assert mirror.log[-1].status == 200  # If-Range failed: the whole new entity came
    assert res.resumed_bytes == 0 and part.read_bytes() == new
    assert res.sha256 == hashlib.sha256(new).hexdigest()


def test_206_for_another_entity_is_never_spliced(httpserver: HTTPServer, tmp_path: Path) -> None:
    """A server that ignores If-Range answers the resume with the range of a NEW entity:
    the part is discarded and the new entity fetched whole (never v1's prefix + v2)."""
    v2 = bytes(reversed(BODY))

    def handler(request: Request) -> Response:
        if "Range" not in request.headers:
            return Response(v2, 200, headers={"ETag": '"v2"'})
        start = int(request.headers["Range"].split("=")[1].rstrip("-"))
        rng = f"bytes {start}-{SIZE - 1}/{SIZE}"
        return Response(v2[start:], 206, headers={"ETag": '"v2"', "Content-Range": rng})

    httpserver.expect_request("/f").respond_with_handler(handler)
    part = _part(tmp_path)
    part.write_bytes(BODY[:1000])
    part.with_name(part.name + ".meta").write_text(json.dumps({"etag": '"v1"'}))
    res = Http().stream_to(httpserver.url_for("/f"), part)
    assert res.resumed_bytes == 0 and part.read_bytes() == v2
    assert res.sha256 == hashlib.sha256(v2).hexdigest()
    assert [r.headers.get("Range") for r, _ in httpserver.log] == ["bytes=1000-", None]


def test_stalled_server_hits_the_read_timeout(mirror: Mirror, tmp_path: Path) -> None:
    mirror.add_fault("/f.bin", Stall(seconds=30, times=1))
    part = _part(tmp_path)
    with pytest.raises(TransientError, match=r"(?i)timed? ?out"):
        Http(read_timeout=0.3).stream_to(mirror.url + "/f.bin", part)


def test_artifact_time_limit_stops_a_slow_transfer_resumably(
    mirror: Mirror, tmp_path: Path
) -> None:
    import time

    mirror.add_fault("/f.bin", Throttle(bytes_per_second=1 << 20))
    part = _part(tmp_path)
    with pytest.raises(TransientError) as info:
        Http().stream_to(mirror.url + "/f.bin", part, deadline=time.monotonic() + 0.4)
    assert info.value.code is Code.DOWNLOAD_TIMEOUT
    assert 0 < part.stat().st_size < SIZE  # kept for the next attempt


@pytest.mark.parametrize("code", [429, 503])
def test_retry_after_is_carried_on_429_and_503(mirror: Mirror, tmp_path: Path, code: int) -> None:
    mirror.add_fault("/f.bin", Status(code, times=1, retry_after=7))
    with pytest.raises(TransientError) as info:
        Http().stream_to(mirror.url + "/f.bin", _part(tmp_path))
    assert info.value.retry_after == 7.0


def test_retry_after_as_an_http_date(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/f").respond_with_data(
        "busy", status=503, headers={"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}
    )
    with pytest.raises(TransientError) as info:
        Http().stream_to(httpserver.url_for("/f"), _part(tmp_path))
    assert info.value.retry_after == 0.0  # a date in the past: retry now


def test_wrong_size_is_refused_before_any_byte(mirror: Mirror, tmp_path: Path) -> None:
    part = _part(tmp_path)
    with pytest.raises(BootError) as info:
        Http().stream_to(mirror.url + "/f.bin", part, expect_size=SIZE + 1)
    assert info.value.code is Code.CHECKSUM_MISMATCH and not part.exists()


def test_no_query_string_in_any_error(tmp_path: Path) -> None:
    with Mirror(tmp_path) as m:
        dead = m.url  # the port is closed once the mirror stops
    secret = "?sv=2024&sig=SECRET%2Bkey"
    with pytest.raises(TransientError) as info:
        Http(connect_timeout=1).get(dead + "/Packages" + secret)
    assert "SECRET" not in info.value.message and "<redacted>" in info.value.message
    with pytest.raises(TransientError) as info2:
        Http(connect_timeout=1).stream_to(dead + "/f.bin" + secret, _part(tmp_path))
    assert "SECRET" not in info2.value.message


# -- proxies -------------------------------------------------------------------------------


class _Proxy(ThreadingHTTPServer):
    """A loopback forwarding HTTP proxy: every host it is asked for is 127.0.0.1."""

    daemon_threads = True
    seen: list[str]


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Proxy

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.server.seen.append(self.path)
        target = urlsplit(self.path)  # absolute-form request line: a proxy request
        conn = http.client.HTTPConnection("127.0.0.1", target.port or 80, timeout=10)
        fwd = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection",)}
        conn.request("GET", target.path + (f"?{target.query}" if target.query else ""), None, fwd)
        resp = conn.getresponse()
        body = resp.read()
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def proxy() -> Iterator[_Proxy]:
    srv = _Proxy(("127.0.0.1", 0), _ProxyHandler)
    srv.seen = []
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_downloads_go_through_the_environment_proxy(
    mirror: Mirror, proxy: _Proxy, tmp_path: Path
) -> None:
    port = urlsplit(mirror.url).port
    url = f"http://mirror.test:{port}/f.bin"  # resolvable only by the proxy
    env = {"HTTP_PROXY": f"http://127.0.0.1:{proxy.server_address[1]}"}
    res = Http(env=env).stream_to(url, _part(tmp_path), allow_http_hosts=["mirror.test"])
    assert res.sha256 == SHA and proxy.seen == [url]
    assert Http(env={**env, "no_proxy": "example.com,.test"}).proxy_for(url) is None


def test_metadata_and_loopback_never_use_the_proxy(mirror: Mirror, proxy: _Proxy) -> None:
    env = {"http_proxy": f"http://127.0.0.1:{proxy.server_address[1]}", "no_proxy": ""}
    h = Http(env=env)
    # link-local (IMDS) is policy-checked only: no request is sent to 169.254.0.0/16 here
    assert h.proxy_for("http://169.254.169.254/metadata/instance") is None
    assert h.proxy_for("http://[fe80::1]/x") is None
    assert h.proxy_for("http://localhost:10248/healthz") is None
    assert h.get(mirror.url + "/f.bin").body == BODY  # loopback, for real: direct
    assert proxy.seen == []
    assert h.proxy_for("http://mirror.test/x") == env["http_proxy"]


def test_a_redirect_to_a_plain_http_host_is_refused(mirror: Mirror, tmp_path: Path) -> None:
    with HTTPServer(host="127.0.0.1") as server:
        port = urlsplit(mirror.url).port
        server.expect_request("/f.bin").respond_with_data(
            "", status=302, headers={"Location": f"http://localhost:{port}/f.bin?sig=SECRET"}
        )
        part = _part(tmp_path)
        with pytest.raises(BootError) as info:
            Http().stream_to(server.url_for("/f.bin"), part, allow_http_hosts=["127.0.0.1"])
    assert info.value.code is Code.INSECURE_URL_REFUSED and "SECRET" not in info.value.message
    assert not part.exists()


@pytest.mark.parametrize(
    "bad", [BadRange(shift=1000), BadRange(extra=1000)], ids=["first-byte", "total"]
)
@pytest.mark.parametrize("how", ["one-connection", "segmented"])
def test_a_resume_answered_with_other_bytes_is_discarded_and_fetched_whole(
    mirror: Mirror, tmp_path: Path, bad: BadRange, how: str
) -> None:
    """The first transfer drops halfway; the resume gets a well-formed 206 whose range
    starts 1000 bytes early, or whose total is 1000 bytes too many. Appended, either
    would corrupt the file (or, sized by its index, fail the boot with 31): the part is
    discarded and the file fetched whole from byte 0 in the same call, and verifies."""
    mirror.add_fault("f.bin", DropMidBody(times=1, fraction=0.5))
    mirror.add_fault("f.bin", bad)
    part, http, url = tmp_path / "f.part", Http(env={}), mirror.url + "/f.bin"

    def fetch() -> Any:
        if how == "segmented":
            return stream_segmented(http, url, part, size=SIZE, segments=1)  # a runfile's way
        return http.stream_to(url, part, expect_size=SIZE)

    with pytest.raises(TransientError):
        fetch()
    have = bytes_on_disk(part)  # what the next call resumes from
    assert have > 0
    res = fetch()
    assert res.sha256 == SHA and res.resumed_bytes == 0 and part.read_bytes() == BODY
    _, resume, *whole = mirror.log  # the file again from byte 0 (in pieces, when segmented)
    assert resume.status == 206 and (resume.range_header or "").startswith(f"bytes={have}-")
    assert (whole[0].range_header or "bytes=0-").startswith("bytes=0-")
    assert sum(e.bytes_sent for e in whole) == SIZE
