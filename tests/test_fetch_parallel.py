"""The fetcher: bounded parallel downloads, clean cancellation, mirror failover."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.fetch.artifacts import Artifact
from bootfsm.fetch.fetcher import Fetched, Fetcher, Job
from bootfsm.host.http import Http
from bootfsm.sim.mirror import Corrupt, DropMidBody, Mirror, NotFound, Status, Throttle

FILES = {f"a{i}.bin": os.urandom((1 << 20) + i * 4096) for i in range(3)}


def _art(name: str, bases: list[str], data: bytes | None = None) -> Artifact:
    data = FILES[name] if data is None else data
    urls = [f"{b}/{name}" for b in bases]
    sha = hashlib.sha256(data).hexdigest()
    return Artifact(name, "toolkit", urls[0], sha, len(data), name, tuple(urls[1:]))


class Run:
    """A Fetcher over a cache dir that records events and finished downloads."""

    def __init__(self, cache: Path, parallel: int = 4) -> None:
        self.cache = cache
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.done: list[Fetched] = []
        self.fetcher = Fetcher(
            Http(read_timeout=5),
            parallel=parallel,
            allow_http_hosts=["127.0.0.1", "localhost"],
            artifact_timeout=60,
            remaining=lambda: 60.0,
            emit=lambda event, **f: self.events.append((event, f)),
        )

    def __call__(self, *arts: Artifact) -> list[Fetched]:
        jobs = [Job(a, self.cache / f"{a.filename}.part") for a in arts]

        def finish(f: Fetched) -> None:
            f.job.part.rename(f.job.part.with_suffix(""))
            self.done.append(f)

        self.fetcher.run(jobs, finish)
        return self.done


@pytest.fixture
def mirrors(tmp_path: Path) -> Iterator[tuple[Mirror, Mirror]]:
    docs = []
    for name in ("a", "b"):
        d = tmp_path / name
        d.mkdir()
        for fn, data in FILES.items():
            (d / fn).write_bytes(data)
        docs.append(d)
    with Mirror(docs[0]) as a, Mirror(docs[1]) as b:
        yield a, b


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    d = tmp_path / "cache"
    d.mkdir()
    return d


def test_downloads_run_concurrently_up_to_the_limit(tmp_path: Path, cache: Path) -> None:
    """Each response waits until all three requests have arrived: only parallel passes."""
    barrier = threading.Barrier(3, timeout=10)
    server = HTTPServer(threaded=True)
    server.start()
    try:
        for name, data in FILES.items():

            def handler(request: Request, data: bytes = data) -> Response:
                barrier.wait()
                return Response(data, headers={"ETag": '"x"'})

            server.expect_request(f"/{name}").respond_with_handler(handler)
        base = server.url_for("").rstrip("/")
        got = Run(cache, parallel=3)(*(_art(n, [base]) for n in FILES))
    finally:
        server.clear()
        server.stop()
    assert sorted(f.job.artifact.name for f in got) == sorted(FILES)
    for name, data in FILES.items():
        assert (cache / name).read_bytes() == data


def test_one_failure_cancels_the_rest_and_leaves_only_part_files(
    mirrors: tuple[Mirror, Mirror], cache: Path
) -> None:
    a, _ = mirrors
    a.add_fault("a0.bin", Throttle(bytes_per_second=256 << 10))  # ~4 s if left alone
    a.add_fault("a1.bin", Throttle(bytes_per_second=256 << 10))
    a.add_fault("a2.bin", Throttle(bytes_per_second=4 << 20))  # fails after ~0.25 s:
    bad = _art("a2.bin", [a.url], data=b"not what the mirror serves")  # its sha256 differs
    bad = Artifact(bad.name, bad.role, bad.url, bad.sha256, None, bad.filename)
    run = Run(cache)
    with pytest.raises(BootError) as info:
        run(_art("a0.bin", [a.url]), _art("a1.bin", [a.url]), bad)
    assert info.value.code is Code.CHECKSUM_MISMATCH
    assert run.done == []
    names = sorted(p.name for p in cache.iterdir())
    assert names == ["a0.bin.part", "a0.bin.part.meta", "a1.bin.part", "a1.bin.part.meta"]
    for n in ("a0.bin", "a1.bin"):
        assert 0 < (cache / f"{n}.part").stat().st_size < len(FILES[n])  # stopped midway


@pytest.mark.parametrize("fault", [Status(503, times=5), NotFound()], ids=["503", "404"])
def test_next_mirror_serves_when_one_fails(
    mirrors: tuple[Mirror, Mirror], cache: Path, fault: Any
) -> None:
    a, b = mirrors
    a.add_fault("a0.bin", fault)
    run = Run(cache)
    [got] = run(_art("a0.bin", [a.url, b.url]))
    assert got.mirror == 1 and got.url.startswith(b.url) and got.attempts == 2
    assert (cache / "a0.bin").read_bytes() == FILES["a0.bin"]
    [(event, fields)] = run.events
    assert event == "artifact.mirror_failed" and fields["mirror"] == 0


def test_corrupt_mirror_is_skipped_for_one_that_verifies(
    mirrors: tuple[Mirror, Mirror], cache: Path
) -> None:
    a, b = mirrors
    a.add_fault("a0.bin", Corrupt())
    [got] = Run(cache)(_art("a0.bin", [a.url, b.url]))
    assert got.mirror == 1 and (cache / "a0.bin").read_bytes() == FILES["a0.bin"]


def test_every_mirror_busy_is_transient_with_the_shortest_retry_after(
    mirrors: tuple[Mirror, Mirror], cache: Path
) -> None:
    a, b = mirrors
    a.add_fault("a0.bin", Status(429, times=1, retry_after=9))
    b.add_fault("a0.bin", Status(503, times=1, retry_after=4))
    with pytest.raises(TransientError) as info:
        Run(cache)(_art("a0.bin", [a.url, b.url]))
    assert info.value.retry_after == 4.0 and "every mirror failed" in info.value.message


def test_every_mirror_missing_is_permanent(mirrors: tuple[Mirror, Mirror], cache: Path) -> None:
    a, b = mirrors
    a.add_fault("a0.bin", NotFound())
    b.add_fault("a0.bin", NotFound())
    with pytest.raises(BootError) as info:
        Run(cache)(_art("a0.bin", [a.url, b.url]))
    assert info.value.code is Code.ARTIFACT_NOT_FOUND and "no mirror serves it" in str(info.value)


def test_a_broken_transfer_resumes_from_its_own_mirror(
    mirrors: tuple[Mirror, Mirror], cache: Path
) -> None:
    a, b = mirrors
    a.add_fault("a0.bin", DropMidBody(times=1, fraction=0.5))
    run = Run(cache)
    with pytest.raises(TransientError):  # bytes came: no failover, resume next attempt
        run(_art("a0.bin", [a.url, b.url]))
    assert b.requests("a0.bin") == 0
    [got] = run(_art("a0.bin", [b.url, a.url]))  # even with the mirrors listed the other way
    assert got.url.startswith(a.url) and got.result.resumed_bytes > 0
    assert got.result.resumed_bytes + got.result.transferred == len(FILES["a0.bin"])
    assert b.requests("a0.bin") == 0 and a.bytes_sent_total == len(FILES["a0.bin"])
