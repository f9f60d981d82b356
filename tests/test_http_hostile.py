"""A hostile peer against the HTTP client: real loopback sockets, a real HTTPS server
with a CA made in the test (trustme), no mocks.

Each test performs the attack: trickled headers, a slowloris body, an endless chunked
body, a redirect from HTTPS to plain HTTP, a certificate from an unknown CA, and one not
yet valid (a clock not yet synced at boot).
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from pytest_httpserver import HTTPServer

from bootfsm.core.codes import Code
from bootfsm.core.config import parse_config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import Host
from bootfsm.host.http import SYSTEM_CA_BUNDLES, Http
from bootfsm.machine.context import trust_store

Serve = Callable[[socket.socket, threading.Event], None]


class RawServer:
    """A one-connection-at-a-time loopback server running ``serve`` per connection.

    Bounded: it stops when the test ends (the event) or after 30 s. With ``tls`` it
    speaks HTTPS (the handshake, then ``serve`` on the TLS socket).
    """

    def __init__(self, serve: Serve, tls: ssl.SSLContext | None = None) -> None:
        self.stop = threading.Event()
        self.tls = tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.thread = threading.Thread(target=self._loop, args=(serve,), daemon=True)
        self.thread.start()

    def _loop(self, serve: Serve) -> None:
        end = time.monotonic() + 30
        while not self.stop.is_set() and time.monotonic() < end:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                try:
                    if self.tls is not None:
                        conn = self.tls.wrap_socket(conn, server_side=True)
                    conn.recv(65536)  # the request
                    serve(conn, self.stop)
                except OSError:
                    pass

    def url(self, path: str = "/x") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        self.sock.close()


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def make(serve: Serve, tls: ssl.SSLContext | None = None) -> RawServer:
        servers.append(RawServer(serve, tls))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


@pytest.fixture
def reader_off_cpu(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """``(at)``: the first socket read to return ``at`` s or more from now is followed by
    0.6 s off the CPU, as a loaded machine deschedules a thread: the deadline falls, and
    the peer's next bytes arrive, while the reader is between two reads."""

    def arm(at: float) -> None:
        real = socket.SocketIO.readinto
        t0, fired = time.monotonic(), []

        def readinto(self: socket.SocketIO, b: Any) -> int | None:
            n = real(self, b)
            if not fired and time.monotonic() - t0 >= at:
                fired.append(True)
                time.sleep(0.6)
            return n

        monkeypatch.setattr(socket.SocketIO, "readinto", readinto)

    return arm


def _trickle(conn: socket.socket, stop: threading.Event, data: bytes, every: float) -> None:
    for i in range(len(data)):
        if stop.wait(every):
            return
        conn.sendall(data[i : i + 1])


