"""``driver.source = "ubuntu-signed"``: Canonical's signed NVIDIA stack for the running
kernel, resolved (pure) from Ubuntu archive ``Packages`` indexes fetch hands in.

For kernel K and branch B: ``linux-modules-nvidia-B-server[-open]-K`` (restricted, the
release, ``-updates`` and ``-security`` pockets); its ``Depends`` on
``nvidia-kernel-common-B-server (>= X), (<= X-1)`` fixes the user-space version X; the
user-space a headless compute node needs is then taken at exactly X, with the closure of
its real ``Depends`` (docs/config.md lists the packages). Dependencies no index read here
lists (libc6, the kernel's linux-image) must already be on the node. Codes: 46 (no module
package for K), 47 (X is no longer listed).
"""

from __future__ import annotations

import lzma
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.core.hardware import requires_open_module, requires_proprietary_module
from bootfsm.node.facts import NodeFacts
from bootfsm.node.guards import needs_fabric_manager, needs_imex
from bootfsm.node.verdict import UBUNTU_CODENAMES
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import PackageEntry, compare_debian_versions, iter_entries
from bootfsm.parsers.debian_relations import Relation, parse_relations, version_satisfies

__all__ = [
    "CODENAMES",
    "Picked",
    "SignedStack",
    "Wanted",
    "archive_sources",
    "asks_newer",
    "deb_version",
    "is_archive_key",
    "module_package",
    "module_type",
    "resolve_stack",
    "resolved_userspace",
    "unxz",
    "upstream",
    "wanted",
]

CODENAMES = UBUNTU_CODENAMES
_KEY_PREFIX = "ubuntu_"
USERSPACE = ("libnvidia-compute", "nvidia-utils", "nvidia-compute-utils", "libnvidia-cfg1")
"""Of ``nvidia-headless-no-dkms-B-server``'s Depends, what a compute node needs besides
nvidia-kernel-common (nvidia-kernel-source is the module's source: prebuilt here)."""


def is_archive_key(key: str) -> bool:
    """An index key of Ubuntu's archive (``ubuntu_<suite>_<component>``)."""
    return key.startswith(_KEY_PREFIX)


def _codename(facts: NodeFacts) -> str:
    return CODENAMES.get(facts.os_version, "") if facts.os_id == "ubuntu" else ""


def archive_sources(cfg: Config, facts: NodeFacts) -> dict[str, tuple[tuple[str, ...], str]]:
    """Index key -> (archive bases, primary first; ``dists/...`` path of its Packages.xz).
    amd64 reads ``sources.ubuntu_archive``, arm64 ``sources.ubuntu_ports`` (Canonical
    publishes arm64 on its ports archive); the mirrors serve the same tree."""
    code = _codename(facts)
    if not code or facts.arch is None:
        return {}
    src = cfg.sources
    primary = src.ubuntu_ports if facts.arch.debian == "arm64" else src.ubuntu_archive
    bases = (primary, *src.ubuntu_archive_mirrors)
    comps = ["restricted"]
    if needs_fabric_manager(facts) or needs_imex(facts):
        comps.append("multiverse")
    return {
        f"{_KEY_PREFIX}{suite}_{comp}": (
            bases,
            f"dists/{suite}/{comp}/binary-{facts.arch.debian}/Packages.xz",
        )
        for suite in (code, f"{code}-updates", f"{code}-security")
        for comp in comps
    }


def unxz(body: bytes, max_bytes: int) -> str:
    """The text of an xz-compressed index, at most ``max_bytes`` (bounded: a bomb fails)."""
    d = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    try:
        out = d.decompress(body, max_length=max_bytes)
    except lzma.LZMAError as exc:
        raise ParseError(f"not an xz stream: {exc}") from None
    if not d.eof:
        raise ParseError(f"decompressed index exceeds {max_bytes} B, or is truncated")
    return out.decode("utf-8", "replace")


