"""`bootfsm run`: provision the node; the exit code is the outcome's code, unchanged."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys
from pathlib import Path

from bootfsm.codes import info
from bootfsm.commands.common import config_path, load_or_exit
from bootfsm.runner import RunOptions, RunResult, execute

__all__ = ["main", "summary_line"]


def summary_line(result: RunResult, seconds: float) -> str:
    """One line a human sees at the end (and the provisioning hook shows)."""
    o = result.outcome
    if o.ok:
        return f"bootfsm: OK code=0 node provisioned in {seconds:.1f} s (run {result.run_id})"
    return (
        f"bootfsm: FAILED code={int(o.code)} {o.code.name} state={o.state or '-'}: "
        f"{o.message.splitlines()[0] if o.message else ''} | hint: {info(o.code).hint}"
    )


def main(args: argparse.Namespace) -> int:
    """Run the machine and print the summary line."""
    cfg = load_or_exit(args)
    if isinstance(cfg, int):
        return cfg
    deadline = args.deadline or float(os.environ.get("BOOTFSM_DEADLINE", "0") or 0)
    if deadline > 0:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, deadline=deadline))
    console = io.StringIO() if args.quiet else sys.stderr
    opts = RunOptions(
        root=Path(args.root),
        config_path=str(config_path(args)[0]),
        console=console,
        console_json=args.json,
        wait_lock=args.wait_lock,
    )
    result = execute(cfg, opts)
    print(summary_line(result, _elapsed(result)))
    return int(result.outcome.code)


def _elapsed(result: RunResult) -> float:
    from bootfsm.trace import load_run

    if result.journal is None:
        return 0.0
    return load_run(result.journal).duration_s or 0.0
