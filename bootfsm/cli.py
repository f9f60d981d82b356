"""Command line: parse arguments and dispatch to bootfsm/commands/. Only argparse loads at
start-up; a command's module loads when it runs, so `bootfsm --help` starts fast."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

__all__ = ["EXIT_CODES", "build_parser", "main"]


_COMMON_CODES = "  2       usage error\n  130     interrupted (Ctrl-C) outside a run\n"

#: The "exit codes" section of each command's --help (and of the man page).
EXIT_CODES: dict[str, str] = {
    "run": "  0       provisioned, or nothing to provision (a VM size without a GPU); with "
    "--hook also a MIG mode that waits for the caller's reboot\n  10-110  the failure's own "
    "code (`bootfsm codes`); with --hook or --exit-codes cse the CSE code of the same meaning "
    "(docs/provisioning-hook.md)\n",
    "plan": "  0       a run would proceed\n  10-110  the code a run would fail fast with\n",
    "trace": "  0       printed or written (whatever the run's outcome)\n  1       nothing to "
    "read, or the OTLP file or endpoint failed\n  10      invalid config\n",
    "status": "  0       the last run provisioned the node (done)\n  3       a run is in progress "
    "(with --wait: still running when the timeout passed)\n  4       no run has started on "
    "this node (with --wait: none started before the timeout)\n  5       the last run ended "
    "without a verdict (killed, crashed or power lost)\n  10-110  the last run failed or was "
    "interrupted: its own exit code (bootfsm codes)\n",
    "codes": "  0       printed\n",
    "explain": "  0       printed\n  1       no such code\n",
    "graph": "  0       printed\n",
    "validate": "  0       the config is valid\n  10      it is not (the message names the key)\n",
    "demo": "  the simulated run's own exit code\n  2       the simulator is not installed (it is "
    "in the source tree only, never in the wheel)\n",
    "fetch": "  0       every artifact fetched and verified\n  10-110  the failure's code\n",
    "bake": "  0       baked (or already baked)\n  10-110  the failure's code\n",
    "install-unit": "  0       installed\n  102     a file or systemctl step failed\n",
    "uninstall-unit": "  0       removed\n  102     a file or systemctl step failed\n",
    "uninstall": "  0       everything the install records list is undone (or nothing was"
    " listed; --plan: printed)\n  11      another run holds the node lock\n  40      dpkg's"
    " lock stayed held\n  105-106 the state dir or the records file is unsafe\n  108     a"
    " step failed (UNINSTALL_FAILED; the message names it)\n",
    "completion": "  0       printed\n",
    "manpage": "  0       printed\n",
}


class _Help(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the exit-code epilog as written and shows every option's default."""