@dataclass(frozen=True)
class Wanted:
    """What to resolve: the running kernel, branch, module type, Debian arch, daemons."""

    kernel: str
    branch: str
    module_type: str  # open | proprietary
    arch: str
    fabric: bool = False
    imex: bool = False


def module_package(w: Wanted) -> str:
    """``linux-modules-nvidia-B-server-open-K`` (``-server-K`` for proprietary)."""
    flavour = "-open" if w.module_type == "open" else ""
    return f"linux-modules-nvidia-{w.branch}-server{flavour}-{w.kernel}"


def module_type(cfg: Config, facts: NodeFacts) -> str:
    """driver.module_type, or for "auto" the choice of install/driver_steps.py's
    fallback_module_type: proprietary for a pre-Turing GPU, else open from branch 560
    or when a GPU (Blackwell) needs it."""
    if cfg.driver.module_type != "auto":
        return cfg.driver.module_type
    models = [g.model for g in facts.gpus]
    if requires_proprietary_module(models):
        return "proprietary"
    branch = cfg.driver.version.split(".", 1)[0]
    open_default = branch.isdigit() and int(branch) >= 560
    return "open" if open_default or requires_open_module(models) else "proprietary"


def wanted(cfg: Config, facts: NodeFacts) -> Wanted:
    """The Wanted of this node and config (branch from driver.version)."""
    assert facts.arch is not None
    return Wanted(
        kernel=facts.kernel,
        branch=cfg.driver.version.split(".", 1)[0],
        module_type=module_type(cfg, facts),
        arch=facts.arch.debian,
        fabric=needs_fabric_manager(facts),
        imex=needs_imex(facts),
    )


def upstream(version: str) -> str:
    """``580.196.07-0ubuntu0.24.04.1`` -> ``580.196.07`` (epoch and revision dropped)."""
    v = version.split(":", 1)[-1]
    return v.rsplit("-", 1)[0] if "-" in v else v


def deb_version(filename: str) -> str:
    """The version in a pool file name ``name_version_arch.deb`` ("" when not one)."""
    parts = filename.rsplit("/", 1)[-1].split("_")
    return parts[1] if len(parts) == 3 and parts[2].endswith(".deb") else ""


class _Resolved(Protocol):  # fetch/artifacts.py's Artifact (which resolves through here)
    @property
    def name(self) -> str: ...
    @property
    def filename(self) -> str: ...


def resolved_userspace(arts: Sequence[_Resolved], branch: str) -> str | None:
    """X: the user-space version a resolution's nvidia-kernel-common has (None: none)."""
    common = f"nvidia-kernel-common-{branch}-server"
    a = next((a for a in arts if a.name == common), None)
    return upstream(deb_version(a.filename)) if a is not None else None


def asks_newer(cfg: Config, arts: Sequence[_Resolved]) -> bool:
    """driver.version names a newer user-space than a (cached) resolution has: the
    archive is read again, and what it lists now is installed in place (an older or equal
    driver.version keeps the resolution: a baked node boots with no network)."""
    have = resolved_userspace(arts, cfg.driver.version.split(".", 1)[0])
    return have is not None and compare_debian_versions(cfg.driver.version, have) > 0


@dataclass(frozen=True)
class Picked:
    """A package to install: the index that lists it and its stanza."""

    key: str
    entry: PackageEntry


@dataclass(frozen=True)
class SignedStack:
    """The resolved stack, in install order (dependencies first)."""

    kernel: str
    module: str
    module_version: str
    userspace: str  # X, the upstream version the module depends on
    packages: tuple[Picked, ...]
    external: tuple[str, ...]  # relation groups the node itself must meet, as text


