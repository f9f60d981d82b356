"""`bootfsm uninstall [--plan] [--json]`: undo ``installed.jsonl``'s records, newest first.

``--plan`` changes nothing (no lock, no journal, no directory). Otherwise it runs in a
run session (lock, journal) and exits 0 when all is undone, else the failure's code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bootfsm.commands.common import load_or_exit, node_env
from bootfsm.core.codes import Code, verdict_line
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.host import Host
from bootfsm.install import records
from bootfsm.install.uninstall import Step, plan, run
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Outcome
from bootfsm.observe.journal import Journal
from bootfsm.run.session import Session, SessionOptions, run_session

__all__ = ["main"]

SCHEMA = 1


def _plan(cfg: Config, args: argparse.Namespace) -> int:
    host = Host(Path(args.root), env=node_env())
    ctx = Context.create(cfg, host, Journal(None, run_id="plan"))
    try:
        steps = plan(ctx, records.load(host, cfg))
    except BootError as exc:
        return _failed(args, exc.code, exc.message)
    if args.json:
        doc = {"schema": SCHEMA, "kind": "uninstall.plan", "steps": [s.as_json() for s in steps]}
        print(json.dumps(doc, indent=2))
    elif not steps:
        print(f"bootfsm uninstall: nothing to do ({records.records_path(cfg)} lists nothing)")
    else:
        print("\n".join(s.line() for s in steps))
    return 0


def _print_json(code: Code, **fields: object) -> None:
    doc = {"schema": SCHEMA, "kind": "uninstall", "code": int(code), "code_name": code.name}
    print(json.dumps({**doc, **fields}, indent=2))


def _failed(args: argparse.Namespace, code: Code, message: str) -> int:
    if args.json:
        _print_json(code, message=message)
    print(verdict_line(code, message, command="uninstall"), file=sys.stderr)
    for line in message.splitlines()[1:]:  # the failed command's output
        print(f"  {line}", file=sys.stderr)
    return int(code)


def _uninstall(cfg: Config, args: argparse.Namespace) -> int:
    """Undo the records in a run session (kind uninstall: lock, journal, signals)."""
    done: dict[str, list[Step]] = {"steps": [], "kept": []}

    def show(step: Step) -> None:
        if not args.json:
            print(step.line())

    def body(s: Session) -> Outcome:
        s.ctx.state = "uninstall"
        try:
            done["steps"], done["kept"] = run(s.ctx, on_step=show)
        except (BootError, TransientError) as exc:
            message = exc.message
            output = getattr(exc, "detail", {}).get("output")
            if isinstance(output, str) and output.strip():
                message += "\n" + output.strip()[-800:]
            return Outcome(exc.code, "uninstall", message)
        s.end_fields["kept"] = [k.target for k in done["kept"]]
        return Outcome(Code.OK, "done", "uninstalled")

    opts = SessionOptions(kind="uninstall", root=Path(args.root), wait_lock=args.wait_lock,
                          env=node_env(), console=None)  # fmt: skip
    r = run_session(cfg, opts, body)
    if not r.outcome.ok:
        return _failed(args, r.outcome.code, r.outcome.message)
    steps, kept = done["steps"], done["kept"]
    if args.json:
        steps_json = [s.as_json() for s in steps]
        _print_json(
            Code.OK, steps=steps_json, kept=[s.target for s in kept], journal=str(r.journal)
        )
    count = sum(1 for s in steps if s.action not in ("keep", "skip"))
    what = f"{count} step(s) done" if steps else "nothing to do"
    kept_text = f", kept {len(kept)} changed file(s) (warnings above)" if kept else ""
    print(f"bootfsm: uninstall OK: {what}{kept_text} | journal {r.journal}", file=sys.stderr)
    return 0


def main(args: argparse.Namespace) -> int:
    """`bootfsm uninstall` (``--plan``: print only)."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    return _plan(cfg, args) if args.plan else _uninstall(cfg, args)
