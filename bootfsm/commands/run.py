"""`bootfsm run`: provision the node; the exit code is the outcome's code, unchanged, or
with ``--exit-codes cse`` (the provisioning hook) the CSE code of the same meaning."""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import sys
import time
from pathlib import Path

from bootfsm.commands.common import config_path, node_env
from bootfsm.core import caller, cse_clock
from bootfsm.core.codes import Code, verdict_line
from bootfsm.core.config import Config, ConfigError
from bootfsm.core.config_files import load_config_sources
from bootfsm.core.cse import CSE_NAMES, cse_exit
from bootfsm.core.deadline import Deadline
from bootfsm.core.errors import BootError
from bootfsm.machine.engine import Outcome
from bootfsm.run.notify import Notifier, state_status
from bootfsm.run.runner import RunOptions, execute
from bootfsm.run.session import SessionResult

__all__ = ["exit_code", "main", "summary_line"]


def summary_line(result: SessionResult, exit_codes: str = "bootfsm") -> str:
    """The one line a human (and the provisioning hook) sees at the end."""
    o = result.outcome
    tail = [f"run {result.run_id}"] if result.run_id else []
    if o.ok:
        message = f"{o.message} in {result.duration_s:.1f} s"
        return verdict_line(Code.OK, message, state="done", tail=tail)
    if exit_codes == "cse":
        number = exit_code(o, exit_codes)
        tail.insert(0, f"cse exit {number} {CSE_NAMES.get(number, '')}".rstrip())
    return verdict_line(o.code, o.message, state=o.state, tail=tail)


def exit_code(outcome: Outcome, exit_codes: str = "bootfsm") -> int:
    """The process exit code: bootfsm's own, or (``cse``) the CSE code of the same meaning."""
    if exit_codes == "cse":
        return cse_exit(outcome.code, outcome.state)
    return int(outcome.code)


def _deadline(args: argparse.Namespace) -> float | str:
    """--deadline, else $BOOTFSM_DEADLINE, else 0 (the config's); a message when invalid."""
    if args.deadline is not None:
        value, where = args.deadline, "--deadline"
    else:
        raw = os.environ.get("BOOTFSM_DEADLINE", "").strip()
        if not raw:
            return 0.0
        where = "BOOTFSM_DEADLINE"
        try:
            value = float(raw)
        except ValueError:
            return f"{where}: expected seconds, got {raw!r}"
    if not 0 < value < float("inf"):
        return f"{where}: must be a positive number of seconds, got {value:g}"
    return float(value)


def _cse_deadline(
    args: argparse.Namespace, cfg: Config
) -> tuple[cse_clock.HookDeadline | None, Deadline | None] | str:
    """`run --hook` under CSE's clock: the hook's deadline (what is left of CSE's budget
    less run.cse_reserve, capped by the run's own), started now so that the lock wait
    counts; (None, None) without the clock; why the caller's variables are invalid."""
    if not args.hook:
        return None, None
    try:
        budget = cse_clock.read_budget(os.environ, time.time())
    except ConfigError as exc:
        return f"the provisioning hook's environment is invalid: {exc}"
    if budget is None:
        return None, None
    cap_source = "--deadline" if args.deadline is not None else "run.deadline"
    if args.deadline is None and os.environ.get("BOOTFSM_DEADLINE", "").strip():
        cap_source = "BOOTFSM_DEADLINE"
    plan = cse_clock.hook_deadline(budget, cfg.run.cse_reserve, cfg.run.deadline, cap_source)
    return plan, Deadline(max(0.0, plan.seconds), time.monotonic, plan.note)


def _refused(code: Code, message: str, exit_codes: str) -> int:
    """Print the summary line for a run that never started (bad arguments)."""
    outcome = Outcome(code, "", message)
    print(summary_line(SessionResult(outcome, "", None), exit_codes))
    return exit_code(outcome, exit_codes)


def _config(
    path: Path, required: bool, hook: bool
) -> tuple[Config, list[caller.Override], dict[str, str]] | str | BootError:
    """The config with the hook's overrides and each value's file; or why it is invalid
    (a BootError: a valid choice of the caller's that bootfsm does not install)."""
    try:
        loaded = load_config_sources(path, required=required)
    except ConfigError as exc:
        return f"config invalid: {exc}"
    cfg, overrides = loaded.config, list[caller.Override]()
    if hook:
        try:
            cfg, overrides = caller.apply(cfg, caller.hook_overrides(cfg, os.environ))
        except ConfigError as exc:
            return f"the provisioning hook's environment is invalid: {exc}"
        except BootError as exc:
            return exc
    return cfg, overrides, dict(loaded.sources)


def main(args: argparse.Namespace) -> int:
    """Run the machine, notify systemd of each state, print the summary line."""
    exit_codes = "cse" if args.hook else args.exit_codes
    path, required = config_path(args)
    configured = _config(path, required, args.hook)
    if isinstance(configured, str):
        print(f"bootfsm: {configured}", file=sys.stderr)
        return _refused(Code.CONFIG_INVALID, configured, exit_codes)
    if isinstance(configured, BootError):
        print(f"bootfsm: {configured.message}", file=sys.stderr)
        return _refused(configured.code, configured.message, exit_codes)
    cfg, overrides, sources = configured
    deadline = _deadline(args)
    if isinstance(deadline, str):
        return _refused(Code.CONFIG_INVALID, deadline, exit_codes)
    if deadline > 0:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, deadline=deadline))
    clocked = _cse_deadline(args, cfg)
    if isinstance(clocked, str):
        print(f"bootfsm: {clocked}", file=sys.stderr)
        return _refused(Code.CONFIG_INVALID, clocked, exit_codes)
    plan, running = clocked
    wait_lock = args.wait_lock if running is None else min(args.wait_lock, running.seconds)
    if args.no_start_kubelet:
        cfg = dataclasses.replace(cfg, join=dataclasses.replace(cfg.join, start_kubelet=False))
    notifier = Notifier.from_env(os.environ)
    notifier.status(state_status("detect"))
    opts = RunOptions(
        root=Path(args.root),
        config_path=str(path),
        console=io.StringIO() if args.quiet else sys.stderr,
        console_json=args.json,
        wait_lock=wait_lock,
        deadline=running,
        env=node_env(),
        on_state=lambda state: notifier.status(state_status(state)),
        on_status=notifier.status if notifier.enabled else None,
        hook=args.hook,
        overrides=tuple(overrides),
        config_sources=sources,
        cse_budget=None if plan is None else plan.fields,
        budget_spent="" if plan is None else plan.spent,
    )
    result = execute(cfg, opts)
    line = summary_line(result, exit_codes)
    notifier.status(line.removeprefix("bootfsm: "))
    notifier.close()
    print(line)
    return exit_code(result.outcome, exit_codes)
