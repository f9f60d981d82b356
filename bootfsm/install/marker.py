"""The prebake marker: what DKMS built, written by `bootfsm bake` or a boot that compiled;
and the ready marker join writes last (``ReadyMarker``).

Pure apart from reading and writing the bake marker through the Host. The driver state
skips the compile only when it matches (``check_marker``); its first four keys are the
bash path's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

from bootfsm.core.config import Config
from bootfsm.host.host import Host
from bootfsm.node.facts import NodeFacts

__all__ = [
    "MATCH_FIELDS",
    "PEER_MARKER",
    "PEER_SOURCE",
    "Marker",
    "MarkerError",
    "Mismatch",
    "ReadyMarker",
    "check_marker",
    "expected_marker",
    "marker_path",
    "module_type_of",
    "parse_marker",
    "parse_modinfo",
    "parse_peer_marker",
    "read_marker",
    "ready_path",
    "render_marker",
    "render_peer_marker",
    "required_module_type",
    "write_marker",
]

MATCH_FIELDS = ("arch", "kernel", "driver_version", "driver_kind", "module_type", "runfile_sha256")
"""Marker fields that must match the node for a boot to skip the compile, in check order."""

_REQUIRED = ("kernel", "driver_version", "driver_kind", "arch")  # the bash marker's four lines

PEER_MARKER = "/opt/azure/aks-gpu/dkms-marker"
"""The bash path's marker: aks-gpu's install.sh (``write_dkms_marker``, build-only mode)
writes ``kernel=``, ``driver_version=``, ``driver_kind=``, ``arch=`` lines there, and
AgentBaker's cse_config.sh reads its ``driver_kind=`` (``sed -n 's/^driver_kind=//p'``).
Newer AgentBaker images add ``dkms_registration=parked-v1`` (ignored here)."""
PEER_SOURCE = "aks-gpu"


@dataclass(frozen=True)
class Marker:
    """What DKMS built: written by bake (``source=bake``) or by a boot that compiled."""

    kernel: str
    driver_version: str
    driver_kind: str
    arch: str
    module_type: str = ""
    runfile_sha256: str = ""
    config_digest: str = ""
    dkms: str = ""
    """``no``: installed without DKMS (bake's build-only module: a shared image keeps no
    NVIDIA DKMS registration, so a kernel update on a CPU node builds nothing,
    Azure/aks-gpu#191); ``yes`` or "": registered with DKMS, whose kernel hook builds
    the module for every new kernel."""
    source: str = "bake"
    baked_at: str = ""
    bootfsm: str = ""


class MarkerError(ValueError):
    """A marker file that cannot be parsed; the message says why."""


@dataclass(frozen=True)
class Mismatch:
    """One marker field that does not match the node (``node`` is what the node needs)."""

    field: str
    marker: str
    node: str


def marker_path(cfg: Config) -> str:
    """Node path of the bake marker: ``<run.state_dir>/bake.marker``."""
    return f"{cfg.run.state_dir}/bake.marker"


def render_marker(m: Marker) -> str:
    """The marker file: a comment line, then ``key=value`` lines (bash-marker compatible)."""
    head = "# bootfsm bake marker: the NVIDIA module DKMS built (docs/image-build.md)\n"
    return head + "".join(f"{k}={v}\n" for k, v in asdict(m).items())


def parse_marker(text: str) -> Marker:
    """Parse ``key=value`` lines (comments, unknown keys ignored); MarkerError names a
    missing required key or a bad line."""
    values: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq or not key.strip():
            raise MarkerError(f"bake marker line {lineno}: expected key=value, got {line[:80]!r}")
        values[key.strip()] = value.strip()
    missing = [k for k in _REQUIRED if not values.get(k)]
    if missing:
        raise MarkerError(f"bake marker lacks {', '.join(f'{k}=' for k in missing)}")
    known = {f.name for f in fields(Marker)}
    return Marker(**{k: v for k, v in values.items() if k in known})


def parse_peer_marker(text: str) -> Marker:
    """Parse PEER_MARKER (no module type or hash; ``source=aks-gpu``); MarkerError as above."""
    # the first line of a key wins, as aks-gpu's `sed -n 's/^key=//p' | head -n1`
    first: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        key = line.partition("=")[0].strip()
        if "=" in line and key in seen:
            continue
        seen.add(key)
        first.append(line)
    m = parse_marker("\n".join(first))
    return replace(m, source=PEER_SOURCE, module_type="", runfile_sha256="", config_digest="")


def render_peer_marker(m: Marker) -> str:
    """The bash path's marker for ``m``: its four lines, in aks-gpu's order."""
    return "".join(f"{k}={getattr(m, k)}\n" for k in _REQUIRED)


def read_marker(host: Host, cfg: Config) -> Marker | None:
    """bootfsm's marker, else (``bake.read_peer_marker``) PEER_MARKER's; None when neither;
    MarkerError when unparsable."""
    text, parse = host.read_text(marker_path(cfg)), parse_marker
    if text is None and cfg.bake.read_peer_marker:
        text, parse = host.read_text(PEER_MARKER), parse_peer_marker
    return None if text is None else parse(text)


def write_marker(host: Host, cfg: Config, m: Marker) -> list[str]:
    """Write the marker atomically (PEER_MARKER too with ``bake.write_peer_marker``);
    return the node paths written."""
    host.write_atomic(marker_path(cfg), render_marker(m), 0o600)
    if not cfg.bake.write_peer_marker:
        return [marker_path(cfg)]
    host.makedirs(PEER_MARKER.rsplit("/", 1)[0], mode=0o755)
    host.write_atomic(PEER_MARKER, render_peer_marker(m), 0o644)
    return [marker_path(cfg), PEER_MARKER]


def required_module_type(
    cfg_type: str, *, needs_open: bool, needs_proprietary: bool = False
) -> str:
    """``open``, ``proprietary``, or "" for either (``auto`` where both drive the GPUs)."""
    if cfg_type == "auto":
        return "open" if needs_open else "proprietary" if needs_proprietary else ""
    return cfg_type


def expected_marker(cfg: Config, facts: NodeFacts) -> Marker:
    """What a marker must say for this node and config (module_type may be ``auto``)."""
    return Marker(
        kernel=facts.kernel,
        driver_version=cfg.driver.version,
        driver_kind=cfg.driver.kind,
        arch=facts.raw_arch,
        module_type=cfg.driver.module_type,
        runfile_sha256=cfg.runfile_sha256(facts.arch.runfile if facts.arch else ""),
        config_digest=cfg.digest(),
    )


def check_marker(
    m: Marker, want: Marker, *, needs_open: bool, needs_proprietary: bool = False
) -> list[Mismatch]:
    """Every ``MATCH_FIELDS`` field where ``m`` does not fit ``want`` (pure); ``auto``
    accepts either module type unless the GPUs need one; sha256 compared only if both have one."""
    out: list[Mismatch] = []
    for name in MATCH_FIELDS:
        have, need = getattr(m, name), getattr(want, name)
        if name == "module_type" and not have:
            continue  # a bash-path marker names no type: the built module's licence decides
        if name == "module_type" and need == "auto":
            only = required_module_type(
                need, needs_open=needs_open, needs_proprietary=needs_proprietary
            )
            if have not in ((only,) if only else ("open", "proprietary")):
                out.append(Mismatch(name, have, only or "auto"))
        elif name == "runfile_sha256":
            if have and need and have.lower() != need.lower():
                out.append(Mismatch(name, have, need))
        elif have != need:
            out.append(Mismatch(name, have, need))
    return out


def parse_modinfo(text: str) -> dict[str, str]:
    """``modinfo`` output (``key:  value`` lines) to the first value of each key."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon and key and " " not in key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


def module_type_of(modinfo: dict[str, str]) -> str:
    """``open`` (licence ``Dual MIT/GPL``), ``proprietary`` (``NVIDIA``) or ""."""
    return {"Dual MIT/GPL": "open", "NVIDIA": "proprietary"}.get(modinfo.get("license", ""), "")


@dataclass(frozen=True)
class ReadyMarker:
    """join's last write, ``<run.state_dir>/ready`` (one JSON object): the driver and
    config this node joined with, and the run that wrote it."""

    driver_version: str
    config_digest: str
    run_id: str = ""
    wall_time: float = 0.0

    def render(self) -> str:
        """The file's text: the fields as one JSON object and a newline."""
        return json.dumps(asdict(self)) + "\n"

    @classmethod
    def parse(cls, text: str) -> ReadyMarker:
        """The file's fields (pure; unknown keys ignored); MarkerError when it is not a JSON
        object whose driver version and config digest are strings."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise MarkerError(f"ready marker is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise MarkerError("ready marker is not a JSON object")
        known = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        if not all(isinstance(known.get(k), str) for k in ("driver_version", "config_digest")):
            raise MarkerError("ready marker lacks a driver_version or config_digest string")
        return cls(**known)

    def fits(self, cfg: Config) -> bool:
        """Written for ``cfg``'s driver version and configuration."""
        return (self.driver_version, self.config_digest) == (cfg.driver.version, cfg.digest())


def ready_path(cfg: Config) -> str:
    """Node path of the ready marker: ``<run.state_dir>/ready``."""
    return f"{cfg.run.state_dir}/ready"