class _Family:
    """The stanzas worth parsing: branch B's nvidia-*/libnvidia-* and the kernel's
    linux-*nvidia* packages (the proprietary module's linux-objects and -signatures)."""

    def __init__(self, kernel: str, branch: str) -> None:
        self.kernel, self.mark = f"-{kernel}", f"-{branch}"

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if name.startswith("linux-"):
            return "-nvidia-" in name and name.endswith(self.kernel)
        return name.startswith(("nvidia-", "libnvidia-")) and self.mark in name

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 1


def _entries(texts: Mapping[str, str], family: _Family) -> list[Picked]:
    out = []
    for key, text in texts.items():
        try:
            out += [Picked(key, e) for e in iter_entries(text, family)]
        except ParseError as exc:
            raise BootError(Code.INDEX_INVALID, f"index {key}: {exc}") from exc
    return out


def _relations(p: Picked, field: str) -> tuple[tuple[Relation, ...], ...]:
    try:
        return parse_relations(getattr(p.entry, field))
    except ParseError as exc:
        raise BootError(Code.INDEX_INVALID, f"{p.entry.package} {field}: {exc}") from exc


def _provides(p: Picked, rel: Relation) -> bool:
    """``p`` is ``rel``'s package at a matching version, or Provides it (a virtual with a
    version matches a constraint; one without matches only an unversioned relation)."""
    if p.entry.package == rel.name:
        return version_satisfies(p.entry.version, rel.op, rel.version)
    for (prov,) in _relations(p, "provides"):
        if prov.name == rel.name and (
            not rel.op or (prov.op == "=" and version_satisfies(prov.version, rel.op, rel.version))
        ):
            return True
    return False


def _best(cands: Sequence[Picked], x: str) -> Picked | None:
    """The candidate at upstream ``x`` when one is, else the newest (apt's candidate)."""
    if not cands:
        return None
    at_x = [c for c in cands if upstream(c.entry.version) == x] or list(cands)
    return max(at_x, key=_version_key)


def _version_key(p: Picked) -> _Version:
    return _Version(p.entry.version)


class _Version:
    def __init__(self, v: str) -> None:
        self.v = v

    def __lt__(self, other: _Version) -> bool:
        return compare_debian_versions(self.v, other.v) < 0


def _no_module(w: Wanted, name: str, texts: Mapping[str, str]) -> BootError:
    """SIGNED_MODULE_MISSING naming the kernel and the newest kernels that have one."""
    flavour = w.kernel.split("-", 2)[-1] if w.kernel.count("-") >= 2 else ""
    prefix = name[: -len(w.kernel)]
    pat = re.compile(rf"^Package: {re.escape(prefix)}(\S+-{re.escape(flavour)})$", re.M)
    kernels = {m[1] for t in texts.values() for m in pat.finditer(t)}
    series = w.kernel.split("-", 1)[0]  # 6.8.0: the same linux-azure series first
    kernels = {k for k in kernels if k.startswith(series + "-")} or kernels
    newest = sorted(kernels, key=_kernel_key)[-3:]
    listed = f"; it has one for {', '.join(newest)}" if newest else ""
    return BootError(
        Code.SIGNED_MODULE_MISSING,
        f"no signed NVIDIA module for kernel {w.kernel}: {name} is not in the archive's"
        f" indexes ({', '.join(sorted(texts))}){listed}. Boot a kernel Canonical builds the"
        ' module for, or, with Secure Boot off, use driver.source = "runfile" (DKMS)',
    )


def _kernel_key(k: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"[0-9]+", k))


def _userspace(w: Wanted, module: Picked) -> tuple[str, tuple[Relation, ...]]:
    """(X, the module's constraints on nvidia-kernel-common-B-server)."""
    common = f"nvidia-kernel-common-{w.branch}-server"
    rels = tuple(g[0] for g in _relations(module, "depends") if len(g) == 1 and g[0].name == common)
    floor = [r for r in rels if r.op in ("=", ">=")]
    if not floor:
        raise BootError(
            Code.INDEX_INVALID,
            f"{module.entry.package} {module.entry.version} names no version of {common}"
            f" in its Depends: {module.entry.depends[:200]!r}",
        )
    return upstream(floor[0].version), rels


