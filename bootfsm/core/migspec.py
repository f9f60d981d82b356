"""The grammar of a MIG layout (``mig.profile`` or the VM tag), as ``nvidia-smi mig -cgi``
reads it, plus AgentBaker's uniform ``MIG1g``..``MIG7g``. Pure: only the form is checked;
which profiles exist is the GPU's to say (`-lgip`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = ["MigItem", "parse_mig_layout"]

_ID = re.compile(r"\d{1,2}")
_NAME = re.compile(r"(?:MIG\s+)?(\d{1,2}g\.\d{1,4}gb(?:\+[a-z][a-z0-9.]*)?)")
_SLICES = re.compile(r"MIG([1-8])g", re.IGNORECASE)
MAX_ITEMS = 8  # no MIG GPU holds more than 7 GPU instances (8 memory slices)


@dataclass(frozen=True)
class MigItem:
    """One layout item: a profile id, a profile name ("MIG 1g.10gb") or n slices (MIGng)."""

    kind: Literal["id", "name", "slices"]
    value: str

    def __str__(self) -> str:
        return f"MIG{self.value}g" if self.kind == "slices" else self.value


def parse_mig_layout(text: str) -> tuple[MigItem, ...]:
    """The items of a layout; ValueError naming the bad item on anything else."""
    raw = [p.strip() for p in text.split(",")]
    if any(not p for p in raw):
        raise ValueError(f"empty MIG profile item in {text!r:.80}")
    if len(raw) > MAX_ITEMS:
        raise ValueError(f"{len(raw)} MIG profile items; a GPU holds at most 7 GPU instances")
    items = tuple(_item(part) for part in raw)
    if len(items) > 1 and any(i.kind == "slices" for i in items):
        raise ValueError("MIG1g..MIG7g name a whole uniform layout; do not list them with others")
    return items


def _item(part: str) -> MigItem:
    if _ID.fullmatch(part):
        return MigItem("id", str(int(part)))
    if slices := _SLICES.fullmatch(part):
        return MigItem("slices", slices[1])
    if name := _NAME.fullmatch(part):
        return MigItem("name", f"MIG {name[1]}")
    raise ValueError(
        f"{part!r:.40} is not a MIG profile: expected a profile id (19), a profile"
        " name (1g.10gb or 'MIG 1g.10gb') or MIG1g..MIG7g"
    )
