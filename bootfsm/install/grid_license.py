"""GRID (vGPU) licences: a GRID node is ready only once its vGPU licence is acquired.

A vGPU guest starts unlicensed; nvidia-gridd acquires the licence from the licence
server. Until it does the vGPU is throttled after a grace period and CUDA reports the
device busy: AKS's GRID nodes came up "Unlicensed" (Azure/AKS issues 4870 and 4880;
Azure/aks-gpu#90 went back to 535 because 550 installed no nvidia-gridd unit).
`nvidia-smi -q` says it per GPU, in the block its guest guides quote::

    vGPU Software Licensed Product
        Product Name                      : NVIDIA Virtual Compute Server
        License Status                    : Licensed (Expiry: 2025-3-19 7:29:4 GMT)

(``Unlicensed`` as gpu-operator #220 shows it; ``Unlicensed (Unrestricted)`` /
``(Restricted)`` in the grace period and after it). verify waits, bounded by
``verify.license_timeout``, until every GPU says ``Licensed``; GRID_NOT_LICENSED else.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import licensed, parse_smi_query

__all__ = ["problems", "wait_licensed", "wanted"]


def wanted(ctx: Context) -> bool:
    """The node runs a GRID driver (``driver.kind = "grid"``)."""
    return ctx.config.driver.kind == "grid"


def problems(ctx: Context) -> list[str]:
    """One `nvidia-smi -q`: ``<bus id>: <License Status>`` of each GPU not licensed (every
    GPU when the report cannot be read); empty when all are."""
    r = ctx.run(["nvidia-smi", "-q"], timeout=120, die_with_bootfsm=False)  # only reads
    try:
        gpus = parse_smi_query(r.output).gpus if r.ok else ()
    except ParseError:
        gpus = ()
    if not gpus:
        return [f"nvidia-smi -q exit {r.returncode}: {r.output.strip()[-200:] or 'no report'}"]
    return [
        f"{g.bus_id}: {g.license_status or 'no vGPU Software Licensed Product block'}"
        for g in gpus
        if not licensed(g.license_status)
    ]


def wait_licensed(ctx: Context) -> None:
    """Wait until every GPU is licensed (bounded); GRID_NOT_LICENSED with what
    nvidia-smi said last when the wait runs out."""
    cfg = ctx.config.verify
    last = problems(ctx)
    if not last:
        return
    ctx.event("grid.license_waiting", gpus=last, timeout_s=cfg.license_timeout)

    def probe() -> bool | None:
        last[:] = problems(ctx)
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
