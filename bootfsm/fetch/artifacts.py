"""Which files this node needs, resolved (pure) from the index texts fetch hands in.

Every artifact carries the sha256 it must match; one without is refused unless
``sources.allow_unverified``. Its URLs list the base that served its index first.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.core.redact import redact_url
from bootfsm.node.facts import NodeFacts
from bootfsm.node.guards import needs_fabric_manager, needs_imex
from bootfsm.node.verdict import installs_driver, kept_image_driver
from bootfsm.parsers import ParseError

__all__ = [
    "Artifact",
    "cache_node_path",
    "expand",
    "index_cache_path",
    "index_candidates",
    "index_urls",
    "join_url",
    "resolution_key",
    "resolve",
    "sha256_of",
]

FM_COMPONENT = "fabricmanager"
NVLSM_COMPONENT = "nvlsm"  # NVLink5 subnet manager, in the driver redist manifest since 580


@dataclass(frozen=True)
class Artifact:
    """One file to download: where from, what it must hash to, where it is cached."""

    name: str
    role: str  # runfile | fabricmanager | nvlsm | imex | toolkit | signed
    url: str
    sha256: str
    size: int | None
    filename: str
    mirrors: tuple[str, ...] = ()  # the same file elsewhere, tried in order after url

    @property
    def urls(self) -> tuple[str, ...]:
        """Every URL of this artifact, in the order to try them."""
        return (self.url, *self.mirrors)

    def to_json(self) -> dict[str, object]:
        """Plain data for resolved.json and `plan --json`."""
        return asdict(self)


def join_url(base: str, rel: str) -> str:
    """``base`` + ``/`` + ``rel`` with the base's query string (a signature) kept last."""
    parts = urlsplit(base)
    path = parts.path.rstrip("/") + "/" + rel.lstrip("/")
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


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


def _bases(cfg: Config, facts: NodeFacts, primary: str, mirrors: Sequence[str]) -> tuple[str, ...]:
    return tuple(expand(b, cfg, facts) for b in (primary, *mirrors))


def _index_sources(cfg: Config, facts: NodeFacts) -> dict[str, tuple[tuple[str, ...], str]]:
    """Index key -> (base URLs, primary first; file name under each base)."""
    src = cfg.sources
    out = {
        "toolkit_packages": (
            _bases(cfg, facts, src.toolkit_repo, src.toolkit_repo_mirrors),
            "Packages",
        )
    }
    installs = installs_driver(cfg, facts)  # a kept image driver: the toolkit alone
    if installs and cfg.driver.source == "ubuntu-signed":
        from bootfsm.fetch.ubuntu_signed import archive_sources  # this source only

        return {**out, **archive_sources(cfg, facts)}  # fabric manager, IMEX: from it too
    if installs and needs_fabric_manager(facts):
        out["redistrib"] = (
            _bases(cfg, facts, src.redist_base, src.redist_mirrors),
            f"redistrib_{cfg.driver.version}.json",
        )
    if installs and needs_imex(facts):
        out["cuda_packages"] = (
            _bases(cfg, facts, src.cuda_repo, src.cuda_repo_mirrors),
            "Packages",
        )
    return out


def index_candidates(cfg: Config, facts: NodeFacts) -> dict[str, tuple[str, ...]]:
    """Every URL of each index this node reads, primary first, then the mirrors."""
    return {
        key: tuple(join_url(b, name) for b in bases)
        for key, (bases, name) in _index_sources(cfg, facts).items()
    }


def index_urls(cfg: Config, facts: NodeFacts) -> dict[str, str]:
    """The manifests and indexes this node must read before it knows its artifacts."""
    return {key: urls[0] for key, urls in index_candidates(cfg, facts).items()}


def index_cache_path(cfg: Config, key: str, primary_url: str) -> str:
    """Node path of the cached copy of an index (flat in the cache, query not part of it)."""
    ident = hashlib.sha256(primary_url.split("?", 1)[0].encode()).hexdigest()[:12]
    return f"{cfg.fetch.cache_dir}/index-{key}-{ident}"


