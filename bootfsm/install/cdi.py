"""Which `nvidia-ctk cdi generate` failures are harmless (pure).

`nvidia-ctk cdi generate` exits non-zero in one documented harmless case: a GPU in MIG
mode with no MIG instances yet has no device to describe, and the spec's merged ``all``
device ends up empty ("invalid device, empty device edits"). AKS provisions such nodes
and lets the MIG partitioning that follows regenerate the spec (Azure/AgentBaker PR
#8736: "nvidia-ctk exits 1 while MIG mode is on with no instances"; PR #9150 tolerates
the refresh unit's exit codes). The same message on a node with MIG off is a real
failure that hides GPUs from pods (kaito-project/kaito#2326), so the case holds only
when a GPU reports MIG mode Enabled. Everything else stays CDI_REFRESH_FAILED (92).

Both ways of refreshing are judged alike (``refresh_cdi``): `nvidia-ctk cdi generate` by
its own output, and the toolkit's refresh unit (1.18+: nvidia-cdi-refresh.service,
``ExecStart=/usr/bin/nvidia-ctk cdi generate``, Type=oneshot) by what that same command
printed in the failed run, read from the journal of the unit's invocation
(`systemctl show -p InvocationID`, `journalctl _SYSTEMD_INVOCATION_ID=<id> -o cat`):
AgentBaker's drop-in on the unit (``SuccessExitStatus=1 2 127``) accepts the same failure
without looking at it; bootfsm accepts exactly the documented case on either path.
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
           "MIG_NO_INSTANCES", "mig_modes", "refresh_cdi", "tolerated_case",
           "unit_installed"]  # fmt: skip

EMPTY_DEVICE_EDITS = "invalid device, empty device edits"
MIG_NO_INSTANCES = "mig-on-no-instances"
CDI_SPEC = "/etc/cdi/nvidia.yaml"
CDI_TOLERATED = "/run/bootfsm/cdi-tolerated"  # this boot's refresh failed harmlessly
CDI_UNIT = "nvidia-cdi-refresh.service"
CDI_UNIT_DIRS = ("/etc/systemd/system", "/lib/systemd/system", "/usr/lib/systemd/system")


def mig_modes(report_xml: str) -> list[str]:
    """Each GPU's current MIG mode ("Enabled", "Disabled", "N/A") from `nvidia-smi -q -x`,
    in order; empty when it is not a whole report (then the failed `cdi generate` is not
    the tolerated case)."""
    try:
        return [g.mig_current for g in parse_smi_xml(report_xml).gpus]
    except ParseError:
        return []


def tolerated_case(generate_output: str, modes: list[str]) -> str | None:
    """The documented harmless case a failed `cdi generate` is, or None (a failure)."""
    if EMPTY_DEVICE_EDITS in generate_output and "Enabled" in modes:
        return MIG_NO_INSTANCES
    return None


def unit_installed(ctx: Context) -> bool:
    """The toolkit's refresh unit is on the node."""
    return any(ctx.host.exists(f"{d}/{CDI_UNIT}") for d in CDI_UNIT_DIRS)


def _unit_run_output(ctx: Context) -> str:
    """What the refresh unit's last run printed (its invocation's journal); "" when unknown."""
    show = ctx.run(["systemctl", "show", "-p", "InvocationID", CDI_UNIT], timeout=15)
    invocation = show.output.strip().partition("InvocationID=")[2].split()[:1]
    if not invocation or ctx.host.which("journalctl") is None:
        return ""
    argv = ["journalctl", f"_SYSTEMD_INVOCATION_ID={invocation[0]}", "-o", "cat", "--no-pager"]
    return ctx.run([*argv, "-q"], timeout=30, die_with_bootfsm=False).output


def refresh_cdi(ctx: Context) -> None:
    """Regenerate the CDI spec: the toolkit's refresh unit when installed (reset-failed,
    restart), else `nvidia-ctk cdi generate`; CDI_REFRESH_FAILED when it fails, except in
    the tolerated case, on either path."""
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
