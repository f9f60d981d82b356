"""fabric: fabric manager from NVIDIA's redist archive, enabled and running (x86
NVSwitch, and NVLink5 HGX B200/B300 with NVLSM).

Entered only when ``needs_fabric_manager`` holds; elsewhere ``disable_stale_unit`` turns
off a unit an older image left enabled (it would fail at boot). Fabric manager always
starts through its unit: its start script run by hand leaves the unit inactive.
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import cache_node_path
from bootfsm.fetch.store import resolved, verified
from bootfsm.install import dpkg, records, signed_stack
from bootfsm.install.daemons import FABRIC_MANAGER
from bootfsm.install.units import systemctl
from bootfsm.machine.context import Context

NAME = "fabric"
UNIT = FABRIC_MANAGER.unit
START_SCRIPT = "/usr/bin/nvidia-fabricmanager-start.sh"
NVLSM_BIN = "/opt/nvidia/nvlsm/sbin/nvlsm"
IB_UMAD_LOAD = "/etc/modules-load.d/ib_umad.conf"


def _marker(ctx: Context, what: str = "fabricmanager") -> str:
    return f"{ctx.config.run.state_dir}/{what}.version"


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


NVLSM_DIRS = (("lib", "/opt/nvidia/nvlsm/lib"), ("share/nvidia/nvlsm", "/usr/share/nvidia/nvlsm"))
"""NVLSM archive directories and where their files go (the start script runs
/opt/nvidia/nvlsm/sbin/nvlsm with -F /usr/share/nvidia/nvlsm/nvlsm.conf)."""


def _nvlsm_ok(ctx: Context) -> bool:
    """The resolved NVLSM archive is the one installed, and its binary is in place."""
    want = next((a.filename for a in resolved(ctx) or [] if a.role == "nvlsm"), "")
    have = (ctx.host.read_text(_marker(ctx, "nvlsm")) or "").strip()
    return bool(want) and have == want and ctx.host.exists(NVLSM_BIN)


def _ib_umad_loaded(ctx: Context) -> bool:
    return ctx.host.exists("/sys/module/ib_umad")


def satisfied(ctx: Context) -> bool:
    """The version installed (NVLSM and ib_umad too on NVLink5), the unit enabled and active."""
    installed = (ctx.host.read_text(_marker(ctx)) or "").strip()
    if ctx.facts.nvlink5 and not (_ib_umad_loaded(ctx) and _nvlsm_ok(ctx)):
        return False
    return installed == _want(ctx) and FABRIC_MANAGER.ready(ctx)


def _want(ctx: Context) -> str:
    """The version to run: driver.version, or the signed stack's (driver.source)."""
    if signed_stack.active(ctx):
        return signed_stack.userspace(ctx) or "-"
    return ctx.config.driver.version


def _signed_installed(ctx: Context) -> None:
    """ubuntu-signed: the driver state installed nvidia-fabricmanager-<B> from the
    archive with the rest of the stack; check it and record its version."""
    name = f"nvidia-fabricmanager-{ctx.config.driver.version.split('.', 1)[0]}"
    have = dpkg.installed_version(ctx, name) or ""
    if not have.startswith(_want(ctx) + "-"):
        raise BootError(
            Code.FABRIC_MANAGER_FAILED, f"{name} {_want(ctx)} is not installed (dpkg: {have!r})"
        )
    records.write_file(ctx, _marker(ctx), _want(ctx) + "\n", 0o600)
    ctx.event("fabricmanager.installed", version=_want(ctx), package=name)


def _extract(ctx: Context, role: str, suffix: str, code: Code) -> tuple[str, str]:
    """Extract the verified archive of ``role``: (its file name, its one top directory).
    What is extracted is a private copy (0700 directory) hashed again as it is copied, as
    the runfile and the debs: a swap of the cached file after fetch hashed it is refused."""
    [(art, _cached)] = verified(ctx, role)
    extract = f"{ctx.config.run.state_dir}/extract"
    dest = f"{extract}/{art.filename.removesuffix(suffix)}"
    ctx.host.own_dir(ctx.config.run.state_dir)
    ctx.host.own_dir(extract)
    ctx.host.rmtree(dest)
    archive = ctx.host.private_copy(cache_node_path(ctx.config, art), extract, art.sha256)
    limit = max(64 << 20, 32 * art.size) if art.size else None  # the manifest's size
    try:
        names = ctx.host.extract_tar(
            archive,
            dest,
            max_bytes=limit,
            deadline=ctx.host.monotonic() + ctx.remaining(),
            on_timeout=ctx.time_error,
        )
    finally:
        ctx.host.remove(f"{extract}/{archive.name}")
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) != 1:
        raise BootError(code, f"{art.filename}: expected one top directory")
    return art.filename, f"{dest}/{tops.pop()}"


