"""`bootfsm fetch [--prefetch]`: fill the verified artifact cache with the fetch state's code.

Without ``--prefetch`` it fetches what this node needs (detect's checks apply, GPUs
included). With ``--prefetch`` (image build) the facts come from the root's files only:
architecture and OS, never the PCI bus, so a build VM without GPUs can run it; the
hardware is the architecture's superset profile (``bootfsm.image.bake.image_facts``: x86_64
with NVSwitch, so fabric manager is fetched; aarch64 Grace, so IMEX is), as `bootfsm
bake` uses. Either way the fetch state's action runs under its table row (limit,
retries), the cache keeps the indexes too, and a later run with the mirrors unreachable
uses the cache when everything in it verifies. Exit code: 0 or the failure's code.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from bootfsm.commands.common import load_or_exit
from bootfsm.core.codes import Code, info
from bootfsm.core.config import Config
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError
from bootfsm.host.host import Host
from bootfsm.host.lock import NodeLock, own_dirs
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal, new_run_id

__all__ = ["FetchResult", "fetch_cache", "main", "summary_line"]

PREFETCH_DEADLINE_S = 3600.0  # image builds are off the node's critical path


@dataclass(frozen=True)
class FetchResult:
    """How a fetch ended: code, message, artifacts in the cache, how many were downloaded."""

    code: Code
    message: str
    artifacts: int = 0
    downloaded: int = 0
    journal: Path | None = None


def fetch_cache(
    cfg: Config,
    root: Path,
    *,
    prefetch: bool,
    console: IO[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> FetchResult:
    """Run the fetch state's action for the node (or image) at ``root``; never raises."""
    host = Host(root, env=env)
    lock = NodeLock(host.path(f"{cfg.run.state_dir}/lock"))
    try:
        own_dirs(host, cfg.run.state_dir, cfg.run.log_dir, cfg.fetch.cache_dir)
        acquired = lock.acquire(0.0)
    except BootError as exc:
        return FetchResult(exc.code, exc.message)
    except OSError as exc:  # a read-only or full state dir
        msg = f"cannot take the node lock {lock.path}: {exc.strerror or exc}"
        return FetchResult(Code.HOST_IO_ERROR, f"{msg}; run.state_dir must be writable")
    if not acquired:
        msg = f"another bootfsm run (pid {lock.holder() or '?'}) holds {lock.path}"
        return FetchResult(Code.ANOTHER_RUN_IN_PROGRESS, msg)
    try:
        return _locked(cfg, host, prefetch=prefetch, console=console)
    finally:
        lock.release()


def _locked(cfg: Config, host: Host, *, prefetch: bool, console: IO[str] | None) -> FetchResult:
    from bootfsm.fetch.store import resolved
    from bootfsm.image.bake import image_facts
    from bootfsm.machine.engine import attempt
    from bootfsm.machine.table import row
    from bootfsm.node.facts import gather_facts
    from bootfsm.states import detect, fetch

    run_id = new_run_id()
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(host.wall()))
    path = host.path(cfg.run.log_dir) / f"fetch-{stamp}-{run_id}.jsonl"
    journal = Journal(path, run_id=run_id, console=console, monotonic=host.monotonic)
    deadline = max(cfg.run.deadline, PREFETCH_DEADLINE_S) if prefetch else cfg.run.deadline
    ctx = Context.create(cfg, host, journal, deadline)
    journal.event("fetch.start", durable=True, root=str(host.root), prefetch=prefetch)
    result = FetchResult(Code.OK, "")
    try:
        facts = image_facts(host, kernel="") if prefetch else gather_facts(host)
        journal.event("node.facts", durable=True, prefetch=prefetch, **facts.summary())
        detect.judge(ctx, facts)
        ctx.facts_ = facts
        srow = row("fetch")
        ctx.state, ctx.state_row = "fetch", srow
        ctx.state_deadline = Deadline(srow.time_limit, host.monotonic)
        if not fetch.satisfied(ctx):
            attempt(ctx, srow, lambda: fetch.run(ctx))
            if not fetch.satisfied(ctx):
                raise BootError(srow.failure_code, "fetched artifacts do not verify")
        total = len(resolved(ctx) or [])
        downloaded = len(ctx.scratch.get("fetch.attempts", {}))
        msg = f"{total} artifacts verified in {cfg.fetch.cache_dir} ({downloaded} downloaded)"
        result = FetchResult(Code.OK, msg, total, downloaded)
    except BootError as exc:
        result = FetchResult(exc.code, exc.message)
    except KeyboardInterrupt:
        result = FetchResult(Code.INTERRUPTED, "interrupted; partial downloads resume next time")
    journal.event(
        "fetch.end",
        durable=True,
        level="info" if result.code is Code.OK else "error",
        code=int(result.code),
        code_name=result.code.name,
        message=result.message,
        duration_s=round(journal.elapsed(), 4),
    )
    journal.close()
    return FetchResult(result.code, result.message, result.artifacts, result.downloaded, path)


def summary_line(result: FetchResult, prefetch: bool) -> str:
    """The one line a build log or a terminal shows at the end."""
    what = "prefetch" if prefetch else "fetch"
    if result.code is Code.OK:
        return f"bootfsm: {what} OK: {result.message}"
    first = result.message.splitlines()[0] if result.message else ""
    return (
        f"bootfsm: {what} FAILED code={int(result.code)} {result.code.name}: {first}"
        f" | hint: {info(result.code).hint}"
    )


def main(args: argparse.Namespace) -> int:
    """Fetch into the cache of ``--root``; print one summary line; exit with the code."""
    cfg = load_or_exit(args)
    if isinstance(cfg, int):
        return cfg
    result = fetch_cache(cfg, Path(args.root), prefetch=args.prefetch, console=sys.stderr)
    print(summary_line(result, args.prefetch))
    return int(result.code)
