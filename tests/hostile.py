"""A peer that never cooperates: a loopback HTTP(S) server that trickles forever.

Each connection is answered on its own thread: the request head is read, then the
status line and headers (``phase="headers"``: an endless header, one byte every
``every`` seconds) or the whole head and then the body one byte every ``every`` seconds
(``phase="body"``), or, as the server side of a TLS handshake, a record of 16 KiB one
byte at a time (``phase="handshake"``). The peer ignores the client's FIN: it keeps
writing until a write fails (the kernel's reset after the client closed), as a hostile
server does. It notes when it first saw the client hang up (a FIN or a reset, seen by
poll's POLLRDHUP without reading) and when its writes failed, so a test measures how long the client
kept the request alive from the peer's side. ``every = 0`` makes it an honest server
(the rest of the body at once, ``Connection: close``).

Bodies are real files (``content(path) -> bytes | None``) served with the headers a
resuming client relies on: Content-Length, a strong ETag, Last-Modified,
Accept-Ranges, and a single-range ``206`` with its ``Content-Range``. TLS uses a
certificate the test's CA issued (trustme), as the other hostile tests do.

Bounded: each connection stops at the test's teardown (``close``) or after
``cap_s``; nothing here is sent anywhere but 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Peer", "Trickler"]

ETAG = '"hostile-1"'
MODIFIED = "Mon, 01 Jun 2026 00:00:00 GMT"
_RANGE = re.compile(rb"^range:\s*bytes=(\d+)-(\d*)\s*$", re.I | re.M)


@dataclass
class Peer:
    """One connection as the peer saw it (monotonic times)."""

    opened: float
    path: str = ""
    range_start: int | None = None
    sent: int = 0  # body (or endless header) bytes written
    hangup: float | None = None  # first FIN or reset of the client seen
    failed: float | None = None  # the write that failed: the connection is gone
    done: threading.Event = field(default_factory=threading.Event)


class Trickler:
    """The hostile peer; ``url(path)`` names it, ``peers`` lists its connections."""

    def __init__(
        self,
        content: Callable[[str], bytes | None],
        *,
        phase: str = "body",
        every: float = 1.0,
        tls: ssl.SSLContext | None = None,
        cap_s: float = 120.0,
    ) -> None:
        assert phase in ("body", "headers", "handshake")
        self.content = content
        self.phase = phase
        self.every = every
        self.tls = tls
        self.cap_s = cap_s
        self.peers: list[Peer] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def url(self, path: str = "/x") -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def close(self) -> None:
        self._stop.set()
        for t in list(self._threads):
            t.join(5)
        self._sock.close()

    def wait_gone(self, timeout: float = 10.0) -> list[Peer]:
        """Every connection so far, once each has seen its client hang up (or timed out)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                peers = list(self.peers)
            if peers and all(p.hangup is not None or p.failed is not None for p in peers):
                return peers
            time.sleep(0.05)
        with self._lock:
            return list(self.peers)

    # -- the server --------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            peer = Peer(time.monotonic())
            with self._lock:
                self.peers.append(peer)
            t = threading.Thread(target=self._serve, args=(conn, peer), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, raw: socket.socket, peer: Peer) -> None:
        conn: socket.socket = raw
        try:
            raw.settimeout(10)
            if self.phase == "handshake":  # a TLS record header, then its body forever
                self._trickle(raw, raw, peer, b"\x16\x03\x03\x40\x00" + b"\x02" * 16384)
                return
            if self.tls is not None:
                conn = raw = self.tls.wrap_socket(raw, server_side=True)  # raw is detached
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            peer.path = head.split(b" ", 2)[1].decode("latin-1") if b" " in head else "/"
            m = _RANGE.search(head)
            if m:
                peer.range_start = int(m.group(1))
            self._answer(conn, raw, peer, m)
        except OSError:
            peer.failed = peer.failed or time.monotonic()
        finally:
            peer.done.set()
            with contextlib.suppress(OSError):
                conn.close()

    def _answer(self, conn: socket.socket, raw: socket.socket, peer: Peer, m: Any) -> None:
        if self.phase == "headers":
            conn.sendall(b"HTTP/1.1 200 OK\r\n")
            self._trickle(conn, raw, peer, None)
            return
        body = self.content(peer.path)
        if body is None:
            conn.sendall(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            return
        start, status, extra, size = 0, b"200 OK", b"", len(body)
        if m is not None and int(m.group(1)) < size:
            start = int(m.group(1))
            end = min(int(m.group(2)), len(body) - 1) if m.group(2) else len(body) - 1
            body = body[: end + 1]
            status = b"206 Partial Content"
            extra = b"Content-Range: bytes %d-%d/%d\r\n" % (
                start,
                end,
                len(self.content(peer.path) or b""),
            )
        conn.sendall(
            b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % (len(body) - start)
            + extra
            + f"ETag: {ETAG}\r\nLast-Modified: {MODIFIED}\r\nAccept-Ranges: bytes\r\n".encode()
            + b"Connection: close\r\n\r\n"
        )  # fmt: skip
        self._trickle(conn, raw, peer, body[start:])

    def _trickle(
        self, conn: socket.socket, raw: socket.socket, peer: Peer, data: bytes | None
    ) -> None:
        """One byte every ``every`` s (of ``data``, else an endless header line) until a
        write fails; the client's FIN changes nothing but the note of when it came."""
        end = time.monotonic() + self.cap_s
        if self.every <= 0 and data is not None:
            conn.sendall(data)
            peer.sent += len(data)
            return
        i = 0
        filler = b"X-Pad: " + b"a" * 60000
        while not self._stop.is_set() and time.monotonic() < end:
            self._wait(raw, peer, self.every)
            if data is not None and i >= len(data):
                continue  # nothing left to send: keep the connection, as a stalled peer does
            byte = (
                data[i : i + 1]
                if data is not None
                else filler[i % len(filler) : i % len(filler) + 1]
            )
            try:
                conn.sendall(byte)
            except OSError:
                peer.failed = time.monotonic()
                return
            i += 1
            peer.sent += 1

    def _wait(self, raw: socket.socket, peer: Peer, seconds: float) -> None:
        """Sleep ``seconds``, noting the client's FIN or reset the moment it comes (poll's
        POLLRDHUP: a FIN even behind bytes the client sent, such as a TLS alert)."""
        end = time.monotonic() + seconds
        poll = select.poll()
        poll.register(raw, select.POLLRDHUP | select.POLLHUP | select.POLLERR)
        while (left := end - time.monotonic()) > 0 and not self._stop.is_set():
            if peer.hangup is not None:
                self._stop.wait(left)
                return
            if poll.poll(min(left, 0.05) * 1000):
                peer.hangup = time.monotonic()
