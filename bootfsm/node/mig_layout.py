"""A MIG layout (``bootfsm.core.migspec``) laid over one GPU's `-lgip` profiles (pure):
the profile ids `nvidia-smi mig -cgi` gets."""

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
    out: list[int] = []
    for item in items:
        found = next((p for p in profiles if _names(item, p)), None)
        if found is None:
            offered = ", ".join(f"{p.name} ({p.profile_id})" for p in profiles) or "none"
            raise BootError(
                Code.MIG_PROFILE_INVALID,
                f"GPU {gpu.bus_id} ({gpu.product_name}) offers no MIG profile {item}; it offers"
                f" {offered}",
            )
        if item.kind == "slices":  # the uniform layout: as many as the GPU holds
            return [found.profile_id] * found.total
        out.append(found.profile_id)
    _check_room(out, profiles, gpu)
    return out


def _check_room(ids: list[int], profiles: list[GiProfile], gpu: SmiGpu) -> None:
    """MIG_PROFILE_INVALID when the layout asks more instances of a profile than fit."""
    for pid, count in Counter(ids).items():
        total = next(p.total for p in profiles if p.profile_id == pid)
        if count > total:
            raise BootError(
                Code.MIG_PROFILE_INVALID,
                f"GPU {gpu.bus_id} holds at most {total} instance(s) of profile {pid}, not {count}",
            )


def _names(item: MigItem, p: GiProfile) -> bool:
    """Whether the item names this profile: its id, its name, or n slices (no "+me")."""
    if item.kind == "slices":
        return p.name.startswith(f"MIG {item.value}g.") and "+" not in p.name
    return str(p.profile_id) == item.value if item.kind == "id" else p.name == item.value