def _ordered(bases: Sequence[str], first: int) -> tuple[str, ...]:
    first = first if 0 <= first < len(bases) else 0
    return (bases[first], *bases[:first], *bases[first + 1 :])


def _runfile(cfg: Config, facts: NodeFacts) -> Artifact:
    assert facts.arch is not None
    sha = cfg.runfile_sha256(facts.arch.runfile)
    if cfg.driver.kind == "grid":
        url = expand(cfg.sources.grid_runfile_url, cfg, facts)
        return Artifact("runfile", "runfile", url, sha, None, urlsplit(url).path.rsplit("/", 1)[-1])
    v = cfg.driver.version
    rel = f"{v}/NVIDIA-Linux-{facts.arch.runfile}-{v}.run"
    bases = _bases(cfg, facts, cfg.sources.runfile_base, cfg.sources.runfile_mirrors)
    return _mirrored("runfile", "runfile", bases, rel, sha, None)


def _mirrored(
    name: str, role: str, bases: Sequence[str], rel: str, sha256: str, size: int | None
) -> Artifact:
    """The artifact at ``rel`` under every base, in the order of ``bases``."""
    urls = [join_url(b, rel) for b in bases]
    return Artifact(name, role, urls[0], sha256, size, rel.rsplit("/", 1)[-1], tuple(urls[1:]))


def _index(indexes: Mapping[str, str], key: str) -> str:
    if key not in indexes:
        raise BootError(Code.INTERNAL_ERROR, f"index {key} was not fetched")
    return indexes[key]


def _from_packages(
    text: str,
    bases: Sequence[str],
    wants: Mapping[str, tuple[Sequence[str], str, str]],
    role: str,
) -> list[Artifact]:
    """The artifacts ``wants`` (key -> names, version, arch) names; each must be found."""
    where = redact_url(join_url(bases[0], "Packages"))
    try:
        from bootfsm.parsers.debian_packages import select_packages  # resolving only

        picked = select_packages(text, wants)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{where}: {exc}") from exc
    out = []
    for key, (names, version, arch) in wants.items():
        entry = picked[key]
        if entry is None:
            raise BootError(
                Code.ARTIFACT_NOT_FOUND,
                f"{' or '.join(names)} {version} ({arch}) is not listed in {where}",
            )
        sha = entry.sha256.lower()
        out.append(_mirrored(entry.package, role, bases, entry.filename, sha, entry.size))
    return out


def resolve(
    cfg: Config,
    facts: NodeFacts,
    indexes: Mapping[str, str],
    served: Mapping[str, int] | None = None,
) -> list[Artifact]:
    """Every artifact this node needs, from the fetched index texts (pure); ``served``
    (index key -> base position) puts that base first in the artifacts' URLs."""
    assert facts.arch is not None
    sources = _index_sources(cfg, facts)
    urls = index_urls(cfg, facts)

    def bases(key: str) -> tuple[str, ...]:
        return _ordered(sources[key][0], (served or {}).get(key, 0))

    out: list[Artifact] = []
    if installs_driver(cfg, facts) and cfg.driver.source == "ubuntu-signed":
        out += _signed(cfg, facts, indexes, bases)
    elif installs_driver(cfg, facts):
        out.append(_runfile(cfg, facts))
    tk = {
        n: ([n], cfg.sources.toolkit_version, facts.arch.debian)
        for n in cfg.sources.toolkit_packages
    }
    out += _from_packages(
        _index(indexes, "toolkit_packages"), bases("toolkit_packages"), tk, "toolkit"
    )
    if "redistrib" in urls:
        redist = (facts, bases("redistrib"), urls["redistrib"], _index(indexes, "redistrib"))
        out.append(_component(*redist, FM_COMPONENT))
        if facts.nvlink5:
            out.append(_component(*redist, NVLSM_COMPONENT))
    if "cuda_packages" in urls:
        branch = cfg.driver.version.split(".", 1)[0]
        names = ["nvidia-imex", f"nvidia-imex-{branch}"]
        imex = {"imex": (names, cfg.driver.version, facts.arch.debian)}
        out += _from_packages(
            _index(indexes, "cuda_packages"), bases("cuda_packages"), imex, "imex"
        )
    for a in out:
        if not a.sha256 and not cfg.sources.allow_unverified:
            raise BootError(
                Code.UNVERIFIED_ARTIFACT_REFUSED,
                f"{a.name} ({redact_url(a.url)}) has no sha256 from a manifest, an index "
                "or the config, and sources.allow_unverified is false",
            )
    return out


