"""`bootfsm codes` and `bootfsm explain CODE`: the exit-code table."""

from __future__ import annotations

import argparse
import json
import sys

from bootfsm.core.codes import CODES, Code, CodeInfo
from bootfsm.core.cse import CSE_NAMES, cse_exit

__all__ = ["cse_markdown", "lookup", "main", "markdown"]


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
        "cse": cse_exit(r.code),
        "cse_name": CSE_NAMES.get(cse_exit(r.code), ""),
        "cse_in_state": dict(r.cse_in_state),
    }


def _cse_cell(r: CodeInfo) -> str:
    """``84`` or ``85 (83 in fetch)``: the CSE exit code of a row, as the docs show it."""
    text = str(cse_exit(r.code))
    if r.cse_in_state:
        text += " (" + ", ".join(f"{c} in {s}" for s, c in r.cse_in_state) + ")"
    return text


def cse_markdown() -> str:
    """The code-mapping table of docs/provisioning-hook.md (a test keeps it in step)."""
    out = [
        "| CSE exit | AgentBaker name | bootfsm codes (the summary line names which) |",
        "|---|---|---|",
    ]
    rows = sorted(CODES.values(), key=lambda r: int(r.code))
    for number in sorted(
        {cse_exit(r.code) for r in rows} | {c for r in rows for _, c in r.cse_in_state}
    ):
        names = []
        for r in rows:
            if cse_exit(r.code) == number:
                names.append(f"`{int(r.code)} {r.name}`")
            for state, c in r.cse_in_state:
                if c == number:
                    names.append(f"`{int(r.code)} {r.name}` (in state {state})")
        out.append(f"| {number} | `{CSE_NAMES.get(number, '?')}` | {', '.join(names)} |")
    return "\n".join(out) + "\n"


def markdown() -> str:
    """docs/codes.md, generated from the table (a test keeps the file in step)."""
    out = [
        "# Exit codes",
        "",
        "Generated from `bootfsm/core/codes.py` (`bootfsm codes --markdown`); do not edit.",
        "Codes avoid 1-2, 64-78 (sysexits), 124-165 (timeout and signals), 200-244 and 255",
        "(systemd). 83, 84, 85 and 87 mean exactly what the cloud provisioning codes mean.",
        "The CSE column is the exit code of `bootfsm run --exit-codes cse` (the provisioning",
        "hook, docs/provisioning-hook.md): AgentBaker's code of the same meaning.",
        "",
        "| code | name | meaning | what to do | transient | CSE |",
        "|---|---|---|---|---|---|",
    ]
    for r in sorted(CODES.values(), key=lambda r: int(r.code)):
        out.append(
            f"| {int(r.code)} | `{r.name}` | {r.summary} | {r.hint} | "
            f"{'yes' if r.transient else 'no'} | {_cse_cell(r)} |"
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
        cse = cse_exit(r.code)
        where = "".join(f"; {c} {CSE_NAMES.get(c, '')} in state {s}" for s, c in r.cse_in_state)
        print(f"  CSE exit (--exit-codes cse): {cse} {CSE_NAMES.get(cse, '')}{where}")
        return 0
    rows = sorted(CODES.values(), key=lambda r: int(r.code))
    if getattr(args, "markdown", False):
        print(markdown(), end="")
        return 0
    if args.json:
        doc = {"schema": 1, "kind": "codes", "codes": [_as_dict(r) for r in rows]}
        print(json.dumps(doc, indent=1))
        return 0
    width = max(len(r.name) for r in rows)
    for r in rows:
        print(f"{int(r.code):>4}  {r.name:<{width}}  {r.summary}")
    return 0