def _finite(minimum: float) -> Callable[[str], float]:
    """An argparse type: a finite number >= ``minimum`` (nan, inf and 1e309 refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(value) or value < minimum:
            raise argparse.ArgumentTypeError(f"must be a finite number >= {minimum:g}: {text!r}")
        return value

    return parse


def _cmd(sub: Any, name: str, help_: str, common: bool = False) -> argparse.ArgumentParser:
    """A command's parser; ``common``: with --root and --config, the node's."""
    p: argparse.ArgumentParser = sub.add_parser(
        name,
        help=help_,
        description=help_[0].upper() + help_[1:] + ".",
        epilog="exit codes:\n" + EXIT_CODES[name] + _COMMON_CODES,
        formatter_class=_Help,
    )
    if common:
        p.add_argument("--root", default="/", help="node root directory")
        p.add_argument(
            "--config",
            default=None,
            help="config file (default: ROOT/etc/bootfsm/config.toml, optional)",
        )
    return p


def _wait_lock(p: argparse.ArgumentParser) -> None:
    """``--wait-lock SECONDS``: the commands that take the node lock."""
    p.add_argument(
        "--wait-lock",
        type=_finite(0.0),
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run's lock (default: exit at once)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every command."""
    parser = argparse.ArgumentParser(
        prog="bootfsm",
        description="Provision a GPU node into Kubernetes as an explicit state machine.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = _cmd(sub, "run", "provision this node (detect -> ... -> join)", common=True)
    p.add_argument("--json", action="store_true", help="JSON lines on the console")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="global deadline in seconds (overrides run.deadline; env BOOTFSM_DEADLINE too)",
    )
    _wait_lock(p)
    p.add_argument("--quiet", action="store_true", help="print only the summary line")
    p.add_argument(
        "--exit-codes",
        choices=("bootfsm", "cse"),
        default="bootfsm",
        help="exit with bootfsm's own code (default) or the CSE code of the same meaning "
        "(the provisioning hook; `bootfsm codes --json` field cse)",
    )
    p.add_argument(
        "--no-start-kubelet",
        action="store_true",
        help="leave kubelet to systemd (join.start_kubelet = false); bootfsm.service uses it",
    )
    p.add_argument(
        "--hook",
        action="store_true",
        help="run as the cloud provisioning hook (AKS CSE, in place of ensureGPUDrivers): "
        "CSE exit codes, the caller's GPU_* environment over the config (kept in "
        "config.d/50-provisioning-hook.toml), kubelet left to the caller, a MIG mode "
        "change is a reboot request, journals and events where AKS collects them "
        "(docs/provisioning-hook.md)",
    )

    p = _cmd(sub, "plan", "what a run would do, without side effects", common=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("--offline", action="store_true", help="do not fetch manifests or indexes")

    p = _cmd(sub, "trace", "postmortem of a run from its journal", common=True)
    p.add_argument(
        "target", nargs="?", default=None, help="run id or journal file (default: latest)"
    )
    p.add_argument("--json", action="store_true", help="the stable JSON form (docs/trace.md)")
    p.add_argument(
        "--history", action="store_true", help="every run kept on the node, oldest first"
    )
    p.add_argument(
        "--html", default=None, metavar="FILE", help="write the run as one self-contained HTML page"
    )
    p.add_argument(
        "--otlp",
        default=None,
        metavar="FILE|URL",
        help="the run as one OpenTelemetry trace: OTLP/JSON written to FILE, or POSTed to "
        "an http(s) URL (a collector's .../v1/traces; OTEL_EXPORTER_OTLP_HEADERS apply)",
    )
    p.add_argument(
        "--fleet",
        default=None,
        metavar="DIR",
        help="aggregate journals collected from many nodes (DIR/**/*.jsonl)",
    )
    p.add_argument("--top", type=int, default=10, help="with --fleet: slowest runs to list")

    p = _cmd(sub, "status", "state and outcome of the current or last run", common=True)
    p.add_argument("--json", action="store_true")
    p.add_argument("--wait", action="store_true", help="block until the run ends")
    p.add_argument(
        "--timeout", type=_finite(0.0), default=600.0, help="with --wait: give up after SECONDS"
    )

    p = _cmd(sub, "codes", "the exit-code table")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help=argparse.SUPPRESS)

    p = _cmd(sub, "explain", "one exit code: meaning and what to do")
    p.add_argument("code", help="number or name, e.g. 31 or CHECKSUM_MISMATCH")

    p = _cmd(sub, "graph", "render the machine table")
    p.add_argument("--format", choices=("mermaid", "json", "markdown"), default="mermaid")

    _cmd(sub, "validate", "validate a config file", common=True)

    p = _cmd(sub, "demo", "boot a simulated node end to end and print the trace")
    p.add_argument("--sku", default="gb300", help="h100-hgx, h100-pcie, b200-hgx, gb200, gb300")
    p.add_argument("--driver-kind", choices=("cuda", "grid"), default="cuda")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME",
        help="inject a fault (repeatable); --fault list shows them",
    )
    p.add_argument("--keep", default=None, metavar="DIR", help="build the node in DIR and keep it")
    p.add_argument("--json", action="store_true", help="print the trace as JSON")

    p = _cmd(sub, "fetch", "fetch and verify this node's artifacts into the cache", common=True)
    p.add_argument(
        "--prefetch", action="store_true", help="image build: fill the offline cache ahead of time"
    )
    p.add_argument(
        "--kernel",
        action="append",
        default=None,
        metavar="RELEASE",
        help="with --prefetch and driver.source = ubuntu-signed: also this kernel's signed"
        " module (repeatable)",
    )

    p = _cmd(sub, "bake", "image build: prefetch artifacts and prebuild the driver", common=True)
    p.add_argument("--kernel", default=None, help="target kernel (default: newest with headers)")

    p = _cmd(sub, "install-unit", "install and enable systemd/bootfsm.service")
    p.add_argument("--root", default="/", help="image root (systemctl --root, works offline)")
    p.add_argument(
        "--exec",
        default=None,
        metavar="PATH",
        help="bootfsm's path on the node for ExecStart (default: this bootfsm)",
    )
    p.add_argument(
        "--after-hook",
        action="store_true",
        help="on an image the provisioning hook provisions at first boot (AKS): the unit "
        "waits for the hook's first run (docs/provisioning-hook.md)",
    )
    p = _cmd(sub, "uninstall-unit", "disable and remove the bootfsm unit")
    p.add_argument("--root", default="/", help="image root")

    p = _cmd(
        sub, "uninstall", "remove what bootfsm installed, as its install records list", common=True
    )
    p.add_argument("--plan", action="store_true", help="print what would be done; change nothing")
    p.add_argument("--json", action="store_true", help="one JSON document")
    _wait_lock(p)

    p = _cmd(sub, "completion", "print a shell completion script generated from this parser")
    p.add_argument("shell", choices=("bash", "zsh"))
    _cmd(sub, "manpage", "print the bootfsm(1) man page (roff) generated from this parser")
    return parser


# the module of each command not named as its module
_MODULES = {
    "explain": "codes",
    "install-unit": "unit",
    "uninstall-unit": "unit",
    "manpage": "completion",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `bootfsm` console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from bootfsm import __version__

        print(f"bootfsm {__version__}")
        return 0
    if not args.command:
        parser.print_help()
        return 0
    args.cli_parser, args.cli_exit_codes = parser, EXIT_CODES  # commands never import the CLI
    module = importlib.import_module(f"bootfsm.commands.{_MODULES.get(args.command, args.command)}")
    try:
        rc: int = module.main(args)
    except KeyboardInterrupt:  # a run handles SIGINT itself (INTERRUPTED, 12)
        print(f"bootfsm {args.command}: interrupted", file=sys.stderr)
        return 130
    return rc


def entry() -> NoReturn:
    """The console script (and ``python -m bootfsm``): ``main()``, then ``os._exit``; 141 for
    a reader gone (as SIGPIPE), 130 for Ctrl-C before a command runs."""
    try:
        rc = main()
        sys.stdout.flush()
    except BrokenPipeError:
        rc = 128 + signal.SIGPIPE
    except KeyboardInterrupt:
        print("bootfsm: interrupted", file=sys.stderr)
        rc = 130
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.flush()
    # no interpreter teardown (~30 ms per boot): files are closed and fsynced, threads joined
    os._exit(rc)


if __name__ == "__main__":
    entry()
