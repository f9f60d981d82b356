"""Teardown of a prebaked NVIDIA driver: on a node that gets no driver, and of aks-gpu's
staged user-space when this node's driver kind or version differs from the prebake's.

As AgentBaker's ``cleanUpGPUDrivers`` -> ``cleanUpPrebakedGPUDriver`` (and, for a driver
change, ``cleanUpGridNodeCudaPrebake``), read at Azure/AgentBaker 06836ee
(parts/linux/cloud-init/artifacts/ubuntu/cse_install_ubuntu.sh, cse_config.sh, cse_main.sh):
a node with a prebake marker (aks-gpu's /opt/azure/aks-gpu/dkms-marker or bootfsm's) that
installs no driver (a CPU VM size, or a GPU one with the ``SkipGpuDriverInstall`` tag, whose
owner runs the GPU Operator) loses the idle module, the DKMS tree and the modules, the
user-space (aks-gpu's /usr/bin/lib64, the binaries, the prebake's libraries), the linker
entry /etc/ld.so.conf.d/nvidia.conf and every line that would load nvidia at the next boot.
What cannot go (a module in use) stays, journaled, and so does the marker: the next run
tries again. Paths as aks-gpu's install.sh stages them (Azure/aks-gpu dde3239, config.sh
``GPU_DEST=/usr/bin``). bootfsm's own install records are undone first (uninstall.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bootfsm.install.driver_init import device_processes
from bootfsm.install.marker import (
    PEER_MARKER,
    MarkerError,
    marker_path,
    parse_marker,
    parse_peer_marker,
)
from bootfsm.machine.context import Context

__all__ = [
    "AKS_GPU_LDCONF",
    "AKS_GPU_STAGE",
    "BINARIES",
    "Survey",
    "supersede",
    "survey",
    "teardown",
]

AKS_GPU_STAGE = "/usr/bin/lib64"
"""aks-gpu's GPU_DEST/lib64: ``cp -a /tmp/overlay/lib64`` leaves the libraries in lib64/lib64."""
AKS_GPU_LDCONF = "/etc/ld.so.conf.d/nvidia.conf"
"""``echo /usr/bin/lib64 > /etc/ld.so.conf.d/nvidia.conf`` (aks-gpu install.sh)."""
BINARIES = (
    "nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server", "nvidia-modprobe", "nvidia-bug-report.sh", "nvidia-powerd",
    "nvidia-ngx-updater", "nvidia-sleep.sh", "nvidia-gridd",
)  # fmt: skip
"""The driver's binaries in /usr/bin: AgentBaker's list, and GRID's licensing daemon."""
UNLOAD = ("nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "nvidia")
DKMS_TREE = "/var/lib/dkms/nvidia"
_KO_GLOBS = (
    "/lib/modules/*/updates/dkms/nvidia*.ko*",
    "/lib/modules/*/kernel/drivers/video/nvidia*.ko*",
)
_AUTOLOAD = ("/etc/modules", "/etc/modules-load.d/*.conf")
_INITRAMFS_MODULES = "/etc/initramfs-tools/modules"


@dataclass(frozen=True)
class Survey:
    """The prebake found before anything is removed: its markers and driver versions."""

    markers: tuple[str, ...] = ()
    versions: tuple[str, ...] = ()
    kinds: tuple[str, ...] = ()


@dataclass
class _Done:
    removed: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)


def survey(ctx: Context) -> Survey:
    """The markers on the node and the driver versions they and the DKMS tree name (read-only)."""
    host, markers, versions, kinds = ctx.host, [], [], []
    for path, parse in ((marker_path(ctx.config), parse_marker), (PEER_MARKER, parse_peer_marker)):
        text = host.read_text(path)
        if text is None:
            continue
        markers.append(path)
        try:
            m = parse(text)
        except MarkerError:
            continue
        versions.append(m.driver_version)
        kinds.append(m.driver_kind)
    versions += host.listdir(DKMS_TREE)
    return Survey(tuple(markers), tuple(dict.fromkeys(versions)), tuple(dict.fromkeys(kinds)))


def _remove(ctx: Context, path: str, done: _Done, tree: bool = False) -> None:
    if not (ctx.host.exists(path) or ctx.host.is_symlink(path)):
        return
    if tree:
        ctx.host.rmtree(path)
    else:
        ctx.host.remove(path)
    done.removed.append(path)
    ctx.event("teardown.remove", path=path)


def _libraries(ctx: Context, versions: tuple[str, ...], done: _Done) -> None:
    """The given driver versions' libraries in the multiarch directory and the SONAME
    links left pointing at nothing."""
    libdir = f"/usr/lib/{ctx.facts.raw_arch}-linux-gnu"
    for v in versions:
        for path in ctx.host.glob(f"{libdir}/lib*.so.{v}"):
            _remove(ctx, path, done)
    for path in ctx.host.glob(f"{libdir}/lib*.so.1"):
        target = ctx.host.readlink(path) if ctx.host.is_symlink(path) else None
        if target is not None and not ctx.host.exists(path):
            _remove(ctx, path, done)


