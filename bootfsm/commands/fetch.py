"""`bootfsm fetch [--prefetch]`: fill the verified artifact cache with the fetch state's code.

``--prefetch`` (image build) never reads the PCI bus: it fetches for the architecture's
superset profile (``bootfsm.image.bake.image_facts``). Exit code: 0 or the failure's code.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from bootfsm.commands.common import load_or_exit
from bootfsm.core.codes import Code, verdict_line
from bootfsm.core.config import Config
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Outcome
from bootfsm.node.facts import NodeFacts
from bootfsm.run.session import Session, SessionOptions, SessionResult, run_session

__all__ = ["fetch_cache", "main", "summary_line"]

PREFETCH_DEADLINE_S = 3600.0  # image builds are off the node's critical path


def fetch_cache(
    cfg: Config,
    root: Path,
    *,
    prefetch: bool,
    console: IO[str] | None = None,
    env: Mapping[str, str] | None = None,
    wait_lock: float = 0.0,
    kernel: str = "",
) -> SessionResult:
    """Run detect -> fetch in a run session for the node (``prefetch``: the image; for
    ``driver.source = "ubuntu-signed"`` its newest kernel, or ``kernel``) at ``root``;
    never raises."""
    from bootfsm.fetch.store import resolved
    from bootfsm.image.bake import image_facts, target_kernel
    from bootfsm.image.steps import FactsDetect
    from bootfsm.machine.table import stop_after
    from bootfsm.node.facts import gather_facts
    from bootfsm.states import fetch

    def facts(ctx: Context) -> NodeFacts:
        if not prefetch:
            return gather_facts(ctx.host)
        signed = cfg.driver.source == "ubuntu-signed"  # the module is a kernel's
        return image_facts(ctx.host, target_kernel(ctx.host, kernel, False) if signed else "")

    def body(s: Session) -> Outcome:
        fetching = fetch.Fetch()
        outcome = s.drive(
            {"detect": FactsDetect(facts), "fetch": fetching}, {}, stop_after("fetch")
        )
        if not outcome.ok:
            return outcome
        total = len(resolved(s.ctx) or [])
        downloaded = len(fetching.attempts)
        s.end_fields.update(artifacts=total, downloaded=downloaded)
        msg = f"{total} artifacts verified in {cfg.fetch.cache_dir} ({downloaded} downloaded)"
        return Outcome(Code.OK, "done", msg)

    session = SessionOptions(
        kind="fetch",
        root=root,
        console=console,
        wait_lock=wait_lock,
        env=env,
        deadline_s=max(cfg.run.deadline, PREFETCH_DEADLINE_S) if prefetch else None,
        dirs=(cfg.fetch.cache_dir,),
        start_fields={"prefetch": prefetch},
    )
    return run_session(cfg, session, body)


def summary_line(outcome: Outcome, prefetch: bool) -> str:
    """The one line a build log or a terminal shows at the end."""
    what = "prefetch" if prefetch else "fetch"
    if outcome.ok:
        return f"bootfsm: {what} OK: {outcome.message}"
    return verdict_line(outcome.code, outcome.message, command=what)


def main(args: argparse.Namespace) -> int:
    """Fetch into the cache of ``--root``; print one summary line; exit with the code."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    # the extra kernels' signed modules first; the image's own resolution is saved last
    for kernel in [*(args.kernel or []), ""] if args.prefetch else [""]:
        result = fetch_cache(
            cfg, Path(args.root), prefetch=args.prefetch, console=sys.stderr, kernel=kernel
        )
        print(summary_line(result.outcome, args.prefetch))
        if not result.outcome.ok:
            break
    return int(result.outcome.code)
