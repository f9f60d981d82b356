"""verify: the driver answers, every PCI GPU is visible, the NVLink fabric is ready.

Satisfied when one `nvidia-smi -q` shows all of that at once; the action waits
(bounded by verify.fabric_timeout) for a fabric still In Progress.
"""

from __future__ import annotations

from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError, TransientError
from bootfsm.guards import fabric_applies, needs_fabric_manager
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiFailure, SmiReport, classify_smi_failure, parse_smi_query
from bootfsm.units import is_active

NAME = "verify"
FM_UNIT = "nvidia-fabricmanager.service"


def _query(ctx: Context) -> SmiReport:
    r = ctx.run(["nvidia-smi", "-q"], timeout=60)
    failure = classify_smi_failure(r.output)
    if failure is SmiFailure.DRIVER_LIBRARY_MISMATCH:
        raise BootError(
            Code.DRIVER_LIBRARY_MISMATCH,
            "NVML: Driver/library version mismatch",
            output=r.output[-1000:],
        )
    if failure is SmiFailure.INFOROM_CORRUPTED:
        raise BootError(
            Code.INFOROM_CORRUPTED, "nvidia-smi: infoROM is corrupted", output=r.output[-1000:]
        )
    if not r.ok:
        raise TransientError(
            Code.DRIVER_NOT_STARTED, f"nvidia-smi -q exit {r.returncode}: {r.output.strip()[-300:]}"
        )
    try:
        report = parse_smi_query(r.output)
    except ParseError as exc:
        raise TransientError(Code.DRIVER_NOT_STARTED, f"nvidia-smi -q unreadable: {exc}") from exc
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


def _fabric_ready(report: SmiReport) -> bool:
    return all(g.fabric_state == "Completed" and g.fabric_status == "Success" for g in report.gpus)


def _fabric_summary(report: SmiReport) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in report.gpus:
        key = f"{g.fabric_state}/{g.fabric_status}"
        out[key] = out.get(key, 0) + 1
    return out


def satisfied(ctx: Context) -> bool:
    """One query shows the driver, all GPUs, a ready fabric and fabric manager active."""
    try:
        report = _query(ctx)
    except (BootError, TransientError):
        return False
    if fabric_applies(ctx.facts) and not _fabric_ready(report):
        return False
    return not needs_fabric_manager(ctx.facts) or is_active(ctx, FM_UNIT)


def run(ctx: Context) -> None:
    """Query, then wait (bounded) for the fabric; each failure class has its own code."""
    report = _query(ctx)
    if fabric_applies(ctx.facts) and not _fabric_ready(report):
        cfg = ctx.config.verify
        ctx.event("fabric.waiting", fabric=_fabric_summary(report), timeout_s=cfg.fabric_timeout)
        last = [report]

        def probe() -> SmiReport | None:
            last[0] = _query(ctx)
            return last[0] if _fabric_ready(last[0]) else None

        ctx.wait_until(
            probe,
            timeout=cfg.fabric_timeout,
            interval=cfg.fabric_poll_interval,
            on_timeout=lambda: BootError(
                Code.FABRIC_NOT_READY,
                f"fabric not Completed/Success after {cfg.fabric_timeout:g} s: "
                f"{_fabric_summary(last[0])}",
            ),
        )
        ctx.event("fabric.ready")
    if needs_fabric_manager(ctx.facts) and not is_active(ctx, FM_UNIT):
        raise BootError(Code.FABRIC_MANAGER_FAILED, f"{FM_UNIT} is not active")
