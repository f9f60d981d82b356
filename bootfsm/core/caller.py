"""The provisioning hook's caller: what AKS's CSE chose for this VM size, as overrides.

Pure: CSE's environment (``GPU_DV``, ``MIG_NODE``...) in, config overrides with their
source out, kept in a drop-in for later runs; ``ConfigError`` names a bad variable,
``BootError(DRIVER_BRANCH_UNSUPPORTED)`` a driver bootfsm does not install. The values
are AgentBaker's (Azure/AgentBaker 06836ee2301e362039418c3a7ed0fe6004a641fd: cse_cmd.sh,
cse_helpers.sh, aks-node-controller/pkg/gpu/gpu.go, cse_config.sh ensureGPUDrivers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.config import DEFAULTS, RUNFILE_SHA256_KEYS, Config, ConfigError, parse_config
from bootfsm.core.errors import BootError

__all__ = [
    "HOOK_DROPIN",
    "HOOK_EVENTS_DIR",
    "HOOK_LOG_DIR",
    "REBOOT_REQUEST",
    "Override",
    "apply",
    "dropin_text",
    "hook_overrides",
]

HOOK_DROPIN = "50-provisioning-hook.toml"
"""The drop-in (in the config's ``config.d``) that keeps the caller's choices."""
REBOOT_REQUEST = "/run/bootfsm/reboot-required"
"""Written (one line: why) when the run needs the caller to reboot the node (a MIG mode
change, with mig.on_pending = reboot); under /run, so the reboot itself clears it."""
HOOK_LOG_DIR = "/var/log/azure/bootfsm"
"""Journals where AKS's log collector gathers them (aks-log-collector.sh collects
``/var/log/azure/*/*``); `bootfsm trace` finds them through the drop-in."""
HOOK_EVENTS_DIR = "/var/log/azure/Microsoft.Azure.Extensions.CustomScript/events"
"""The guest agent's event directory for the CSE extension (AgentBaker's
``logs_to_events`` writes there; the collector gathers ``/var/log/azure/*/*/*``)."""

_DRIVER_TYPES = {"cuda": "cuda", "cuda-lts": "cuda", "grid": "grid", "grid-v20": "grid"}
_BOOL = {"true": True, "false": False}


@dataclass(frozen=True)
class Override:
    """One config key the caller set: its value and where it came from."""

    key: str  # "driver.version"
    value: str | bool
    source: str  # "GPU_DV=580.159.04", "--hook"
    persist: bool = True  # kept for later runs (the drop-in)


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str]:
    """(name, value) of the first of ``names`` set to a non-empty value, else ("", "")."""
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return name, value
    return "", ""


def _flag(env: Mapping[str, str], name: str) -> bool | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if raw.lower() not in _BOOL:
        raise ConfigError(f"{name}: expected true or false, got {raw[:40]!r}")
    return _BOOL[raw.lower()]


def _flag_override(
    env: Mapping[str, str], name: str, key: str, values: tuple[str | bool, str | bool]
) -> Override | None:
    """``key`` set to ``values`` (false, true) by the true/false variable ``name``."""
    flag = _flag(env, name)
    return None if flag is None else Override(key, values[flag], f"{name}={env[name].strip()}")


def _driver_version(env: Mapping[str, str], cfg: Config) -> Override | None:
    name, version = _first(env, "GPU_DV", "GPU_DRIVER_VERSION")
    if not name:
        if _flag(env, "GPU_NODE"):  # GetGPUDriverVersion gives "" without components.json
            why = f"GPU_DV is empty (GPU_NODE=true): the config's {cfg.driver.version}"
            return Override("driver.version", cfg.driver.version, why, persist=False)
        return None
    kind, _, number = version.rpartition("-")
    if kind and kind in _DRIVER_TYPES and all(p.isdigit() for p in number.split(".")):
        # an aks-gpu image tag, not a version: gpu.go's Nvidia470CudaDriverVersion
        # ("cuda-470.82.01"), which GetGPUDriverVersion gives the retired NCv1 (K80) sizes
        raise BootError(
            Code.DRIVER_BRANCH_UNSUPPORTED,
            f"{name}={version[:40]}: the R{number.split('.', 1)[0]} {kind} driver AgentBaker "
            "pins for the retired NCv1 sizes (Tesla K80); bootfsm installs no driver of "
            "that branch and none drives a K80 after it",
        )
    if not all(p.isdigit() for p in version.split(".")):
        raise ConfigError(
            f"{name}: expected a driver version like 580.159.04, got {version[:40]!r}"
        )
    return Override("driver.version", version, f"{name}={version}")


def _driver_kind(env: Mapping[str, str]) -> Override | None:
    name, kind = _first(env, "NVIDIA_GPU_DRIVER_TYPE", "GPU_DRIVER_TYPE")
    if not name:
        return None
    if kind not in _DRIVER_TYPES:
        raise ConfigError(f"{name}: expected one of {', '.join(_DRIVER_TYPES)}, got {kind[:40]!r}")
    return Override("driver.kind", _DRIVER_TYPES[kind], f"{name}={kind}")


def _mig_profile(env: Mapping[str, str]) -> Override | None:
    mig = _flag(env, "MIG_NODE")
    profile = env.get("GPU_INSTANCE_PROFILE", "").strip()
    if mig and not profile:
        raise ConfigError("MIG_NODE=true but GPU_INSTANCE_PROFILE is empty: no MIG layout to make")
    if mig is None:
        return None
    source = f"MIG_NODE={env['MIG_NODE'].strip()}, GPU_INSTANCE_PROFILE={profile}"
    # MIG_NODE=false: no layout, whatever the profile says
    return Override("mig.profile", profile if mig else "", source)


def hook_overrides(cfg: Config, env: Mapping[str, str]) -> list[Override]:
    """Everything `bootfsm run --hook` changes in ``cfg``: the caller's environment, and
    what running inside CSE needs (kubelet and reboots are CSE's; journals where AKS collects)."""
    found = [
        _flag_override(env, "GPU_NODE", "detect.gpu_node", ("no", "yes")),
        _flag_override(env, "GPU_NEEDS_FABRIC_MANAGER", "detect.fabric_manager", ("no", "yes")),
        _driver_version(env, cfg),
        _driver_kind(env),
        # false: validateGPUDrivers, the image's driver if it loads, else configGPUDrivers
        _flag_override(env, "CONFIG_GPU_DRIVER_IF_NEEDED", "driver.install", (True, True)),
        _flag_override(
            env, "CONFIG_GPU_DRIVER_IF_NEEDED", "driver.keep_image_driver", (True, False)
        ),
        _mig_profile(env),
    ]
    out = [o for o in found if o is not None]
    # CSE's ensureKubelet configures and starts kubelet after the GPU step
    out.append(Override("join.start_kubelet", False, "--hook", persist=False))
    out.append(Override("mig.on_pending", "reboot", "--hook", persist=False))
    if cfg.run.log_dir == DEFAULTS.run.log_dir:
        out.append(Override("run.log_dir", HOOK_LOG_DIR, "--hook"))
    if not cfg.run.cse_events_dir:
        out.append(Override("run.cse_events_dir", HOOK_EVENTS_DIR, "--hook"))
    return out


def apply(cfg: Config, overrides: Sequence[Override]) -> tuple[Config, list[Override]]:
    """``cfg`` with ``overrides`` set and validated, and every override in effect (the given
    ones, plus ``runfile_sha256*`` emptied when the caller chose another driver)."""
    data: dict[str, dict[str, Any]] = {
        section: {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        for section, values in cfg.to_dict().items()
    }
    for o in overrides:
        section, key = o.key.split(".", 1)
        data[section][key] = o.value
    done = list(overrides)
    chosen = (data["driver"]["kind"], data["driver"]["version"])
    # the plain runfile_sha256* keys pin the configured driver; only runfile_pins pin others
    if chosen != (cfg.driver.kind, cfg.driver.version):
        why = (
            f"pins {cfg.driver.kind} {cfg.driver.version}, not the caller's {chosen[0]} {chosen[1]}"
        )
        for key in RUNFILE_SHA256_KEYS:
            if data["sources"][key]:
                data["sources"][key] = ""
                done.append(Override(f"sources.{key}", "", why))
    return parse_config(data), done


def _toml(value: str | bool) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def dropin_text(overrides: Sequence[Override], run_id: str) -> str:
    """The drop-in that keeps the caller's choices for later runs (those to persist)."""
    lines = [
        f"# Written by `bootfsm run --hook` (run {run_id}): the provisioning script's",
        "# choices for this VM size, from the environment it exported. Every later run",
        "# (bootfsm.service at the next boot) keeps them; remove this file to go back to",
        "# config.toml alone.",
    ]
    sections: dict[str, list[Override]] = {}
    for o in overrides:
        if o.persist:
            sections.setdefault(o.key.split(".", 1)[0], []).append(o)
    for section, items in sections.items():
        lines += ["", f"[{section}]"]
        lines += [f"{o.key.split('.', 1)[1]} = {_toml(o.value)}  # {o.source}" for o in items]
    return "\n".join(lines) + "\n"
