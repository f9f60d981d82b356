"""Segmented downloads: one large artifact over several ranged connections.

The segmented half of ``bootfsm.host.http.Http`` (a mixin). The first unfinished
segment's ranged request probes the server; a ``206`` for the whole entity lets the
others open (at once, or with ``below_rate`` only once the first connection, which then
asks for every piece left in a row, is seen slower than that), each its own request with
its own watchdog, ``If-Range`` and a read cap at its range, writing at its offset in one
preallocated ``.part``. The sidecar records each segment's progress so a later attempt
asks only for what is missing; the sha256 covers the whole file on disk. A ``200``
(Range ignored) is read whole on one connection.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host import partfile as pf
from bootfsm.host import segment_meta as sm
from bootfsm.host.http_wire import (
    Bounds,
    Progress,
    Watch,
    check_url,
    receive,
)
from bootfsm.host.partfile import StreamResult, url_id
from bootfsm.host.segment_workers import (
    Plan,
    Segs,
    file_size,
    first_error,
    guarded_io,
    int_or_none,
    left_s,
    preallocate,
)

__all__ = ["Segmented"]


class _NoTotal(Exception):
    """An unsized probe's 206 gave no total to plan segments from."""


class Segmented:
    """Http's segmented-download methods (the client's own helpers come from Http)."""

    if TYPE_CHECKING:
        connect_timeout: float
        read_timeout: float

        def clone(self) -> Any: ...
        def close(self) -> None: ...
        def _sess(self) -> Any: ...
        def _kwargs(self, url: str, timeout: float | None) -> dict[str, Any]: ...
        def _within(self, url: str, seconds: float | None) -> float | None: ...
        def _classify(self, exc: BaseException, url: str, watch: Any = None) -> Any: ...
        def _check_status(self, status: int, headers: Mapping[str, str], url: str) -> None: ...

        stream_to: Callable[..., StreamResult]

    def stream_segmented(
        self,
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
        """Download ``url`` (``size`` B per its index) on up to ``segments`` connections.

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
        for _ in range(2):  # a resume answered with other bytes or entity starts over once
            try:
                res = self._segmented_once(
                    url,
                    part,
                    size,
                    Plan(
                        deadline,
                        progress,
                        cancel,
                        allow_http_hosts,
                        fsync,
                        {},
                        segments,
                        below_rate,
                    ),
                    min_size,
                )
            except _NoTotal:  # a 206 without a total: read it as an unsized file
                return self.stream_to(
                    url,
                    part,
                    deadline=deadline,
                    progress=progress,
                    cancel=cancel,
                    expect_size=None,
                    allow_http_hosts=allow_http_hosts,
                    fsync=fsync,
                )
            if res is not None:
                return res
        raise TransientError(  # pragma: no cover - the second try never resumes
            Code.DOWNLOAD_RETRIES_EXHAUSTED, f"{redact_url(url)} changed twice"
        )

    def _segmented_once(
        self, url: str, part: Path, indexed: int | None, plan: Plan, min_size: int = 0
    ) -> StreamResult | None:
        import requests  # noqa: TID251

        deadline, progress, cancel = plan.deadline, plan.progress, plan.cancel
        allow_http_hosts, fsync, count = plan.allow_http_hosts, plan.fsync, plan.connections

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
                return self._segments(None, part, segs, [], size, url, plan)
            start, end, done = segs[first]
            headers = {"Accept-Encoding": "identity", "Range": f"bytes={start + done}-{end - 1}"}
        left = self._within(url, left_s(url, deadline))
        if validator:
            headers["If-Range"] = validator
        session = self._sess()
        session.allow_http_hosts = allow_http_hosts
        with Watch(left) as watch:
            try:
                with session.get(url, headers=headers, stream=True, **self._kwargs(url, left)) as r:
                    if allow_http_hosts is not None:
                        check_url(r.url, allow_http_hosts)
                    self._check_status(r.status_code, r.headers, url)
                    if r.status_code == 200 and validator:
                        pf.discard(part)  # the entity changed: start over
                        return None
                    bounds = Bounds(deadline, watch, size)
                    if r.status_code != 206:  # Range ignored: this response is the download
                        return self._whole(r, part, size, url, bounds, progress, cancel, fsync)
                    got, total = pf.content_range(r.headers.get("Content-Range", ""))
                    if size is None:
                        if got != 0 or not total:  # no total to plan from: one connection
                            raise _NoTotal
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
                    plan = dataclasses.replace(plan, headers=dict(r.headers))
                    known: int = size
                    guarded_io(
                        part, lambda: sm.write_segments(meta_file, r.headers, known, url, segs)
                    )
                    ids = [first]
                    if indexed is None and not validator and plan.below_rate > 0:
                        ids = list(range(len(segs)))  # it was asked for all of them
                    return self._segments((r, watch), part, segs, ids, size, url, plan)
            except (requests.RequestException, OSError) as exc:
                raise self._classify(exc, url, watch) from exc

    def _whole(
        self,
        r: Any,
        part: Path,
        size: int | None,
        url: str,
        bounds: Bounds,
        progress: Progress | None,
        cancel: threading.Event | None,
        fsync: bool,
    ) -> StreamResult:
        """A 200 to the probe: the whole body on this connection, as ``stream_to`` reads it."""
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
        return receive(r, part, 0, total, url, bounds, progress, cancel, fsync=fsync)

    def _segments(
        self,
        probe: tuple[Any, Watch] | None,
        part: Path,
        segs: list[list[int]],
        ids: list[int],
        size: int,
        url: str,
        plan: Plan,
    ) -> StreamResult:
        """Receive every unfinished segment (``ids``, in a row, on ``probe``; the others on
        their own connections) into ``part``; hash the file in order as its prefix
        completes."""
        try:
            fd = os.open(part, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise pf.write_error(part, exc) from exc
        state = Segs(self, part, url, size, plan)
        try:
            guarded_io(part, lambda: preallocate(fd, size))
            fr = sm.Frontier(fd, segs, size)
            state.frontier, state.fd = fr, fd
            resumed = fr.done()
            state.resumed = resumed
            state.queue = [i for i, (s, e, d) in enumerate(segs) if i not in ids and s + d < e]
            state.queue.reverse()  # popped from the end: in file order
            if probe is None or plan.below_rate <= 0:
                state.open_others()
            if probe is not None:
                state.guard(lambda: state.pump(probe[0], ids, probe[1], True))
                probe[0].close()
            state.guard(lambda: state.pieces(self, first=True))
            for t in state.threads:
                t.join()
            if state.errors:
                fr.stop()
                if state.changed:
                    pf.discard(part)
                else:
                    state.save(force=True)
                raise first_error(state.errors)
            try:
                sha = fr.finish()
                if plan.fsync:
                    os.fsync(fd)
            except OSError as exc:
                raise pf.write_error(part, exc) from exc
            state.save(force=True)
            return StreamResult(size, sha, resumed, size - resumed)
        finally:
            state.halt()  # on any way out, no receiver writes to fd once it is closed
            for t in state.threads:
                t.join()
            if state.frontier is not None:
                state.frontier.stop()
            os.close(fd)


def _recorded_size(meta: Mapping[str, Any]) -> int | None:
    """The size a segmented sidecar recorded (from an earlier probe's total), else None."""
    size = meta.get("size")
    if isinstance(size, int) and not isinstance(size, bool) and size > 0 and meta.get("segments"):
        return size
    return None
