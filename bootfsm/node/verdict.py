"""Verdicts on a node's facts against the config: pure, shared by detect, `plan` and bake."""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.core.hardware import (
    branch_problem,
    requires_open_module,
    requires_proprietary_module,
)
from bootfsm.core.vmsizes import has_nvidia_gpu
from bootfsm.node.facts import NodeFacts
from bootfsm.node.guards import needs_fabric_manager, needs_imex

__all__ = [
    "UBUNTU_CODENAMES",
    "fabric_manager_disagreement",
    "installs_driver",
    "judge",
    "keeps_image_driver",
    "kept_image_driver",
    "no_gpu_reason",
    "not_kept_reason",
]


def _asks_to_keep(cfg: Config) -> bool:
    return cfg.driver.install and cfg.driver.keep_image_driver


def not_kept_reason(cfg: Config, f: NodeFacts) -> str | None:
    """Why the image's driver is not kept though driver.keep_image_driver asks, or None
    (kept when it loads, or not asked): a fabric manager or IMEX must be the driver's
    exact version, and bootfsm installs them for driver.version alone."""
    if not _asks_to_keep(cfg) or not (needs_fabric_manager(f) or needs_imex(f)):
        return None
    what = "fabric manager" if needs_fabric_manager(f) else "IMEX"
    return (
        f"this node's {what} must match the driver exactly and bootfsm installs it for "
        f"driver.version ({cfg.driver.version}) only, so that driver is installed"
    )


def keeps_image_driver(cfg: Config, f: NodeFacts) -> bool:
    """The config asks for AgentBaker's ``validateGPUDrivers`` (driver.install and
    driver.keep_image_driver; the hook's ``CONFIG_GPU_DRIVER_IF_NEEDED=false``) and this
    node allows it (``not_kept_reason``): the image's driver is checked first and kept
    when its module loads."""
    return _asks_to_keep(cfg) and not_kept_reason(cfg, f) is None


def kept_image_driver(cfg: Config, f: NodeFacts) -> str | None:
    """The version of the image's driver this run keeps, or None: with
    ``keeps_image_driver``, the nvidia module loaded when detect looked (at boot, or by
    its ``nvidia-modprobe -u -c0``), whatever its version. Then nothing of
    driver.version is judged, fetched or built. The one answer every state asks."""
    return f.loaded_driver if keeps_image_driver(cfg, f) else None


def installs_driver(cfg: Config, f: NodeFacts) -> bool:
    """This run installs driver.version: driver.install, and no image driver kept."""
    return cfg.driver.install and kept_image_driver(cfg, f) is None


def judge(cfg: Config, f: NodeFacts) -> None:
    """Raise the first permanent problem with these facts, before any download."""
    if f.arch is None:
        raise BootError(
            Code.UNSUPPORTED_ARCH,
            f"architecture {f.raw_arch or '(unknown)'!r} is not supported; x86_64 or aarch64",
        )
    if cfg.driver.kind == "grid" and f.raw_arch != "x86_64":
        raise BootError(
            Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH,
            f"GRID (vGPU) drivers exist for x86_64 only; this node is {f.raw_arch}",
        )
    os_key = f"{f.os_id}:{f.os_version}"
    if os_key not in cfg.detect.supported_os:
        raise BootError(
            Code.UNSUPPORTED_OS,
            f"OS {os_key} is not supported (detect.supported_os: "
            f"{', '.join(cfg.detect.supported_os)})",
        )
    installs = installs_driver(cfg, f)  # a kept image driver needs no pin, no source
    if installs and cfg.driver.source == "ubuntu-signed":
        _judge_ubuntu(f)
    _judge_gpus(cfg, f)
    if installs:
        _judge_driver(cfg, f, f.arch.runfile)


UBUNTU_CODENAMES = {"22.04": "jammy", "24.04": "noble"}
"""Ubuntu releases whose archive has linux-azure's signed NVIDIA modules, by VERSION_ID."""


def _judge_ubuntu(f: NodeFacts) -> None:
    """driver.source = "ubuntu-signed" needs Ubuntu's archive: Ubuntu 22.04 or 24.04."""
    if f.os_id != "ubuntu" or f.os_version not in UBUNTU_CODENAMES:
        raise BootError(
            Code.UNSUPPORTED_OS,
            f'driver.source = "ubuntu-signed" installs Canonical\'s signed packages from'
            f" Ubuntu's archive, for Ubuntu {' and '.join(UBUNTU_CODENAMES)}; this node is"
            f' {f.os_id}:{f.os_version}: use driver.source = "runfile"',
        )


