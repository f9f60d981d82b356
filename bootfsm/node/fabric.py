"""How ready each GPU's NVLink fabric is, judged from what it reports and its family.

Pure: a parsed ``nvidia-smi -q -x`` report in, a verdict out; the verify state waits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bootfsm.core.hardware import blackwell_or_later, has_fabric_probe, model_for
from bootfsm.core.strenum import StrEnum
from bootfsm.parsers.nvidia_smi import SmiGpu, SmiReport

__all__ = [
    "FabricJudgement",
    "FabricVerdict",
    "fabric_gpus",
    "judge_fabric",
]

_NO_FABRIC_STATES = frozenset({"", "N/A", "Not Supported"})
_ZERO_UUID = "00000000-0000-0000-0000-000000000000"


class FabricVerdict(StrEnum):
    """What the GPUs' Fabric blocks say about the node as a whole."""

    NONE = "none"  # no GPU has a fabric to wait for
    READY = "ready"  # every GPU with a fabric is Completed/Success and not Unhealthy
    WAITING = "waiting"  # some GPU is still In Progress / Not Started / ...
    UNHEALTHY = "unhealthy"  # Completed/Success, Health Summary Unhealthy
    FAILED = "failed"  # Completed with a Status other than Success: final


@dataclass(frozen=True)
class FabricJudgement:
    """The verdict, the GPUs that keep it from ready, and findings worth a warning."""

    verdict: FabricVerdict
    problems: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing is left to wait for."""
        return self.verdict in (FabricVerdict.NONE, FabricVerdict.READY)


def _name(g: SmiGpu) -> str:
    return g.bus_id or g.product_name or "GPU"


def judge_fabric(report: SmiReport) -> FabricJudgement:
    """The node's verdict: the first of FAILED, WAITING, UNHEALTHY, READY, NONE any GPU has."""
    problems: dict[FabricVerdict, list[str]] = {}
    warnings: list[str] = []
    for g in report.gpus:
        verdict, problem = _judge_gpu(g)
        problems.setdefault(verdict, []).append(problem)
        if verdict is FabricVerdict.READY and _outside_nvlink_domain(g):
            warnings.append(
                f"{_name(g)}: CliqueId 0 and an all-zero ClusterUUID on a Grace-Blackwell"
                " tray (not part of an NVLink domain?)"
            )
    for verdict in (FabricVerdict.FAILED, FabricVerdict.WAITING, FabricVerdict.UNHEALTHY):
        if verdict in problems:
            return FabricJudgement(verdict, tuple(problems[verdict]), tuple(warnings))
    verdict = FabricVerdict.READY if FabricVerdict.READY in problems else FabricVerdict.NONE
    return FabricJudgement(verdict, (), tuple(warnings))


def _judge_gpu(g: SmiGpu) -> tuple[FabricVerdict, str]:
    """One GPU's verdict, and what keeps it from ready ("" when nothing does)."""
    model = model_for(g.device_id) if g.device_id else None
    if g.fabric_state in _NO_FABRIC_STATES or (model is not None and not has_fabric_probe(model)):
        return FabricVerdict.NONE, ""  # Ampere: Fabric is N/A by design, fabric manager or not
    if g.fabric_state != "Completed":
        return FabricVerdict.WAITING, f"{_name(g)}: {g.fabric_state}/{g.fabric_status or '?'}"
    if g.fabric_status != "Success":
        return (
            FabricVerdict.FAILED,
            f"{_name(g)}: Completed with Status {g.fabric_status or '(none)'}",
        )
    if g.health_summary == "Unhealthy":
        return FabricVerdict.UNHEALTHY, f"{_name(g)}: Health Summary Unhealthy"
    return FabricVerdict.READY, ""


def _outside_nvlink_domain(g: SmiGpu) -> bool:
    model = model_for(g.device_id) if g.device_id else None
    grace_blackwell = model is not None and model.grace and blackwell_or_later(model.device_id)
    return grace_blackwell and g.clique_id == "0" and g.cluster_uuid == _ZERO_UUID


def fabric_gpus(report: SmiReport) -> list[dict[str, Any]]:
    """Per-GPU fabric facts for the journal (bus id, state, status, clique, cluster, health)."""
    return [
        {
            "bus_id": g.bus_id,
            "state": g.fabric_state,
            "status": g.fabric_status,
            "clique_id": g.clique_id,
            "cluster_uuid": g.cluster_uuid,
            "health": g.health_summary,
        }
        for g in report.gpus
    ]
