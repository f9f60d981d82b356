"""Artifacts: which files this node needs, resolved from real upstream layouts.

``index_urls`` and ``resolve`` are pure: the fetch state downloads the indexes (the
``redistrib_<ver>.json`` manifest, the ``Packages`` indexes) and hands their text in.
Every artifact carries the sha256 it must match; one without a checksum is refused
unless ``sources.allow_unverified`` is set. The resolved list is saved beside the
cache so later states (and reruns) use exactly what fetch verified.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from bootfsm.codes import Code
from bootfsm.config import Config
from bootfsm.errors import BootError
from bootfsm.facts import NodeFacts
from bootfsm.guards import needs_fabric_manager, needs_imex
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import parse_packages, select_package
from bootfsm.parsers.redistrib import parse_redistrib

__all__ = [
    "Artifact",
    "cache_node_path",
    "expand",
    "index_urls",
    "resolution_key",
    "resolve",
    "sha256_of",
]

FM_COMPONENT = "fabricmanager"


@dataclass(frozen=True)
class Artifact:
    """One file to download: where from, what it must hash to, where it is cached."""

    name: str
    role: str  # runfile | fabricmanager | imex | toolkit
    url: str
    sha256: str
    size: int | None
    filename: str

    def to_json(self) -> dict[str, object]:
        """Plain data for resolved.json and `plan --json`."""
        return asdict(self)


def expand(template: str, cfg: Config, facts: NodeFacts) -> str:
    """Fill ``{os_id}``, ``{os_version_nodot}``, ``{redist_arch}``, ``{debian_arch}``..."""
    arch = facts.arch
    values = {
        "os_id": facts.os_id,
        "os_version": facts.os_version,
        "os_version_nodot": facts.os_version.replace(".", ""),
        "redist_arch": arch.redist if arch else "",
        "debian_arch": arch.debian if arch else "",
        "runfile_arch": arch.runfile if arch else "",
        "kernel_arch": arch.kernel if arch else "",
        "version": cfg.driver.version,
    }
    try:
        return template.format(**values)
    except (KeyError, IndexError, ValueError) as exc:
        raise BootError(Code.CONFIG_INVALID, f"bad URL template {template!r}: {exc}") from exc


def index_urls(cfg: Config, facts: NodeFacts) -> dict[str, str]:
    """The manifests and indexes this node must read before it knows its artifacts."""
    urls = {"toolkit_packages": expand(cfg.sources.toolkit_repo, cfg, facts) + "/Packages"}
    if cfg.driver.install and needs_fabric_manager(facts):
        urls["redistrib"] = f"{cfg.sources.redist_base}/redistrib_{cfg.driver.version}.json"
    if cfg.driver.install and needs_imex(facts):
        urls["cuda_packages"] = expand(cfg.sources.cuda_repo, cfg, facts) + "/Packages"
    return urls


def _runfile(cfg: Config, facts: NodeFacts) -> Artifact:
    assert facts.arch is not None
    if cfg.driver.kind == "grid":
        url = expand(cfg.sources.grid_runfile_url, cfg, facts)
    else:
        url = (
            f"{cfg.sources.runfile_base}/{cfg.driver.version}/"
            f"NVIDIA-Linux-{facts.arch.runfile}-{cfg.driver.version}.run"
        )
    return Artifact(
        "runfile", "runfile", url, cfg.sources.runfile_sha256.lower(), None, url.rsplit("/", 1)[-1]
    )


def _index(indexes: Mapping[str, str], key: str, urls: Mapping[str, str]) -> str:
    if key not in indexes:
        raise BootError(Code.INTERNAL_ERROR, f"index {key} was not fetched")
    return indexes[key]


def _from_packages(
    text: str, url: str, names: Sequence[str], version: str, arch: str, role: str
) -> Artifact:
    try:
        entries = parse_packages(text)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{url}: {exc}") from exc
    entry = select_package(entries, names, version, arch)
    if entry is None:
        raise BootError(
            Code.ARTIFACT_NOT_FOUND,
            f"{' or '.join(names)} {version} ({arch}) is not listed in {url}",
        )
    base = url.rsplit("/", 1)[0]
    return Artifact(
        entry.package,
        role,
        f"{base}/{entry.filename}",
        entry.sha256.lower(),
        entry.size,
        entry.filename.rsplit("/", 1)[-1],
    )


def resolve(cfg: Config, facts: NodeFacts, indexes: Mapping[str, str]) -> list[Artifact]:
    """Every artifact this node needs, from the fetched index texts (pure)."""
    assert facts.arch is not None
    urls = index_urls(cfg, facts)
    out: list[Artifact] = []
    if cfg.driver.install:
        out.append(_runfile(cfg, facts))
    tk_url = urls["toolkit_packages"]
    tk_text = _index(indexes, "toolkit_packages", urls)
    for name in cfg.sources.toolkit_packages:
        out.append(
            _from_packages(
                tk_text, tk_url, [name], cfg.sources.toolkit_version, facts.arch.debian, "toolkit"
            )
        )
    if "redistrib" in urls:
        out.append(
            _fabricmanager(cfg, facts, urls["redistrib"], _index(indexes, "redistrib", urls))
        )
    if "cuda_packages" in urls:
        branch = cfg.driver.version.split(".", 1)[0]
        out.append(
            _from_packages(
                _index(indexes, "cuda_packages", urls),
                urls["cuda_packages"],
                ["nvidia-imex", f"nvidia-imex-{branch}"],
                cfg.driver.version,
                facts.arch.debian,
                "imex",
            )
        )
    for a in out:
        if not a.sha256 and not cfg.sources.allow_unverified:
            raise BootError(
                Code.UNVERIFIED_ARTIFACT_REFUSED,
                f"{a.name} ({a.url.split('?', 1)[0]}) has no sha256 from a manifest, an index "
                "or the config, and sources.allow_unverified is false",
            )
    return out


def _fabricmanager(cfg: Config, facts: NodeFacts, url: str, text: str) -> Artifact:
    assert facts.arch is not None
    try:
        manifest = parse_redistrib(text)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{url}: {exc}") from exc
    platform = f"linux-{facts.arch.redist}"
    comp = manifest.components.get(FM_COMPONENT)
    entry = comp.platforms.get(platform) if comp else None
    if entry is None:
        raise BootError(
            Code.ARTIFACT_NOT_FOUND, f"{FM_COMPONENT} for {platform} is not listed in {url}"
        )
    return Artifact(
        FM_COMPONENT,
        "fabricmanager",
        f"{cfg.sources.redist_base}/{entry.relative_path}",
        entry.sha256.lower(),
        entry.size,
        entry.relative_path.rsplit("/", 1)[-1],
    )


def cache_node_path(cfg: Config, a: Artifact) -> str:
    """Where a verified artifact lives in the cache (content-addressed by sha256)."""
    bucket = a.sha256[:16] if a.sha256 else "unverified"
    return f"{cfg.fetch.cache_dir}/{bucket}/{a.filename}"


def resolution_key(cfg: Config, facts: NodeFacts) -> str:
    """Identifies what a saved resolution was made for: config and platform."""
    parts = [cfg.digest(), facts.raw_arch, facts.os_id, facts.os_version]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def dump_resolution(key: str, arts: Sequence[Artifact]) -> str:
    """resolved.json content."""
    return json.dumps({"key": key, "artifacts": [a.to_json() for a in arts]}, indent=1)


def load_resolution(text: str | None, key: str) -> list[Artifact] | None:
    """Artifacts from resolved.json when it was made for ``key``; None otherwise."""
    if not text:
        return None
    try:
        data = json.loads(text)
        if data.get("key") != key:
            return None
        return [Artifact(**a) for a in data["artifacts"]]
    except (ValueError, TypeError, KeyError):
        return None


def sha256_of(path: Path) -> str:
    """sha256 hex digest of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()