def _judge_gpus(cfg: Config, f: NodeFacts) -> None:
    """The node has GPUs, and the configured kernel module type can drive them."""
    if not f.gpus:
        why = f"VM size {f.vm_size} has NVIDIA GPUs" if f.vm_size else "detect.gpu_node = yes"
        raise BootError(
            Code.NO_GPU,
            f"no NVIDIA GPU (vendor 0x10de, class 0x0302/0x0300) on PCI, but this node "
            f"should have one ({why})",
        )
    models = [g.model for g in f.gpus]
    if cfg.driver.module_type == "proprietary" and requires_open_module(models):
        raise BootError(
            Code.MODULE_TYPE_UNSUPPORTED,
            f"{f.gpu_model} (Blackwell) needs the open kernel modules; "
            'driver.module_type is "proprietary"',
        )
    if cfg.driver.module_type == "open" and requires_proprietary_module(models):
        raise BootError(  # no GSP before Turing: the open modules refuse these GPUs
            Code.MODULE_TYPE_UNSUPPORTED,
            f"{f.gpu_model} (older than Turing) needs the proprietary kernel modules; "
            'driver.module_type is "open"',
        )


def _judge_driver(cfg: Config, f: NodeFacts, runfile: str) -> None:
    """The driver to install: its source, its branch for these GPUs, its pinned runfile."""
    d = cfg.driver
    _judge_signatures(cfg, f)
    if d.kind == "grid" and not cfg.sources.grid_runfile_url:
        raise BootError(Code.CONFIG_INVALID, "driver.kind = grid needs sources.grid_runfile_url")
    if (unsupported := branch_problem(d.version, [g.model for g in f.gpus])) is not None:
        raise BootError(
            Code.DRIVER_BRANCH_UNSUPPORTED, f"driver.version {d.version}: {unsupported}"
        )
    if not cfg.runfile_sha256(runfile) and not cfg.sources.allow_unverified:
        raise BootError(
            Code.DRIVER_VERSION_UNPINNED,
            f"no sha256 is pinned for the {d.kind} driver {d.version} runfile "
            f'({runfile}): add "{d.kind} {d.version} {runfile} <sha256>" to '
            f"sources.runfile_pins (sources.runfile_sha256_{runfile} for the configured "
            "driver), or bake that driver into the image; never another version instead",
        )


_SAID_BY = {"efi": "EFI variable SecureBoot = 1", "imds": "IMDS secureBootEnabled"}


def _judge_signatures(cfg: Config, f: NodeFacts) -> None:
    """SECURE_BOOT_NEEDS_SIGNED_MODULE when the kernel enforces module signatures and the
    driver would load an unsigned module: GRID always, the runfile unless the key DKMS
    signs with is enrolled (docs/security.md, "Secure Boot")."""
    sb = f.secure_boot
    if not sb.enforced:
        return
    why = (
        f"Secure Boot is on ({_SAID_BY.get(sb.source, sb.source)})"
        if sb.enabled
        else f"the kernel enforces module signatures (lockdown {sb.lockdown}, "
        f"module.sig_enforce {'Y' if sb.sig_enforce else 'N'})"
    )
    if cfg.driver.kind == "grid":
        raise BootError(
            Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
            f"{why}, and NVIDIA ships no signed GRID (vGPU) driver: its module would be "
            "refused at load; create this VM with Secure Boot off (Azure's NVIDIA GRID "
            "guidance for N-series VMs)",
        )
    if cfg.driver.source == "runfile" and not sb.dkms_key_enrolled:
        raise BootError(
            Code.SECURE_BOOT_NEEDS_SIGNED_MODULE,
            f'{why}, and driver.source = "runfile" builds an unsigned module (no DKMS '
            'signing key is enrolled in MokListRT): set driver.source = "ubuntu-signed" '
            "for Canonical's signed modules, or create the VM with Secure Boot off",
        )


def no_gpu_reason(cfg: Config, f: NodeFacts) -> str | None:
    """Why this node has nothing to provision, or None: no GPU on PCI is a CPU node unless
    the VM size or detect.gpu_node says it should have one (then ``judge`` says NO_GPU)."""
    want = cfg.detect.gpu_node
    if want == "no":
        return "not a GPU node (detect.gpu_node = no)"
    if f.gpus or want == "yes":
        return None
    if f.vm_size is not None:
        return None if has_nvidia_gpu(f.vm_size) else f"VM size {f.vm_size} has no NVIDIA GPU"
    return (
        "no NVIDIA GPU on PCI, and neither the VM size (IMDS) nor detect.gpu_node says "
        "this node should have one"
    )


def fabric_manager_disagreement(cfg: Config, f: NodeFacts) -> str | None:
    """The line to journal when detect.fabric_manager disagrees with the hardware, or None."""
    # the hardware decides; the claim is the caller's GPU_NEEDS_FABRIC_MANAGER
    claim = cfg.detect.fabric_manager
    need = needs_fabric_manager(f)
    if claim == "auto" or (claim == "yes") == need:
        return None
    hw = f"{len(f.nvswitches)} NVSwitch(es), NVLink5 {'yes' if f.nvlink5 else 'no'}"
    return (
        f"detect.fabric_manager = {claim}, but the hardware ({hw}, {f.raw_arch}) "
        f"{'needs' if need else 'needs no'} fabric manager: the hardware decides"
    )
