"""Driver steps shared by the driver state and ``bootfsm bake``: nouveau off, the toolkit
debs, the DKMS build of the runfile and the checks of what it built.

Bake runs them against an image root; only a boot loads, initializes or unloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.core.hardware import GpuModel, requires_open_module, requires_proprietary_module
from bootfsm.core.node_paths import INSTALLER_LOG
from bootfsm.fetch.artifacts import cache_node_path
from bootfsm.fetch.store import verified
from bootfsm.host.progress import LogWatch, terminal
from bootfsm.install import dpkg, records
from bootfsm.install.marker import module_type_of, parse_modinfo
from bootfsm.machine.context import Context
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_dkms_status

__all__ = [
    "BLACKLIST",
    "BLACKLIST_TEXT",
    "INSTALLER_LOG",
    "OPEN_DEFAULT_BRANCH",
    "blacklist_nouveau",
    "build_module",
    "built",
    "fallback_module_type",
    "install_toolkit",
    "installer_module_args",
    "modprobe_conf_ok",
    "module_problem",
    "nouveau_off",
    "parse_module_type",
    "toolkit_ok",
    "write_modprobe_conf",
]

BLACKLIST = "/etc/modprobe.d/blacklist-nouveau.conf"
BLACKLIST_TEXT = "blacklist nouveau\noptions nouveau modeset=0\n"
OPEN_DEFAULT_BRANCH = 560
"""From this driver branch on, NVIDIA installs the open modules by default, and the
installer takes -M/--kernel-module-type and --print-recommended-kernel-module-type (the
575.57.08 --advanced-options in samples/installer/nvidia-run_help_info_advanced_excerpts
.txt; NVIDIA/gpu-driver-container PR #182: "--kernel-module-type is a new flag and is
only available from R560 onwards", so its driver container still passes -m for 535 and
550, and its GPU Operator docs: auto is not supported with 550 and 535)."""
OPEN_MODULES_BRANCH = 515
"""The first branch whose package carries the open modules (kernel-open/ beside kernel/,
chosen with -m/--kernel-module-build-directory: NVIDIA driver README, "Open Linux Kernel
Modules", "Starting in the 515 driver release series")."""
PROGRESS_EVERY_S = 10.0
"""Seconds between ``driver.progress`` journal events while nvidia-installer builds."""


def toolkit_ok(ctx: Context) -> bool:
    """Every toolkit package is installed at the configured version."""
    want = ctx.config.sources.toolkit_version
    found = dpkg.asked_versions(ctx, ctx.config.sources.toolkit_packages)
    return all(v == want for v in found.values())


def built(ctx: Context) -> bool:
    """`dkms status` lists the configured version installed for ``ctx.facts.kernel``."""
    if ctx.host.which("dkms") is None:
        return False
    r = ctx.run(["dkms", "status", "-m", "nvidia"], timeout=30, probe=True)
    try:
        entries = parse_dkms_status(r.output) if r.ok else []
    except ParseError:
        return False
    return any(
        e.version == ctx.config.driver.version
        and e.kernel == ctx.facts.kernel
        and e.status.startswith("installed")
        for e in entries
    )


def modprobe_conf_ok(ctx: Context, path: str, text: str) -> bool:
    """The modprobe.d file ``path`` says ``text`` and an initramfs was rebuilt since
    (a module loaded from it reads its copy), so a run killed before the rebuild
    redoes it."""
    if ctx.host.read_text(path) != text:
        return False
    written = ctx.host.mtime(path) or 0.0
    images = [ctx.host.mtime(p) or 0.0 for p in ctx.host.glob("/boot/initrd.img-*")]
    return not images or max(images) >= written


def write_modprobe_conf(ctx: Context, path: str, text: str, kernel: str | None) -> None:
    """Write the modprobe.d file (recorded) and rebuild the initramfs (of ``kernel`` when
    given); uninstall rebuilds it again once the file is gone."""
    argv = ["update-initramfs", "-u", *(["-k", kernel] if kernel else [])]
    records.write_file(ctx, path, text, then=argv)
    ctx.require(argv, code=Code.DRIVER_INSTALL_FAILED, timeout=300)


def nouveau_off(ctx: Context) -> bool:
    """The nouveau blacklist is in place and in the initramfs."""
    return modprobe_conf_ok(ctx, BLACKLIST, BLACKLIST_TEXT)


def blacklist_nouveau(ctx: Context, kernel: str | None = None) -> bool:
    """Blacklist nouveau and rebuild the initramfs (of ``kernel`` when given); True if changed."""
    if nouveau_off(ctx):
        return False
    write_modprobe_conf(ctx, BLACKLIST, BLACKLIST_TEXT, kernel)
    return True


def install_toolkit(ctx: Context) -> bool:
    """Install the verified container toolkit debs unless present; True if installed."""
    if toolkit_ok(ctx):
        return False
    order = {n: i for i, n in enumerate(ctx.config.sources.toolkit_packages)}
    debs = sorted(verified(ctx, "toolkit"), key=lambda ap: order.get(ap[0].name, 99))
    dpkg.install_debs(
        ctx,
        dpkg.debs_of(ctx, debs),
        force=["overwrite"],
        code=Code.TOOLKIT_INSTALL_FAILED,
        names=[a.name for a, _ in debs],
    )
    return True


def parse_module_type(text: str) -> str | None:
    """The type `nvidia-installer --print-recommended-kernel-module-type` printed
    (``open`` or ``proprietary``, alone or as ``kernel_module_type=<word>``), or None."""
    for raw in text.splitlines():
        line = raw.strip()
        key, eq, value = line.partition("=")
        word = value.strip() if eq and key.strip() == "kernel_module_type" else line
        if word in ("open", "proprietary"):
            return word
    return None


def _branch(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else OPEN_DEFAULT_BRANCH


def fallback_module_type(version: str, models: Iterable[GpuModel]) -> str:
    """The type to build without a recommendation: ``proprietary`` for a GPU older
    than Turing (open needs GSP), ``open`` from branch 560 or when a GPU needs it,
    else ``proprietary``."""
    gpus = list(models)
    if requires_proprietary_module(gpus):
        return "proprietary"
    if _branch(version) >= OPEN_DEFAULT_BRANCH:
        return "open"
    return "open" if requires_open_module(gpus) else "proprietary"


def installer_module_args(version: str, module_type: str) -> list[str]:
    """The installer option picking ``module_type`` in ``version``'s branch (pure):
    ``--kernel-module-type`` from 560, ``-m=kernel-open``/``-m=kernel`` from 515, none
    before; ValueError for open before 515."""
    branch = _branch(version)
    if branch >= OPEN_DEFAULT_BRANCH:
        return [f"--kernel-module-type={module_type}"]
    if branch >= OPEN_MODULES_BRANCH:
        return [f"-m={'kernel-open' if module_type == 'open' else 'kernel'}"]
    if module_type == "open":
        raise ValueError(f"driver {version} has no open kernel modules (branch 515 and later)")
    return []


def _module_type(ctx: Context, installer: str) -> str:
    mt = ctx.config.driver.module_type
    if mt != "auto":
        return mt
    version = ctx.config.driver.version
    fallback = fallback_module_type(version, [g.model for g in ctx.facts.gpus])
    if _branch(version) < OPEN_DEFAULT_BRANCH:  # no --print-recommended-kernel-module-type
        ctx.event("driver.module_type", module_type=fallback, source="branch")
        return fallback
    r = ctx.run([installer, "--print-recommended-kernel-module-type"], timeout=60, probe=True)
    recommended = parse_module_type(r.output) if r.ok else None
    if recommended is not None:
        ctx.event("driver.module_type", module_type=recommended, source="installer")
        return recommended
    ctx.warn(
        f"installer gave no module type recommendation (exit {r.returncode}); using "
        f"{fallback} (driver {version}: open is the default from branch {OPEN_DEFAULT_BRANCH})",
        output=r.output[-300:],
    )
    return fallback


def build_module(
    ctx: Context,
    module_type: str | None = None,
    extra: Sequence[str] = (),
    *,
    dkms: bool = True,
) -> str:
    """Build the verified runfile's driver for ``ctx.facts.kernel``; return the module
    type.

    ``module_type`` None follows the config; ``extra`` extends the installer's argv;
    ``dkms`` False installs without DKMS, the files recorded instead."""
    kernel = ctx.facts.kernel
    if not ctx.host.exists(f"/lib/modules/{kernel}/build"):
        raise BootError(
            Code.KERNEL_HEADERS_MISSING, f"/lib/modules/{kernel}/build is missing; DKMS needs it"
        )
    [(art, _cached)] = verified(ctx, "runfile")
    extract = f"{ctx.config.run.state_dir}/extract"
    target = f"{extract}/{art.filename.removesuffix('.run')}"
    ctx.host.own_dir(ctx.config.run.state_dir)
    ctx.host.own_dir(extract)  # never a planted link to a directory others can write
    ctx.host.rmtree(target)
    # What runs is a private copy (0700, in a 0700 root directory), hashed as it is
    # copied: a swap of the cached file after its last hash cannot reach the exec.
    runfile = ctx.host.private_copy(cache_node_path(ctx.config, art), extract, art.sha256)
    ctx.require(
        [str(runfile), "-x", "--target", str(ctx.host.path(target))],
        code=Code.DRIVER_INSTALL_FAILED,
        timeout=300,
        what="runfile extraction failed",
    )
    installer = str(ctx.host.path(f"{target}/nvidia-installer"))
    mt = module_type or _module_type(ctx, installer)
    try:
        type_args = installer_module_args(ctx.config.driver.version, mt)
    except ValueError as exc:
        raise BootError(Code.MODULE_TYPE_UNSUPPORTED, str(exc)) from None
    ctx.event("driver.install", version=ctx.config.driver.version, module_type=mt, kernel=kernel)
    watch = LogWatch(
        ctx.host.path(INSTALLER_LOG),
        what="driver",
        label="driver: nvidia-installer building",
        emit=ctx.event,
        status=ctx.status,
        tty=terminal(),
        every_s=PROGRESS_EVERY_S,
        clock=ctx.host.monotonic,
        wall=ctx.host.wall,
    )
    dest = f"/lib/modules/{kernel}/updates/dkms"
    # bake: no DKMS registration, or a CPU node's kernel update builds NVIDIA (aks-gpu#191)
    registration = (
        ["--dkms"] if dkms else ["--no-dkms", f"--kernel-install-path={ctx.host.path(dest)}"]
    )
    modules = [f"{dest}/{m}.ko" for m in ("nvidia", "nvidia-uvm", "nvidia-modeset")]
    before = {} if dkms else {m: records.snapshot(ctx.host, m) for m in modules}
    with watch:
        ctx.require(
            [
                installer,
                "-s",
                "-a",
                "--no-drm",
                *registration,
                f"--kernel-name={kernel}",
                *type_args,
                f"--log-file-name={ctx.host.path(INSTALLER_LOG)}",
                *extra,
            ],
            code=Code.DRIVER_INSTALL_FAILED,
            timeout=ctx.config.driver.command_timeout,
            what="nvidia-installer failed",
        )
    if dkms:
        records.record_dkms(ctx, "nvidia", ctx.config.driver.version, kernel)
    else:
        for path in modules:
            if ctx.host.exists(path):
                records.track(ctx, path, before[path])  # uninstall removes them
    return mt


def module_problem(ctx: Context, module_type: str = "", *, dkms: bool = True) -> str | None:
    """Why the module for ``ctx.facts.kernel`` is unusable, or None when `dkms status`
    (only if ``dkms``) and `modinfo` agree on the version and, if given,
    ``module_type``."""
    version, kernel = ctx.config.driver.version, ctx.facts.kernel
    if dkms and not built(ctx):
        return f"dkms status lists no installed nvidia/{version} for {kernel}"
    if ctx.host.which("modinfo") is None:
        return "modinfo is not on PATH: cannot confirm the module"
    r = ctx.run(["modinfo", "-k", kernel, "nvidia"], timeout=30, probe=True)
    info = parse_modinfo(r.output) if r.ok else {}
    if info.get("version") != version:
        return f"modinfo: nvidia for {kernel} is {info.get('version') or 'absent'}, not {version}"
    if module_type and module_type_of(info) != module_type:
        return f"modinfo: nvidia is {module_type_of(info) or 'of unknown type'}, not {module_type}"
    return None
