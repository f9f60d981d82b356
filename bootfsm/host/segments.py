"""Segmented downloads: one large artifact over several ranged connections.

``stream_segmented`` downloads through an ``Http`` client (which knows nothing of
segments). ``SegmentedDownload`` is one attempt, made through that client (each other
connection through a clone of it) and its ``request``: every request has its own
watchdog, ``If-Range`` and a read cap at its range, and writes at its offset
(``pwrite``) in one preallocated ``.part``. The first unfinished segment's ranged
request probes the server; a ``206`` for the whole entity lets the others open (at
once, or with ``below_rate`` only once the first connection, which then asks for every
piece left in a row, is seen slower than that over a ``PACE_S`` window; it then hands
back what it has not begun). The sidecar records each segment's progress (every
``SAVE_EVERY_S``) so a later attempt asks only for what is missing; the sha256 covers
the whole file on disk. A ``200`` (Range ignored) is read whole on one connection.
"""

from __future__ import annotations

import errno
import http.client
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
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
from bootfsm.host.http_wire import Bounds, Cancelled, Progress, Watch, receive, short, too_slow
from bootfsm.host.partfile import CHUNK, StreamResult, url_id

__all__ = ["SAVE_EVERY_S", "NoTotal", "Plan", "SegmentedDownload", "stream_segmented"]


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


class NoTotal(Exception):
    """An unsized probe's 206 gave no total to plan segments from."""


class Aborted(Exception):
    """Another segment failed: this one stops (its bytes so far are kept)."""


SAVE_EVERY_S = 0.5
PACE_S = 0.25  # how long the first connection is watched at a time against ``below_rate``


def stream_segmented(
    client: Http,
    url: str,
    part: Path,
    *,
    size: int | None,
    segments: int,
    deadline: float | None = None,
    progress: Progress | None = None,
    cancel: threading.Event | None = None,
    allow_http_hosts: Sequence[str] | None = None,
    fsync: bool = False,
    below_rate: int = 0,
    min_size: int = 0,
) -> StreamResult:
    """Download ``url`` (``size`` B per its index) on up to ``segments`` connections,
    all through ``client`` (the others on clones of it).

    The first unfinished segment's ranged request is the probe: a ``206`` for the
    whole entity of ``size`` B starts the other segments, each its own request (its
    own watchdog, ``If-Range`` with the probe's validator, reads capped at its
    range) writing at its offset in one preallocated ``part``; the sidecar records
    each segment's progress, so a later attempt asks only for the missing ranges. A
    ``200`` to the probe (Range ignored) is read whole on that one connection, as
    ``stream_to`` would; a ``200`` to a resume (the entity changed) starts over.
    With ``below_rate`` (B/s) the other connections open only once the first is
    seen receiving less than that (until then it takes the pieces in turn); 0 opens
    them at once. The sha256 covers the whole file as it is on disk. Errors are
    those of ``stream_to``; a failed or cancelled segment stops the others and keeps
    the rest.

    ``size`` None (an artifact whose index gives no size, such as the driver
    runfile): the probe asks for ``bytes=0-`` and the segments are planned from its
    ``Content-Range`` total (a file under ``min_size`` is one segment on that one
    connection; the total must fit on the disk before anything is reserved); a
    resume takes the size its sidecar recorded. A 206 that gives no total is read
    as ``stream_to`` reads an unsized file.
    """
    plan = Plan(deadline, progress, cancel, allow_http_hosts, fsync, segments, below_rate)
    for _ in range(2):  # a resume answered with other bytes or entity starts over once
        try:
            res = SegmentedDownload(client, url, part, plan).run(size, min_size)
        except NoTotal:  # a 206 without a total: read it as an unsized file
            return client.stream_to(
                url,
                part,
                deadline=deadline,
                progress=progress,
                cancel=cancel,
                allow_http_hosts=allow_http_hosts,
                fsync=fsync,
            )
        if res is not None:
            return res
    raise TransientError(  # pragma: no cover - the second try never resumes
        Code.DOWNLOAD_RETRIES_EXHAUSTED, f"{redact_url(url)} changed twice"
    )


