"""The transfer of a segmented download once its probe has planned it.

``SegmentTransfer`` receives the unfinished segments of one preallocated ``.part``, each
request watched, with ``If-Range`` and a read cap at its range, written by ``pwrite``.
With ``below_rate`` the other connections open only when the first is slower than that.
The sidecar records progress every ``SAVE_EVERY_S``. ``segments`` probes and plans."""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host import partfile as pf
from bootfsm.host import segment_meta as sm
from bootfsm.host.http import Http, left_s
from bootfsm.host.http_errors import check_status
from bootfsm.host.http_wire import (
    Bounds,
    Cancelled,
    Progress,
    Watch,
    read_body,
    read_errors,
    read_failed,
    too_slow,
)
from bootfsm.host.partfile import CHUNK, StreamResult

__all__ = ["SAVE_EVERY_S", "Plan", "SegmentTransfer", "ranged_get"]


@dataclass(frozen=True)
class Plan:
    """What bounds every segment of one segmented download."""

    deadline: float | None
    progress: Progress | None
    cancel: threading.Event | None
    allow_http_hosts: Sequence[str] | None
    fsync: bool
    connections: int
    below_rate: int = 0  # B/s: open the others only while one connection is slower; 0: at once


class Aborted(Exception):
    """Another segment failed: this one stops (its bytes so far are kept)."""


SAVE_EVERY_S = 0.5
PACE_S = 0.25  # how long the first connection is watched at a time against ``below_rate``


@contextmanager
def ranged_get(
    client: Http, url: str, plan: Plan, want: str, validator: str | None
) -> Iterator[tuple[Any, Watch]]:
    """A watched GET of ``want`` (a Range value; ``If-Range`` when ``validator``), its
    status checked (``check_status``); the response and its watch."""
    headers = {"Accept-Encoding": "identity", "Range": want}
    if validator:
        headers["If-Range"] = validator
    limit = left_s(url, plan.deadline)
    with client.request(url, headers, limit=limit, allow_http_hosts=plan.allow_http_hosts) as (
        r,
        watch,
    ):
        check_status(r.status_code, r.headers, url)
        yield r, watch


