"""The exit codes by number and stable name; their meanings are ``bootfsm.core.codes``.

Numbers avoid 1-2, 64-78, 124-165, 200-244 and 255 (owned by shells, sysexits, signals
and systemd); 83-87 reuse the CSE numbers of the same meaning.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["Code", "CodeInfo"]


class Code(IntEnum):
    """Process exit codes; the names are stable and appear in journals and traces."""

    OK = 0
    CONFIG_INVALID = 10
    ANOTHER_RUN_IN_PROGRESS = 11
    INTERRUPTED = 12
    ARCHIVE_INVALID = 14
    SECURE_BOOT_NEEDS_SIGNED_MODULE = 15
    DRIVER_BRANCH_UNSUPPORTED = 17
    REPO_KEYRING_MISSING = 18
    DRIVER_VERSION_UNPINNED = 19
    UNSUPPORTED_ARCH = 20
    DRIVER_KIND_UNSUPPORTED_ON_ARCH = 21
    NO_GPU = 22
    UNSUPPORTED_OS = 23
    MODULE_TYPE_UNSUPPORTED = 24
    KERNEL_HEADERS_MISSING = 25
    MIG_RESET_REQUIRED = 26
    MIG_PROFILE_INVALID = 27
    MIG_CONFIG_FAILED = 28
    REPO_INDEX_MISMATCH = 29
    ARTIFACT_NOT_FOUND = 30
    CHECKSUM_MISMATCH = 31
    UNVERIFIED_ARTIFACT_REFUSED = 32
    DOWNLOAD_RETRIES_EXHAUSTED = 33
    INSUFFICIENT_SPACE = 34
    INDEX_INVALID = 35
    INSECURE_URL_REFUSED = 36
    UNSAFE_ARCHIVE = 37
    TLS_VERIFY_FAILED = 38
    REPO_SIGNATURE_INVALID = 39
    DPKG_LOCK_TIMEOUT = 40
    DRIVER_INSTALL_FAILED = 41
    REBOOT_REQUIRED = 42
    MODULE_LOAD_FAILED = 43
    TOOLKIT_INSTALL_FAILED = 44
    MODULE_SIGNATURE_REJECTED = 45
    SIGNED_MODULE_MISSING = 46
    SIGNED_USERSPACE_MISSING = 47
    DPKG_REPAIR_FAILED = 48
    FABRIC_MANAGER_FAILED = 50
    FABRIC_NOT_READY = 51
    IMEX_INSTALL_FAILED = 52
    FABRIC_STATUS_FAILED = 53
    FABRIC_UNHEALTHY = 54
    NVLSM_INSTALL_FAILED = 55
    IB_UMAD_NOT_LOADED = 56
    GRID_NOT_LICENSED = 57
    DRIVER_LIBRARY_MISMATCH = 60
    GPU_COUNT_MISMATCH = 61
    WRONG_MODULE_TYPE = 62
    COHERENT_MEMORY_MODE_NOT_APPLIED = 63
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
    UNSAFE_STATE_DIR = 105
    UNSAFE_STATE_FILE = 106
    EXEC_FAILED = 107
    UNINSTALL_FAILED = 108
    INTERNAL_ERROR = 110


@dataclass(frozen=True)
class CodeInfo:
    """One row of the table: what a code means and what to do about it."""

    code: Code
    summary: str
    hint: str
    transient: bool = False
    cse: int | None = None
    """The CSE exit code of the same meaning (``--exit-codes cse``); None: not mapped yet."""
    cse_in_state: tuple[tuple[str, int], ...] = ()
    """Where the state that failed says more: (state, CSE code) pairs that win over ``cse``."""

    @property
    def name(self) -> str:
        """The stable upper-case name, e.g. ``CHECKSUM_MISMATCH``."""
        return self.code.name
