"""Which `nvidia-ctk cdi generate` failures are harmless (pure), the CDI refresh, and
whether this boot's spec is fresh.

Only "invalid device, empty device edits" while a GPU is in MIG mode with no instances
yet (Azure/AgentBaker PR #8736); anything else is CDI_REFRESH_FAILED (92). A failed
refresh unit is judged by what its run of `cdi generate` printed (its journal), alike.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import CommandError
from bootfsm.install import records
from bootfsm.install.units import reset_failed
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi_xml import parse_smi_xml

__all__ = ["CDI_SPEC", "CDI_TOLERATED", "CDI_UNIT", "CDI_UNIT_DIRS", "EMPTY_DEVICE_EDITS",
           "MIG_NO_INSTANCES", "mig_modes", "refresh_cdi", "spec_fresh",
           "tolerated_case", "unit_installed"]  # fmt: skip

EMPTY_DEVICE_EDITS = "invalid device, empty device edits"
MIG_NO_INSTANCES = "mig-on-no-instances"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
CDI_TOLERATED = "/run/bootfsm/cdi-tolerated"  # this boot's refresh failed harmlessly
CDI_UNIT = "nvidia-cdi-refresh.service"
CDI_UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def mig_modes(report_xml: str) -> list[str]:
    """Each GPU's current MIG mode from `nvidia-smi -q -x`, in order; [] when not a
    whole report (then the failure is not the tolerated case)."""
    try:
        return [g.mig_current for g in parse_smi_xml(report_xml).gpus]
    except ParseError:
        return []


def tolerated_case(generate_output: str, modes: list[str]) -> str | None:
    """The documented harmless case a failed `cdi generate` is, or None (a failure)."""
    # with MIG off the same message is a real failure that hides GPUs (kaito#2326)
    if EMPTY_DEVICE_EDITS in generate_output and "Enabled" in modes:
        return MIG_NO_INSTANCES
    return None


def unit_installed(ctx: Context) -> bool:
    """The toolkit's refresh unit is on the node."""
    return any(ctx.host.exists(f"{d}/{CDI_UNIT}") for d in CDI_UNIT_DIRS)


def spec_fresh(ctx: Context) -> bool:
    """Read-only: the refresh unit is installed (its spec is its own, per boot), or a CDI
    spec (or this boot's tolerated-failure mark) is newer than this boot's
    /dev/nvidia-uvm (devtmpfs), so every boot regenerates it."""
    if unit_installed(ctx):
        return True
    uvm = ctx.host.mtime("/dev/nvidia-uvm")
    spec = max((ctx.host.mtime(p) or -1.0 for p in (CDI_SPEC, CDI_TOLERATED)), default=-1.0)
    return uvm is not None and spec >= uvm


def _unit_run_output(ctx: Context) -> str:
    """What the refresh unit's last run printed (its invocation's journal); "" when unknown."""
    show = ctx.run(["systemctl", "show", "-p", "InvocationID", CDI_UNIT], timeout=15)
    invocation = show.output.strip().partition("InvocationID=")[2].split()[:1]
    if not invocation or ctx.host.which("journalctl") is None:
        return ""
    argv = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation[0]}", "-o", "cat", "--no-pager"]
    return ctx.run([*argv, "-q"], timeout=30, die_with_bootfsm=False).output


def refresh_cdi(ctx: Context) -> None:
    """Regenerate the CDI spec (the refresh unit when installed, else `nvidia-ctk cdi
    generate`); CDI_REFRESH_FAILED unless the tolerated case."""
    if unit_installed(ctx):
        reset_failed(ctx, CDI_UNIT, "nvidia-cdi-refresh.path")
        argv = ["systemctl", "restart", CDI_UNIT]
        r = ctx.run(argv, timeout=60, die_with_bootfsm=False)  # PID 1 runs the job
        if not r.ok:
            output = _unit_run_output(ctx) if not r.timed_out else ""
            _judge(ctx, argv, r.returncode, r.timed_out, f"{r.output}{output}", "CDI refresh")
        return
    ctx.host.makedirs(CDI_SPEC.rsplit("/", 1)[0])
    argv = ["nvidia-ctk", "cdi", "generate", f"--output={ctx.host.path(CDI_SPEC)}"]
    before = records.snapshot(ctx.host, CDI_SPEC)
    r = ctx.run(argv, timeout=120)
    if r.ok:
        records.track(ctx, CDI_SPEC, before)
        return
    what = "CDI refresh (nvidia-ctk cdi generate)"
    _judge(ctx, argv, r.returncode, r.timed_out, r.output, what)


def _judge(ctx: Context, argv: list[str], rc: int, timed_out: bool, output: str, what: str) -> None:
    """A failed refresh: the tolerated case journaled and marked, else CDI_REFRESH_FAILED."""
    smi = (
        ctx.run(["nvidia-smi", "-q", "-x"], timeout=120, die_with_bootfsm=False)
        if EMPTY_DEVICE_EDITS in output and not timed_out
        else None
    )
    case = tolerated_case(output, mig_modes(smi.output) if smi and smi.ok else [])
    if case is None or timed_out:
        code = ctx.state_row.timeout_code if timed_out and ctx.state_row else None
        raise CommandError(
            code or Code.CDI_REFRESH_FAILED, argv, rc, output[-1500:], f"{what} failed"
        )
    ctx.event("cdi.tolerated", case=case, rc=rc, output=output[-500:], via=argv[0])
    ctx.host.makedirs(CDI_TOLERATED.rsplit("/", 1)[0], mode=0o700)
    ctx.host.write_atomic(CDI_TOLERATED, f"{case}\n", 0o600)
    ctx.warn(
        f"{what} exit {rc} tolerated ({case}): MIG mode is on with no MIG instances yet;"
        " partitioning them regenerates the spec"
    )
