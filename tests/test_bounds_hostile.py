"""Every time bound against a peer that trickles forever and ignores the client's FIN.

The peer (tests/hostile.py) is a real loopback server, plain or HTTPS with a CA made in
the test: it answers each request with one byte every second or two, of its headers or
of its body, and goes on writing until its socket fails. Each test measures the bound
itself (the time the call took, and when the peer saw the client hang up) and asserts
it ends within one second of its limit: a request's own limit (IMDS, kubelet probes,
index fetches), a download's deadline, the read timeout, the kubelet wait, a state's
time limit and the run's deadline. A download cut by its deadline keeps the bytes it
had: the ``.part`` holds them and the next run resumes from there.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trustme

from bootfsm.core.codes import Code
from bootfsm.core.errors import TransientError
from bootfsm.host.http import Http
from bootfsm.host.segments import stream_segmented
from bootfsm.machine import engine
from tests.conftest import MakeWorld, run_in_process
from tests.hostile import Peer, Trickler

BODY = bytes(range(256)) * 4096  # 1 MiB a peer never finishes at a byte a second
MakePeer = Callable[..., Trickler]


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_file(ca: trustme.CA, tmp_path: Path) -> str:
    path = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return str(path)


@pytest.fixture
def peer(ca: trustme.CA) -> Iterator[MakePeer]:
    """``peer(tls=False, phase="body", every=1.0, content=...)``: a hostile peer."""
    made: list[Trickler] = []

    def make(
        *,
        tls: bool = False,
        phase: str = "body",
        every: float = 1.0,
        content: Callable[[str], bytes | None] = lambda _: BODY,
    ) -> Trickler:
        ctx = None
        if tls:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ca.issue_cert("127.0.0.1").configure_cert(ctx)
        made.append(Trickler(content, phase=phase, every=every, tls=ctx))
        return made[-1]

    yield make
    for t in made:
        t.close()


def _gone(t: Trickler, limit: float) -> list[Peer]:
    """The peer's connections, each of which the client hung up within 1 s of ``limit``
    after it opened (measured at the peer: the client really dropped it)."""
    peers = t.wait_gone()
    assert peers, "the client never connected"
    for p in peers:
        assert p.hangup is not None or p.failed is not None, f"{p.path} still open"
        ended = p.hangup if p.hangup is not None else p.failed
        assert ended is not None and ended - p.opened <= limit + 1, (ended - p.opened, limit)
    return peers


TRANSPORTS = [
    pytest.param(False, "body", id="http-body"),
    pytest.param(False, "headers", id="http-headers"),
    pytest.param(True, "body", id="https-body"),
    pytest.param(True, "headers", id="https-headers"),
]


def _client(tls: bool, ca_file: str, **kw: Any) -> Http:
    return Http(ca_file=ca_file if tls else "", env={}, **kw)


@pytest.mark.parametrize(("tls", "phase"), TRANSPORTS)
def test_a_get_ends_within_a_second_of_its_limit(
    peer: MakePeer, ca_file: str, tls: bool, phase: str
) -> None:
    """An index fetch (through requests, with its allowed hosts) and a node-local GET
    (IMDS, kubelet: plain HTTP, never proxied) with a 2 s limit and a 30 s read timeout
    that no single read of a trickle ever reaches."""
    t = peer(tls=tls, phase=phase)
    kinds = {"index": ["127.0.0.1"]} | ({} if tls else {"node-local": None})
    for kind, allow in kinds.items():
        t0 = time.monotonic()
        with pytest.raises(TransientError) as err:
            _client(tls, ca_file, read_timeout=30).get(
                t.url(f"/{kind}"), timeout=2, allow_http_hosts=allow
            )
        took = time.monotonic() - t0
        assert err.value.code is Code.DOWNLOAD_TIMEOUT, (kind, err.value.message)
        assert 2 <= took <= 3, (kind, took)
    _gone(t, 2)


@pytest.mark.parametrize(("tls", "phase"), TRANSPORTS)
@pytest.mark.parametrize("segmented", [False, True], ids=["whole", "segmented"])
def test_a_download_ends_at_its_deadline_and_keeps_its_bytes(
    peer: MakePeer, ca_file: str, tmp_path: Path, tls: bool, phase: str, segmented: bool
) -> None:
    """A download (one connection, or the segmented probe a runfile starts with) whose
    deadline falls while the peer still trickles: DOWNLOAD_TIMEOUT within a second of
    it, and every body byte it had received is in the ``.part``, in place."""
    t = peer(tls=tls, phase=phase)
    part = tmp_path / "a.part"
    http = _client(tls, ca_file, read_timeout=30)
    t0 = time.monotonic()
    with pytest.raises(TransientError) as err:
        if segmented:
            stream_segmented(http, t.url(), part, size=None, segments=4, deadline=t0 + 3)
        else:
            http.stream_to(t.url(), part, deadline=t0 + 3)
    took = time.monotonic() - t0
    assert err.value.code is Code.DOWNLOAD_TIMEOUT, err.value.message
    assert 3 <= took <= 4, took
    [p] = _gone(t, 3)
    if phase == "body":
        got = _received(part)
        assert 1 <= len(got) <= p.sent and got == BODY[: len(got)]


def _received(part: Path) -> bytes:
    """The body bytes a ``.part`` holds: a segmented one is preallocated to the full
    size; its sidecar says how far its one segment got."""
    data = part.read_bytes()
    meta = json.loads(part.with_name(part.name + ".meta").read_text())
    if meta.get("segments"):
        [(start, _end, done)] = meta["segments"]
        return data[start : start + done]
    return data


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_read_timeout_ends_a_request_whose_peer_pauses_longer(
    peer: MakePeer, ca_file: str, tmp_path: Path, tls: bool
) -> None:
    """fetch.read_timeout = 1 against one byte every 2 s: each pause is longer than the
    read timeout, so the request ends one read timeout after its last byte, not at the
    (far) deadline."""
    t = peer(tls=tls, every=2.0)
    t0 = time.monotonic()
    with pytest.raises(TransientError) as err:
        _client(tls, ca_file, read_timeout=1).stream_to(
            t.url(), tmp_path / "a.part", deadline=t0 + 60
        )
    took = time.monotonic() - t0
    assert err.value.code is Code.DOWNLOAD_RETRIES_EXHAUSTED, err.value.message
    assert "timed out" in err.value.message.lower()
    assert took <= 1 + 1, took
    _gone(t, 1)


# -- the bounds of a run, against the same peer --------------------------------------------
def _files_of(w: Any) -> Callable[[str], bytes | None]:
    """What an honest mirror would serve: the world's mirror files, by URL path."""

    def content(path: str) -> bytes | None:
        f = w.docroot / path.split("?", 1)[0].lstrip("/")
        return f.read_bytes() if f.is_file() else None

    return content


