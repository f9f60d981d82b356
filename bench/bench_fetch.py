"""Fetch vs curl and aria2c on loopback: whole-process speed, segments, bytes after a drop.

(a) one large artifact (``BENCH_FETCH_MIB``, default 1024; ``BENCH_FETCH_RUNS`` runs,
    default 5), each tool a fresh process timed from outside, interleaved in a rotated
    order: `curl -o`, `curl -o` + `sha256sum`, `aria2c -x8 -s8 --checksum`, and bootfsm's
    real Fetcher (bench/fetch_one.py) with one connection and with the default 8
    segments; against an unthrottled server, one that ignores Range, and one paced per
    connection (bench/range_server.py, a separate process using sendfile(2));
(b) the connection drops at 50 %: bytes the server sent until the file was whole,
    bootfsm (resumes) against curl rerun without resume (today's bash path);
(c) three artifacts from a server throttled per connection: bootfsm in parallel
    against the largest alone and against one after the other (bootfsm and curl).

(b) and (c) use ``bootfsm.sim.mirror.Mirror`` (Range, ETag, Throttle, DropMidBody).
The files go under ``BENCH_FETCH_DIR`` (default: the temporary directory); the report
names the directory and its filesystem.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import node_install

from bootfsm.core.errors import TransientError
from bootfsm.fetch.artifacts import Artifact
from bootfsm.fetch.fetcher import Fetched, Fetcher, Job
from bootfsm.host.http import Http
from bootfsm.sim.mirror import DropMidBody, Mirror, Throttle

GIB = 1 << 30
MIB = 1 << 20
HERE = Path(__file__).resolve().parent
RUNS = int(os.environ.get("BENCH_FETCH_RUNS", "5"))
THROTTLE = 50_000_000  # bytes/s per connection for (c)


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


def _fetcher(parallel: int = 4, fsync: bool = False, segments: int = 8) -> Fetcher:
    return Fetcher(
        Http(read_timeout=30),
        parallel=parallel,
        allow_http_hosts=["127.0.0.1"],
        artifact_timeout=600,
        remaining=lambda: 600.0,
        emit=lambda event, **fields: None,
        fsync=fsync,
        segments=segments,
    )


def _bootfsm(
    arts: list[Artifact], out: Path, parallel: int = 4, fsync: bool = False, segments: int = 8
) -> float:
    """Seconds for the fetcher to download, verify and move every artifact into ``out``."""
    jobs = [Job(a, out / f"{a.filename}.part") for a in arts]

    def done(f: Fetched) -> None:
        f.job.part.rename(f.job.part.with_suffix(""))
        f.job.part.with_name(f.job.part.name + ".meta").unlink(missing_ok=True)

    t0 = time.perf_counter()
    _fetcher(parallel, fsync, segments).run(jobs, done)
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
    env = node_install.env(dict(os.environ))  # as a unit runs it: no development settings
    t0 = time.perf_counter()
    for argv in argvs:
        subprocess.run(argv, capture_output=True, check=True, env=env)
    return time.perf_counter() - t0


def _server(doc: Path, *flags: str) -> tuple[subprocess.Popen[bytes], str]:
    """bench/range_server.py in its own process (so it never shares the client's GIL)."""
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "range_server.py"), str(doc), *flags],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    return proc, proc.stdout.readline().decode().strip()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.stdin is not None:
        proc.stdin.close()
    proc.wait(timeout=30)


def _tools(url: str, dest: Path, sha: str, size: int, served: Path) -> dict[str, list[list[str]]]:
    """Whole-process commands, each leaving a verified (or, for curl -o, plain) DEST;
    ``hash``: the sha256 alone of the served file (page cache), no download at all."""
    boot = [str(node_install.PYTHON), str(HERE / "fetch_one.py"), url, str(dest), sha, str(size)]
    tools = {
        "curl": [["curl", "-sS", "-o", str(dest), url]],
        "hash": [["openssl", "dgst", "-sha256", str(served)]],
        "pyhash": [[str(node_install.PYTHON), "-c", PY_FLOOR, str(served)]],
        "curl+sha": [["curl", "-sS", "-o", str(dest), url], ["sha256sum", str(dest)]],
        "boot1": [[*boot, "1"]],
        "boot8": [[*boot, "8"]],
        "boot8u": [[*boot[:-1], "-", "8"]],
    }
    if shutil.which("aria2c"):
        tools["aria2c"] = [
            [
                "aria2c", "-q", "-x8", "-s8", f"--checksum=sha-256={sha}",
                "--allow-overwrite=true", "--auto-file-renaming=false",
                "-d", str(dest.parent), "-o", dest.name, url,
            ]
        ]  # fmt: skip
    return tools


