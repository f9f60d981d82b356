"""Image build ("bake"): fetch verified artifacts and prebuild the driver; the bake marker.

A bake is an engine run in a run session over the table up to the driver state, with
the image root's facts and the image's driver step (bootfsm/image/steps.py); it never
loads a module or starts a service. docs/image-build.md has the marker and decisions.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO

from bootfsm.core.archnames import normalize_arch
from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.core.hardware import model_for
from bootfsm.host.host import Host
from bootfsm.image.steps import BakeDriver, Counted, FactsDetect
from bootfsm.install.marker import Marker
from bootfsm.install.prebuilt import bake_module_type, current_marker
from bootfsm.machine.context import Context
from bootfsm.machine.engine import Outcome
from bootfsm.machine.table import stop_after
from bootfsm.node.facts import NodeFacts, PciGpu
from bootfsm.parsers import ParseError
from bootfsm.parsers.osrelease import parse_os_release
from bootfsm.run.session import Session, SessionOptions, run_session

__all__ = [
    "BAKE_DEADLINE_S",
    "BakeOptions",
    "BakeResult",
    "bake",
    "bake_module_type",
    "image_facts",
    "target_kernel",
]

BAKE_DEADLINE_S = 3600.0
"""Budget of one bake: image builds are off the node's critical path (the 720 s deadline)."""

_PROFILE_GPU = {"x86_64": 0x2330, "aarch64": 0x2941}  # H100 SXM5 (HGX), GB200 (IMEX tray)


def _version_key(name: str) -> list[tuple[int, int, str]]:
    return [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.findall(r"\d+|\D+", name)]


def _has_build(host: Host, kernel: str) -> bool:
    """/lib/modules/K/build exists, following links inside the root (not the build host)."""
    path = f"/lib/modules/{kernel}/build"
    for _ in range(8):
        target = host.readlink(path) if host.is_symlink(path) else None
        if target is None:
            break
        base = target if target.startswith("/") else posixpath.join(posixpath.dirname(path), target)
        path = posixpath.normpath(base)
    return host.exists(path) and bool(host.listdir(path))


def target_kernel(host: Host, requested: str | None, build: bool = True) -> str:
    """The kernel to build for: ``requested``, else the newest under /lib/modules with a
    ``build`` tree (version order); KERNEL_HEADERS_MISSING when there is none. Without
    ``build`` (a prebuilt signed module), any kernel under /lib/modules counts."""
    if requested and ("/" in requested or requested in (".", "..")):
        raise BootError(Code.KERNEL_HEADERS_MISSING, f"not a kernel release: {requested!r}")
    found = sorted(host.listdir("/lib/modules"), key=_version_key)
    if not build and (requested or found):
        return requested or found[-1]
    if requested:
        if not _has_build(host, requested):
            raise BootError(
                Code.KERNEL_HEADERS_MISSING,
                f"/lib/modules/{requested}/build is missing or empty; DKMS needs the headers",
            )
        return requested
    kernels = host.listdir("/lib/modules")
    with_build = sorted((k for k in kernels if _has_build(host, k)), key=_version_key)
    if not with_build:
        seen = ", ".join(kernels) or "none"
        raise BootError(
            Code.KERNEL_HEADERS_MISSING,
            f"no kernel under /lib/modules has a build tree (kernels: {seen}); "
            "install linux-headers for the image's kernel",
        )
    return with_build[-1]


def _image_arch(host: Host) -> str:
    """The image's architecture: its one multiarch library directory, else the kernel's."""
    dirs = [a for a in ("x86_64", "aarch64") if host.exists(f"/usr/lib/{a}-linux-gnu")]
    if len(dirs) == 1:
        return dirs[0]
    return (host.read_text("/proc/sys/kernel/arch") or "").strip()


def image_facts(host: Host, kernel: str) -> NodeFacts:
    """Facts of an image root: arch, OS, kernel from the root; hardware the arch's superset
    profile (x86_64 an NVSwitch HGX, aarch64 a Grace tray), never the build VM's PCI bus."""
    raw_arch = _image_arch(host)
    try:
        text = host.read_text("/etc/os-release") or host.read_text("/usr/lib/os-release")
        osr = parse_os_release(text or "")
        os_id, os_version = osr.id, osr.version_id
    except ParseError:
        os_id, os_version = "", ""
    device = _PROFILE_GPU.get(raw_arch)
    gpus = (PciGpu("image-profile", device, model_for(device)),) if device else ()
    return NodeFacts(
        raw_arch=raw_arch,
        arch=normalize_arch(raw_arch) if raw_arch else None,
        os_id=os_id,
        os_version=os_version,
        kernel=kernel,
        gpus=gpus,
        nvswitches=("image-profile",) if raw_arch == "x86_64" else (),
        nvlink5=False,
        loaded_driver=None,
    )


# ----------------------------------------------------------------------------- bake


@dataclass(frozen=True)
class BakeOptions:
    """Where the image root is, which kernel to build for, where to print."""

    root: Path = Path("/")
    kernel: str | None = None
    config_path: str = ""
    console: IO[str] | None = None
    env: Mapping[str, str] | None = None
    wait_lock: float = 0.0


@dataclass(frozen=True)
class BakeResult:
    """How a bake ended; ``changed`` lists the steps that did work (empty: a no-op)."""

    code: Code
    message: str
    marker: Marker | None = None
    changed: tuple[str, ...] = ()
    journal: Path | None = None

    @property
    def ok(self) -> bool:
        """True when the image is baked."""
        return self.code is Code.OK


def _facts(ctx: Context, requested: str | None) -> NodeFacts:
    """The image's facts for its target kernel, journaled as ``bake.facts`` too."""
    signed = ctx.config.driver.source == "ubuntu-signed"
    kernel = target_kernel(ctx.host, requested, build=not signed)
    facts = image_facts(ctx.host, kernel)
    ctx.journal.event(
        "bake.facts",
        durable=True,
        arch=facts.raw_arch,
        os=f"{facts.os_id}:{facts.os_version}",
        kernel=kernel,
        kernels=ctx.host.listdir("/lib/modules"),
        profile="nvswitch-hgx" if facts.nvswitches else "grace",
    )
    return facts


def bake(cfg: Config, opts: BakeOptions) -> BakeResult:
    """Bake the image at ``opts.root``; never raises for node problems (see BakeResult)."""
    from bootfsm.states import fetch

    changed: list[str] = []
    marker: list[Marker] = []

    def body(s: Session) -> Outcome:
        s.end_fields.update(changed=changed, marker=None)
        registry = {
            "detect": FactsDetect(lambda ctx: _facts(ctx, opts.kernel)),
            "fetch": Counted(fetch, changed, "fetch"),
            "driver": BakeDriver(changed),
        }
        outcome = s.drive(registry, {}, stop_after("driver"))
        if not outcome.ok:
            return outcome
        m = current_marker(s.host, cfg) if cfg.driver.install else None
        if m is not None:
            marker.append(m)
            s.end_fields["marker"] = asdict(m)
        return Outcome(Code.OK, "done", "image baked" if changed else "already baked")

    session = SessionOptions(
        kind="bake",
        root=opts.root,
        config_path=opts.config_path,
        console=opts.console,
        wait_lock=opts.wait_lock,
        env=opts.env,
        deadline_s=BAKE_DEADLINE_S,
        dirs=(cfg.fetch.cache_dir,),
        start_fields={"kernel_requested": opts.kernel or ""},
    )
    r = run_session(cfg, session, body)
    o = r.outcome
    return BakeResult(o.code, o.message, marker[0] if marker else None, tuple(changed), r.journal)
