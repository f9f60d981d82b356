"""`bootfsm demo`: boot a simulated node end to end with the real CLI, then trace it.
Exits 2 where bootfsm/sim is absent (it is never in the wheel a node installs)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["NOT_INSTALLED", "main"]

NOT_INSTALLED = 2


def main(args: argparse.Namespace) -> int:
    """Run the simulator's demo (bootfsm.sim.demo), or explain why it cannot."""
    try:
        from bootfsm.sim.demo import run_demo
    except ModuleNotFoundError as exc:
        if exc.name not in ("bootfsm.sim", "bootfsm.sim.demo"):
            raise
        print(
            "bootfsm demo: the simulator is not installed: it lives in bootfsm's source "
            "tree (bootfsm/sim) and is never part of the installed package; run "
            "`make demo` in a checkout",
            file=sys.stderr,
        )
        return NOT_INSTALLED
    from bootfsm.observe.trace import load_run, render, to_json

    def show(journal: Path) -> None:
        report = load_run(journal)
        if args.json:
            print(json.dumps(to_json(report), indent=1, default=str))
        else:
            print()
            print(render(report), end="")

    return run_demo(args, show)