def _signed(
    cfg: Config, facts: NodeFacts, indexes: Mapping[str, str], bases: Callable[[str], Sequence[str]]
) -> list[Artifact]:
    """Canonical's signed module for the running kernel and its exact user-space, in
    install order (bootfsm/fetch/ubuntu_signed.py)."""
    from bootfsm.fetch.ubuntu_signed import resolve_stack, wanted  # this source only

    keys = [k for k in index_urls(cfg, facts) if k.startswith("ubuntu_")]
    if not keys:
        raise BootError(
            Code.UNSUPPORTED_OS,
            f'driver.source = "ubuntu-signed" needs Ubuntu 22.04 or 24.04; this node is'
            f" {facts.os_id}:{facts.os_version}",
        )
    if facts.nvlink5:  # NVIDIA publishes NVLSM in its redist and CUDA repo, not Ubuntu's
        raise BootError(
            Code.NVLSM_INSTALL_FAILED,
            "NVLink5 needs NVLSM, which Ubuntu's archive does not carry: driver.source ="
            ' "ubuntu-signed" does not provision NVLink5 (B200/B300 HGX) nodes yet',
        )
    stack = resolve_stack({k: _index(indexes, k) for k in keys}, wanted(cfg, facts))
    return [
        _mirrored(p.entry.package, "signed", bases(p.key), p.entry.filename, p.entry.sha256,
                  p.entry.size)
        for p in stack.packages
    ]  # fmt: skip


def _component(facts: NodeFacts, bases: Sequence[str], url: str, text: str, key: str) -> Artifact:
    """A redist archive (fabric manager, NVLSM) for this node's platform."""
    assert facts.arch is not None
    try:
        from bootfsm.parsers.redistrib import parse_redistrib  # resolving only

        manifest = parse_redistrib(text)
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{redact_url(url)}: {exc}") from exc
    platform = f"linux-{facts.arch.redist}"
    comp = manifest.components.get(key)
    entry = comp.platforms.get(platform) if comp else None
    if entry is None:
        code = Code.NVLSM_INSTALL_FAILED if key == NVLSM_COMPONENT else Code.ARTIFACT_NOT_FOUND
        need = (
            " (NVLink5 needs it; driver 580+ manifests list it)" if key == NVLSM_COMPONENT else ""
        )
        raise BootError(code, f"{key} for {platform} is not listed in {redact_url(url)}{need}")
    return _mirrored(key, key, bases, entry.relative_path, entry.sha256.lower(), entry.size)


def cache_node_path(cfg: Config, a: Artifact) -> str:
    """Where a verified artifact lives in the cache (content-addressed by sha256)."""
    bucket = a.sha256[:16] if a.sha256 else "unverified"
    return f"{cfg.fetch.cache_dir}/{bucket}/{a.filename}"


def resolution_key(cfg: Config, facts: NodeFacts) -> str:
    """Identifies what a saved resolution was made for: config and platform."""
    parts = [cfg.digest(), facts.raw_arch, facts.os_id, facts.os_version]
    if cfg.driver.source == "ubuntu-signed":  # the module is the running kernel's
        parts.append(facts.kernel)
    kept = kept_image_driver(cfg, facts)
    if kept is not None:  # no driver of the config's in it: never reused for an install
        parts.append(f"kept {kept}")
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
        return [
            Artifact(**{**a, "mirrors": tuple(a.get("mirrors", ()))}) for a in data["artifacts"]
        ]
    except (ValueError, TypeError, KeyError):
        return None


def sha256_of(path: Path) -> str:
    """sha256 hex digest of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()