class SegmentTransfer:
    """One attempt's segments of ``size`` B of the entity the probe answered with
    (``entity``, its headers: every segment must match), through ``client``: their
    receivers, their errors and the sidecar."""

    def __init__(
        self, client: Http, url: str, part: Path, plan: Plan, entity: Mapping[str, str], size: int
    ) -> None:
        self.client = client
        self.part = part
        self.url = url
        self.plan = plan
        self.entity = entity
        self.size = size
        self.frontier: sm.Frontier | None = None
        self.fd = -1
        self.errors: list[BaseException] = []
        self.queue: list[int] = []  # pieces no connection has taken yet, last = next
        self.changed = False  # a segment saw another entity: the part is discarded
        self._abort = threading.Event()  # take no new piece
        self._halt = threading.Event()  # stop mid-piece too (permanent error, cancel)
        self._lock = threading.Lock()
        self._saved = time.monotonic()
        self.threads: list[threading.Thread] = []  # the other connections, once opened
        self._opened = False
        self._held: list[int] = []  # pieces the first connection asked for, not begun yet
        self._window = (time.monotonic(), 0)  # (since, bytes) the first connection's pace
        self._gap_from: float | None = None  # when its last response ended (``pump``)

    def run(
        self, probe: tuple[Any, Watch] | None, segs: list[list[int]], ids: list[int]
    ) -> StreamResult:
        """Receive every unfinished segment (``ids``, in a row, on ``probe``; the others on
        their own connections) into ``part``; hash the file in order as its prefix
        completes."""
        part, plan, size = self.part, self.plan, self.size
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW
        fd = pf.guarded_io(part, lambda: os.open(part, flags, 0o600))
        try:
            pf.guarded_io(part, lambda: preallocate(fd, size))
            fr = sm.Frontier(fd, segs, size)
            self.frontier, self.fd = fr, fd
            resumed = fr.done()
            self.queue = [i for i, (s, e, d) in enumerate(segs) if i not in ids and s + d < e]
            self.queue.reverse()  # popped from the end: in file order
            if probe is None or plan.below_rate <= 0:
                self.open_others()
            if probe is not None:
                self.guard(lambda: self.pump(probe[0], ids, probe[1], True))
                probe[0].close()
            self.guard(lambda: self.pieces(self.client, first=True))
            for t in self.threads:
                t.join()
            if self.errors:
                fr.stop()
                if self.changed:
                    pf.discard(part)
                else:
                    self.save(force=True)
                raise first_error(self.errors)
            sha = pf.guarded_io(part, fr.finish)
            if plan.fsync:
                pf.guarded_io(part, lambda: os.fsync(fd))
            self.save(force=True)
            return StreamResult(size, sha, resumed, size - resumed)
        finally:
            self.halt()  # on any way out, no receiver writes to fd once it is closed
            for t in self.threads:
                t.join()
            if self.frontier is not None:
                self.frontier.stop()
            os.close(fd)

    def open_others(self) -> None:
        """Start the other connections (once), each taking pieces from the queue; the
        pieces the first connection asked for but has not begun go back to it first."""
        with self._lock:
            if self._opened:
                return
            self._opened = True
            self.queue.extend(reversed(self._held))  # popped from the end: in file order
            self._held.clear()
            count = min(self.plan.connections - 1, len(self.queue))
        for _ in range(count):
            t = threading.Thread(target=self.worker, name="bootfsm-seg", daemon=True)
            t.start()
            self.threads.append(t)

    def pace(self, n: int) -> None:
        """On the first connection, after each chunk: open the others once a window of
        ``PACE_S`` received less than ``below_rate`` B/s. A mirror that one connection
        already drains fast gets no more (they would only cost CPU and disk seeks)."""
        since, got = self._window
        now, got = time.monotonic(), got + n
        if now - since < PACE_S:
            self._window = (since, got)
            return
        if got < self.plan.below_rate * (now - since):
            self.open_others()
        self._window = (now, 0)

    def save(self, *, force: bool = False) -> None:
        """Write the sidecar with every segment's progress (at most every 0.5 s)."""
        if self.frontier is None:
            return
        with self._lock:
            now = time.monotonic()
            if not force and now - self._saved < SAVE_EVERY_S:
                return
            self._saved = now
            segs = self.frontier.snapshot()
            sm.write_segments(self.part, self.entity, self.size, self.url, segs)

    def halt(self) -> None:
        """Stop every receiver at its next chunk (no-op once they are done)."""
        self._abort.set()
        self._halt.set()

    def guard(self, fn: Callable[[], None]) -> None:
        """Run segments; after an error no piece is taken (a transient error lets the
        others finish the piece they hold: its bytes are already on the way)."""
        try:
            fn()
        except Aborted:
            pass
        except BaseException as exc:  # re-raised on the calling thread
            with self._lock:
                self.errors.append(exc)
            self._abort.set()
            if not isinstance(exc, TransientError) or self.changed:
                self._halt.set()  # a transient one lets the others finish their piece

    def worker(self) -> None:
        client = self.client.clone()
        try:
            self.guard(lambda: self.pieces(client))
        finally:
            client.close()

    def pieces(self, client: Http, *, first: bool = False) -> None:
        """Take the next piece in file order and fetch it, until none is left. The first
        connection (``first``), while it is alone, asks for every piece left in a row in
        one request, paces itself against ``below_rate`` and hands the pieces it has not
        started back once the others open."""
        assert self.frontier is not None
        segs = self.frontier.segments
        while not self._abort.is_set():
            with self._lock:
                if not self.queue:
                    return
                ids = [self.queue.pop()]
                while (
                    first
                    and not self._opened
                    and self.queue
                    and self.queue[-1] == ids[-1] + 1
                    and segs[self.queue[-1]][2] == 0
                ):
                    ids.append(self.queue.pop())
            self._request(client, ids, first)

    def _request(self, client: Http, ids: list[int], first: bool = False) -> None:
        assert self.frontier is not None
        start, _, done = self.frontier.segments[ids[0]]
        end = self.frontier.segments[ids[-1]][1]
        url, plan = self.url, self.plan
        entity = {
            "etag": self.entity.get("ETag"),
            "last_modified": self.entity.get("Last-Modified"),
        }
        validator = pf.if_range(entity)
        want = f"bytes={start + done}-{end - 1}"
        with ranged_get(client, url, plan, want, validator) as (r, watch):
            got, total = pf.content_range(r.headers.get("Content-Range", ""))
            same = not validator or pf.same_entity(entity, r.headers)
            if r.status_code != 206 or got != start + done or total != self.size or not same:
                self.changed = True
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"{redact_url(url)} changed during a segmented download "
                    f"(HTTP {r.status_code} for bytes {start + done}-{end - 1}); "
                    "partial file discarded",
                )
            self.pump(r, ids, watch, first)

    def pump(self, r: Any, ids: list[int], watch: Watch, first: bool = False) -> None:
        """Read the body of the pieces ``ids`` (in a row) into their ranges of the file,
        never past the last one's end. On the first connection (``first``) it is paced
        against ``below_rate``; once the others are open, the pieces not started yet go
        back to the queue and the response is dropped unread."""
        fp = getattr(r.raw, "_fp", None)
        held = list(ids[1:])  # only the first connection asks for more than one piece
        if first:
            with self._lock:
                self._held = held
            self._resume_pace()
        i: int | None = ids[0]
        while i is not None:
            self._piece(r, fp, i, watch, first)
            with self._lock:  # open_others may have taken the rest back meanwhile
                i = held.pop(0) if held else None
        if first:
            self._gap_from = time.monotonic()
        if fp is not None and fp.isclosed():  # body read to its end: keep the connection
            r.raw.release_conn()

    def _resume_pace(self) -> None:
        """The first connection's pace counts only while it receives: from its first
        response's first byte, with the time between two of its responses left out
        (preallocating the file, asking for the next pieces: not the mirror being slow)."""
        now = time.monotonic()
        since, got = self._window
        self._window = (now, 0) if self._gap_from is None else (since + now - self._gap_from, got)

    def _piece(self, r: Any, fp: Any, i: int, watch: Watch, first: bool) -> None:
        fr, plan, url = self.frontier, self.plan, self.url
        assert fr is not None
        start, end, _ = fr.segments[i]
        bounds = Bounds(plan.deadline, watch, None)
        read_into = getattr(fp, "readinto", None)
        buf = bytearray(CHUNK)
        while (pos := start + fr.segments[i][2]) < end:
            if plan.cancel is not None and plan.cancel.is_set():
                raise Cancelled(f"download of {redact_url(url)} cancelled")
            if self._halt.is_set():
                raise Aborted
            bounds.check(url, fr.done())
            try:
                n = read_body(r, read_into, buf, min(len(buf), end - pos), decode=False)
            except read_errors() as exc:
                raise read_failed(url, watch, exc, f"at byte {pos}") from exc
            if not n:
                if watch.fired:
                    raise too_slow(url, watch)
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"short body from {redact_url(url)}: bytes {start}-{end - 1} stopped at {pos}",
                )
            _pwrite_all(self.part, self.fd, memoryview(buf)[:n], pos)
            fr.advance(i, n)
            if first and not self._opened:
                self.pace(n)
            if plan.progress is not None:
                plan.progress(fr.done(), self.size)
            self.save()


def _pwrite_all(part: Path, fd: int, data: memoryview, pos: int) -> None:
    written = 0
    try:
        while written < len(data):
            written += os.pwrite(fd, data[written:], pos + written)
    except OSError as exc:
        raise pf.write_error(part, exc) from exc


def preallocate(fd: int, size: int) -> None:
    """Reserve the file's blocks (a full disk fails now, not mid-segment)."""
    if os.fstat(fd).st_size == size:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)


def first_error(errors: list[BaseException]) -> BaseException:
    """The error to raise for a failed segmented download: a permanent one first."""
    permanent = [e for e in errors if isinstance(e, BootError)]
    other = [e for e in errors if not isinstance(e, Cancelled)]
    return (permanent or other or errors)[0]
