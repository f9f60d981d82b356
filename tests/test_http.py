"""Network behaviour against a real loopback server (pytest-httpserver), no mocks."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.http import Http, check_url
from bootfsm.host.segments import stream_segmented

BODY = bytes(range(256)) * 4096  # 1 MiB
ETAG = '"v1"'


def _ranged(request: Request) -> Response:
    rng = request.headers.get("Range")
    if rng and request.headers.get("If-Range", ETAG) == ETAG:
        start = int(rng.split("=")[1].split("-")[0])
        if start >= len(BODY):
            return Response(status=416, headers={"Content-Range": f"bytes */{len(BODY)}"})
        part = BODY[start:]
        return Response(
            part,
            status=206,
            headers={"Content-Range": f"bytes {start}-{len(BODY) - 1}/{len(BODY)}", "ETag": ETAG},
        )
    return Response(BODY, status=200, headers={"ETag": ETAG})


def _seed_part(tmp_path: Path, n: int, etag: str = ETAG) -> Path:
    part = tmp_path / "file.part"
    part.write_bytes(BODY[:n])
    (tmp_path / "file.part.meta").write_text(json.dumps({"validator": etag}))
    return part


def test_resume_transfers_only_the_rest(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/a").respond_with_handler(_ranged)
    part = _seed_part(tmp_path, len(BODY) // 2)
    res = Http().stream_to(httpserver.url_for("/a"), part)
    assert res.resumed_bytes == len(BODY) // 2
    assert res.transferred == len(BODY) - len(BODY) // 2
    assert res.sha256 == hashlib.sha256(BODY).hexdigest()
    assert part.read_bytes() == BODY


def test_server_ignoring_range_restarts_cleanly(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/a").respond_with_data(BODY)  # no Range support: 200
    part = _seed_part(tmp_path, 1000)
    res = Http().stream_to(httpserver.url_for("/a"), part)
    assert res.resumed_bytes == 0 and res.transferred == len(BODY)
    assert part.read_bytes() == BODY


def test_changed_artifact_is_not_spliced(httpserver: HTTPServer, tmp_path: Path) -> None:
    new = b"N" * len(BODY)

    def handler(request: Request) -> Response:
        # the artifact changed: If-Range no longer matches, so the whole new file comes
        assert request.headers.get("If-Range") == '"old"'
        return Response(new, status=200, headers={"ETag": '"new"'})

    httpserver.expect_request("/a").respond_with_handler(handler)
    part = _seed_part(tmp_path, 5000, etag='"old"')
    res = Http().stream_to(httpserver.url_for("/a"), part)
    assert res.resumed_bytes == 0 and part.read_bytes() == new
    assert res.sha256 == hashlib.sha256(new).hexdigest()


def test_416_discards_the_partial_file(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/a").respond_with_handler(_ranged)
    part = tmp_path / "file.part"
    part.write_bytes(BODY + b"extra")
    (tmp_path / "file.part.meta").write_text(json.dumps({"validator": ETAG}))
    with pytest.raises(TransientError):
        Http().stream_to(httpserver.url_for("/a"), part)
    assert not part.exists()


def test_503_is_transient_with_retry_after(httpserver: HTTPServer, tmp_path: Path) -> None:
    httpserver.expect_request("/a").respond_with_data(
        "busy", status=503, headers={"Retry-After": "7"}
    )
    with pytest.raises(TransientError) as info:
        Http().stream_to(httpserver.url_for("/a"), tmp_path / "p")
    assert info.value.retry_after == 7.0


@pytest.mark.parametrize("status", [404, 403, 410])
def test_client_errors_are_permanent(httpserver: HTTPServer, tmp_path: Path, status: int) -> None:
    httpserver.expect_request("/a").respond_with_data("no", status=status)
    with pytest.raises(BootError) as info:
        Http().get(httpserver.url_for("/a"))
    assert info.value.code is Code.ARTIFACT_NOT_FOUND


def test_short_body_is_transient_and_keeps_the_prefix(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    def handler(request: Request) -> Response:
        def gen() -> Iterator[bytes]:
            yield BODY[: len(BODY) // 2]
            raise ConnectionResetError("drop")

        return Response(gen(), headers={"Content-Length": str(len(BODY)), "ETag": ETAG})

    httpserver.expect_request("/a").respond_with_handler(handler)
    part = tmp_path / "file.part"
    with pytest.raises(TransientError):
        Http().stream_to(httpserver.url_for("/a"), part)
    assert 0 < part.stat().st_size <= len(BODY) // 2


def test_stalled_server_hits_the_read_timeout(httpserver: HTTPServer, tmp_path: Path) -> None:
    import time

    def handler(request: Request) -> Response:
        def gen() -> Iterator[bytes]:
            yield b"x"
            time.sleep(3)
            yield b"y"

        return Response(gen(), headers={"Content-Length": "2"})

    httpserver.expect_request("/a").respond_with_handler(handler)
    with pytest.raises(TransientError, match=r"Timeout|timed out"):
        Http(read_timeout=0.5).stream_to(httpserver.url_for("/a"), tmp_path / "p")


def test_https_is_required_unless_host_allowed() -> None:
    check_url("https://mirror.example.com/x", ())
    check_url("http://127.0.0.1:8080/x", ("127.0.0.1",))
    with pytest.raises(BootError) as info:
        check_url("http://mirror.example.com/x?sig=SECRET", ("127.0.0.1",))
    assert info.value.code is Code.INSECURE_URL_REFUSED
    assert "SECRET" not in info.value.message


def test_warm_loads_the_library_and_builds_the_session_without_io(
    httpserver: HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A timed request after ``warm`` measures the network: the session exists, built
    while no connection could be opened, and the request then reuses it."""
    import socket

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("warm opened a connection")

    http = Http()
    with monkeypatch.context() as m:
        m.setattr(socket, "create_connection", refuse)
        m.setattr(socket.socket, "connect", refuse)
        http.warm()
    session = http._session
    assert session is not None
    httpserver.expect_request("/a").respond_with_data(b"ok")
    assert http.get(httpserver.url_for("/a")).body == b"ok"
    assert http._session is session


def test_every_request_kind_refuses_a_plain_http_host_not_allowed(
    httpserver: HTTPServer, tmp_path: Path
) -> None:
    """The one request path checks the URL for a GET, a download and a segmented one,
    and the refusal names the URL without its query string (a signature)."""
    httpserver.expect_request("/x").respond_with_data(b"data")
    url = httpserver.url_for("/x") + "?sig=SECRET"
    allow = ["192.0.2.7"]  # not the server's host
    calls = [
        lambda: Http().get(url, timeout=5, allow_http_hosts=allow),
        lambda: Http().stream_to(url, tmp_path / "a.part", allow_http_hosts=allow),
        lambda: stream_segmented(
            Http(), url, tmp_path / "b.part", size=4, segments=2, allow_http_hosts=allow
        ),
    ]
    for call in calls:
        with pytest.raises(BootError) as info:
            call()
        assert info.value.code is Code.INSECURE_URL_REFUSED
        assert "SECRET" not in info.value.message
