"""GRID (vGPU) licences: a GRID node is ready only once every GPU's licence is acquired.

verify waits, bounded by ``verify.license_timeout``, until `nvidia-smi -q -x` shows each
GPU's ``license_status`` as ``Licensed``; GRID_NOT_LICENSED else. An unlicensed vGPU is
throttled and CUDA reports it busy (Azure/AKS issues 4870, 4880).
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiReport, licensed
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

__all__ = ["problems", "wait_licensed", "wanted"]


def wanted(ctx: Context) -> bool:
    """The node runs a GRID driver (``driver.kind = "grid"``)."""
    return ctx.config.driver.kind == "grid"


def problems(report: SmiReport) -> list[str]:
    """``<bus id>: <License Status>`` of each unlicensed GPU (pure); empty when all are."""
    return [
        f"{g.bus_id}: {g.license_status or 'no vgpu_software_licensed_product element'}"
        for g in report.gpus
        if not licensed(g.license_status)
    ]


def _asked(ctx: Context) -> list[str]:
    """``problems`` of a new `nvidia-smi -q -x` (one line when it cannot be read)."""
    r = ctx.run(["nvidia-smi", "-q", "-x"], timeout=120, die_with_bootfsm=False)  # only reads
    try:
        report = parse_smi_xml(r.output) if r.ok else None
    except ParseError:
        report = None
    if report is None or not report.gpus:
        tail = r.output.strip()[-200:] or "no report"
        return [f"nvidia-smi -q -x exit {r.returncode}: {tail}"]
    return problems(report)


def wait_licensed(ctx: Context, report: SmiReport) -> None:
    """Wait, bounded, until every GPU is licensed, starting from ``report``;
    GRID_NOT_LICENSED with what nvidia-smi said last when the wait runs out."""
    cfg = ctx.config.verify
    last = problems(report)
    if not last:
        return
    ctx.event("grid.license_waiting", gpus=last, timeout_s=cfg.license_timeout)

    def probe() -> bool | None:
        last[:] = _asked(ctx)
        return True if not last else None

    ctx.wait_until(
        probe,
        timeout=cfg.license_timeout,
        interval=cfg.license_poll_interval,
        on_timeout=lambda: BootError(
            Code.GRID_NOT_LICENSED,
            f"the vGPU licence was not acquired within verify.license_timeout ="
            f" {cfg.license_timeout:g} s: {'; '.join(last)[:500]}",
        ),
    )
    ctx.event("grid.licensed")
