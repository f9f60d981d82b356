"""verify: the driver answers, every PCI GPU is visible, the NVLink fabric is ready.

Satisfied when only the loaded driver's libraries resolve (`ldconfig -p`) and one
`nvidia-smi -q -x` shows all of that (fabric manager active where
needed; on GRID every vGPU licensed). A GPU that reports a fabric must reach
Completed/Success, not Unhealthy, within verify.fabric_timeout; N/A is no fabric.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.install import grid_license, libraries
from bootfsm.install.daemons import FABRIC_MANAGER
from bootfsm.install.driver_init import inforom_error
from bootfsm.machine.context import Context
from bootfsm.node.fabric import (
    FabricJudgement,
    FabricVerdict,
    fabric_gpus,
    judge_fabric,
)
from bootfsm.node.guards import needs_fabric_manager
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import (
    SmiFailure,
    SmiReport,
    classify_smi_failure,
    wrong_module_type,
)
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

__all__ = ["run", "satisfied"]

NAME = "verify"
SMI_QUERY = ("nvidia-smi", "-q", "-x")
PROC_VERSION = "/proc/driver/nvidia/version"


def _inforom(ctx: Context) -> None:
    """INFOROM_CORRUPTED when plain `nvidia-smi` warns (`-q -x` exits 0 without it)."""
    r = ctx.run(["nvidia-smi"], timeout=120, die_with_bootfsm=False)  # only reads
    error = inforom_error(r.output, r.returncode)
    if error is not None:
        raise error


def _query(ctx: Context) -> SmiReport:
    r = ctx.run(list(SMI_QUERY), timeout=60, die_with_bootfsm=False)  # only reads
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
    """Fabric manager active (asked first: fabric's postcondition just got the
    answer), and one query shows the driver, all GPUs and a ready fabric."""
    if needs_fabric_manager(ctx.facts) and not FABRIC_MANAGER.running(ctx):
        return False
    try:
        _inforom(ctx)
        report = _query(ctx)
        libraries.require_one_driver(ctx)
    except (BootError, TransientError):
        return False
    if grid_license.wanted(ctx) and grid_license.problems(report):
        return False
    return judge_fabric(report).ok


def skip_reason(ctx: Context) -> str | None:
    """On GRID, the GPUs that report no vGPU licence element (read-only): no licence to
    wait for; None elsewhere (the default reason then)."""
    if not grid_license.wanted(ctx):
        return None
    try:
        passthrough = grid_license.no_vgpu(_query(ctx))
    except (BootError, TransientError):
        return None
    if not passthrough:
        return None
    return f"GRID driver, no vGPU licence element ({'; '.join(passthrough)}): none to wait for"


def _judge(ctx: Context, report: SmiReport) -> FabricJudgement:
    """``judge_fabric``; Completed with a Status other than Success is final:
    FABRIC_STATUS_FAILED."""
    judgement = judge_fabric(report)
    if judgement.verdict is FabricVerdict.FAILED:
        ctx.event("fabric.gpus", gpus=fabric_gpus(report))
        raise BootError(
            Code.FABRIC_STATUS_FAILED,
            "fabric Completed with a Status other than Success (final): "
            + "; ".join(judgement.problems),
        )
    return judgement


def _wait_fabric(ctx: Context, report: SmiReport, judgement: FabricJudgement) -> SmiReport:
    """Query again until the fabric is ready (bounded by verify.fabric_timeout)."""
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
        last[0] = _judge(ctx, now)
        return now if last[0].ok else None

    def timed_out() -> BootError:
        unhealthy = last[0].verdict is FabricVerdict.UNHEALTHY
        return BootError(
            Code.FABRIC_UNHEALTHY if unhealthy else Code.FABRIC_NOT_READY,
            f"fabric not ready after {cfg.fabric_timeout:g} s: {'; '.join(last[0].problems)}",
        )

    return ctx.wait_until(
        probe, timeout=cfg.fabric_timeout, interval=cfg.fabric_poll_interval, on_timeout=timed_out
    )


def run(ctx: Context) -> None:
    """The infoROM, the libraries that resolve, a query, a bounded wait for the fabric
    (and on GRID the licence)."""
    _inforom(ctx)
    libraries.require_one_driver(ctx)  # only the loaded driver's libraries resolve
    report = _query(ctx)
    judgement = _judge(ctx, report)
    if not judgement.ok:
        report = _wait_fabric(ctx, report, judgement)
        judgement = judge_fabric(report)
        ctx.event("fabric.ready")
    if judgement.verdict is FabricVerdict.READY:
        ctx.event("fabric.gpus", gpus=fabric_gpus(report))
    for warning in judgement.warnings:
        ctx.warn(warning)
    if needs_fabric_manager(ctx.facts):
        FABRIC_MANAGER.require_running(ctx)
    if grid_license.wanted(ctx):
        grid_license.wait_licensed(ctx, report)
