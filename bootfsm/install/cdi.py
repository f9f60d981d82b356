"""Which `nvidia-ctk cdi generate` failures are harmless (pure).

`nvidia-ctk cdi generate` exits non-zero in one documented harmless case: a GPU in MIG
mode with no MIG instances yet has no device to describe, and the spec's merged ``all``
device ends up empty ("invalid device, empty device edits"). AKS provisions such nodes
and lets the MIG partitioning that follows regenerate the spec (Azure/AgentBaker PR
#8736: "nvidia-ctk exits 1 while MIG mode is on with no instances"; PR #9150 tolerates
the refresh unit's exit codes). The same message on a node with MIG off is a real
failure that hides GPUs from pods (kaito-project/kaito#2326), so the case holds only
when a GPU reports MIG mode Enabled. Everything else stays CDI_REFRESH_FAILED (92).
"""

from __future__ import annotations

from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import parse_smi_query

__all__ = ["EMPTY_DEVICE_EDITS", "MIG_NO_INSTANCES", "mig_modes", "tolerated_case"]

EMPTY_DEVICE_EDITS = "invalid device, empty device edits"
MIG_NO_INSTANCES = "mig-on-no-instances"


def mig_modes(query_text: str) -> list[str]:
    """Each GPU's current MIG mode ("Enabled", "Disabled", "N/A") from `nvidia-smi -q`
    text, read by bootfsm.parsers.nvidia_smi, in order; empty when the text is not a
    whole report (then the failed `cdi generate` is not the tolerated case)."""
    try:
        return [g.mig_current for g in parse_smi_query(query_text).gpus]
    except ParseError:
        return []


def tolerated_case(generate_output: str, modes: list[str]) -> str | None:
    """The documented harmless case a failed `cdi generate` is, or None (a failure)."""
    if EMPTY_DEVICE_EDITS in generate_output and "Enabled" in modes:
        return MIG_NO_INSTANCES
    return None
