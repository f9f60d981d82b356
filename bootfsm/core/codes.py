"""The exit-code table: one row per ``Code``: summary, hint, CSE code, transient or not.

``bootfsm codes`` prints it; docs/codes.md is generated from it.
"""

from __future__ import annotations

from collections.abc import Sequence

from bootfsm.core.code_names import Code, CodeInfo

__all__ = ["CODES", "Code", "CodeInfo", "info", "verdict_line"]


# (code, the CSE exit code of the same meaning): (summary, hint)
_TABLE: dict[tuple[Code, int], tuple[str, str]] = {
    (Code.OK, 0): ("node provisioned", "nothing to do"),
    (Code.CONFIG_INVALID, 84): (
        "configuration file is missing, unreadable or invalid",
        "run `bootfsm validate --config FILE`; the message names the key",
    ),
    (Code.ANOTHER_RUN_IN_PROGRESS, 85): (
        "another bootfsm run holds the node lock",
        "wait for it (`bootfsm status --wait`) or pass --wait-lock SECONDS",
    ),
    (Code.INTERRUPTED, 84): (
        "run interrupted by SIGTERM or SIGINT",
        "rerun `bootfsm run`; it resumes at the first unsatisfied state",
    ),
    (Code.ARCHIVE_INVALID, 84): (
        "an archive matches its sha256 but is not a readable archive (not a tar.xz,"
        " truncated or corrupt inside)",
        "the publisher hashed broken bytes: the mirror's file and its manifest agree;"
        " pin another version or mirror and tell the publisher (the message names the file)",
    ),
    (Code.SECURE_BOOT_NEEDS_SIGNED_MODULE, 84): (
        "the kernel enforces module signatures (Secure Boot) and the chosen driver would"
        " load an unsigned module: NVIDIA's runfile built by DKMS without an enrolled"
        " key, or GRID (no signed GRID driver exists)",
        'set driver.source = "ubuntu-signed" (Canonical\'s signed modules); for GRID,'
        " or to keep the runfile, create the VM with Secure Boot off",
    ),
    (Code.DRIVER_BRANCH_UNSUPPORTED, 84): (
        "the chosen driver's branch does not drive this node's GPUs",
        "choose a branch the GPU supports (B300, GB300: R580+): driver.version or GPU_DV",
    ),
    (Code.REPO_KEYRING_MISSING, 84): (
        "a repository's keyring is missing and this boot must download from it",
        "bake the image (`bootfsm bake`) or `bootfsm fetch --prefetch`: a boot then "
        "downloads nothing; or install the keyring the message names",
    ),
    (Code.DRIVER_VERSION_UNPINNED, 84): (
        "no sha256 is pinned for the chosen driver's runfile",
        'add "KIND VERSION ARCH SHA256" to sources.runfile_pins, or bake that driver',
    ),
    (Code.UNSUPPORTED_ARCH, 84): (
        "machine architecture is not supported",
        "bootfsm supports x86_64 and aarch64 nodes only",
    ),
    (Code.DRIVER_KIND_UNSUPPORTED_ON_ARCH, 84): (
        "driver kind is not available for this architecture",
        'GRID (vGPU) drivers are x86_64 only; use driver.kind = "cuda" on arm64',
    ),
    (Code.NO_GPU, 84): (
        "this node should have an NVIDIA GPU (its VM size has one, or detect.gpu_node"
        " = yes) and none is on the PCI bus",
        "a GPU fell off the bus or was not attached: check /sys/bus/pci/devices and "
        "`nvidia-smi`, redeploy the VM; a VM size without a GPU ends 0 instead",
    ),
    (Code.UNSUPPORTED_OS, 84): (
        "operating system or version is not supported",
        "see detect.supported_os in docs/config.md",
    ),
    (Code.MODULE_TYPE_UNSUPPORTED, 84): (
        "requested kernel module type cannot drive these GPUs",
        'Blackwell needs the open modules, V100/P100 (pre-Turing) proprietary: use "auto"',
    ),
    (Code.KERNEL_HEADERS_MISSING, 84): (
        "kernel headers for the running kernel are missing",
        "install linux-headers-$(uname -r) in the image; DKMS cannot build without them",
    ),
    (Code.MIG_RESET_REQUIRED, 84): (
        "MIG mode pending: a GPU reset or reboot is required",
        "reboot the node (an Azure VM needs a reboot; AgentBaker's CSE reboots a MIG node);"
        " the next run finds MIG mode current and creates the instances",
    ),
    (Code.MIG_PROFILE_INVALID, 84): (
        "the MIG profile is not one these GPUs offer, or the GPUs do not support MIG",
        "`nvidia-smi mig -lgip` lists this GPU's profiles; fix mig.profile or the VM tag"
        " (never retried)",
    ),
    (Code.MIG_CONFIG_FAILED, 84): (
        "enabling MIG mode or creating the GPU/compute instances failed",
        "the message has nvidia-smi's words; 'In use by another client' means a process"
        " holds the GPU (nvidia-smi --query-compute-apps=pid,name --format=csv)",
    ),
    (Code.REPO_INDEX_MISMATCH, 84): (
        "a Packages index differs from the SHA256/size its signed Release lists, the"
        " Release has expired (Valid-Until), or the redist manifest differs from its pin",
        "the mirror is mid-sync or serves stale or altered metadata; check the mirror,"
        " the node's clock, or sources.redist_manifest_sha256",
    ),
    (Code.ARTIFACT_NOT_FOUND, 84): (
        "an artifact, manifest or package is not on the mirror (404 or not listed)",
        "check the version and the base URLs in [sources]; the journal names the URL",
    ),
    (Code.CHECKSUM_MISMATCH, 84): (
        "a downloaded artifact does not match its sha256",
        "the mirror serves a different file than its index says; fix the mirror or pin",
    ),
    (Code.UNVERIFIED_ARTIFACT_REFUSED, 84): (
        "an artifact has no known sha256 and unverified artifacts are not allowed",
        "set its sha256 in [sources] (or allow_unverified = true, not recommended)",
    ),
    (Code.DOWNLOAD_RETRIES_EXHAUSTED, 83): (
        "transient download failures continued past the retry budget",
        "the mirror or network is unhealthy; the journal lists every attempt",
    ),
    (Code.INSUFFICIENT_SPACE, 84): (
        "not enough free space in the cache directory for the artifacts",
        "free space or move fetch.cache_dir; the message gives needed and free bytes",
    ),
    (Code.INDEX_INVALID, 84): (
        "a Packages index or redistrib manifest could not be parsed",
        "the mirror serves a broken index; the message names the line",
    ),
    (Code.INSECURE_URL_REFUSED, 84): (
        "a URL is not HTTPS and its host is not in fetch.allow_http_hosts",
        "use an HTTPS mirror or list the host in fetch.allow_http_hosts",
    ),
    (Code.UNSAFE_ARCHIVE, 84): (
        "an archive holds absolute paths, '..' or links that leave its directory",
        "the artifact is malicious or broken; do not use this mirror",
    ),
    (Code.TLS_VERIFY_FAILED, 84): (
        "a server's TLS certificate did not verify against the node's trust store",
        "at boot the usual cause is a clock not yet synced (check timedatectl); else "
        "the CA is missing from the system store or fetch.ca_file, or a proxy "
        "inspects TLS with its own CA",
    ),
    (Code.REPO_SIGNATURE_INVALID, 84): (
        "a repository's InRelease/Release is missing, unsigned, or its signature does not"
        " verify with gpgv against the source's keyring (bad, expired, unknown key)",
        "install the repository's keyring (sources.cuda_repo_keyring,"
        " sources.toolkit_repo_keyring, sources.ubuntu_archive_keyring); the message names"
        " gpgv's reason",
    ),
    (Code.DPKG_LOCK_TIMEOUT, 85): (
        "the dpkg lock stayed held past driver.dpkg_lock_timeout",
        "another package operation (unattended-upgrades?) holds /var/lib/dpkg/lock-frontend"
        " or /var/lib/dpkg/lock",
    ),
    (Code.DRIVER_INSTALL_FAILED, 84): (
        "nvidia-installer failed",
        "see the installer output in `bootfsm trace` and /var/log/nvidia-installer.log",
    ),
    (Code.REBOOT_REQUIRED, 84): (
        "a driver of another version is loaded and in use",
        "reboot the node; the next run installs the configured version",
    ),
    (Code.MODULE_LOAD_FAILED, 84): (
        "the nvidia kernel module did not load",
        "check dmesg for NVRM lines; Blackwell needs the open module",
    ),
    (Code.MODULE_SIGNATURE_REJECTED, 84): (
        "the kernel refused the nvidia module for its signature (unsigned, or signed by"
        " a key it does not trust: 'Key was rejected by service')",
        'set driver.source = "ubuntu-signed", or enroll the signing key (mokutil) or turn'
        " Secure Boot off; the message quotes kmod or the kernel log",
    ),
    (Code.TOOLKIT_INSTALL_FAILED, 84): (
        "the NVIDIA container toolkit packages did not install",
        "see the dpkg output in `bootfsm trace`",
    ),
    (Code.SIGNED_MODULE_MISSING, 84): (
        "Ubuntu's archive has no signed NVIDIA module package for the running kernel"
        " (driver.source = ubuntu-signed)",
        "boot a kernel Canonical builds the module for (a newer linux-azure), or, with"
        ' Secure Boot off, driver.source = "runfile" (DKMS); the message names the kernel',
    ),
    (Code.SIGNED_USERSPACE_MISSING, 84): (
        "the signed module for the running kernel needs a user-space version the"
        " archive's indexes no longer list (driver.source = ubuntu-signed)",
        "boot the newer kernel whose module needs the listed version, or bake the image"
        " while both are listed; the message names both versions",
    ),
    (Code.DPKG_REPAIR_FAILED, 84): (
        "an interrupted dpkg left the database half-done and dpkg --configure -a failed",
        "see its output in `bootfsm trace`; repair what `dpkg --audit` lists",
    ),
    (Code.FABRIC_MANAGER_FAILED, 84): (
        "fabric manager did not install or start",
        "check `journalctl -u nvidia-fabricmanager`; its version must match the driver",
    ),
    (Code.FABRIC_NOT_READY, 84): (
        "GPU fabric did not reach Completed/Success in time",
        "check fabric manager / NVLink health; raise verify.fabric_timeout only with evidence",
    ),
    (Code.IMEX_INSTALL_FAILED, 84): (
        "the nvidia-imex package did not install",
        "see the dpkg output in `bootfsm trace`",
    ),
    (Code.FABRIC_STATUS_FAILED, 84): (
        "GPU fabric Completed with a Status other than Success (final)",
        "the message names the status (e.g. Insufficient Resources): check the NVLink"
        " partition / fabric manager configuration; waiting does not change it",
    ),
    (Code.FABRIC_UNHEALTHY, 84): (
        "GPU fabric Completed/Success but its Health Summary stayed Unhealthy",
        "check `nvidia-smi -q -d FABRIC` Health fields and the NVLink domain (IMEX, NVSwitch"
        " trays); the GPU is attached but not fit for work",
    ),
    (Code.NVLSM_INSTALL_FAILED, 84): (
        "NVLSM (the NVLink5 subnet manager) is not in the redist manifest or did not install",
        "NVLink5 nodes need the manifest's nvlsm component (580+ redist); check the manifest",
    ),
    (Code.IB_UMAD_NOT_LOADED, 84): (
        "the ib_umad kernel module did not load; fabric manager cannot start on NVLink5",
        "install the kernel's InfiniBand modules (linux-modules-extra / MOFED); see dmesg",
    ),
    (Code.GRID_NOT_LICENSED, 84): (
        "GRID: a vGPU's licence element still says unlicensed after verify.license_timeout"
        " or the run's deadline",
        "check nvidia-gridd (unit, /etc/nvidia/gridd.conf) and the licence server",
    ),
    (Code.DRIVER_LIBRARY_MISMATCH, 84): (
        "NVML reports a driver/library version mismatch, or another driver's libraries resolve",
        "a partial upgrade left an old module loaded (reboot the node), or another driver's "
        "libraries are where the loader looks (the message names them: remove them, run ldconfig)",
    ),
    (Code.GPU_COUNT_MISMATCH, 84): (
        "nvidia-smi sees fewer GPUs than the PCI bus",
        "a GPU fell off the bus or failed init; check dmesg (Xid) and replace the node",
    ),
    (Code.WRONG_MODULE_TYPE, 84): (
        "nvidia-smi finds no devices: the proprietary kernel module is loaded on a GPU"
        " that needs the open modules (Blackwell or later, device id >= 0x2900)",
        'set driver.module_type = "open" (or "auto") and rebuild; the proprietary module'
        " never drives these GPUs",
    ),
    (Code.COHERENT_MEMORY_MODE_NOT_APPLIED, 84): (
        "Grace, R580+: the loaded nvidia module lacks the coherent GPU memory mode",
        "another modprobe.d file or the initramfs overrides it (the message says); reboot",
    ),
    (Code.CONTAINERD_RESTART_FAILED, 4): (
        "containerd did not restart with the NVIDIA runtime",
        "check `journalctl -u containerd` and the drop-in under /etc/containerd",
    ),
    (Code.KUBELET_NOT_HEALTHY, 34): (
        "kubelet did not report healthy in time",
        "check `journalctl -u kubelet`; /healthz on 127.0.0.1:10248 must answer ok",
    ),
    (Code.CDI_REFRESH_FAILED, 84): (
        "the CDI specification could not be generated",
        "run `nvidia-ctk cdi generate` by hand to see why",
    ),
    (Code.CONTAINERD_CONFIG_INVALID, 84): (
        "/etc/containerd/config.toml cannot be read as TOML or its imports line edited",
        "fix config.toml (containerd config dump shows the merged view)",
    ),
    (Code.CONTAINERD_RUNTIME_MISSING, 84): (
        "containerd's merged config has no nvidia runtime after the drop-in was written",
        "check `containerd config dump`: config.toml must import the drop-in directory",
    ),
    (Code.DOWNLOAD_TIMEOUT, 83): (
        "downloading GPU artifacts exceeded the fetch state's time limit",
        "same meaning as CSE exit 83; check mirror throughput",
    ),
    (Code.DRIVER_NOT_STARTED, 84): (
        "the driver is installed but nvidia-smi cannot talk to it",
        "same meaning as CSE exit 84; check dmesg for NVRM errors",
    ),
    (Code.DRIVER_INSTALL_TIMEOUT, 85): (
        "installing the driver exceeded the driver state's time limit",
        "same meaning as CSE exit 85; the DKMS build hung or the node is starved",
    ),
    (Code.INFOROM_CORRUPTED, 87): (
        "a GPU reports a corrupted infoROM",
        "same meaning as CSE exit 87; the GPU needs service, replace the node",
    ),
    (Code.DEADLINE_EXCEEDED, 85): (
        "the global deadline ran out",
        "the message names the state that was running; see the blame view in the trace",
    ),
    (Code.COMMAND_MISSING, 84): (
        "a required command is not on PATH",
        "the image lacks a tool bootfsm needs; the message names it",
    ),
    (Code.HOST_IO_ERROR, 84): (
        "reading or writing a node file failed (disk full, read-only filesystem)",
        "the message names the path and the OS error",
    ),
    (Code.STATE_TIMEOUT, 85): (
        "a state exceeded its own time limit",
        "the message names the state and its limit",
    ),
    (Code.UNSAFE_STATE_DIR, 84): (
        "a bootfsm directory (state, cache, log, extract) is unsafe: a symlink, not a"
        " directory, not owned by root, or writable by group or others",
        "another user could plant or swap what root runs; the message names the"
        " directory and its owner and mode: remove it (bootfsm recreates it 0700) or"
        " chown root and chmod go-w it and everything above it",
    ),
    (Code.UNSAFE_STATE_FILE, 84): (
        "a file bootfsm writes in its own directory is a symlink or not a regular file",
        "something planted it there; the message names the path: remove it and rerun",
    ),
    (Code.EXEC_FAILED, 84): (
        "a command could not be executed (not an executable, text file busy, no permission)",
        "the message names the file and the OS error; a corrupt cached runfile is"
        " downloaded again after removing it from fetch.cache_dir",
    ),
    (Code.UNINSTALL_FAILED, 84): (
        "`bootfsm uninstall` could not undo what its install records list",
        "the message names the step (dkms remove, dpkg --purge, systemctl) and its output;"
        " fix that and rerun `bootfsm uninstall` (done steps are not repeated)",
    ),
    (Code.INTERNAL_ERROR, 84): (
        "bootfsm hit an unexpected error (a bug)",
        "the journal holds the traceback; please report it",
    ),
}
_TRANSIENT = {  # retried; the unit restarts
    Code.ANOTHER_RUN_IN_PROGRESS,
    Code.INTERRUPTED,
    Code.DOWNLOAD_RETRIES_EXHAUSTED,
    Code.DPKG_LOCK_TIMEOUT,
    Code.FABRIC_NOT_READY,
    Code.FABRIC_UNHEALTHY,
    Code.DOWNLOAD_TIMEOUT,
}
_CSE_IN_STATE = {  # where the failing state says more: state -> CSE code
    Code.DEADLINE_EXCEEDED: {"fetch": 83},
    Code.STATE_TIMEOUT: {"fetch": 83},
}

