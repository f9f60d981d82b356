"""`bootfsm demo`'s body: boot a simulated node end to end with the real CLI (a child
process), then trace it. Part of the simulator: in the source tree only, never in the
wheel a node installs (bootfsm/commands/demo.py says so when it is absent).

The exit code is the run's. Needs `makeself` and `dpkg-deb` (the mirror serves real
formats); `make demo` installs them.
"""

from __future__ import annotations

import argparse
import subprocess  # noqa: TID251 - the demo runs the real `bootfsm run` as a child
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bootfsm.sim.artifacts_signing import close_shared
from bootfsm.sim.world import FAULTS, World

__all__ = ["run_demo"]


def run_demo(args: argparse.Namespace, show: Callable[[Path], None]) -> int:
    """Build the world, run `bootfsm run` against it, hand its journal to ``show`` (the
    trace, rendered by the caller: the simulator never imports bootfsm's observers)."""

    if "list" in args.fault:
        for name, text in FAULTS.items():
            print(f"{name:<28} {text}")
        return 0
    try:
        return _demo(args, show)
    finally:
        close_shared()  # the signing key's gpg-agent: a daemon, never left behind


def _demo(args: argparse.Namespace, show: Callable[[Path], None]) -> int:
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
                show(journals[-1])
        if args.keep:
            print(f"demo: node kept at {w.root}", file=sys.stderr)
        return proc.returncode