def slow_body(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    _trickle(conn, stop, b"x" * 1000, 0.2)


def slow_headers(conn: socket.socket, stop: threading.Event) -> None:
    _trickle(conn, stop, b"HTTP/1.1 200 OK\r\n" + b"X-Pad: " + b"a" * 500 + b"\r\n\r\n", 0.2)


def endless_chunked(conn: socket.socket, stop: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    end = time.monotonic() + 20
    while not stop.is_set() and time.monotonic() < end:
        conn.sendall(b"64\r\n" + b"y" * 100 + b"\r\n")


@pytest.mark.parametrize("serve", [slow_body, slow_headers], ids=["body", "headers"])
def test_trickling_peer_cannot_stretch_a_small_get(
    raw_server: Callable[[Serve], RawServer], serve: Serve
) -> None:
    """A 2 s limit (IMDS, kubelet healthz) holds against one byte every 0.2 s, although
    no single read ever waits as long as the 30 s read timeout."""
    srv = raw_server(serve)
    t0 = time.monotonic()
    with pytest.raises(TransientError) as err:
        Http(read_timeout=30).get(srv.url(), timeout=2)
    elapsed = time.monotonic() - t0
    assert err.value.code is Code.DOWNLOAD_TIMEOUT
    assert "total time limit (2 s)" in str(err.value)
    assert elapsed < 10  # the trickle alone would take 100 s or more


def test_slowloris_download_ends_at_its_deadline(
    raw_server: Callable[[Serve], RawServer],
    reader_off_cpu: Callable[[float], None],
    tmp_path: Path,
) -> None:
    """A download's deadline holds mid-body; the bytes so far stay for a resume, also
    when the reader is off the CPU as the deadline falls and the peer keeps sending."""
    srv = raw_server(slow_body)
    reader_off_cpu(1.7)
    part = tmp_path / "a.part"
    t0 = time.monotonic()
    with pytest.raises(TransientError) as err:
        Http(read_timeout=30).stream_to(srv.url(), part, deadline=time.monotonic() + 2)
    assert err.value.code is Code.DOWNLOAD_TIMEOUT
    assert time.monotonic() - t0 < 10
    assert 0 < part.stat().st_size < 1000


def test_endless_chunked_body_stops_one_byte_past_the_index_size(
    raw_server: Callable[[Serve], RawServer], tmp_path: Path
) -> None:
    """An 836-byte deb served as an endless chunked body: a size mismatch after 837 B,
    never a full disk."""
    srv = raw_server(endless_chunked)
    part = tmp_path / "deb.part"
    with pytest.raises(BootError) as err:
        Http().stream_to(srv.url(), part, expect_size=836, deadline=time.monotonic() + 15)
    assert err.value.code is Code.CHECKSUM_MISMATCH
    assert "more than the 836 B" in str(err.value)
    assert part.stat().st_size == 837


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def _https(cert: trustme.LeafCert) -> HTTPServer:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(ctx)
    server = HTTPServer(host="127.0.0.1", ssl_context=ctx)
    server.start()
    return server


@pytest.fixture
def https(ca: trustme.CA) -> Iterator[HTTPServer]:
    server = _https(ca.issue_cert("127.0.0.1", "localhost"))
    yield server
    server.clear()
    server.stop()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


def test_https_with_the_node_ca(https: HTTPServer, ca_file: str) -> None:
    https.expect_request("/index").respond_with_data("ok")
    assert Http(ca_file=ca_file, env={}).get(https.url_for("/index")).body == b"ok"


def test_unknown_ca_is_its_own_permanent_code(https: HTTPServer) -> None:
    """Not retried as a transient 33: a verification failure names the trust store and
    the usual cause at boot."""
    https.expect_request("/index").respond_with_data("ok")
    with pytest.raises(BootError) as err:
        Http(env={}).get(https.url_for("/index"))
    assert err.value.code is Code.TLS_VERIFY_FAILED
    assert "did not verify" in str(err.value) and "trust store: certifi" in str(err.value)


def test_certificate_not_yet_valid_points_at_the_clock(ca: trustme.CA, ca_file: str) -> None:
    later = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=2)
    server = _https(
        ca.issue_cert("127.0.0.1", not_before=later, not_after=later + datetime.timedelta(1))
    )
    try:
        server.expect_request("/index").respond_with_data("ok")
        with pytest.raises(BootError) as err:
            Http(ca_file=ca_file, env={}).get(server.url_for("/index"))
    finally:
        server.stop()
    assert err.value.code is Code.TLS_VERIFY_FAILED
    assert "clock may not be synced" in str(err.value)


def test_redirect_from_https_to_http_is_refused(
    https: HTTPServer, httpserver: HTTPServer, ca_file: str, tmp_path: Path
) -> None:
    """Even to a host allowed plain HTTP: a hop may not leave HTTPS (GET and download)."""
    httpserver.expect_request("/x").respond_with_data("downgraded")
    https.expect_request("/x").respond_with_data(
        "", status=302, headers={"Location": httpserver.url_for("/x")}
    )
    client = Http(ca_file=ca_file, env={})
    for call in (
        lambda: client.get(https.url_for("/x"), allow_http_hosts=["127.0.0.1"]),
        lambda: client.get(https.url_for("/x")),
        lambda: client.stream_to(https.url_for("/x"), tmp_path / "p", allow_http_hosts=[]),
    ):
        with pytest.raises(BootError) as err:
            call()
        assert err.value.code is Code.INSECURE_URL_REFUSED
        assert "may not leave HTTPS" in str(err.value)
    assert httpserver.log == []  # the plain-HTTP server never saw a request


def test_redirect_hop_to_a_host_not_allowed_plain_http_is_refused(
    httpserver: HTTPServer,
) -> None:
    httpserver.expect_request("/x").respond_with_data(
        "", status=302, headers={"Location": "http://localhost:9/elsewhere"}
    )
    with pytest.raises(BootError) as err:
        Http(env={}).get(httpserver.url_for("/x"), allow_http_hosts=["127.0.0.1"])
    assert err.value.code is Code.INSECURE_URL_REFUSED


def test_the_node_system_store_is_the_default(
    https: HTTPServer, ca: trustme.CA, tmp_path: Path
) -> None:
    """The node's /etc/ssl/certs/ca-certificates.crt (where a custom CA or a TLS
    inspecting proxy's CA is installed) is what a run trusts; fetch.ca_file overrides."""
    root = tmp_path / "node"
    bundle = root / SYSTEM_CA_BUNDLES[0].lstrip("/")
    bundle.parent.mkdir(parents=True)
    ca.cert_pem.write_to_path(str(bundle))
    host = Host(root)
    path = trust_store(parse_config({}), host)
    assert path == str(bundle)
    https.expect_request("/i").respond_with_data("ok")
    assert Http(ca_file=path, env={}).get(https.url_for("/i")).body == b"ok"
    custom = trust_store(parse_config({"fetch": {"ca_file": "/etc/corp/ca.pem"}}), host)
    assert custom == str(root / "etc/corp/ca.pem")
    with pytest.raises(BootError) as err:
        Http(ca_file=custom, env={}).get(https.url_for("/i"))
    assert err.value.code is Code.TLS_VERIFY_FAILED and "does not exist" in str(err.value)
    assert trust_store(parse_config({}), Host(tmp_path / "bare")) == ""


def steady_body(conn: socket.socket, stop: threading.Event) -> None:
    """``x`` in 16 KiB writes, 2 ms apart (8 MB/s, 16 MiB in all): some of it is always
    in flight when the client's deadline falls."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (16 << 20))
    for _ in range(1 << 10):
        if stop.wait(0.002):
            return
        conn.sendall(b"x" * (16 << 10))


def test_https_download_cut_at_its_deadline_keeps_only_plaintext(
    raw_server: Callable[..., RawServer],
    reader_off_cpu: Callable[[float], None],
    ca: trustme.CA,
    ca_file: str,
    tmp_path: Path,
) -> None:
    """The deadline wakes the TLS reader at the socket, under the TLS layer: what it had
    received is decrypted and kept; nothing still in flight is read past TLS. (Shutting
    the ssl.SSLSocket itself drops its TLS state, and the records still queued were read
    as plain body: ciphertext in the part file, which the resume then extended.)"""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(ctx)
    srv = raw_server(steady_body, ctx)
    reader_off_cpu(1.2)
    part = tmp_path / "a.part"
    with pytest.raises(TransientError) as err:
        Http(ca_file=ca_file, env={}, read_timeout=30).stream_to(
            srv.url(), part, deadline=time.monotonic() + 1.5
        )
    assert err.value.code is Code.DOWNLOAD_TIMEOUT
    body = part.read_bytes()
    assert body and body == b"x" * len(body)  # a prefix of the body, for the resume