def _configure(w: Any, ca: trustme.CA, **sections: dict[str, Any]) -> dict[str, str]:
    """Point the world's config at ``sections`` (merged over the sim's), the node's CA
    file at the test CA; the run's environment names no other trust store."""
    ca.cert_pem.write_to_path(str(w.root / "etc/bootfsm/test-ca.pem"))
    over = {k: dict(v) for k, v in sections.items()}
    over.setdefault("fetch", {})["ca_file"] = "/etc/bootfsm/test-ca.pem"
    w.config_overrides = over
    w.write_config()
    env = w.env()
    for key in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        env.pop(key, None)
    return env


def _events(path: Any, name: str) -> list[dict[str, Any]]:
    lines = Path(path).read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == name]


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_run_deadline_cuts_a_trickled_runfile_and_the_next_run_resumes(
    make_world: MakeWorld, peer: MakePeer, ca: trustme.CA, tls: bool
) -> None:
    """run.deadline = 6 s, the runfile's mirror trickles its body forever: the run ends
    DEADLINE_EXCEEDED within a second of the deadline, the ``.part`` holds the bytes
    received, and the next run (the mirror fast again) asks for the rest only."""
    w = make_world("h100-pcie")
    t = peer(tls=tls, content=_files_of(w))
    env = _configure(
        w,
        ca,
        run={"deadline": 6.0, "backoff_scale": 0.05},
        sources={"runfile_base": t.url("/tesla")},
    )
    t0 = time.monotonic()
    r = run_in_process(w, env=env)
    took = time.monotonic() - t0
    assert r.outcome.code is Code.DEADLINE_EXCEEDED, r.outcome.message
    assert took <= 6 + 1, took
    runfile = [p for p in t.wait_gone() if p.path.endswith(".run")]
    assert runfile and all((p.hangup or p.failed or 1e9) - t0 <= 6 + 1 for p in runfile)
    [part] = list(w.root.rglob("*.run.part"))
    got = _received(part)
    genuine = (w.docroot / runfile[0].path.lstrip("/")).read_bytes()
    assert 1 <= len(got) <= sum(p.sent for p in runfile) and got == genuine[: len(got)]
    t.every = 0  # the mirror is fast again
    w.config_overrides["run"] = {"deadline": 120.0, "backoff_scale": 0.05}
    w.write_config()
    r = run_in_process(w, env=env)
    assert r.outcome.code is Code.OK, r.outcome.message
    assert [p.range_start for p in t.peers if p.path.endswith(".run")][-1] == len(got)
    [fetched] = [e for e in _events(r.journal, "artifact.fetched") if e["artifact"] == "runfile"]
    assert fetched["resumed_bytes"] == len(got) and fetched["size"] == len(genuine)


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_the_run_deadline_cuts_an_index_whose_headers_trickle(
    make_world: MakeWorld, peer: MakePeer, ca: trustme.CA, tls: bool
) -> None:
    """The toolkit repository's mirror trickles its response headers forever (Release
    and Packages alike): the run ends within a second of its 6 s deadline."""
    w = make_world("h100-pcie")
    t = peer(tls=tls, phase="headers")
    env = _configure(
        w,
        ca,
        run={"deadline": 6.0, "backoff_scale": 0.05},
        sources={"toolkit_repo": t.url("/toolkit/{debian_arch}")},
    )
    t0 = time.monotonic()
    r = run_in_process(w, env=env)
    took = time.monotonic() - t0
    assert (r.outcome.state, r.outcome.code) == ("fetch", Code.DOWNLOAD_TIMEOUT), r.outcome
    assert took <= 6 + 1, took
    assert all((p.hangup or p.failed or 1e9) - t0 <= 6 + 1 for p in t.wait_gone())


