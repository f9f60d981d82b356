"""The fetch state inside whole runs: Retry-After, resume across runs, mirrors, secrets."""

from __future__ import annotations

import io
import signal
import subprocess
import threading
import time
from urllib.parse import urlsplit

from bootfsm.core.codes import Code
from bootfsm.core.config_files import load_config
from bootfsm.run.runner import RunOptions, execute
from bootfsm.sim.mirror import Corrupt, Mirror, Status, Throttle
from tests.conftest import MakeWorld, run_in_process
from tests.test_fetch_cache import CACHE, _events, _point_sources_at, bulk_up_deb
from tests.test_fetch_resume import _Proxy, _ProxyHandler


def test_retry_after_sets_the_wait_end_to_end(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    w.mirror.add_fault(".run", Status(429, times=1, retry_after=0.5))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [retry] = _events(result, "state.retry")
    # the jittered backoff at this backoff_scale would be 0.025-0.05 s; the server said 0.5
    assert retry["sleep_s"] == 0.5 and retry["code"] == "DOWNLOAD_RETRIES_EXHAUSTED"


def test_interrupted_download_resumes_in_the_next_run(make_world: MakeWorld) -> None:
    """SIGTERM mid-download: exit 12, a .part stays; the next run sends only the rest."""
    w = make_world("h100-pcie")
    deb = bulk_up_deb(w, "nvidia-container-toolkit", 3 << 20)
    size = deb.stat().st_size
    w.mirror.add_fault(deb.name, Throttle(bytes_per_second=1 << 20))
    child = subprocess.Popen(w.argv(), env=w.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = None
    deadline = time.monotonic() + 60
    while part is None and child.poll() is None and time.monotonic() < deadline:
        found = [p for p in (w.root / CACHE).glob(f"*/{deb.name}.part") if p.stat().st_size]
        part = found[0] if found and found[0].stat().st_size > 1 << 20 else None
        time.sleep(0.02)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    assert part is not None, err.decode()[-2000:]
    assert child.returncode == Code.INTERRUPTED, err.decode()[-2000:]
    kept = part.stat().st_size
    assert 0 < kept < size and not part.with_suffix("").exists()
    [killed] = w.journals()
    progress = [e for e in _events(killed, "artifact.progress") if e["total"] == size]
    assert progress and 0 < progress[-1]["bytes"] <= kept and progress[-1]["rate_mb_s"] > 0

    w.mirror.clear_faults()
    sent_before = sum(e.bytes_sent for e in w.mirror.log if e.path.endswith(deb.name))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [ev] = [e for e in _events(result, "artifact.fetched") if e["artifact"] == deb.name[:24]]
    assert ev["resumed_bytes"] == kept and ev["transferred"] == size - kept
    sent = sum(e.bytes_sent for e in w.mirror.log if e.path.endswith(deb.name))
    assert sent - sent_before == size - kept


def test_mirror_failover_and_no_secret_in_journal_or_console(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    with Mirror(w.docroot) as gone:
        dead = gone.url  # closed once stopped: connection refused
    sig = "?sv=2024-05-04&sig=SECRET%2Fsig%3D"
    u = w.mirror.url
    w.config_overrides = {
        "sources": {
            "runfile_base": f"{dead}/tesla{sig}",
            "runfile_mirrors": [f"{u}/nothing-here{sig}", f"{u}/tesla{sig}"],
            "toolkit_repo": f"{dead}/toolkit/{{debian_arch}}{sig}",
            "toolkit_repo_mirrors": [f"{u}/toolkit/{{debian_arch}}{sig}"],
        }
    }
    w.write_config()
    console = io.StringIO()
    result = run_in_process(w, console=console)
    assert result.outcome.ok, result.outcome.message
    assert result.journal is not None
    assert "SECRET" not in result.journal.read_text() and "SECRET" not in console.getvalue()
    fetched = {e["artifact"]: e for e in _events(result, "artifact.fetched")}
    assert fetched["runfile"]["mirror_index"] == 2  # dead, then 404, then served
    assert fetched["runfile"]["url"].endswith(".run?<redacted>")
    assert {e["mirror_index"] for n, e in fetched.items() if n != "runfile"} == {0}
    failed = _events(result, "artifact.mirror_failed")
    assert [(e["artifact"], e["mirror"], e["code"]) for e in failed] == [
        ("runfile", 0, "DOWNLOAD_RETRIES_EXHAUSTED"),
        ("runfile", 1, "ARTIFACT_NOT_FOUND"),
    ]
    [index] = _events(result, "index.fetched")
    assert index["mirror"] == 1  # the toolkit index came from the mirror...
    assert all(e["mirror"].startswith(u) for e in fetched.values())  # ...and so did its debs


def test_whole_fetch_goes_through_the_environment_proxy(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    proxy = _Proxy(("127.0.0.1", 0), _ProxyHandler)
    proxy.seen = []
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        host = f"mirror.test:{urlsplit(w.mirror.url).port}"  # only the proxy resolves it
        _point_sources_at(w, f"http://{host}")
        w.config_overrides = {
            **w.config_overrides,
            "fetch": {"allow_http_hosts": ["127.0.0.1", "mirror.test"]},
        }
        w.write_config()
        env = {**w.env(), "HTTP_PROXY": f"http://127.0.0.1:{proxy.server_address[1]}"}
        cfg = load_config(w.config_path, required=True)
        result = execute(cfg, RunOptions(root=w.root, env=env))
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert result.outcome.ok, result.outcome.message
    assert sum(p.endswith(".run") for p in proxy.seen) == 1
    assert sum(p.endswith(".deb") for p in proxy.seen) == 4
    assert all(urlsplit(p).netloc == host for p in proxy.seen)  # IMDS and kubelet: direct


def test_plain_http_mirror_is_refused_before_any_download(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    w.config_overrides = {"sources": {"runfile_mirrors": ["http://mirror.example/tesla"]}}
    w.write_config()
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.INSECURE_URL_REFUSED, "fetch")
    assert "mirror.example" in result.outcome.message
    assert [e.path for e in w.mirror.log if e.path.endswith((".run", ".deb"))] == []


def test_index_durations_are_their_transfers_alone(make_world: MakeWorld) -> None:
    """``index.fetched`` times the index's GET, not its trust check: a stalled InRelease
    shows in ``index.release_fetched``, and gpgv starts after both transfers ended."""
    from bootfsm.sim.mirror import Stall

    w = make_world("h100-pcie")
    w.mirror.add_fault("InRelease", Stall(0.3))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    evs = _events(result)
    eps = 2e-4  # t and duration_s are rounded to 0.1 ms
    indexes = [i for i, e in enumerate(evs) if e["event"] == "index.fetched"]
    assert indexes
    checked = 0
    for i in indexes:
        index = evs[i]
        after = evs[i + 1 :]
        nxt = next((j for j, e in enumerate(after) if e["event"] == "index.fetched"), len(after))
        releases = [e for e in after[:nxt] if e["event"] == "index.release_fetched"]
        gpgv = [e for e in after[:nxt] if e["event"] == "command" and e["argv"][0] == "gpgv"]
        if not releases:
            continue  # an index without a Release (the pinned redistrib JSON)
        [release] = releases
        assert release["url"].endswith("/InRelease") and release["size"] > 0
        assert release["duration_s"] >= 0.3  # the stall is the release's, not the index's
        assert index["t"] <= release["t"] - release["duration_s"] + eps
        [cmd] = gpgv
        assert release["t"] <= cmd["t"] - cmd["duration_s"] + eps
        checked += 1
    assert checked >= 1


# -- a checksum mismatch: once more from scratch, then permanent ---------------------------
def _runfile_gets(m: Mirror) -> int:
    return len([e for e in m.log if e.path.endswith(".run")])


def test_one_corrupted_transfer_is_fetched_once_more_and_the_boot_goes_on(
    make_world: MakeWorld,
) -> None:
    """A single mirror whose runfile transfer arrives corrupted once (a flipped byte on
    the way): fetched once more from scratch, it verifies and the node provisions."""
    w = make_world("h100-pcie")
    w.mirror.add_fault(".run", Corrupt(times=1))
    r = run_in_process(w)
    assert r.outcome.ok, r.outcome.message
    assert _runfile_gets(w.mirror) == 2
    [warn] = [e for e in _events(r, "warning") if "once more from scratch" in e["message"]]
    assert "sha256" in warn["message"] and "runfile" in warn["message"]
    assert not [e for e in _events(r, "state.retry") if e["state"] == "fetch"]


def test_the_same_wrong_bytes_twice_are_permanent(make_world: MakeWorld) -> None:
    """The mirror's file itself is bad (every transfer the same wrong bytes): one fetch
    more, then CHECKSUM_MISMATCH, permanent, naming why; no third download."""
    w = make_world("h100-pcie")
    w.mirror.add_fault(".run", Corrupt())
    r = run_in_process(w)
    assert (r.outcome.state, r.outcome.code) == ("fetch", Code.CHECKSUM_MISMATCH)
    assert "same wrong bytes twice" in r.outcome.message
    assert _runfile_gets(w.mirror) == 2


def test_a_corrupt_mirror_is_followed_by_the_next_one(make_world: MakeWorld) -> None:
    """Two mirrors: the first serves wrong bytes, the once-more fetch is the next
    mirror's, which verifies. When both serve the same wrong bytes, each is tried once
    and the boot fails 31."""
    w = make_world("h100-pcie")
    with Mirror(w.docroot) as bad:
        bad.add_fault(".run", Corrupt())
        u = w.mirror.url
        w.config_overrides = {
            "sources": {"runfile_base": f"{bad.url}/tesla", "runfile_mirrors": [f"{u}/tesla"]}
        }
        w.write_config()
        r = run_in_process(w)
        assert r.outcome.ok, r.outcome.message
        assert (_runfile_gets(bad), _runfile_gets(w.mirror)) == (1, 1)
        fetched = {e["artifact"]: e for e in _events(r, "artifact.fetched")}
        assert fetched["runfile"]["mirror_index"] == 1
        w.mirror.add_fault(".run", Corrupt())
        for p in w.root.rglob("*.run"):
            p.unlink()  # a fresh node's cache
        for p in w.root.rglob("*.run.sha256"):
            p.unlink()
        r = run_in_process(w)
        assert (r.outcome.state, r.outcome.code) == ("fetch", Code.CHECKSUM_MISMATCH)
        assert (_runfile_gets(bad), _runfile_gets(w.mirror)) == (2, 2)
