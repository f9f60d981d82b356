"""Parse `nvidia-smi mig -lgip`, `-lgi` and `-lci` tables into rows (drivers 510-580).
"No ... found: Not Found" reads as no rows; any other unknown line is a ParseError."""

from __future__ import annotations

import re
from dataclasses import dataclass

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = [
    "ComputeInstance",
    "GiProfile",
    "GpuInstance",
    "parse_lci",
    "parse_lgi",
    "parse_lgip",
]


@dataclass(frozen=True)
class GiProfile:
    """One row of `-lgip`: a GPU instance profile of one GPU."""

    gpu: int
    name: str  # "MIG 1g.10gb"
    profile_id: int
    free: int
    total: int
    memory_gib: float


@dataclass(frozen=True)
class GpuInstance:
    """One row of `-lgi`."""

    gpu: int
    name: str
    profile_id: int
    instance_id: int
    placement: str  # "start:size"


@dataclass(frozen=True)
class ComputeInstance:
    """One row of `-lci`."""

    gpu: int
    gpu_instance_id: int
    name: str
    profile_id: int
    instance_id: int
    placement: str


_RULE = re.compile(r"\+-+\+|\|=+\|")
_NAME = r"(MIG [0-9][0-9a-z.+]*)"
_LGIP_ROW = re.compile(
    rf"\|\s+(\d+)\s+{_NAME}\s+(\d+)\s+(\d+)/(\d+)\s+(\d+(?:\.\d+)?)\s+(?:Yes|No)\s+\d+\s+\d+\s+\d+\s+\|"
)
_LGIP_SECOND = re.compile(r"\|\s+\d+\s+\d+\s+\d+\s+\|")
_LGI_ROW = re.compile(rf"\|\s+(\d+)\s+{_NAME}\s+(\d+)\s+(\d+)\s+(\d+:\d+)\s+\|")
_LCI_ROW = re.compile(rf"\|\s+(\d+)\s+(\d+)\s+{_NAME}\s+(\d+)\s+(\d+)\s+(\d+:\d+)\s+\|")
_HEADER = re.compile(r"\|[A-Za-z0-9/:\s]*\|")


def _body(text: str, what: str, title: str, none: str | None) -> list[str]:
    """The row lines after the ``|===|`` rule, rules dropped; [] for the "none" line."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    if [ln.strip() for ln in lines] == [none]:
        return []
    if not lines:
        raise ParseError(f"nvidia-smi mig {what}: empty output")
    rule = _header_rule(lines, what, title)
    if not lines[-1].startswith("+-"):
        raise ParseError(f"nvidia-smi mig {what}: table not closed (truncated output?)")
    return [ln for ln in lines[rule + 1 :] if _RULE.fullmatch(ln) is None]


def _header_rule(lines: list[str], what: str, title: str) -> int:
    """Index of the ``|===|`` rule under the title and header lines."""
    if len(lines) < 4 or not lines[1].startswith("|") or title not in lines[1]:
        raise ParseError(f"nvidia-smi mig {what}: no {title!r} table: {excerpt(lines[0], 80)}")
    rule = next((i for i, ln in enumerate(lines) if ln.startswith("|===")), None)
    if rule is None:
        raise ParseError(f"nvidia-smi mig {what}: no '|===|' rule under the header")
    for ln in lines[2:rule]:
        if _HEADER.fullmatch(ln) is None:
            raise ParseError(f"nvidia-smi mig {what}: unexpected header line {excerpt(ln, 80)}")
    return rule


def _bad(what: str, line: str) -> ParseError:
    return ParseError(f"nvidia-smi mig {what}: unreadable row {excerpt(line, 100)}")


def parse_lgip(text: str) -> list[GiProfile]:
    """The profiles `nvidia-smi mig -lgip` lists, in its order (every GPU's)."""
    body = _body(text, "-lgip", "GPU instance profiles:", None)
    out: list[GiProfile] = []
    for i, line in enumerate(body):
        if i % 2:  # a profile's second line (CE/JPEG/OFA)
            if _LGIP_SECOND.fullmatch(line) is None:
                raise _bad("-lgip", line)
            continue
        m = _LGIP_ROW.fullmatch(line)
        if m is None:
            raise _bad("-lgip", line)
        free, total = int(m[4]), int(m[5])
        if free > total:
            raise ParseError(
                f"nvidia-smi mig -lgip: {free}/{total} free of total in {excerpt(line, 100)}"
            )
        out.append(GiProfile(int(m[1]), m[2], int(m[3]), free, total, float(m[6])))
    if len(body) % 2:
        raise ParseError("nvidia-smi mig -lgip: a profile row without its second line")
    return out


def parse_lgi(text: str) -> list[GpuInstance]:
    """The GPU instances `nvidia-smi mig -lgi` lists; [] for "No GPU instances found"."""
    body = _body(text, "-lgi", "GPU instances:", "No GPU instances found: Not Found")
    out: list[GpuInstance] = []
    for line in body:
        m = _LGI_ROW.fullmatch(line)
        if m is None:
            raise _bad("-lgi", line)
        out.append(GpuInstance(int(m[1]), m[2], int(m[3]), int(m[4]), m[5]))
    return out


def parse_lci(text: str) -> list[ComputeInstance]:
    """The compute instances `nvidia-smi mig -lci` lists; [] for "No compute instances"."""
    body = _body(text, "-lci", "Compute instances:", "No compute instances found: Not Found")
    out: list[ComputeInstance] = []
    for line in body:
        m = _LCI_ROW.fullmatch(line)
        if m is None:
            raise _bad("-lci", line)
        out.append(ComputeInstance(int(m[1]), int(m[2]), m[3], int(m[4]), int(m[5]), m[6]))
    return out
