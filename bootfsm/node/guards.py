"""Named guards: pure predicates on node facts that choose the table's transitions.

After the driver state they are exhaustive and mutually exclusive (tested on every fact mix).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from bootfsm.core.hardware import blackwell_or_later
from bootfsm.node.facts import NodeFacts

__all__ = [
    "GUARDS",
    "gpu_install_skipped",
    "installs_gpu_driver",
    "mig_configured",
    "mig_not_configured",
    "needs_fabric_manager",
    "needs_imex",
    "no_nvlink_fabric",
]


def _grace_blackwell(f: NodeFacts) -> bool:
    """A Grace-Blackwell (or later) tray such as GB200/GB300."""
    return any(g.model.grace and blackwell_or_later(g.device_id) for g in f.gpus)


def needs_fabric_manager(f: NodeFacts) -> bool:
    """x86_64 with NVSwitch (or NVLink5 switch management): fabric manager must run."""
    return f.raw_arch == "x86_64" and (bool(f.nvswitches) or f.nvlink5)


def needs_imex(f: NodeFacts) -> bool:
    """arm64 Grace-Blackwell tray (an NVLink domain): IMEX must run; GH200 needs none."""
    return f.raw_arch == "aarch64" and _grace_blackwell(f) and not needs_fabric_manager(f)


def no_nvlink_fabric(f: NodeFacts) -> bool:
    """Neither fabric manager nor IMEX applies (PCIe GPUs, no NVLink fabric)."""
    return not needs_fabric_manager(f) and not needs_imex(f)


def gpu_install_skipped(f: NodeFacts) -> bool:
    """No GPU step: the SkipGpuDriverInstall tag, or no GPU to provision (a CPU VM size)."""
    return f.skip_gpu_install is not None or f.no_gpu is not None


def installs_gpu_driver(f: NodeFacts) -> bool:
    """The GPU step runs (no skip tag, a GPU to provision)."""
    return not gpu_install_skipped(f)


def mig_configured(f: NodeFacts) -> bool:
    """A MIG layout is asked for (mig.profile or the VM tag): verify -> mig."""
    return f.mig_profile is not None


def mig_not_configured(f: NodeFacts) -> bool:
    """No MIG layout: verify -> join."""
    return f.mig_profile is None


GUARDS: Mapping[str, Callable[[NodeFacts], bool]] = {
    "gpu_install_skipped": gpu_install_skipped,
    "installs_gpu_driver": installs_gpu_driver,
    "needs_fabric_manager": needs_fabric_manager,
    "mig_configured": mig_configured,
    "mig_not_configured": mig_not_configured,
    "needs_imex": needs_imex,
    "no_nvlink_fabric": no_nvlink_fabric,
}
