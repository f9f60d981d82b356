"""`bootfsm demo`: boot a simulated node end to end with the real CLI, then trace it.

The exit code is the run's. Needs `makeself` and `dpkg-deb` (the mirror serves real
formats); `make demo` installs them.
"""

from __future__ import annotations

import argparse
import subprocess  # noqa: TID251 - the demo runs the real `bootfsm run` as a child
import sys
import tempfile
from pathlib import Path

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """Build the world, run `bootfsm run` against it, print the trace."""
    from bootfsm.observe.trace import load_run, render, to_json
    from bootfsm.sim.world import FAULTS, World

    if "list" in args.fault:
        for name, text in FAULTS.items():
            print(f"{name:<28} {text}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bootfsm-demo-") as tmp:
        base = Path(args.keep) if args.keep else Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        try:
            w = World(base, args.sku, tuple(args.fault), driver_kind=args.driver_kind)
        except ValueError as exc:
            print(f"bootfsm demo: {exc}", file=sys.stderr)
            return 2
        with w:
            print(
                f"demo: simulated {args.sku} node at {w.root}; mirror {w.mirror.url}; "
                f"faults: {', '.join(args.fault) or 'none'}",
                file=sys.stderr,
            )
            sys.stderr.flush()
            # --json: stdout carries the JSON document alone; the run's console goes to stderr
            proc = subprocess.run(
                w.argv(),
                env=w.env(),
                check=False,
                timeout=600,
                stdout=sys.stderr if args.json else None,
            )
            journals = w.journals()
            if journals:
                report = load_run(journals[-1])
                if args.json:
                    import json

                    print(json.dumps(to_json(report), indent=1, default=str))
                else:
                    print()
                    print(render(report), end="")
        if args.keep:
            print(f"demo: node kept at {w.root}", file=sys.stderr)
        return proc.returncode
