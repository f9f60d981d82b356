"""Configuration: TOML in, a frozen, validated ``Config`` out (the spec of a run).

Every key has a default (an empty file is valid); ``ConfigError`` names the bad key.
docs/config.md lists every key; a test keeps it and ``DEFAULTS`` in step.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from bootfsm.core.config_rules import (
    ConfigError,
    Rule,
    absolute,
    absolute_or_empty,
    base_urls,
    mig_profile,
    mig_tag,
    node_path,
    one_of,
    pins,
    sha256,
    version,
)

__all__ = ["DEFAULTS", "DEFAULT_PATH", "Config", "ConfigError", "parse_config"]

DEFAULT_PATH = "/etc/bootfsm/config.toml"


@dataclass(frozen=True)
class RunSpec:
    """[run]: the global deadline and where bootfsm keeps its state and journals."""

    deadline: float = 720.0
    state_dir: str = "/var/lib/bootfsm"
    log_dir: str = "/var/log/bootfsm"
    keep_journals: int = 20
    backoff_scale: float = 1.0
    metrics_file: str = "/var/lib/node_exporter/textfile_collector/bootfsm.prom"
    cse_events_dir: str = ""
    cse_reserve: float = 60.0


@dataclass(frozen=True)
class DetectSpec:
    """[detect]: supported platforms and the optional cloud metadata lookup."""

    supported_os: tuple[str, ...] = ("ubuntu:22.04", "ubuntu:24.04", "debian:12")
    imds: bool = True
    imds_url: str = "http://169.254.169.254/metadata/instance?api-version=2021-02-01"
    imds_timeout: float = 2.0
    skip_tag: bool = True
    cleanup_on_no_gpu: bool = True
    gpu_node: str = "auto"
    fabric_manager: str = "auto"


@dataclass(frozen=True)
class DriverSpec:
    """[driver]: which driver to install and how."""

    install: bool = True
    keep_image_driver: bool = False
    version: str = "580.159.04"
    kind: str = "cuda"
    module_type: str = "auto"
    dpkg_lock_timeout: float = 120.0
    command_timeout: float = 600.0
    smi_wait: float = 60.0
    persistenced: bool = True
    coherent_memory_mode: str = "driver"
    source: str = "runfile"


@dataclass(frozen=True)
class SourcesSpec:
    """[sources]: where artifacts come from (mirrors) and the checksums not in an index."""

    runfile_base: str = "https://us.download.nvidia.com/tesla"
    runfile_sha256: str = ""
    runfile_sha256_x86_64: str = ""
    runfile_sha256_aarch64: str = ""
    grid_runfile_url: str = ""
    redist_base: str = "https://developer.download.nvidia.com/compute/nvidia-driver/redist"
    cuda_repo: str = (
        "https://developer.download.nvidia.com/compute/cuda/repos/{os_id}{os_version_nodot}"
        "/{redist_arch}"
    )
    toolkit_repo: str = "https://nvidia.github.io/libnvidia-container/stable/deb/{debian_arch}"
    toolkit_version: str = "1.19.0-1"
    toolkit_packages: tuple[str, ...] = (
        "libnvidia-container1",
        "libnvidia-container-tools",
        "nvidia-container-toolkit-base",
        "nvidia-container-toolkit",
    )
    runfile_pins: tuple[str, ...] = ()
    allow_unverified: bool = False
    cuda_repo_keyring: str = "/usr/share/keyrings/cuda-archive-keyring.gpg"
    toolkit_repo_keyring: str = "/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
    allow_unsigned_repos: bool = False
    redist_manifest_sha256: str = ""
    runfile_mirrors: tuple[str, ...] = ()
    redist_mirrors: tuple[str, ...] = ()
    cuda_repo_mirrors: tuple[str, ...] = ()
    toolkit_repo_mirrors: tuple[str, ...] = ()
    ubuntu_archive: str = "http://archive.ubuntu.com/ubuntu"
    ubuntu_ports: str = "http://ports.ubuntu.com/ubuntu-ports"
    ubuntu_archive_mirrors: tuple[str, ...] = ()
    ubuntu_archive_keyring: str = "/usr/share/keyrings/ubuntu-archive-keyring.gpg"

    def runfile_sha256_for(self, kind: str, version: str, runfile_arch: str) -> str:
        """The pinned lower-case sha256 of that runfile, or "": a ``runfile_pins`` entry first,
        else the per-arch key, else ``runfile_sha256`` (those two pin driver.version only)."""
        for pin in self.runfile_pins:
            k, v, a, sha = pin.split()
            if (k, v, a) == (kind, version, runfile_arch):
                return sha.lower()
        per_arch = {"x86_64": self.runfile_sha256_x86_64, "aarch64": self.runfile_sha256_aarch64}
        return (per_arch.get(runfile_arch) or self.runfile_sha256).lower()


@dataclass(frozen=True)
class FetchSpec:
    """[fetch]: the download cache and network limits."""

    cache_dir: str = "/var/cache/bootfsm"
    connect_timeout: float = 5.0
    read_timeout: float = 30.0
    allow_http_hosts: tuple[str, ...] = ()
    parallel: int = 4
    artifact_timeout: float = 300.0
    fsync: bool = False
    ca_file: str = ""
    segments: int = 8
    segment_min_size: int = 64 << 20
    segment_below_rate: int = 200_000_000


@dataclass(frozen=True)
class VerifySpec:
    """[verify]: how long to wait for the NVLink fabric and (GRID) the vGPU licence."""

    fabric_timeout: float = 300.0
    fabric_poll_interval: float = 5.0
    license_timeout: float = 300.0
    license_poll_interval: float = 5.0


@dataclass(frozen=True)
class MigSpec:
    """[mig]: MIG partitioning after verify (off unless a profile is configured or tagged)."""

    profile: str = ""
    tag: str = "GpuInstanceProfile"
    on_pending: str = "fail"


@dataclass(frozen=True)
class JoinSpec:
    """[join]: container runtime wiring and kubelet start-up."""

    containerd_restart_timeout: float = 60.0
    start_kubelet: bool = True
    kubelet_healthz_url: str = "http://127.0.0.1:10248/healthz"
    kubelet_timeout: float = 120.0
    kubelet_poll_interval: float = 2.0
    cdi_refresh: bool = True


@dataclass(frozen=True)
class BakeSpec:
    """[bake]: the prebake marker of the bash path (aks-gpu, /opt/azure/aks-gpu/dkms-marker)."""

    read_peer_marker: bool = True
    write_peer_marker: bool = False


@dataclass(frozen=True)
class Config:
    """The validated configuration of one run (frozen: the spec never changes mid-run)."""

    run: RunSpec = RunSpec()
    detect: DetectSpec = DetectSpec()
    driver: DriverSpec = DriverSpec()
    sources: SourcesSpec = SourcesSpec()
    fetch: FetchSpec = FetchSpec()
    verify: VerifySpec = VerifySpec()
    mig: MigSpec = MigSpec()
    join: JoinSpec = JoinSpec()
    bake: BakeSpec = BakeSpec()

    def digest(self) -> str:
        """sha256 of the canonical JSON of the config: names it in journals and markers."""
        blob = json.dumps(asdict(self), sort_keys=True, default=list).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (for `plan --json` and the docs test)."""
        return asdict(self)

    def runfile_sha256(self, runfile_arch: str) -> str:
        """The pinned sha256 of this config's driver runfile for ``runfile_arch``."""
        d = self.driver
        return self.sources.runfile_sha256_for(d.kind, d.version, runfile_arch)


