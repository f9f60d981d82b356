"""mig: MIG mode current on every GPU and exactly the GPU instances the layout asks for.

The layout is ``mig.profile`` or the VM tag ``mig.tag`` names. A mode left pending (an
A100 in a VM, a GPU held by a client) ends the run with MIG_RESET_REQUIRED; nothing is
ever destroyed on a GPU already right.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import TypeVar

from bootfsm.core.caller import REBOOT_REQUEST
from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.migspec import MigItem, parse_mig_layout
from bootfsm.machine.context import Context
from bootfsm.node.mig_layout import wanted
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiGpu
from bootfsm.parsers.nvidia_smi_mig import parse_lci, parse_lgi, parse_lgip
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

__all__ = ["run", "satisfied"]

NAME = "mig"
SMI = "nvidia-smi"
_PERMANENT = ("Insufficient Resources", "Invalid Argument", "Not Supported")
T = TypeVar("T")


def _layout(ctx: Context) -> tuple[MigItem, ...]:
    text = ctx.facts.mig_profile or ""
    try:
        return parse_mig_layout(text)
    except ValueError as exc:
        raise BootError(
            Code.MIG_PROFILE_INVALID, f"{ctx.facts.mig_profile_source}: {exc}"
        ) from None


def _gpus(ctx: Context) -> tuple[SmiGpu, ...]:
    r = ctx.run([SMI, "-q", "-x"], timeout=60, die_with_bootfsm=False)  # only reads
    if not r.ok:
        raise TransientError(Code.MIG_CONFIG_FAILED, f"nvidia-smi -q -x exit {r.returncode}")
    try:
        return parse_smi_xml(r.output).gpus
    except ParseError as exc:
        raise TransientError(Code.MIG_CONFIG_FAILED, str(exc)) from exc


def _list(ctx: Context, flag: str, parse: Callable[[str], list[T]]) -> list[T]:
    """One `nvidia-smi mig <flag>` table (every GPU); its "none found" line is []."""
    r = ctx.run([SMI, "mig", flag], timeout=60, probe=True)
    try:
        return parse(r.output)
    except ParseError as exc:
        raise BootError(
            Code.MIG_CONFIG_FAILED, f"nvidia-smi mig {flag} exit {r.returncode}: {exc}"
        ) from exc


def _state(ctx: Context, index: int) -> tuple[list[int], bool]:
    """(sorted GPU instance profile ids on GPU ``index``, each has exactly one CI)."""
    gis = [g for g in _list(ctx, "-lgi", parse_lgi) if g.gpu == index]
    cis = [c for c in _list(ctx, "-lci", parse_lci) if c.gpu == index]
    per_gi = Counter(c.gpu_instance_id for c in cis)
    return sorted(g.profile_id for g in gis), per_gi == Counter(g.instance_id for g in gis)


def _plan(ctx: Context, gpus: tuple[SmiGpu, ...]) -> list[list[int]]:
    items = _layout(ctx)
    profiles = _list(ctx, "-lgip", parse_lgip)
    return [wanted(items, [p for p in profiles if p.gpu == i], g) for i, g in enumerate(gpus)]


def _reboot_requested(ctx: Context, gpus: tuple[SmiGpu, ...]) -> bool:
    """A pending mode waits for the reboot this boot already requested
    (REBOOT_REQUEST, the hook's): every run of the boot, so kubelet's Requires= run
    does not fail 26."""
    pending = any(g.mig_current != "Enabled" and g.mig_pending == "Enabled" for g in gpus)
    return pending and ctx.host.exists(REBOOT_REQUEST)


def satisfied(ctx: Context) -> bool:
    """MIG current everywhere and each GPU holds exactly its layout, or a pending mode
    awaits the reboot this boot requested (read-only)."""
    if ctx.facts.mig_profile is None:
        return True
    try:
        gpus = _gpus(ctx)
        if _reboot_requested(ctx, gpus):
            return True
        if not gpus or any(g.mig_current != "Enabled" for g in gpus):
            return False
        plan = _plan(ctx, gpus)
        return all(_state(ctx, i) == (sorted(want), True) for i, want in enumerate(plan))
    except (BootError, TransientError):
        return False


def _enable(ctx: Context, gpus: tuple[SmiGpu, ...]) -> tuple[SmiGpu, ...] | None:
    """`nvidia-smi -i N -mig 1` where off; the GPUs, or None when a mode is left pending."""
    unsupported = [g for g in gpus if g.mig_current in ("", "N/A")]
    if unsupported:
        names = ", ".join(f"{g.bus_id} ({g.product_name})" for g in unsupported)
        raise BootError(Code.MIG_PROFILE_INVALID, f"MIG is not supported (MIG Mode N/A) on {names}")
    for i, g in enumerate(gpus):
        if g.mig_current != "Enabled" and g.mig_pending != "Enabled":
            r = ctx.run([SMI, "-i", str(i), "-mig", "1"], timeout=120)
            ctx.event("mig.enable", gpu=i, bus_id=g.bus_id, rc=r.returncode, output=r.tail[-300:])
            if not r.ok:
                raise BootError(
                    Code.MIG_CONFIG_FAILED, f"nvidia-smi -i {i} -mig 1: {r.tail[-300:]}"
                )
    gpus = _gpus(ctx)
    pending = [g for g in gpus if g.mig_current != "Enabled"]
    if not pending:
        return gpus
    _pending(ctx, pending)
    return None


def _pending(ctx: Context, pending: list[SmiGpu]) -> None:
    """MIG_RESET_REQUIRED, or (mig.on_pending = reboot) a reboot request for the caller."""
    shown = ", ".join(g.bus_id for g in pending[:3]) + (" ..." if len(pending) > 3 else "")
    why = (
        f"MIG mode pending on {len(pending)} GPU(s) ({shown}; Current/Pending"
        f" {pending[0].mig_current}/{pending[0].mig_pending})"
    )
    if ctx.config.mig.on_pending != "reboot":
        raise BootError(Code.MIG_RESET_REQUIRED, f"{why}: reset or reboot required")
    ctx.host.makedirs(REBOOT_REQUEST.rsplit("/", 1)[0], mode=0o755)
    ctx.host.write_atomic(REBOOT_REQUEST, f"{why}\n", 0o644)
    ctx.journal.event("mig.reboot_requested", durable=True, state=ctx.state, reason=why)


def _destroy(ctx: Context, index: int, have: list[int], want: list[int]) -> None:
    ctx.event("mig.reconfigure", gpu=index, have=have, want=sorted(want))
    cis = any(c.gpu == index for c in _list(ctx, "-lci", parse_lci))
    for flag in ("-dci", "-dgi") if cis else ("-dgi",):  # compute instances first
        r = ctx.run([SMI, "mig", "-i", str(index), flag], timeout=120)
        if not r.ok:
            raise BootError(Code.MIG_CONFIG_FAILED, f"nvidia-smi mig {flag}: {r.tail[-400:]}")


def run(ctx: Context) -> None:
    """Enable MIG mode, then create (or recreate) each GPU's instances."""
    ctx.event("mig.profile", profile=ctx.facts.mig_profile, source=ctx.facts.mig_profile_source)
    _layout(ctx)  # a bad layout fails before anything changes
    gpus = _enable(ctx, _gpus(ctx))
    if gpus is None:  # the caller reboots; the next boot's run creates the instances
        return
    for i, want in enumerate(_plan(ctx, gpus)):
        have, cis_ok = _state(ctx, i)
        if (have, cis_ok) == (sorted(want), True):
            ctx.event("mig.gpu_ready", gpu=i, profiles=have, changed=False)
            continue
        if have:
            _destroy(ctx, i, have, want)
        ids = ",".join(map(str, want))
        r = ctx.run([SMI, "mig", "-i", str(i), "-cgi", ids, "-C"], timeout=120)
        if not r.ok:
            code = (
                Code.MIG_PROFILE_INVALID
                if any(w in r.output for w in _PERMANENT)
                else Code.MIG_CONFIG_FAILED
            )
            raise BootError(code, f"nvidia-smi mig -i {i} -cgi {ids} -C: {r.tail[-400:]}")
        ctx.event("mig.gpu_ready", gpu=i, profiles=sorted(want), changed=True)