def _staged(ctx: Context, done: _Done) -> bool:
    """aks-gpu's staging directory and its linker entry; True when anything went."""
    before = len(done.removed)
    _remove(ctx, AKS_GPU_STAGE, done, tree=True)
    _remove(ctx, AKS_GPU_LDCONF, done)
    return len(done.removed) > before


def _unload(ctx: Context, done: _Done) -> None:
    """Unload the idle modules, dependents first; a module in use stays (kept)."""
    if not ctx.host.exists("/sys/module/nvidia"):
        return
    holders = device_processes(ctx)
    if not holders:
        for module in UNLOAD:
            if ctx.host.exists(f"/sys/module/{module}"):
                r = ctx.run(["modprobe", "-r", module], timeout=60)
                ctx.event("teardown.unload", module=module, ok=r.ok, rc=r.returncode)
    if ctx.host.exists("/sys/module/nvidia"):
        held = f" (held by {', '.join(holders[:10])})" if holders else ""
        done.kept.append(f"module nvidia{held}")


def _autoload_lines(ctx: Context, done: _Done) -> bool:
    """Lines naming an NVIDIA module in modules-load.d, /etc/modules and initramfs-tools'
    list go (a file left with no module at all goes); True when the initramfs list changed."""
    initramfs = False
    for path in [p for g in (*_AUTOLOAD, _INITRAMFS_MODULES) for p in ctx.host.glob(g)]:
        text = ctx.host.read_text(path) or ""
        lines = text.splitlines(keepends=True)
        keep = [ln for ln in lines if not ln.split("#", 1)[0].strip().startswith("nvidia")]
        if keep == lines:
            continue
        if "modules-load.d/" in path and not any(ln.split("#", 1)[0].strip() for ln in keep):
            _remove(ctx, path, done)
        else:
            st = ctx.host.stat(path)
            ctx.host.write_atomic(path, "".join(keep), st.st_mode & 0o7777 if st else 0o644)
            done.removed.append(f"{path}: nvidia lines")
            ctx.event("teardown.edit", path=path, lines=len(lines) - len(keep))
        initramfs = initramfs or path == _INITRAMFS_MODULES
    return initramfs


def teardown(ctx: Context, found: Survey) -> str:
    """Remove the prebake ``found`` describes (module docstring): ``cleaned``, ``incomplete``
    (what stayed is warned; the markers kept) or ``none`` (no marker: nothing done)."""
    if not found.markers:
        return "none"
    done = _Done()
    ctx.event("teardown.start", markers=list(found.markers), versions=list(found.versions))
    _unload(ctx, done)
    _remove(ctx, DKMS_TREE, done, tree=True)
    for path in [p for g in _KO_GLOBS for p in ctx.host.glob(g)]:
        _remove(ctx, path, done)
    _staged(ctx, done)
    for name in BINARIES:
        _remove(ctx, f"/usr/bin/{name}", done)
    _libraries(ctx, found.versions, done)
    if _autoload_lines(ctx, done):
        ctx.run(["update-initramfs", "-u", "-k", "all"], timeout=300)
    r = ctx.run(["ldconfig"], timeout=120)
    if not r.ok:
        done.kept.append(f"linker cache (ldconfig exit {r.returncode})")
    done.kept += [p for p in (DKMS_TREE, "/usr/bin/nvidia-modprobe") if ctx.host.exists(p)]
    if not done.kept:
        for path in found.markers:
            _remove(ctx, path, done)
    status = "incomplete" if done.kept else "cleaned"
    ctx.journal.event(
        "teardown.done", durable=True, status=status, removed=len(done.removed),
        kept=done.kept, markers_kept=list(found.markers) if done.kept else [],
    )  # fmt: skip
    if done.kept:
        ctx.warn(f"prebaked driver teardown incomplete: {', '.join(done.kept)} stayed; "
                 "the marker stays so the next run tries again")  # fmt: skip
    return status


def supersede(ctx: Context) -> list[str]:
    """Before this node's driver is built over an aks-gpu prebake of another kind or
    version: the prebake's staged user-space, linker entry, libraries and marker go, so only
    the new driver's libraries resolve (Azure/AKS#5860, #5869, #5871). Returns what went."""
    text = ctx.host.read_text(PEER_MARKER)
    try:
        peer = parse_peer_marker(text) if text is not None else None
    except MarkerError:
        peer = None
    cfg = ctx.config.driver
    staged = [v for p in ctx.host.glob(f"{AKS_GPU_STAGE}/lib64/libnvidia-ml.so.*")
              if (v := p.rsplit(".so.", 1)[1]) != "1"]  # fmt: skip
    old = [peer.driver_version] if peer is not None else []
    old += [v for v in staged if v not in old]
    differs = peer is not None and (peer.driver_kind, peer.driver_version) != (
        cfg.kind,
        cfg.version,
    )
    if not differs and all(v == cfg.version for v in old):
        return []
    done = _Done()
    _staged(ctx, done)
    _libraries(ctx, tuple(v for v in old if v != cfg.version), done)
    if peer is not None:
        _remove(ctx, PEER_MARKER, done)
    ctx.event(
        "driver.superseded",
        prebake=old,
        kind=peer.driver_kind if peer else "",
        removed=done.removed,
    )
    return done.removed