DEFAULTS = Config()

_SECTIONS = [f.name for f in fields(Config)]
_CHOICES = {
    ("driver", "kind"): ("cuda", "grid"),
    ("driver", "module_type"): ("auto", "open", "proprietary"),
    ("detect", "gpu_node"): ("auto", "yes", "no"),
    ("detect", "fabric_manager"): ("auto", "yes", "no"),
    ("mig", "on_pending"): ("fail", "reboot"),
    ("driver", "coherent_memory_mode"): ("driver", ""),
    ("driver", "source"): ("runfile", "ubuntu-signed"),
}
_DAY = 86400.0
RANGES: dict[tuple[str, str], tuple[float, float, bool]] = {
    # (section, key): (low, high, low is allowed). Every number has one (a test checks);
    # validate and run share it, so nan, inf, 1e309 and negatives never reach a run.
    ("run", "deadline"): (0, _DAY, False),
    ("run", "keep_journals"): (0, 100_000, True),
    ("run", "backoff_scale"): (0, 100, True),
    ("run", "cse_reserve"): (0, _DAY, True),
    ("detect", "imds_timeout"): (0, 300, False),
    ("driver", "dpkg_lock_timeout"): (0, _DAY, False),
    ("driver", "command_timeout"): (0, _DAY, False),
    ("driver", "smi_wait"): (0, _DAY, False),
    ("fetch", "connect_timeout"): (0, 3600, False),
    ("fetch", "read_timeout"): (0, 3600, False),
    ("fetch", "parallel"): (1, 16, True),
    ("fetch", "artifact_timeout"): (0, _DAY, False),
    ("fetch", "segments"): (1, 16, True),
    ("fetch", "segment_min_size"): (1 << 20, 1 << 40, True),
    ("fetch", "segment_below_rate"): (0, 1 << 40, True),
    ("verify", "fabric_timeout"): (0, _DAY, False),
    ("verify", "fabric_poll_interval"): (0, 3600, False),
    ("verify", "license_timeout"): (0, _DAY, False),
    ("verify", "license_poll_interval"): (0, 3600, False),
    ("join", "containerd_restart_timeout"): (0, _DAY, False),
    ("join", "kubelet_timeout"): (0, _DAY, False),
    ("join", "kubelet_poll_interval"): (0, 3600, False),
}