@pytest.mark.parametrize("phase", ["headers", "body"])
def test_imds_timeout_holds_and_the_run_goes_on(
    make_world: MakeWorld, peer: MakePeer, ca: trustme.CA, phase: str
) -> None:
    """detect.imds_timeout = 2 against an IMDS that trickles: the request ends within a
    second of 2 s (the peer sees the client go), the instance document is skipped and
    the node still provisions."""
    w = make_world("h100-pcie")
    t = peer(phase=phase)
    env = _configure(w, ca, detect={"imds_url": t.url("/metadata/instance"), "imds_timeout": 2.0})
    r = run_in_process(w, env=env)
    assert r.outcome.code is Code.OK, r.outcome.message
    _gone(t, 2)
    [skipped] = _events(r.journal, "imds.skipped")
    assert "time limit (2 s)" in skipped["reason"]


def test_kubelet_timeout_bounds_its_last_probe(
    make_world: MakeWorld, peer: MakePeer, ca: trustme.CA
) -> None:
    """join.kubelet_timeout = 4 s, /healthz trickles: every probe is cut where the wait
    ends, so KUBELET_NOT_HEALTHY comes within a second of the 4 s wait (a probe's own
    3 s limit once ran past it: 0-3 s, then 3.1-6.1 s)."""
    w = make_world("h100-pcie")
    t = peer()
    env = _configure(w, ca, join={"kubelet_healthz_url": t.url("/healthz"), "kubelet_timeout": 4.0})
    r = run_in_process(w, env=env)
    assert (r.outcome.state, r.outcome.code) == ("join", Code.KUBELET_NOT_HEALTHY)
    probes = t.wait_gone()
    first = min(p.opened for p in probes)
    last = max((p.hangup or p.failed or 1e9) for p in probes)
    assert last - first <= 4 + 1, last - first


@pytest.mark.parametrize("bound", ["state-limit", "deadline"])
def test_a_state_limit_and_the_deadline_bound_a_request_with_a_longer_limit(
    make_world: MakeWorld,
    peer: MakePeer,
    ca: trustme.CA,
    monkeypatch: pytest.MonkeyPatch,
    bound: str,
) -> None:
    """detect.imds_timeout = 60 s, but detect's time limit (made 3 s here) or the run's
    deadline (3 s) comes first: the IMDS request ends within a second of it (the peer
    sees the client go). Under the state limit, detect then goes on without the
    instance document; under the deadline, the run ends DEADLINE_EXCEEDED within a
    second of it."""
    w = make_world("h100-pcie")
    t = peer()
    run: dict[str, Any] = {"backoff_scale": 0.05}
    if bound == "state-limit":
        real = engine.row
        monkeypatch.setattr(
            engine, "row", lambda n: replace(real(n), time_limit=3) if n == "detect" else real(n)
        )
    else:
        run["deadline"] = 3.0
    env = _configure(
        w, ca, run=run, detect={"imds_url": t.url("/metadata/instance"), "imds_timeout": 60.0}
    )
    t0 = time.monotonic()
    r = run_in_process(w, env=env)
    took = time.monotonic() - t0
    _gone(t, 3)
    [skipped] = _events(r.journal, "imds.skipped")
    assert "time limit (3 s)" in skipped["reason"] or "no time left" in skipped["reason"]
    if bound == "deadline":
        assert r.outcome.code is Code.DEADLINE_EXCEEDED, r.outcome
        assert took <= 3 + 1, took
    else:
        assert r.outcome.code is Code.OK, r.outcome


@pytest.mark.parametrize("kind", ["index", "download"])
def test_a_trickled_tls_handshake_ends_within_a_second_of_the_limit(
    peer: MakePeer, ca_file: str, tmp_path: Path, kind: str
) -> None:
    """The peer answers the ClientHello with a 16 KiB TLS record, one byte a second:
    the handshake never completes and no read waits as long as the read timeout. The
    request's limit holds during the handshake too (one call under the connect timeout,
    capped at the request's limit)."""
    t = peer(tls=True, phase="handshake")
    http = _client(True, ca_file, read_timeout=30)
    t0 = time.monotonic()
    with pytest.raises(TransientError) as err:
        if kind == "index":
            http.get(t.url(), timeout=2, allow_http_hosts=["127.0.0.1"])
        else:
            http.stream_to(t.url(), tmp_path / "a.part", deadline=t0 + 2)
    took = time.monotonic() - t0
    assert err.value.code is Code.DOWNLOAD_TIMEOUT, err.value.message
    assert 2 <= took <= 3, took
    _gone(t, 2)
