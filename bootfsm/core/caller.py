"""The provisioning hook's caller: what AKS's provisioning script chose for this VM size.

AgentBaker's CSE decides per VM size which driver a node gets and exports it to the
commands it runs (cse_cmd.sh sets ``GPU_NODE``, ``GPU_DRIVER_VERSION``,
``GPU_DRIVER_TYPE``, ``GPU_NEEDS_FABRIC_MANAGER``, ``MIG_NODE`` and
``GPU_INSTANCE_PROFILE``; cse_helpers.sh exports ``GPU_DV`` and
``NVIDIA_GPU_DRIVER_TYPE`` from the two driver ones; aks-node-controller/pkg/gpu and
karpenter-provider-azure's pkg/utils/gpu.go give the values: driver types ``cuda``,
``cuda-lts``, ``grid``, ``grid-v20``). ``bootfsm run --hook`` reads them here as
overrides of the config, each with its source, and writes them as a config drop-in so
that later runs (the unit at the next boot) keep the caller's choices.

Pure: environment in, overrides out; ``ConfigError`` names the variable of a bad value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bootfsm.core.config import DEFAULTS, RUNFILE_SHA256_KEYS, Config, ConfigError, parse_config

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


def _driver_version(env: Mapping[str, str]) -> Override | None:
    name, version = _first(env, "GPU_DV", "GPU_DRIVER_VERSION")
    if not name:
        return None
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
    """Everything `bootfsm run --hook` changes in ``cfg``: the caller's choices from its
    environment, and what the hook's place in the provisioning script needs (kubelet is
    the caller's: ``ensureKubelet`` configures and starts it after the GPU step; a MIG
    mode that needs a reboot is the caller's reboot; journals and events where AKS
    collects them, unless the config already chose other places)."""
    found = [
        _flag_override(env, "GPU_NODE", "detect.gpu_node", ("no", "yes")),
        _flag_override(env, "GPU_NEEDS_FABRIC_MANAGER", "detect.fabric_manager", ("no", "yes")),
        _driver_version(env),
        _driver_kind(env),
        _flag_override(env, "CONFIG_GPU_DRIVER_IF_NEEDED", "driver.install", (False, True)),
        _mig_profile(env),
    ]
    out = [o for o in found if o is not None]
    out.append(Override("join.start_kubelet", False, "--hook", persist=False))
    out.append(Override("mig.on_pending", "reboot", "--hook", persist=False))
    if cfg.run.log_dir == DEFAULTS.run.log_dir:
        out.append(Override("run.log_dir", HOOK_LOG_DIR, "--hook"))
    if not cfg.run.cse_events_dir:
        out.append(Override("run.cse_events_dir", HOOK_EVENTS_DIR, "--hook"))
    return out


def apply(cfg: Config, overrides: Sequence[Override]) -> tuple[Config, list[Override]]:
    """``cfg`` with ``overrides`` set, validated as a config file would be, and every
    override in effect: those given plus, when the caller chose another driver than the
    configured one, the plain ``runfile_sha256*`` keys emptied (they pin the configured
    driver's runfile, not the caller's: only a ``runfile_pins`` entry verifies that)."""
    data: dict[str, dict[str, Any]] = {
        section: {k: list(v) if isinstance(v, tuple) else v for k, v in values.items()}
        for section, values in cfg.to_dict().items()
    }
    for o in overrides:
        section, key = o.key.split(".", 1)
        data[section][key] = o.value
    done = list(overrides)
    chosen = (data["driver"]["kind"], data["driver"]["version"])
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
