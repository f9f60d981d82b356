"""Fabric blocks as people paste them (`nvidia-smi -q | grep -A N Fabric`), read with the
product's own -q line reader: a test helper for the field excerpts in the samples (no
node runs a pasted block, so this is not product code)."""

from __future__ import annotations

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiGpu
from tests.smi_text import _GpuBuilder, _split

__all__ = ["parse_fabric_block"]


def parse_fabric_block(text: str) -> SmiGpu:
    """Read one pasted Fabric block (as `nvidia-smi -q | grep -A N Fabric` shows it).

    The outer indent may be missing; keys are State, Status, CliqueId, ClusterUUID and
    Health/Summary. The GPU's bus id and product name are "" (a bare block has none).
    ParseError when there is no "Fabric" heading followed by a State line.
    """
    lines = [raw.rstrip() for raw in text.splitlines() if raw.strip()]
    heads = [i for i, line in enumerate(lines) if line.strip() == "Fabric"]
    if not heads:
        raise ParseError("fabric block: no 'Fabric' heading")
    for head in heads:  # the first heading with a State under it (pastes repeat headings)
        base = len(lines[head]) - len(lines[head].lstrip(" "))
        gpu = _GpuBuilder("")
        gpu.feed(4, "Fabric", None)
        for line in lines[head + 1 :]:
            indent, key, value = _split(line)
            if indent <= base:
                break
            gpu.feed(indent - base + 4, key, value)
        built = gpu.build()
        if built.fabric_state:
            return built
    raise ParseError("fabric block: no State line under 'Fabric'")