def _userspace_missing(
    w: Wanted, module: Picked, name: str, x: str, listed: list[str]
) -> BootError:
    have = ", ".join(sorted(set(listed))) or "none"
    return BootError(
        Code.SIGNED_USERSPACE_MISSING,
        f"kernel {w.kernel}'s signed module {module.entry.package} {module.entry.version}"
        f" needs {name} {x}; the archive's indexes list {have}. Boot a newer kernel (its"
        f" module needs the listed version), or bake the image while {x} is listed",
    )


def resolve_stack(texts: Mapping[str, str], w: Wanted) -> SignedStack:
    """The stack for ``w`` from the archive's Packages texts (index key -> text); raises
    SIGNED_MODULE_MISSING, SIGNED_USERSPACE_MISSING or INDEX_INVALID."""
    name = module_package(w)
    every = _entries(texts, _Family(w.kernel, w.branch))
    every = [p for p in every if p.entry.architecture in (w.arch, "all")]
    by_name: dict[str, list[Picked]] = {}
    for p in every:
        by_name.setdefault(p.entry.package, []).append(p)
    if name not in by_name:
        raise _no_module(w, name, texts)
    module = max(by_name[name], key=_version_key)
    x, rels = _userspace(w, module)
    common = f"nvidia-kernel-common-{w.branch}-server"
    fits = [p for p in by_name.get(common, []) if all(_provides(p, r) for r in rels)]
    if not fits:
        listed = [p.entry.version for p in by_name.get(common, [])]
        raise _userspace_missing(w, module, common, x, listed)
    roots = [module, max(fits, key=_version_key)]
    names = [f"{n}-{w.branch}-server" for n in USERSPACE]
    names += [f"nvidia-fabricmanager-{w.branch}", f"libnvidia-nscq-{w.branch}"] if w.fabric else []
    names += [f"nvidia-imex-{w.branch}"] if w.imex else []
    for n in names:
        at_x = [p for p in by_name.get(n, []) if upstream(p.entry.version) == x]
        if not at_x:
            listed = [p.entry.version for p in by_name.get(n, [])]
            raise _userspace_missing(w, module, n, x, listed)
        roots.append(max(at_x, key=_version_key))
    picked, external = _closure(roots, every, x)
    return SignedStack(
        w.kernel, name, module.entry.version, x, tuple(_install_order(picked)), external
    )


def _closure(
    roots: list[Picked], every: list[Picked], x: str
) -> tuple[list[Picked], tuple[str, ...]]:
    """Roots plus every package their Depends need from the indexes (at X where listed);
    the groups no index meets are left to the node."""
    picked = list(roots)
    external: list[str] = []
    todo = list(roots)
    while todo:
        p = todo.pop(0)
        for group in _relations(p, "depends"):
            if any(_provides(q, r) for q in picked for r in group):
                continue
            cands = [q for r in group for q in every if _provides(q, r)]
            best = _best(cands, x)
            if best is None:
                text = " | ".join(str(r) for r in group)
                if text not in external:
                    external.append(text)
                continue
            picked.append(best)
            todo.append(best)
    return picked, tuple(external)


def _install_order(picked: list[Picked]) -> list[Picked]:
    """Dependencies before their dependents (stable; a cycle keeps the listed order)."""
    done: list[Picked] = []
    seen: set[str] = set()

    def visit(p: Picked, path: tuple[str, ...]) -> None:
        if p.entry.package in seen or p.entry.package in path:
            return
        for group in _relations(p, "depends"):
            for q in picked:
                if q is not p and any(_provides(q, r) for r in group):
                    visit(q, (*path, p.entry.package))
                    break
        seen.add(p.entry.package)
        done.append(p)

    for p in picked:
        visit(p, ())
    return done
