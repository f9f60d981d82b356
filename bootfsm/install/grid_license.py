"""GRID (vGPU) licences: a GRID node is ready only once every vGPU's licence is acquired.

A GPU whose `nvidia-smi -q -x` report has a ``vgpu_software_licensed_product`` element is
a vGPU guest: verify waits, bounded by ``verify.license_timeout`` and by what is left of
the run's deadline (under the hook, CSE's budget), until its ``license_status`` says
``Licensed``; GRID_NOT_LICENSED else. An unlicensed vGPU is throttled and CUDA reports it
busy (Azure/AKS issues 4870, 4880). A GPU without the element (passed through whole:
virtualization mode Pass-Through or None) never reports a licence: no wait, journaled.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiReport, licensed
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

__all__ = ["no_vgpu", "problems", "wait_licensed", "wanted"]

LAST_QUERY_S = 5.0
"""Seconds of the run's deadline kept for the wait's last `nvidia-smi -q -x`, so that a
licence that never comes ends GRID_NOT_LICENSED, not a bare deadline error."""


def wanted(ctx: Context) -> bool:
    """The node runs a GRID driver (``driver.kind = "grid"``)."""
    return ctx.config.driver.kind == "grid"


def problems(report: SmiReport) -> list[str]:
    """``<bus id>: <License Status>`` of each vGPU not licensed (pure); empty when all are."""
    return [
        f"{g.bus_id}: {g.license_status or '(empty license_status)'}"
        for g in report.gpus
        if g.license_status is not None and not licensed(g.license_status)
    ]


def no_vgpu(report: SmiReport) -> list[str]:
    """``<bus id>: <virtualization mode>`` of each GPU without a licence element (pure)."""
    return [
        f"{g.bus_id}: virtualization mode {g.virtualization_mode or '(none reported)'}"
        for g in report.gpus
        if g.license_status is None
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
    """Wait, bounded, until every vGPU is licensed, starting from ``report``;
    GRID_NOT_LICENSED with what nvidia-smi said last when the wait runs out."""
    cfg = ctx.config.verify
    passthrough = no_vgpu(report)
    if passthrough:
        ctx.event(
            "grid.no_vgpu", gpus=passthrough, reason="no licence element: no licence to wait for"
        )
    last = problems(report)
    if not last:
        return
    left = max(0.0, ctx.remaining() - LAST_QUERY_S)
    bound = (
        f"verify.license_timeout = {cfg.license_timeout:g} s"
        if cfg.license_timeout <= left
        else f"the {left:.0f} s left of the run's deadline ({ctx.deadline.seconds:g} s)"
    )
    timeout = min(cfg.license_timeout, left)
    ctx.event("grid.license_waiting", gpus=last, timeout_s=round(timeout, 1))

    def probe() -> bool | None:
        last[:] = _asked(ctx)
        return True if not last else None

    ctx.wait_until(
        probe,
        timeout=timeout,
        interval=cfg.license_poll_interval,
        on_timeout=lambda: BootError(
            Code.GRID_NOT_LICENSED,
            f"the vGPU licence was not acquired within {bound}: {'; '.join(last)[:500]}",
        ),
    )
    ctx.event("grid.licensed")