#: What any verified fetch by bootfsm's interpreter pays before and besides its copying:
#: the interpreter's start, requests' import, and the sha256 of every byte (OpenSSL's,
#: through hashlib, as bootfsm hashes), here of the served file from the page cache.
PY_FLOOR = (
    "import hashlib, sys, requests\n"
    "with open(sys.argv[1], 'rb') as f:\n"
    "    hashlib.file_digest(f, 'sha256')"
)

TOOL_NAMES = {
    "curl": "`curl -o FILE` (no checksum: the baseline)",
    "curl+sha": "`curl -o FILE` then `sha256sum FILE`",
    "hash": "`openssl dgst -sha256` of the file alone (no download: the floor of any "
    "verified fetch)",
    "pyhash": "bootfsm's interpreter: `import requests`, then `hashlib` sha256 of the file "
    "alone (no download: the floor of a verified fetch in Python)",
    "aria2c": "`aria2c -x8 -s8 --checksum=sha-256=...`",
    "boot1": "bootfsm, `fetch.segments = 1` (one connection)",
    "boot8": "bootfsm, `fetch.segments = 8` (the default)",
    "boot8u": "bootfsm, `fetch.segments = 8`, no size given (as the driver runfile)",
}


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used (proc(5): /proc/PID/stat
    fields 14 and 15, in clock ticks)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _interleaved(
    tools: dict[str, list[list[str]]], out: Path, runs: int, server: int
) -> dict[str, list[float]]:
    """Seconds per tool per run; each run takes the tools in a rotated order, after one
    discarded round of every tool (the first writes of a fresh file system's pages cost
    the kernel more than any later ones, whichever tool happens to come first). The
    CPU of each cell, the tool's and the server's (pid ``server``), goes to ``CPU``
    and ``SERVER_CPU``."""
    times: dict[str, list[float]] = {k: [] for k in tools}
    CPU.clear()
    SERVER_CPU.clear()
    names = list(tools)
    for k in names:  # the warm-up round, not timed
        _clean(out)
        _timed(*tools[k])
    for r in range(runs):
        for k in names[r % len(names) :] + names[: r % len(names)]:
            _clean(out)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            served = _proc_cpu(server)
            times[k].append(_timed(*tools[k]))
            SERVER_CPU.setdefault(k, []).append(_proc_cpu(server) - served)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            CPU.setdefault(k, []).append(
                after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            )
    _clean(out)
    return times


CPU: dict[str, list[float]] = {}  # CPU seconds (user + sys) per tool, of the last table
SERVER_CPU: dict[str, list[float]] = {}  # the server's CPU seconds in each tool's cells


def _spread(ts: list[float]) -> str:
    return f"{statistics.median(ts):.2f} s ({min(ts):.2f}-{max(ts):.2f})"


def _table(times: dict[str, list[float]], size: int, base: str) -> str:
    rows = []
    for k, ts in times.items():
        paired = [b / t for t, b in zip(ts, times[base], strict=True)]
        rows.append(
            f"| {TOOL_NAMES[k]} | {_spread(ts)} | {size / statistics.median(ts) / 1e6:,.0f} | "
            f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f}) | "
            f"{statistics.median(CPU[k]):.2f} s | {statistics.median(SERVER_CPU[k]):.2f} s |"
        )
    head = (
        "| tool (whole process) | wall, median (min-max) | MB/s (median) "
        f"| speed vs {TOOL_NAMES[base]}, paired runs | CPU (user+sys), median "
        "| the server's CPU meanwhile, median |"
    )
    return head + "\n|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n"


