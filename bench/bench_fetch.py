"""Fetch vs curl on one loopback mirror: throughput, bytes after a drop, parallel time.

(a) a 1 GiB artifact: bootfsm (stream, sha256 of every byte, verify, rename) against
    `curl -o` of the same file from the same server (curl -o /dev/null shows what the
    server alone can push, so it is not the bottleneck); with ``fetch.fsync`` on, both
    sides wait for the disk (`curl -o` then `sync FILE`);
(b) the connection drops at 50 %: bytes the server sent until the file was whole,
    bootfsm (resumes) against curl rerun without resume (today's bash path);
(c) three artifacts from a server throttled per connection: bootfsm in parallel
    against the largest alone and against one after the other (bootfsm and curl).

The mirror is ``bootfsm.sim.mirror.Mirror`` (Range, ETag, Throttle, DropMidBody); for
(a) it runs in a child process so it does not share the client's interpreter.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bootfsm.artifacts import Artifact
from bootfsm.errors import TransientError
from bootfsm.fetcher import Fetched, Fetcher, Job
from bootfsm.http import Http
from bootfsm.sim.mirror import DropMidBody, Mirror, Throttle

GIB = 1 << 30
MIB = 1 << 20
RUNS = 5
THROTTLE = 50_000_000  # bytes/s per connection for (c)
SERVER = (
    "import sys; from pathlib import Path; from bootfsm.sim.mirror import Mirror\n"
    "m = Mirror(Path(sys.argv[1])).start(); print(m.url, flush=True); sys.stdin.read(); m.stop()"
)


def _write_random(path: Path, size: int) -> str:
    h = hashlib.sha256()
    with path.open("wb") as fh:
        left = size
        while left:
            block = os.urandom(min(64 * MIB, left))
            fh.write(block)
            h.update(block)
            left -= len(block)
    return h.hexdigest()


def _artifact(name: str, url: str, sha: str, size: int) -> Artifact:
    return Artifact(name, "bench", url, sha, size, name)


def _fetcher(parallel: int = 4, fsync: bool = False) -> Fetcher:
    return Fetcher(
        Http(read_timeout=30),
        parallel=parallel,
        allow_http_hosts=["127.0.0.1"],
        artifact_timeout=600,
        remaining=lambda: 600.0,
        emit=lambda event, **fields: None,
        fsync=fsync,
    )


def _bootfsm(arts: list[Artifact], out: Path, parallel: int = 4, fsync: bool = False) -> float:
    """Seconds for the fetcher to download, verify and move every artifact into ``out``."""
    jobs = [Job(a, out / f"{a.filename}.part") for a in arts]

    def done(f: Fetched) -> None:
        f.job.part.rename(f.job.part.with_suffix(""))
        f.job.part.with_name(f.job.part.name + ".meta").unlink(missing_ok=True)

    t0 = time.perf_counter()
    _fetcher(parallel, fsync).run(jobs, done)
    return time.perf_counter() - t0


def _curl(url: str, dest: str, *extra: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    rc = subprocess.run(["curl", "-sS", *extra, "-o", dest, url], check=False).returncode
    return time.perf_counter() - t0, rc


def _clean(out: Path) -> None:
    for p in out.iterdir():
        p.unlink()
    subprocess.run(["sync"], check=True)  # no run pays for the previous one's writeback


def _timed(*argvs: list[str]) -> float:
    t0 = time.perf_counter()
    for argv in argvs:
        subprocess.run(argv, capture_output=True, check=True)
    return time.perf_counter() - t0


THROUGHPUT_ROWS = {
    "null": "`curl -o /dev/null` (the server's ceiling)",
    "curl": "`curl -o FILE` (no checksum: the baseline)",
    "curl+sha": "`curl -o FILE` then `sha256sum FILE`",
    "curl+sync": "`curl -o FILE` then `sync FILE` (durable)",
    "bootfsm": "bootfsm fetcher (streaming sha256, verify, rename)",
    "bootfsm+fsync": "bootfsm fetcher with `fetch.fsync = true` (durable)",
}


def bench_throughput(work: Path) -> str:
    doc, out = work / "doc-a", work / "out-a"
    doc.mkdir()
    out.mkdir()
    sha = _write_random(doc / "big.bin", GIB)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(doc)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    times: dict[str, list[float]] = {k: [] for k in THROUGHPUT_ROWS}
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip() + "/big.bin"
        art = _artifact("big.bin", url, sha, GIB)
        dest = str(out / "big.bin")
        curl = ["curl", "-sS", "-o", dest, url]
        _curl(url, "/dev/null")  # warm the server's page cache
        for _ in range(RUNS):  # interleaved, so drift on a shared machine hits all alike
            times["null"].append(_curl(url, "/dev/null")[0])
            times["curl"].append(_timed(curl))
            times["curl+sha"].append(times["curl"][-1] + _timed(["sha256sum", dest]))
            _clean(out)
            times["curl+sync"].append(_timed(curl, ["sync", dest]))
            _clean(out)
            times["bootfsm"].append(_bootfsm([art], out))
            assert (out / "big.bin").stat().st_size == GIB
            _clean(out)
            times["bootfsm+fsync"].append(_bootfsm([art], out, fsync=True))
            _clean(out)
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(timeout=30)
        shutil.rmtree(doc)  # the 1 GiB file goes as soon as it is measured
    rate = {k: GIB / statistics.median(v) / 1e6 for k, v in times.items()}
    body = "\n".join(
        f"| {name} | {rate[k]:,.0f} | {rate[k] / rate['curl']:.2f}x | "
        + ", ".join(f"{GIB / t / 1e6:,.0f}" for t in times[k])
        + " |"
        for k, name in THROUGHPUT_ROWS.items()
    )
    ratio = rate["bootfsm"] / rate["curl"]
    durable = rate["bootfsm+fsync"] / rate["curl+sync"]
    verdict = "met" if ratio >= 0.9 else "NOT met"
    return (
        f"### (a) 1 GiB artifact, median of {RUNS} interleaved runs\n\n"
        "| tool | MB/s (median) | vs `curl -o` | runs, MB/s |\n|---|---|---|---|\n"
        f"{body}\n\n"
        f"Goal >= 0.9x `curl -o`: {verdict} ({ratio:.2f}x). Both durable variants wait for "
        f"the disk: bootfsm with fsync is {durable:.2f}x `curl -o` + `sync`.\n"
    )


def _sent(mirror: Mirror, name: str) -> int:
    return sum(e.bytes_sent for e in mirror.log if e.path.endswith(name))


def _until_done(attempt: Callable[[], object], tries: int = 5) -> int:
    for n in range(1, tries + 1):
        try:
            attempt()
            return n
        except TransientError:
            continue
    raise RuntimeError("did not finish")


def bench_drop(work: Path) -> str:
    size = 64 * MIB
    doc, out = work / "doc-b", work / "out-b"
    doc.mkdir()
    out.mkdir()
    sha = _write_random(doc / "drop.bin", size)
    with Mirror(doc) as m:
        url = m.url + "/drop.bin"
        m.add_fault("drop.bin", DropMidBody(times=1, fraction=0.5))
        n = _until_done(lambda: _bootfsm([_artifact("drop.bin", url, sha, size)], out))
        ours = _sent(m, "drop.bin")
        _clean(out)
        m.add_fault("drop.bin", DropMidBody(times=1, fraction=0.5))
        dest = str(out / "drop.bin")
        rcs = [_curl(url, dest)[1]]
        rcs.append(_curl(url, dest)[1])  # the bash path reruns the whole download
        curl_plain = _sent(m, "drop.bin") - ours
        _clean(out)
        m.add_fault("drop.bin", DropMidBody(times=1, fraction=0.5))
        before = _sent(m, "drop.bin")
        _curl(url, dest)
        _curl(url, dest, "-C", "-")
        curl_resume = _sent(m, "drop.bin") - before
        _clean(out)
    assert rcs[-1] == 0
    rows = [
        ("bootfsm (resumes; sha256 over the whole file)", ours, f"{n} attempts"),
        ("`curl -o` rerun, no resume (today's path)", curl_plain, f"exit {rcs[0]}, then 0"),
        ("`curl -C -` rerun (reference)", curl_resume, "2 runs"),
    ]
    body = "\n".join(f"| {a} | {b / MIB:.1f} MiB | {b / size:.2f}x | {c} |" for a, b, c in rows)
    verdict = "met" if ours <= 1.05 * size else "NOT met"
    return (
        f"### (b) connection dropped at 50 % of a {size // MIB} MiB artifact\n\n"
        "| tool | bytes sent by the server | x file size | how |\n|---|---|---|---|\n"
        f"{body}\n\nGoal <= 1.05x file size: {verdict}.\n"
    )


def bench_parallel(work: Path) -> str:
    sizes = {"p0.bin": 96 * MIB, "p1.bin": 64 * MIB, "p2.bin": 32 * MIB}
    doc, out = work / "doc-c", work / "out-c"
    doc.mkdir()
    out.mkdir()
    shas = {n: _write_random(doc / n, s) for n, s in sizes.items()}
    with Mirror(doc) as m:
        for n in sizes:
            m.add_fault(n, Throttle(bytes_per_second=THROTTLE))
        arts = [_artifact(n, f"{m.url}/{n}", shas[n], s) for n, s in sizes.items()]
        alone = _bootfsm(arts[:1], out)
        _clean(out)
        together = _bootfsm(arts, out, parallel=4)
        _clean(out)
        one_by_one = _bootfsm(arts, out, parallel=1)
        _clean(out)
        t0 = time.perf_counter()
        for a in arts:
            _curl(a.url, str(out / a.filename))
        curl_seq = time.perf_counter() - t0
        _clean(out)
        t0 = time.perf_counter()
        subprocess.run(
            ["curl", "-sS", "--no-progress-meter", "-Z", "--parallel-immediate"]
            + [x for a in arts for x in ("-o", str(out / a.filename), a.url)],
            check=True,
        )
        curl_par = time.perf_counter() - t0
        _clean(out)
    ratio = together / alone
    rows = [
        ("largest alone (bootfsm)", alone),
        ("bootfsm, fetch.parallel = 4", together),
        ("bootfsm, fetch.parallel = 1 (sequential)", one_by_one),
        ("`curl -o` one after another (today's path)", curl_seq),
        ("`curl -Z` (parallel, reference)", curl_par),
    ]
    body = "\n".join(f"| {n} | {t:.2f} | {t / alone:.2f}x |" for n, t in rows)
    mb = ", ".join(f"{s // MIB} MiB" for s in sizes.values())
    verdict = "met" if ratio <= 1.2 else "NOT met"
    return (
        f"### (c) three artifacts ({mb}), server throttled to {THROTTLE / 1e6:.0f} MB/s "
        "per connection\n\n"
        "| how | seconds | x largest alone |\n|---|---|---|\n"
        f"{body}\n\nGoal parallel <= 1.2x the largest alone: {verdict} ({ratio:.2f}x).\n"
    )


def main() -> str:
    """Run (a), (b), (c) in a temporary directory and return the Markdown section."""
    if shutil.which("curl") is None:
        return "## Fetch\n\ncurl is not installed: nothing to compare against.\n"
    with tempfile.TemporaryDirectory(prefix="bootfsm-bench-fetch-") as d:
        work = Path(d)
        free = shutil.disk_usage(work).free
        if free < 3 * GIB:
            return f"## Fetch\n\nskipped: {work} has {free / GIB:.1f} GiB free, 3 GiB needed.\n"
        parts = [bench_throughput(work), bench_drop(work), bench_parallel(work)]
    head = (
        "## Fetch: bootfsm vs curl (bench/bench_fetch.py)\n\n"
        "Same loopback mirror (bootfsm.sim.mirror: Range, ETag, per-connection throttle) "
        "and the same files for both tools; bootfsm runs its real fetcher "
        "(bootfsm/fetcher.py: streaming sha256, verify, rename; no fsync unless "
        "`fetch.fsync`). The mirror sends fault-free files with sendfile(2), so on a "
        "small machine its CPU does not decide the race.\n\n"
    )
    return head + "\n".join(parts)


if __name__ == "__main__":
    print(main())
