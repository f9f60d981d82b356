"""fabric: fabric manager from NVIDIA's redist archive, enabled and running (x86 NVSwitch).

Only entered when ``needs_fabric_manager`` holds. On every other node the transition
callback ``disable_stale_unit`` turns off a fabric manager unit an older image left
enabled, which would otherwise fail at boot and fail provisioning.
"""

from __future__ import annotations

from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError
from bootfsm.store import verified
from bootfsm.units import enabled_state, is_active, systemctl

NAME = "fabric"
UNIT = "nvidia-fabricmanager.service"
START_SCRIPT = "/usr/bin/nvidia-fabricmanager-start.sh"


def _marker(ctx: Context) -> str:
    return f"{ctx.config.run.state_dir}/fabricmanager.version"


def install_map(arch_dir: str) -> list[tuple[str, str]]:
    """(archive path, node destination) pairs, as NVIDIA's package installer places them."""
    nv = "/usr/share/nvidia/nvswitch"
    return [
        ("lib/libnvfm.so.1", f"/usr/lib/{arch_dir}-linux-gnu/libnvfm.so.1"),
        ("lib/libnvfm.so", f"/usr/lib/{arch_dir}-linux-gnu/libnvfm.so"),
        ("bin/nv-fabricmanager", "/usr/bin/nv-fabricmanager"),
        ("bin/nvswitch-audit", "/usr/bin/nvswitch-audit"),
        ("bin/nvidia-fabricmanager-start.sh", START_SCRIPT),
        ("systemd/nvidia-fabricmanager.service", f"/lib/systemd/system/{UNIT}"),
        ("etc/fabricmanager.cfg", f"{nv}/fabricmanager.cfg"),
        ("include/nv_fm_agent.h", "/usr/include/nv_fm_agent.h"),
        ("include/nv_fm_types.h", "/usr/include/nv_fm_types.h"),
        ("LICENSE", "/usr/share/doc/nvidia-fabricmanager/LICENSE"),
    ]


def satisfied(ctx: Context) -> bool:
    """The configured version is installed, the unit enabled and active."""
    installed = (ctx.host.read_text(_marker(ctx)) or "").strip()
    return (
        installed == ctx.config.driver.version
        and enabled_state(ctx, UNIT) == "enabled"
        and is_active(ctx, UNIT)
    )


def _install(ctx: Context) -> None:
    [(art, archive)] = verified(ctx, "fabricmanager")
    dest = f"{ctx.config.run.state_dir}/extract/{art.filename.removesuffix('.tar.xz')}"
    ctx.host.rmtree(dest)
    names = ctx.host.extract_tar(archive, dest)
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        raise BootError(Code.FABRIC_MANAGER_FAILED, f"{art.filename}: expected one top directory")
    top = f"{dest}/{tops.pop()}"
    for src, dst in install_map(ctx.facts.raw_arch):
        if not ctx.host.exists(f"{top}/{src}") and not ctx.host.is_symlink(f"{top}/{src}"):
            raise BootError(Code.FABRIC_MANAGER_FAILED, f"{art.filename} lacks {src}")
        ctx.host.install_file(f"{top}/{src}", dst)
    for topo in ctx.host.listdir(f"{top}/share/nvidia/nvswitch"):
        ctx.host.install_file(
            f"{top}/share/nvidia/nvswitch/{topo}", f"/usr/share/nvidia/nvswitch/{topo}"
        )
    ctx.host.write_atomic(_marker(ctx), ctx.config.driver.version + "\n", 0o600)
    ctx.event("fabricmanager.installed", version=ctx.config.driver.version)


def run(ctx: Context) -> None:
    """Install from the verified archive, enable the unit, start it (NVLSM on NVLink5)."""
    if (ctx.host.read_text(_marker(ctx)) or "").strip() != ctx.config.driver.version:
        _install(ctx)
    code = Code.FABRIC_MANAGER_FAILED
    ctx.require(["ldconfig"], code=code, timeout=120)
    systemctl(ctx, "daemon-reload", code=code)
    systemctl(ctx, "enable", UNIT, code=code)
    if ctx.facts.nvlink5:
        ctx.require(
            [str(ctx.host.path(START_SCRIPT)), "--mode", "start"],
            code=code,
            timeout=180,
            what="nvidia-fabricmanager-start.sh failed (fabric manager + NVLSM)",
        )
    else:
        systemctl(ctx, "start", UNIT, code=code, timeout=180)
    if not is_active(ctx, UNIT):
        raise BootError(code, f"{UNIT} is not active after start")


def disable_stale_unit(ctx: Context) -> None:
    """Transition callback: no fabric manager here, so a unit left enabled is disabled."""
    if enabled_state(ctx, UNIT) != "enabled":
        return
    ctx.warn(f"{UNIT} is enabled on a node without NVSwitch; disabling it")
    systemctl(ctx, "disable", "--now", UNIT, code=Code.FABRIC_MANAGER_FAILED)