CODES: dict[Code, CodeInfo] = {
    code: CodeInfo(
        code, summary, hint, code in _TRANSIENT, cse, tuple(_CSE_IN_STATE.get(code, {}).items())
    )
    for (code, cse), (summary, hint) in _TABLE.items()
}


def info(code: int) -> CodeInfo:
    """Return the table row for ``code``; raise KeyError for an unknown code."""
    return CODES[Code(code)]


def verdict_line(
    code: Code,
    message: str,
    *,
    command: str = "",
    state: str | None = None,
    head: str = "",
    tail: Sequence[str] = (),
) -> str:
    """The one line that ends ``run``, ``fetch``, ``bake`` and ``uninstall`` (the hook's
    last line, systemd's STATUS=) and ``status``'s for a failed run; the only builder:
    ``bootfsm: HEAD code=N NAME[ state=S]: MESSAGE[ | hint: HINT][ | TAIL]...``.

    HEAD is ``[command ]OK`` for code 0, ``INTERRUPTED`` for an interrupted run, else
    ``FAILED``, unless ``head`` names it (``failed: run ID``). A failure shows only its
    message's first line (a command's output follows it) and always the code's hint."""
    verdict = "OK" if code is Code.OK else "INTERRUPTED" if code is Code.INTERRUPTED else "FAILED"
    ok = code is Code.OK and not head
    lead = head or (f"{command} {verdict}" if command else verdict)
    where = "" if state is None else f" state={state or '-'}"
    text = message if ok else (message.splitlines() or [""])[0]
    hint = [] if ok else [f"hint: {info(code).hint}"]
    line = f"bootfsm: {lead} code={int(code)} {code.name}{where}: {text}"
    return " | ".join([line, *hint, *tail])