def _ratio(times: dict[str, list[float]], a: str, b: str) -> tuple[float, float, float]:
    """Median, min, max over runs of time(a) / time(b) (paired by run)."""
    r = [x / y for x, y in zip(times[a], times[b], strict=True)]
    return statistics.median(r), min(r), max(r)


def _fmt(r: tuple[float, float, float], goal: float | None = None) -> str:
    """``median (min-max)``; with ``goal``, the median to three places where two would
    round it onto the goal (1.004x would read 1.00x beside "not met")."""
    med = f"{r[0]:.3f}" if goal is not None and round(r[0], 2) == goal != r[0] else f"{r[0]:.2f}"
    return f"{med}x ({r[1]:.2f}-{r[2]:.2f})"


def _best(times: dict[str, list[float]]) -> tuple[float, float, float]:
    """Median, min, max over runs of curl's time / the lower bound of a verified fetch
    from Python in the same run: start + max(hash, (curl's CPU + the hash's + the
    server's) / cores), start = the Python hash less the openssl hash (at least 0)."""
    cores, r = os.cpu_count() or 1, []
    for i, curl in enumerate(times["curl"]):
        start = max(0.0, times["pyhash"][i] - times["hash"][i])
        work = CPU["curl"][i] + CPU["hash"][i] + SERVER_CPU["curl"][i]
        r.append(curl / (start + max(times["hash"][i], work / cores)))
    return statistics.median(r), min(r), max(r)


def _goals(times: dict[str, list[float]], flags: tuple[str, ...]) -> str:
    seg = _ratio(times, "boot8", "boot1")
    unsized = f" Without a size (the runfile): {_fmt(_ratio(times, 'boot8u', 'boot1'))}."
    if flags and flags[0] == "--rate":
        ok = "met" if seg[0] <= 0.35 else "NOT met"
        return (
            f"Segmented time / one connection: {_fmt(seg, 0.35)}; goal <= 0.35x: {ok}.{unsized}\n"
        )
    ok = "met" if seg[0] <= 1.0 else "NOT met"
    text = f"Segmented time / one connection: {_fmt(seg, 1.0)}; goal <= 1.0x (no slower): {ok}."
    text += unsized
    if not flags:
        vs = _ratio(times, "curl", "boot8")
        ok = "met" if vs[0] >= 1.0 else "NOT met"
        text += f" bootfsm speed vs `curl -o`: {_fmt(vs, 1.0)}; goal >= 1.0x: {ok}."
        hash_s, curl_s = statistics.median(times["hash"]), statistics.median(times["curl"])
        text += (
            f" The sha256 alone (`openssl dgst`, no download) takes {hash_s:.2f} s, "
            f"{hash_s / curl_s:.2f}x of `curl -o`'s {curl_s:.2f} s: a tool that verifies "
            "must do curl's copying plus that much hashing in the same wall time, on "
            f"{os.cpu_count()} cores shared with the server."
        )
        best = _best(times)
        text += (
            f"\n\nThe best any verified fetch from bootfsm's interpreter can do here, per run: "
            "no byte arrives before the interpreter and requests are loaded (the Python row "
            "less the `openssl` row), and then the work left is at least curl's CPU, the "
            "hash's and the server's, spread over every core, and never less than the hash "
            f"alone (sha256 is one sequential pass): {_fmt(best)} of `curl -o`'s speed"
            + (
                f"; the goal of 1.0x is out of reach on these {os.cpu_count()} cores."
                if best[2] < 1.0
                else "."
            )
        )
    return text + "\n"


