"""Command line: parse arguments and dispatch; each command lives in bootfsm/commands/.

Only argparse is imported at start-up; a command's module (and its heavy imports) loads
when that command runs, so `bootfsm --help` and `bootfsm codes` start fast.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


_STATUS_EPILOG = """exit codes (bootfsm/commands/status.py, docs/trace.md):
  0       the last run provisioned the node (done)
  3       a run is in progress (with --wait: still running when the timeout passed)
  4       no run has started on this node (with --wait: none started before the timeout)
  5       the last run ended without a verdict (killed, crashed or power lost)
  10-110  the last run failed or was interrupted: its own exit code (bootfsm codes)
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/", help="node root directory (default: /)")
    p.add_argument(
        "--config",
        default=None,
        help="config file (default: ROOT/etc/bootfsm/config.toml, optional)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every command."""
    parser = argparse.ArgumentParser(
        prog="bootfsm",
        description="Provision a GPU node into Kubernetes as an explicit state machine.",
    )
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="provision this node (detect -> ... -> join)")
    _common(p)
    p.add_argument("--json", action="store_true", help="JSON lines on the console")
    p.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="global deadline in seconds (overrides run.deadline; env BOOTFSM_DEADLINE too)",
    )
    p.add_argument(
        "--wait-lock",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait this long for another run's lock (default: exit at once)",
    )
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

    p = sub.add_parser("plan", help="what a run would do, without side effects")
    _common(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--offline", action="store_true", help="do not fetch manifests or indexes")

    p = sub.add_parser("trace", help="postmortem of a run from its journal")
    _common(p)
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

    p = sub.add_parser(
        "status",
        help="state and outcome of the current or last run",
        epilog=_STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _common(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--wait", action="store_true", help="block until the run ends")
    p.add_argument(
        "--timeout", type=float, default=600.0, help="with --wait: give up after SECONDS"
    )

    p = sub.add_parser("codes", help="the exit-code table")
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help=argparse.SUPPRESS)

    p = sub.add_parser("explain", help="one exit code: meaning and what to do")
    p.add_argument("code", help="number or name, e.g. 31 or CHECKSUM_MISMATCH")

    p = sub.add_parser("graph", help="render the machine table")
    p.add_argument("--format", choices=("mermaid", "json", "markdown"), default="mermaid")

    p = sub.add_parser("validate", help="validate a config file")
    _common(p)

    p = sub.add_parser("demo", help="boot a simulated node end to end and print the trace")
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

    p = sub.add_parser("fetch", help="fetch and verify this node's artifacts into the cache")
    _common(p)
    p.add_argument(
        "--prefetch", action="store_true", help="image build: fill the offline cache ahead of time"
    )

    p = sub.add_parser("bake", help="image build: prefetch artifacts and prebuild the driver")
    _common(p)
    p.add_argument("--kernel", default=None, help="target kernel (default: newest with headers)")

    p = sub.add_parser("install-unit", help="install and enable systemd/bootfsm.service")
    p.add_argument("--root", default="/", help="image root (systemctl --root, works offline)")
    p.add_argument(
        "--exec",
        default=None,
        metavar="PATH",
        help="bootfsm's path on the node for ExecStart (default: this bootfsm)",
    )
    p = sub.add_parser("uninstall-unit", help="disable and remove the bootfsm unit")
    p.add_argument("--root", default="/", help="image root")
    return parser


_COMMANDS = {
    "run": "run",
    "plan": "plan",
    "trace": "trace",
    "status": "status",
    "codes": "codes",
    "explain": "codes",
    "graph": "graph",
    "validate": "validate",
    "demo": "demo",
    "fetch": "fetch",
    "bake": "bake",
    "install-unit": "unit",
    "uninstall-unit": "unit",
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
    module = importlib.import_module(f"bootfsm.commands.{_COMMANDS[args.command]}")
    rc: int = module.main(args)
    return rc


if __name__ == "__main__":
    sys.exit(main())
