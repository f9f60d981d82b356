"""`bootfsm trace [RUN-ID | FILE]`: the story of a run, for a person or as JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bootfsm.commands.common import load_or_exit
from bootfsm.trace import latest_journal, load_run, render, to_json

__all__ = ["main"]


def _find(args: argparse.Namespace, log_dir: Path) -> Path | None:
    if args.target is None:
        return latest_journal(log_dir)
    p = Path(args.target)
    if p.is_file():
        return p
    matches = sorted(log_dir.glob(f"run-*{args.target}*.jsonl"))
    return matches[-1] if matches else None


def main(args: argparse.Namespace) -> int:
    """Print the trace; exit 1 when there is no journal to read."""
    cfg = load_or_exit(args)
    if isinstance(cfg, int):
        return cfg
    log_dir = Path(args.root) / cfg.run.log_dir.lstrip("/")
    path = _find(args, log_dir)
    if path is None:
        print(f"bootfsm: no journal found in {log_dir}", file=sys.stderr)
        return 1
    report = load_run(path)
    if args.json:
        print(json.dumps(to_json(report), indent=1, default=str))
    else:
        print(render(report), end="")
    return 0