def _coerce(section: str, key: str, value: Any, default: Any) -> Any:
    """``value`` as the type of ``default``, then every rule of ``_RULES`` for the key."""
    where = f"{section}.{key}"
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true or false, got {value!r}")
    elif isinstance(default, int | float):
        value = _number(where, value, default, RANGES[(section, key)])
    elif isinstance(default, tuple):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{where}: expected a list of strings, got {value!r}")
        value = tuple(value)
    elif not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    for rule in _RULES.get((section, key), ()):
        rule(where, value)
    return value


def _number(where: str, value: Any, default: float, bounds: tuple[float, float, bool]) -> float:
    if type(value) not in (int, float):  # TOML's own types; a bool is no number here
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if isinstance(default, int) and not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    lo, hi, lo_ok = bounds
    if not (lo <= value if lo_ok else lo < value) or value > hi:
        raise ConfigError(
            f"{where}: must be {'>=' if lo_ok else '>'} {lo:g} and <= {hi:g}, got {value!r}"
        )
    return type(default)(value)  # the default's type: a float key takes a whole number too


_UBUNTU = ("archive", "ports")
RUNFILE_SHA256_KEYS = ("runfile_sha256", "runfile_sha256_x86_64", "runfile_sha256_aarch64")
"""The plain runfile pins: they pin driver.version as configured (not ``runfile_pins``)."""
_RULES: dict[tuple[str, str], tuple[Rule, ...]] = {
    **{k: (one_of(choices),) for k, choices in _CHOICES.items()},
    **{k: (node_path, absolute) for k in (("run", "state_dir"), ("run", "log_dir"))},
    **{("run", k): (node_path, absolute_or_empty) for k in ("metrics_file", "cse_events_dir")},
    ("fetch", "cache_dir"): (node_path, absolute),
    ("fetch", "ca_file"): (node_path, absolute_or_empty),
    **{("sources", f"{k}_repo_keyring"): (absolute,) for k in ("cuda", "toolkit")},
    ("sources", "ubuntu_archive_keyring"): (node_path, absolute),
    **{("sources", f"ubuntu_{k}"): (lambda w, v: base_urls(w, (v,)),) for k in _UBUNTU},
    **{("sources", k): (sha256,) for k in (*RUNFILE_SHA256_KEYS, "redist_manifest_sha256")},
    **{
        ("sources", f"{k}_mirrors"): (base_urls,)
        for k in ("runfile", "redist", "cuda_repo", "toolkit_repo", "ubuntu_archive")
    },
    ("sources", "runfile_pins"): (pins,),
    ("driver", "version"): (version,),
    ("mig", "profile"): (mig_profile,),
    ("mig", "tag"): (mig_tag,),
}
"""Every key's checks beyond its type (and its range, ``RANGES``, for a number)."""


def parse_config(data: Mapping[str, Any]) -> Config:
    """Build a Config from parsed TOML data; unknown sections or keys are errors."""
    sections: dict[str, Any] = {}
    for name, table in data.items():
        if name not in _SECTIONS:
            raise ConfigError(f"unknown section [{name}]; known: {', '.join(_SECTIONS)}")
        if not isinstance(table, dict):
            raise ConfigError(f"[{name}] must be a table")
        default = getattr(DEFAULTS, name)
        known = {f.name for f in fields(default)}
        values: dict[str, Any] = {}
        for key, value in table.items():
            if key not in known:
                raise ConfigError(f"{name}.{key}: unknown key; known: {', '.join(sorted(known))}")
            values[key] = _coerce(name, key, value, getattr(default, key))
        sections[name] = replace(default, **values)
    return Config(**sections)
