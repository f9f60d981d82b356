"""verify: the driver answers, every PCI GPU is visible, the NVLink fabric is ready.

Reads the structured `nvidia-smi -q -x` (the whole output, however many GPUs). The
fabric is judged by what each GPU reports and what its family supports, not by the
guards: Ampere has no GPU fabric probe (Fabric N/A even with NVSwitch and fabric
manager), N/A / Not Supported means no fabric to wait for, any other state must reach
Completed (bounded by verify.fabric_timeout), Completed with a Status other than
Success is final, and a Completed/Success GPU whose Health Summary is Unhealthy is not
ready. Clique id and cluster UUID are journaled per GPU.

Satisfied when one query shows all of that at once (and fabric manager active where
the node needs it).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError, TransientError
from bootfsm.guards import needs_fabric_manager
from bootfsm.hardware import blackwell_or_later, has_fabric_probe, model_for
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import (
    SmiFailure,
    SmiGpu,
    SmiReport,
    classify_smi_failure,
    wrong_module_type,
)
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml
from bootfsm.units import is_active

__all__ = [
    "FabricJudgement",
    "FabricVerdict",
    "fabric_gpus",
    "judge_fabric",
    "run",
    "satisfied",
]

NAME = "verify"
FM_UNIT = "nvidia-fabricmanager.service"
SMI_QUERY = ("nvidia-smi", "-q", "-x")
PROC_VERSION = "/proc/driver/nvidia/version"
NO_FABRIC_STATES = frozenset({"", "N/A", "Not Supported"})
ZERO_UUID = "00000000-0000-0000-0000-000000000000"


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
    """Judge every GPU's Fabric block (pure; the order of precedence is FAILED, WAITING,
    UNHEALTHY, READY, NONE)."""
    failed: list[str] = []
    waiting: list[str] = []
    unhealthy: list[str] = []
    ready = 0
    warnings: list[str] = []
    for g in report.gpus:
        model = model_for(g.device_id) if g.device_id else None
        if model is not None and not has_fabric_probe(model):
            continue  # Ampere: Fabric is N/A by design, fabric manager or not
        state = g.fabric_state
        if state in NO_FABRIC_STATES:
            continue
        if state != "Completed":
            waiting.append(f"{_name(g)}: {state}/{g.fabric_status or '?'}")
        elif g.fabric_status != "Success":
            failed.append(f"{_name(g)}: Completed with Status {g.fabric_status or '(none)'}")
        elif g.health_summary == "Unhealthy":
            unhealthy.append(f"{_name(g)}: Health Summary Unhealthy")
        else:
            ready += 1
            grace_blackwell = (
                model is not None and model.grace and blackwell_or_later(model.device_id)
            )
            if grace_blackwell and g.clique_id == "0" and g.cluster_uuid == ZERO_UUID:
                warnings.append(
                    f"{_name(g)}: CliqueId 0 and an all-zero ClusterUUID on a Grace-Blackwell"
                    " tray (not part of an NVLink domain?)"
                )
    if failed:
        return FabricJudgement(FabricVerdict.FAILED, tuple(failed), tuple(warnings))
    if waiting:
        return FabricJudgement(FabricVerdict.WAITING, tuple(waiting), tuple(warnings))
    if unhealthy:
        return FabricJudgement(FabricVerdict.UNHEALTHY, tuple(unhealthy), tuple(warnings))
    return FabricJudgement(
        FabricVerdict.READY if ready else FabricVerdict.NONE, (), tuple(warnings)
    )


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


def _query(ctx: Context) -> SmiReport:
    r = ctx.run(list(SMI_QUERY), timeout=60)
    failure = classify_smi_failure(r.output)
    if failure is SmiFailure.DRIVER_LIBRARY_MISMATCH:
        raise BootError(
            Code.DRIVER_LIBRARY_MISMATCH, "NVML: Driver/library version mismatch", output=r.tail
        )
    if failure is SmiFailure.INFOROM_CORRUPTED:
        raise BootError(Code.INFOROM_CORRUPTED, "nvidia-smi: infoROM is corrupted", output=r.tail)
    if failure is SmiFailure.NO_DEVICES:
        why = wrong_module_type(
            r.output, [g.device_id for g in ctx.facts.gpus], ctx.host.read_text(PROC_VERSION) or ""
        )
        if why is not None:
            raise BootError(Code.WRONG_MODULE_TYPE, why)
    if not r.ok:
        raise TransientError(
            Code.DRIVER_NOT_STARTED,
            f"nvidia-smi -q -x exit {r.returncode}: {r.tail.strip()[-300:]}",
        )
    try:
        report = parse_smi_xml(r.output)
    except ParseError as exc:
        raise TransientError(
            Code.DRIVER_NOT_STARTED, f"nvidia-smi -q -x unreadable: {exc}"
        ) from exc
    if report.inforom_corrupted:
        raise BootError(
            Code.INFOROM_CORRUPTED, f"infoROM is corrupted on {', '.join(report.inforom_corrupted)}"
        )
    want = len(ctx.facts.gpus)
    if report.attached_gpus != want:
        raise BootError(
            Code.GPU_COUNT_MISMATCH,
            f"nvidia-smi sees {report.attached_gpus} GPU(s); the PCI bus has {want}",
        )
    return report


def _summary(report: SmiReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in report.gpus:
        key = f"{g.fabric_state or '-'}/{g.fabric_status or '-'}"
        if g.health_summary == "Unhealthy":
            key += "/Unhealthy"
        out[key] = out.get(key, 0) + 1
    return out


def satisfied(ctx: Context) -> bool:
    """One query shows the driver, all GPUs, a ready fabric and fabric manager active."""
    try:
        report = _query(ctx)
    except (BootError, TransientError):
        return False
    if not judge_fabric(report).ok:
        return False
    return not needs_fabric_manager(ctx.facts) or is_active(ctx, FM_UNIT)


def _fail_final(judgement: FabricJudgement) -> BootError:
    return BootError(
        Code.FABRIC_STATUS_FAILED,
        "fabric Completed with a Status other than Success (final): "
        + "; ".join(judgement.problems),
    )


def run(ctx: Context) -> None:
    """Query, then wait (bounded) for the fabric; each failure class has its own code."""
    report = _query(ctx)
    judgement = judge_fabric(report)
    if judgement.verdict is FabricVerdict.FAILED:
        ctx.event("fabric.gpus", gpus=fabric_gpus(report))
        raise _fail_final(judgement)
    if not judgement.ok:
        cfg = ctx.config.verify
        ctx.event(
            "fabric.waiting",
            fabric=_summary(report),
            verdict=judgement.verdict.value,
            timeout_s=cfg.fabric_timeout,
        )
        last = [judgement]

        def probe() -> SmiReport | None:
            now = _query(ctx)
            seen = judge_fabric(now)
            last[0] = seen
            if seen.verdict is FabricVerdict.FAILED:
                ctx.event("fabric.gpus", gpus=fabric_gpus(now))
                raise _fail_final(seen)
            return now if seen.ok else None

        def timed_out() -> BootError:
            seen = last[0]
            code = (
                Code.FABRIC_UNHEALTHY
                if seen.verdict is FabricVerdict.UNHEALTHY
                else Code.FABRIC_NOT_READY
            )
            return BootError(
                code,
                f"fabric not ready after {cfg.fabric_timeout:g} s: {'; '.join(seen.problems)}",
            )

        report = ctx.wait_until(
            probe,
            timeout=cfg.fabric_timeout,
            interval=cfg.fabric_poll_interval,
            on_timeout=timed_out,
        )
        judgement = judge_fabric(report)
        ctx.event("fabric.ready")
    if judgement.verdict is FabricVerdict.READY:
        ctx.event("fabric.gpus", gpus=fabric_gpus(report))
    for warning in judgement.warnings:
        ctx.warn(warning)
    if needs_fabric_manager(ctx.facts) and not is_active(ctx, FM_UNIT):
        raise BootError(Code.FABRIC_MANAGER_FAILED, f"{FM_UNIT} is not active")
