"""`bootfsm codes` and `bootfsm explain CODE`: the exit-code table."""

from __future__ import annotations

import argparse
import json
import sys

from bootfsm.codes import CODES, Code, CodeInfo

__all__ = ["lookup", "main"]


def lookup(text: str) -> CodeInfo | None:
    """A table row by number or (case-insensitive) name."""
    key = text.strip()
    if key.isdigit():
        try:
            return CODES[Code(int(key))]
        except ValueError:
            return None
    name = key.upper().replace("-", "_")
    return next((r for r in CODES.values() if r.name == name), None)


def _as_dict(r: CodeInfo) -> dict[str, object]:
    return {
        "code": int(r.code),
        "name": r.name,
        "summary": r.summary,
        "hint": r.hint,
        "transient": r.transient,
    }


def markdown() -> str:
    """docs/codes.md, generated from the table (a test keeps the file in step)."""
    out = [
        "# Exit codes",
        "",
        "Generated from `bootfsm/codes.py` (`bootfsm codes --markdown`); do not edit.",
        "Codes avoid 1-2, 64-78 (sysexits), 124-165 (timeout and signals), 200-244 and 255",
        "(systemd). 83, 84, 85 and 87 mean exactly what the cloud provisioning codes mean.",
        "",
        "| code | name | meaning | what to do | transient |",
        "|---|---|---|---|---|",
    ]
    for r in sorted(CODES.values(), key=lambda r: int(r.code)):
        out.append(
            f"| {int(r.code)} | `{r.name}` | {r.summary} | {r.hint} | "
            f"{'yes' if r.transient else 'no'} |"
        )
    return "\n".join(out) + "\n"


def main(args: argparse.Namespace) -> int:
    """Print the whole table, or explain one code."""
    if args.command == "explain":
        r = lookup(args.code)
        if r is None:
            print(f"bootfsm: unknown exit code {args.code!r}; see `bootfsm codes`", file=sys.stderr)
            return 2
        print(f"{int(r.code)} {r.name}\n  {r.summary}\n  what to do: {r.hint}")
        if r.transient:
            print("  transient: a later run may succeed without changes")
        return 0
    rows = sorted(CODES.values(), key=lambda r: int(r.code))
    if getattr(args, "markdown", False):
        print(markdown(), end="")
        return 0
    if args.json:
        print(json.dumps([_as_dict(r) for r in rows], indent=1))
        return 0
    width = max(len(r.name) for r in rows)
    for r in rows:
        print(f"{int(r.code):>4}  {r.name:<{width}}  {r.summary}")
    return 0