def _install(ctx: Context) -> None:
    name, top = _extract(ctx, "fabricmanager", ".tar.xz", Code.FABRIC_MANAGER_FAILED)
    files: list[tuple[str, str, int | None]] = []
    for src, dst in install_map(ctx.facts.raw_arch):
        if not ctx.host.exists(f"{top}/{src}") and not ctx.host.is_symlink(f"{top}/{src}"):
            raise BootError(Code.FABRIC_MANAGER_FAILED, f"{name} lacks {src}")
        files.append((f"{top}/{src}", dst, None))
    files += _dir_files(ctx, f"{top}/share/nvidia/nvswitch", "/usr/share/nvidia/nvswitch")
    records.install_files(ctx, files)
    records.write_file(ctx, _marker(ctx), ctx.config.driver.version + "\n", 0o600)
    ctx.event("fabricmanager.installed", version=ctx.config.driver.version)


def _dir_files(ctx: Context, src: str, dst: str) -> list[tuple[str, str, int | None]]:
    return [(f"{src}/{n}", f"{dst}/{n}", None) for n in ctx.host.listdir(src)]


def install_nvlsm(ctx: Context) -> None:
    """Install NVLSM from its verified archive; NVLSM_INSTALL_FAILED when it is incomplete."""
    code = Code.NVLSM_INSTALL_FAILED
    name, top = _extract(ctx, "nvlsm", ".tar.xz", code)
    if not ctx.host.exists(f"{top}/sbin/nvlsm"):
        raise BootError(code, f"{name} lacks sbin/nvlsm")
    files: list[tuple[str, str, int | None]] = [(f"{top}/sbin/nvlsm", NVLSM_BIN, 0o755)]
    for src, dst in NVLSM_DIRS:
        files += _dir_files(ctx, f"{top}/{src}", dst)
    if ctx.host.exists(f"{top}/LICENSE"):
        files.append((f"{top}/LICENSE", "/usr/share/doc/nvlsm/LICENSE", None))
    if not ctx.host.exists(f"{top}/share/nvidia/nvlsm/nvlsm.conf"):  # before any change
        raise BootError(code, f"{name} lacks share/nvidia/nvlsm/nvlsm.conf")
    records.install_files(ctx, files)
    records.write_file(ctx, _marker(ctx, "nvlsm"), name + "\n", 0o600)
    ctx.event("nvlsm.installed", archive=name)


def load_ib_umad(ctx: Context) -> None:
    """Load ib_umad now and at every boot (modules-load.d); IB_UMAD_NOT_LOADED."""
    if ctx.host.read_text(IB_UMAD_LOAD) != "ib_umad\n":
        records.write_file(ctx, IB_UMAD_LOAD, "ib_umad\n")
    if _ib_umad_loaded(ctx):
        return
    r = ctx.run(["modprobe", "ib_umad"], timeout=60)
    if not r.ok or not _ib_umad_loaded(ctx):
        raise BootError(
            Code.IB_UMAD_NOT_LOADED,
            'kernel module "ib_umad" did not load: fabric manager cannot start on NVLink5',
            output=r.output[-1000:],
        )
    records.record_module(ctx, "ib_umad")
    ctx.event("module.loaded", module="ib_umad")


def run(ctx: Context) -> None:
    """Install what is missing (on NVLink5 NVLSM and ib_umad first), start the unit,
    require it active."""
    if (ctx.host.read_text(_marker(ctx)) or "").strip() != _want(ctx):
        _signed_installed(ctx) if signed_stack.active(ctx) else _install(ctx)
    if ctx.facts.nvlink5:  # `--mode start` needs both; the precheck only waits for IB
        if not _nvlsm_ok(ctx):
            install_nvlsm(ctx)
        load_ib_umad(ctx)
    ctx.require(["ldconfig"], code=FABRIC_MANAGER.code, timeout=120)
    systemctl(ctx, "daemon-reload", code=FABRIC_MANAGER.code)
    FABRIC_MANAGER.ensure_running(ctx, reset_failed=True)  # a failed earlier try


def disable_stale_unit(ctx: Context) -> None:
    """Transition callback: no fabric manager here, so a unit left enabled is disabled."""
    if not FABRIC_MANAGER.configured(ctx):
        return
    ctx.warn(f"{UNIT} is enabled on a node without NVSwitch; disabling it")
    FABRIC_MANAGER.disable(ctx)
