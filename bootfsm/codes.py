"""The exit-code table: every failure class bootfsm can end with, in one place.

Codes avoid the ranges that other layers own: 1-2 (generic shell and usage errors),
64-78 (BSD sysexits), 124-165 (timeout(1), shell and signal conventions), 200-244 and
255 (systemd).  Where a code means exactly what a cloud provisioning (CSE) code means,
it uses that number: 83 download timeout, 84 driver did not start, 85 driver install
timeout, 87 infoROM corrupted.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["CODES", "Code", "CodeInfo", "info"]


class Code(IntEnum):
    """Process exit codes; the names are stable and appear in journals and traces."""

    OK = 0
    CONFIG_INVALID = 10
    ANOTHER_RUN_IN_PROGRESS = 11
    INTERRUPTED = 12
    UNSUPPORTED_ARCH = 20
    DRIVER_KIND_UNSUPPORTED_ON_ARCH = 21
    NO_GPU = 22
    UNSUPPORTED_OS = 23
    MODULE_TYPE_UNSUPPORTED = 24
    KERNEL_HEADERS_MISSING = 25
    ARTIFACT_NOT_FOUND = 30
    CHECKSUM_MISMATCH = 31
    UNVERIFIED_ARTIFACT_REFUSED = 32
    DOWNLOAD_RETRIES_EXHAUSTED = 33
    INSUFFICIENT_SPACE = 34
    INDEX_INVALID = 35
    INSECURE_URL_REFUSED = 36
    UNSAFE_ARCHIVE = 37
    DPKG_LOCK_TIMEOUT = 40
    DRIVER_INSTALL_FAILED = 41
    REBOOT_REQUIRED = 42
    MODULE_LOAD_FAILED = 43
    TOOLKIT_INSTALL_FAILED = 44
    DPKG_REPAIR_FAILED = 48
    FABRIC_MANAGER_FAILED = 50
    FABRIC_NOT_READY = 51
    IMEX_INSTALL_FAILED = 52
    NVLSM_INSTALL_FAILED = 55
    IB_UMAD_NOT_LOADED = 56
    DRIVER_LIBRARY_MISMATCH = 60
    GPU_COUNT_MISMATCH = 61
    CONTAINERD_RESTART_FAILED = 90
    KUBELET_NOT_HEALTHY = 91
    CDI_REFRESH_FAILED = 92
    CONTAINERD_CONFIG_INVALID = 93
    CONTAINERD_RUNTIME_MISSING = 94
    DOWNLOAD_TIMEOUT = 83
    DRIVER_NOT_STARTED = 84
    DRIVER_INSTALL_TIMEOUT = 85
    INFOROM_CORRUPTED = 87
    DEADLINE_EXCEEDED = 100
    COMMAND_MISSING = 101
    HOST_IO_ERROR = 102
    STATE_TIMEOUT = 103
    POSTCONDITION_FAILED = 104
    INTERNAL_ERROR = 110


@dataclass(frozen=True)
class CodeInfo:
    """One row of the table: what a code means and what to do about it."""

    code: Code
    summary: str
    hint: str
    transient: bool = False

    @property
    def name(self) -> str:
        """The stable upper-case name, e.g. ``CHECKSUM_MISMATCH``."""
        return self.code.name


def _row(code: Code, summary: str, hint: str, transient: bool = False) -> CodeInfo:
    return CodeInfo(code, summary, hint, transient)


CODES: dict[Code, CodeInfo] = {
    r.code: r
    for r in (
        _row(Code.OK, "node provisioned", "nothing to do"),
        _row(
            Code.CONFIG_INVALID,
            "configuration file is missing, unreadable or invalid",
            "run `bootfsm validate --config FILE`; the message names the key",
        ),
        _row(
            Code.ANOTHER_RUN_IN_PROGRESS,
            "another bootfsm run holds the node lock",
            "wait for it (`bootfsm status --wait`) or pass --wait-lock SECONDS",
            transient=True,
        ),
        _row(
            Code.INTERRUPTED,
            "run interrupted by SIGTERM or SIGINT",
            "rerun `bootfsm run`; it resumes at the first unsatisfied state",
            transient=True,
        ),
        _row(
            Code.UNSUPPORTED_ARCH,
            "machine architecture is not supported",
            "bootfsm supports x86_64 and aarch64 nodes only",
        ),
        _row(
            Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH,
            "driver kind is not available for this architecture",
            'GRID (vGPU) drivers are x86_64 only; use driver.kind = "cuda" on arm64',
        ),
        _row(
            Code.NO_GPU,
            "no NVIDIA GPU found on the PCI bus",
            "check the VM size and that the GPU is attached (/sys/bus/pci/devices)",
        ),
        _row(
            Code.UNSUPPORTED_OS,
            "operating system or version is not supported",
            "see detect.supported_os in docs/config.md",
        ),
        _row(
            Code.MODULE_TYPE_UNSUPPORTED,
            "requested kernel module type cannot drive these GPUs",
            'Blackwell GPUs need the open kernel modules: driver.module_type = "open" or "auto"',
        ),
        _row(
            Code.KERNEL_HEADERS_MISSING,
            "kernel headers for the running kernel are missing",
            "install linux-headers-$(uname -r) in the image; DKMS cannot build without them",
        ),
        _row(
            Code.ARTIFACT_NOT_FOUND,
            "an artifact, manifest or package is not on the mirror (404 or not listed)",
            "check the version and the base URLs in [sources]; the journal names the URL",
        ),
        _row(
            Code.CHECKSUM_MISMATCH,
            "a downloaded artifact does not match its sha256",
            "the mirror serves a different file than its index says; fix the mirror or pin",
        ),
        _row(
            Code.UNVERIFIED_ARTIFACT_REFUSED,
            "an artifact has no known sha256 and unverified artifacts are not allowed",
            "set its sha256 in [sources] (or allow_unverified = true, not recommended)",
        ),
        _row(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            "transient download failures continued past the retry budget",
            "the mirror or network is unhealthy; the journal lists every attempt",
            transient=True,
        ),
        _row(
            Code.INSUFFICIENT_SPACE,
            "not enough free space in the cache directory for the artifacts",
            "free space or move fetch.cache_dir; the message gives needed and free bytes",
        ),
        _row(
            Code.INDEX_INVALID,
            "a Packages index or redistrib manifest could not be parsed",
            "the mirror serves a broken index; the message names the line",
        ),
        _row(
            Code.INSECURE_URL_REFUSED,
            "a URL is not HTTPS and its host is not in fetch.allow_http_hosts",
            "use an HTTPS mirror or list the host in fetch.allow_http_hosts",
        ),
        _row(
            Code.UNSAFE_ARCHIVE,
            "an archive holds absolute paths, '..' or links that leave its directory",
            "the artifact is malicious or broken; do not use this mirror",
        ),
        _row(
            Code.DPKG_LOCK_TIMEOUT,
            "the dpkg lock stayed held past driver.dpkg_lock_timeout",
            "another package operation (unattended-upgrades?) holds /var/lib/dpkg/lock-frontend"
            " or /var/lib/dpkg/lock",
            transient=True,
        ),
        _row(
            Code.DRIVER_INSTALL_FAILED,
            "nvidia-installer failed",
            "see the installer output in `bootfsm trace` and /var/log/nvidia-installer.log",
        ),
        _row(
            Code.REBOOT_REQUIRED,
            "a driver of another version is loaded and in use",
            "reboot the node; the next run installs the configured version",
        ),
        _row(
            Code.MODULE_LOAD_FAILED,
            "the nvidia kernel module did not load",
            "check dmesg for NVRM lines; Blackwell needs the open module",
        ),
        _row(
            Code.TOOLKIT_INSTALL_FAILED,
            "the NVIDIA container toolkit packages did not install",
            "see the dpkg output in `bootfsm trace`",
        ),
        _row(
            Code.DPKG_REPAIR_FAILED,
            "an interrupted dpkg left the database half-done and dpkg --configure -a failed",
            "see its output in `bootfsm trace`; repair what `dpkg --audit` lists",
        ),
        _row(
            Code.FABRIC_MANAGER_FAILED,
            "fabric manager did not install or start",
            "check `journalctl -u nvidia-fabricmanager`; its version must match the driver",
        ),
        _row(
            Code.FABRIC_NOT_READY,
            "GPU fabric did not reach Completed/Success in time",
            "check fabric manager / NVLink health; raise verify.fabric_timeout only with evidence",
            transient=True,
        ),
        _row(
            Code.IMEX_INSTALL_FAILED,
            "the nvidia-imex package did not install",
            "see the dpkg output in `bootfsm trace`",
        ),
        _row(
            Code.NVLSM_INSTALL_FAILED,
            "NVLSM (the NVLink5 subnet manager) is not in the redist manifest or did not install",
            "NVLink5 nodes need the manifest's nvlsm component (580+ redist); check the manifest",
        ),
        _row(
            Code.IB_UMAD_NOT_LOADED,
            "the ib_umad kernel module did not load; fabric manager cannot start on NVLink5",
            "install the kernel's InfiniBand modules (linux-modules-extra / MOFED); see dmesg",
        ),
        _row(
            Code.DRIVER_LIBRARY_MISMATCH,
            "NVML reports a driver/library version mismatch",
            "a partial upgrade left an old module loaded; reboot the node",
        ),
        _row(
            Code.GPU_COUNT_MISMATCH,
            "nvidia-smi sees fewer GPUs than the PCI bus",
            "a GPU fell off the bus or failed init; check dmesg (Xid) and replace the node",
        ),
        _row(
            Code.CONTAINERD_RESTART_FAILED,
            "containerd did not restart with the NVIDIA runtime",
            "check `journalctl -u containerd` and the drop-in under /etc/containerd",
        ),
        _row(
            Code.KUBELET_NOT_HEALTHY,
            "kubelet did not report healthy in time",
            "check `journalctl -u kubelet`; /healthz on 127.0.0.1:10248 must answer ok",
        ),
        _row(
            Code.CDI_REFRESH_FAILED,
            "the CDI specification could not be generated",
            "run `nvidia-ctk cdi generate` by hand to see why",
        ),
        _row(
            Code.CONTAINERD_CONFIG_INVALID,
            "/etc/containerd/config.toml cannot be read as TOML or its imports line edited",
            "fix config.toml (containerd config dump shows the merged view)",
        ),
        _row(
            Code.CONTAINERD_RUNTIME_MISSING,
            "containerd's merged config has no nvidia runtime after the drop-in was written",
            "check `containerd config dump`: config.toml must import the drop-in directory",
        ),
        _row(
            Code.DOWNLOAD_TIMEOUT,
            "downloading GPU artifacts exceeded the fetch state's time limit",
            "same meaning as CSE exit 83; check mirror throughput",
            transient=True,
        ),
        _row(
            Code.DRIVER_NOT_STARTED,
            "the driver is installed but nvidia-smi cannot talk to it",
            "same meaning as CSE exit 84; check dmesg for NVRM errors",
        ),
        _row(
            Code.DRIVER_INSTALL_TIMEOUT,
            "installing the driver exceeded the driver state's time limit",
            "same meaning as CSE exit 85; the DKMS build hung or the node is starved",
        ),
        _row(
            Code.INFOROM_CORRUPTED,
            "a GPU reports a corrupted infoROM",
            "same meaning as CSE exit 87; the GPU needs service, replace the node",
        ),
        _row(
            Code.DEADLINE_EXCEEDED,
            "the global deadline ran out",
            "the message names the state that was running; see the blame view in the trace",
        ),
        _row(
            Code.COMMAND_MISSING,
            "a required command is not on PATH",
            "the image lacks a tool bootfsm needs; the message names it",
        ),
        _row(
            Code.HOST_IO_ERROR,
            "reading or writing a node file failed (disk full, read-only filesystem)",
            "the message names the path and the OS error",
        ),
        _row(
            Code.STATE_TIMEOUT,
            "a state exceeded its own time limit",
            "the message names the state and its limit",
        ),
        _row(
            Code.POSTCONDITION_FAILED,
            "a state's action finished but the node is still not in the expected state",
            "the message names the check that failed",
        ),
        _row(
            Code.INTERNAL_ERROR,
            "bootfsm hit an unexpected error (a bug)",
            "the journal holds the traceback; please report it",
        ),
    )
}


def info(code: int) -> CodeInfo:
    """Return the table row for ``code``; raise KeyError for an unknown code."""
    return CODES[Code(code)]