class SegmentedDownload:
    """One attempt at one segmented download through ``client``: the probe, the
    segments' receivers, their errors and the sidecar."""

    def __init__(self, client: Http, url: str, part: Path, plan: Plan) -> None:
        self.client = client
        self.part = part
        self.url = url
        self.plan = plan
        self.entity: Mapping[str, str] = {}  # the probe's headers: every segment must match
        self.size = 0
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

    def run(self, indexed: int | None, min_size: int = 0) -> StreamResult | None:
        """Download the file (``indexed`` B per its index, None: unknown); None when the
        entity changed under a resume (the part is gone: the caller starts over once).
        Raises ``NoTotal`` for an unsized file whose 206 gives no total."""
        url, part, plan = self.url, self.part, self.plan
        deadline, count = plan.deadline, plan.connections

        meta_file = pf.meta_path(part)
        meta = pf.read_meta(meta_file) if part.exists() else {}
        size = indexed if indexed is not None else _recorded_size(meta)
        segs = sm.resume_segments(meta, size) if meta and size is not None else None
        validator = pf.if_range(meta) if segs is not None else None
        if size is not None and (
            segs is None or validator is None or meta.get("source") != url_id(url)
        ):
            segs, validator = sm.segment_plan(size, count), None
        if size is None or segs is None:  # no size known: the probe asks for all of it
            size, segs, first = None, [], 0
            headers = {"Accept-Encoding": "identity", "Range": "bytes=0-"}
        else:
            first = next((i for i, (s, e, d) in enumerate(segs) if s + d < e), -1)
            if first < 0:  # every segment on disk: hash it as it is
                return self._segments(None, segs, [], size)
            start, end, done = segs[first]
            headers = {"Accept-Encoding": "identity", "Range": f"bytes={start + done}-{end - 1}"}
        if validator:
            headers["If-Range"] = validator
        with self.client.request(
            url, headers, limit=left_s(url, deadline), allow_http_hosts=plan.allow_http_hosts
        ) as (r, watch):
            check_status(r.status_code, r.headers, url)
            if r.status_code == 200 and validator:
                pf.discard(part)  # the entity changed: start over
                return None
            bounds = Bounds(deadline, watch, size)
            if r.status_code != 206:  # Range ignored: this response is the download
                return self._whole(r, size, bounds)
            got, total = pf.content_range(r.headers.get("Content-Range", ""))
            if size is None:
                if got != 0 or not total:  # no total to plan from: one connection
                    raise NoTotal
                size = total
                segs = sm.segment_plan(size, count) if size >= min_size else [[0, size, 0]]
                start, end, done = segs[0]
            elif total != size:
                if indexed is None or validator:  # a resume that does not continue
                    pf.discard(part)  # the bytes on disk: start over, from byte 0
                    return None
                raise BootError(
                    Code.CHECKSUM_MISMATCH,
                    f"{redact_url(url)} is {total} B but its index says {size} B",
                    wrong_size=True,
                )
            if got != start + done or (validator and not pf.same_entity(meta, r.headers)):
                pf.discard(part)
                if validator:  # a resume answered with other bytes: start over
                    return None
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"cannot resume {redact_url(url)} in segments: the server "
                    "answered another range or entity; partial file discarded",
                )
            if not validator:
                pf.check_space(part, size, freed=file_size(part))
                pf.discard(part)
            self.entity = dict(r.headers)
            known: int = size
            guarded_io(part, lambda: sm.write_segments(meta_file, r.headers, known, url, segs))
            ids = [first]
            if indexed is None and not validator and plan.below_rate > 0:
                ids = list(range(len(segs)))  # it was asked for all of them
            return self._segments((r, watch), segs, ids, size)

    def _whole(self, r: Any, size: int | None, bounds: Bounds) -> StreamResult:
        """A 200 to the probe: the whole body on this connection, as ``stream_to`` reads it."""
        part, url, plan = self.part, self.url, self.plan
        total = int_or_none(r.headers.get("Content-Length"))
        if total is not None and size is not None and total != size:
            raise BootError(
                Code.CHECKSUM_MISMATCH,
                f"{redact_url(url)} is {total} B but its index says {size} B",
                wrong_size=True,
            )
        pf.check_space(part, size if size is not None else total or 0, freed=file_size(part))
        pf.discard(part)
        pf.write_meta(pf.meta_path(part), r.headers, total, url)
        return receive(r, part, 0, total, url, bounds, plan.progress, plan.cancel, fsync=plan.fsync)

    def _segments(
        self, probe: tuple[Any, Watch] | None, segs: list[list[int]], ids: list[int], size: int
    ) -> StreamResult:
        """Receive every unfinished segment (``ids``, in a row, on ``probe``; the others on
        their own connections) into ``part``; hash the file in order as its prefix
        completes."""
        part, plan = self.part, self.plan
        self.size = size
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise pf.write_error(part, exc) from exc
        try:
            guarded_io(part, lambda: preallocate(fd, size))
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
            try:
                sha = fr.finish()
                if plan.fsync:
                    os.fsync(fd)
            except OSError as exc:
                raise pf.write_error(part, exc) from exc
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
            guarded_io(
                self.part,
                lambda: sm.write_segments(
                    pf.meta_path(self.part), self.entity, self.size, self.url, segs
                ),
            )

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
        headers = {"Accept-Encoding": "identity", "Range": f"bytes={start + done}-{end - 1}"}
        entity = {
            "etag": self.entity.get("ETag"),
            "last_modified": self.entity.get("Last-Modified"),
        }
        validator = pf.if_range(entity)
        if validator:
            headers["If-Range"] = validator
        with client.request(
            url, headers, limit=left_s(url, plan.deadline), allow_http_hosts=plan.allow_http_hosts
        ) as (r, watch):
            check_status(r.status_code, r.headers, url)
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
        import urllib3

        read_errors = (http.client.HTTPException, OSError, urllib3.exceptions.HTTPError)
        fr, plan, url = self.frontier, self.plan, self.url
        assert fr is not None
        start, end, _ = fr.segments[i]
        read_into = getattr(fp, "readinto", None)
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while (pos := start + fr.segments[i][2]) < end:
            if plan.cancel is not None and plan.cancel.is_set():
                raise Cancelled(f"download of {redact_url(url)} cancelled")
            if self._halt.is_set():
                raise Aborted
            if watch.fired or (plan.deadline is not None and time.monotonic() > plan.deadline):
                raise TransientError(
                    Code.DOWNLOAD_TIMEOUT,
                    f"{redact_url(url)} did not finish within its time limit "
                    f"({fr.done()} B so far)",
                )
            cap = min(len(buf), end - pos)
            try:
                if read_into is not None:
                    n = int(read_into(view[:cap]))
                else:
                    data = r.raw.read(cap, decode_content=False)
                    n = len(data)
                    buf[:n] = data
            except read_errors as exc:
                if watch.fired:
                    raise too_slow(url, watch) from exc
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"{type(exc).__name__} reading {redact_url(url)} at byte {pos}: {short(exc)}",
                ) from exc
            if not n:
                if watch.fired:
                    raise too_slow(url, watch)
                raise TransientError(
                    Code.DOWNLOAD_RETRIES_EXHAUSTED,
                    f"short body from {redact_url(url)}: bytes {start}-{end - 1} stopped at {pos}",
                )
            written = 0
            while written < n:
                try:
                    written += os.pwrite(self.fd, view[written:n], pos + written)
                except OSError as exc:
                    raise pf.write_error(self.part, exc) from exc
            fr.advance(i, n)
            if first and not self._opened:
                self.pace(n)
            if plan.progress is not None:
                plan.progress(fr.done(), self.size)
            self.save()


def file_size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def guarded_io(part: Path, fn: Callable[[], None]) -> None:
    try:
        fn()
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
    for e in errors:
        if isinstance(e, BootError):
            return e
    for e in errors:
        if not isinstance(e, Cancelled):
            return e
    return errors[0]


def _recorded_size(meta: Mapping[str, Any]) -> int | None:
    """The size a segmented sidecar recorded (from an earlier probe's total), else None."""
    size = meta.get("size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0 and meta.get("segments"):
        return size
    return None