def bench_throughput(work: Path) -> str:
    size, runs = MIB * int(os.environ.get("BENCH_FETCH_MIB", "1024")), RUNS
    doc, out = work / "doc-a", work / "out-a"
    doc.mkdir()
    out.mkdir()
    sha = _write_random(doc / "big.bin", size)
    parts = []
    try:
        for title, flags in (
            ("unthrottled loopback server", ()),
            ("server that ignores Range (200 to every GET)", ("--ignore-range",)),
            (
                f"server paced to {THROTTLE / 1e6:.0f} MB/s per connection",
                ("--rate", str(THROTTLE)),
            ),
        ):
            proc, base = _server(doc, *flags)
            try:
                url = base + "/big.bin"
                tools = _tools(url, out / "big.bin", sha, size, doc / "big.bin")
                _timed(["curl", "-sS", "-o", "/dev/null", url])  # the page cache is warm
                times = _interleaved(tools, out, runs, proc.pid)
            finally:
                _stop(proc)
            parts.append(f"#### {title}\n\n{_table(times, size, 'curl')}\n{_goals(times, flags)}\n")
    finally:
        shutil.rmtree(doc)
    return (
        f"### (a) one {size // MIB} MiB artifact, whole processes, {runs} interleaved runs\n\n"
        "Each cell is a fresh process (bootfsm: bench/fetch_one.py, the real Fetcher with "
        "its imports, `.part`, sha256 of every byte, verify, rename), timed from the outside; "
        "the tools take turns in a rotated order each run (after one untimed warm-up round "
        "of every tool) and the output is removed and `sync`ed between cells. Speed is "
        "paired per run (curl's time / the tool's time) "
        "and shown as median (min-max). `curl -o` hashes nothing; bootfsm hashes every byte "
        "(OpenSSL's sha256) while it receives, and a segmented download hashes each piece "
        "in file order from the page cache (one more copy than one connection).\n\n"
        + "\n".join(parts)
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
        alone = _bootfsm(arts[:1], out, segments=1)
        _clean(out)
        together = _bootfsm(arts, out, parallel=4, segments=1)
        _clean(out)
        one_by_one = _bootfsm(arts, out, parallel=1, segments=1)
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
        "per connection, one connection per artifact (`fetch.segments = 1`: this measures "
        "artifacts in parallel; segments are (a))\n\n"
        "| how | seconds | x largest alone |\n|---|---|---|\n"
        f"{body}\n\nGoal parallel <= 1.2x the largest alone: {verdict} ({ratio:.2f}x).\n"
    )


def main() -> str:
    """Run (a), (b), (c) in a temporary directory and return the Markdown section."""
    if shutil.which("curl") is None:
        return "## Fetch\n\ncurl is not installed: nothing to compare against.\n"
    node_install.install()
    where = os.environ.get("BENCH_FETCH_DIR") or None
    with tempfile.TemporaryDirectory(prefix="bootfsm-bench-fetch-", dir=where) as d:
        work = Path(d)
        fs = subprocess.run(
            ["stat", "-f", "-c", "%T", str(work)], capture_output=True, text=True, check=False
        ).stdout.strip()
        free = shutil.disk_usage(work).free
        if free < 3 * GIB:
            return f"## Fetch\n\nskipped: {work} has {free / GIB:.1f} GiB free, 3 GiB needed.\n"
        parts = [bench_throughput(work), bench_drop(work), bench_parallel(work)]
        where_line = f"Files under {work.parent} ({fs or 'unknown filesystem'}"
        where_line += ", `BENCH_FETCH_DIR`)" if where else ", the default temporary directory)"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    size = int(os.environ.get("BENCH_FETCH_MIB", "1024"))
    head = (
        "## Fetch: bootfsm vs curl and aria2c (bench/bench_fetch.py)\n\n"
        f"This run: (a) with a {size} MiB file and {RUNS} interleaved runs per cell "
        f"(`BENCH_FETCH_MIB={size} BENCH_FETCH_RUNS={RUNS}`); load average at the end "
        f"{load} on {os.cpu_count()} cores. {where_line}. The same files for every tool; "
        "bootfsm runs its real fetcher from a node install (bench/node_install.py) as "
        "bench/fetch_one.py (bootfsm/fetch/fetcher.py: sha256 of every byte, verify, "
        "rename; no fsync unless `fetch.fsync`); every server sends with sendfile(2) from "
        "its own process in (a), on the same cores as the client.\n\n"
    )
    return head + "\n".join(parts)


if __name__ == "__main__":
    print(main())
