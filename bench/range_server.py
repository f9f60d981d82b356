"""A loopback file server for the fetch benchmark: single-range 206 (RFC 9110 14.2),
ETag/If-Range, and a pace per connection (how CDNs limit a client), with sendfile(2).

    python bench/range_server.py DOCROOT [--rate BYTES_PER_S] [--ignore-range]

prints its base URL on stdout, serves until stdin closes. ``--rate`` paces each
response body to that many bytes per second (per connection, not per server);
``--ignore-range`` answers every GET with the whole file and 200, as
``python -m http.server`` does.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_PACE_S = 0.02  # one sendfile slice per 20 ms at the paced rate


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        path = self.server.root / self.path.split("?", 1)[0].lstrip("/")
        try:
            fh = path.open("rb")
        except OSError:
            self.send_error(404)
            return
        with fh:
            st = os.fstat(fh.fileno())
            size, etag = st.st_size, f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
            start, end, code = 0, size - 1, 200
            m = _RANGE.fullmatch(self.headers.get("Range", ""))
            if_range = self.headers.get("If-Range")
            if m and not self.server.ignore_range and (not if_range or if_range == etag):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
                if start > end:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                code = 206
            self.send_response(code)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(end - start + 1))
            if not self.server.ignore_range:
                self.send_header("Accept-Ranges", "bytes")
            if code == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            self._send(fh, start, end - start + 1)

    def _send(self, fh: object, offset: int, length: int) -> None:
        rate = self.server.rate
        step = max(64 << 10, int(rate * _PACE_S)) if rate else 8 << 20
        began, sent = time.monotonic(), 0
        with contextlib.suppress(OSError):
            while sent < length:
                n = self.connection.sendfile(fh, offset + sent, min(step, length - sent))  # type: ignore[arg-type]
                if not n:
                    return
                sent += n
                if rate:
                    delay = sent / rate - (time.monotonic() - began)
                    if delay > 0:
                        time.sleep(delay)


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, rate: int, ignore_range: bool) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.root, self.rate, self.ignore_range = root, rate, ignore_range


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root", type=Path)
    ap.add_argument("--rate", type=int, default=0)
    ap.add_argument("--ignore-range", action="store_true")
    args = ap.parse_args()
    srv = Server(args.root, args.rate, args.ignore_range)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    print(f"http://127.0.0.1:{srv.server_address[1]}", flush=True)
    sys.stdin.read()
    srv.shutdown()


if __name__ == "__main__":
    main()
