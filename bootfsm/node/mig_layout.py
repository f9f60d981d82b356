"""A MIG layout on one GPU: the profile ids `nvidia-smi mig -cgi` gets (pure).

The mig state asks `nvidia-smi mig -lgip` what each GPU offers and lays the configured
layout (``bootfsm.core.migspec``) over it here.
"""

from __future__ import annotations

from collections import Counter

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.core.migspec import MigItem
from bootfsm.parsers.nvidia_smi import SmiGpu
from bootfsm.parsers.nvidia_smi_mig import GiProfile

__all__ = ["wanted"]


def wanted(items: tuple[MigItem, ...], profiles: list[GiProfile], gpu: SmiGpu) -> list[int]:
    """The profile ids of the layout on this GPU; MIG_PROFILE_INVALID for one it lacks."""
    offered = ", ".join(f"{p.name} ({p.profile_id})" for p in profiles) or "none"
    out: list[int] = []
    for item in items:
        if item.kind == "slices":
            n = [
                p
                for p in profiles
                if p.name.startswith(f"MIG {item.value}g.") and "+" not in p.name
            ]
            if n:
                return [n[0].profile_id] * n[0].total
        match = [
            p
            for p in profiles
            if (item.kind == "id" and str(p.profile_id) == item.value)
            or (item.kind == "name" and p.name == item.value)
        ]
        if not match:
            raise BootError(
                Code.MIG_PROFILE_INVALID,
                f"GPU {gpu.bus_id} ({gpu.product_name}) offers no MIG profile {item}; it offers"
                f" {offered}",
            )
        out.append(match[0].profile_id)
    for pid, count in Counter(out).items():
        total = next(p.total for p in profiles if p.profile_id == pid)
        if count > total:
            raise BootError(
                Code.MIG_PROFILE_INVALID,
                f"GPU {gpu.bus_id} holds at most {total} instance(s) of profile {pid}, not {count}",
            )
    return out
