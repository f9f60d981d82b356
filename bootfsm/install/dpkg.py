"""Debian packages through `dpkg`: a bounded wait for the locks, repair after an
interrupted dpkg, installed versions, installs.

Both ``fcntl`` locks are waited on; an interrupted dpkg (a journal in
/var/lib/dpkg/updates/, or `dpkg --audit` output) is repaired before the next install.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, CommandError, TransientError
from bootfsm.fetch.artifacts import Artifact, cache_node_path
from bootfsm.fetch.store import resolved
from bootfsm.install import records
from bootfsm.machine.context import Context

__all__ = [
    "LOCK",
    "LOCKS",
    "UPDATES_DIR",
    "asked_versions",
    "install_debs",
    "installed_version",
    "installed_versions",
    "interrupted",
    "parse_audit",
    "parse_query",
    "repair",
    "wait_for_lock",
]

LOCK = "/var/lib/dpkg/lock-frontend"
LOCKS = (LOCK, "/var/lib/dpkg/lock")
UPDATES_DIR = "/var/lib/dpkg/updates"

# `dpkg --audit` headings (dpkg 1.21 src/main/enquiry.c, C locale) of the states that
# `dpkg --configure -a` completes; the list/md5sums headings need a reinstall instead.
_REPAIRABLE = {
    "have been unpacked but not yet configured": "unpacked",
    "are only half configured": "half-configured",
    "are only half installed": "half-installed",
    "are awaiting processing of triggers": "triggers-awaited",
    "have been triggered, but the trigger processing": "triggers-pending",
}
_HEADING = re.compile(r"^The following packages (.*)$")


def parse_audit(text: str) -> dict[str, list[str]]:
    """`dpkg --audit` output -> {state: [package, ...]} for the states `--configure
    -a` completes (pure); {} for a sound database."""
    out: dict[str, list[str]] = {}
    state: str | None = None
    for line in text.splitlines():
        m = _HEADING.match(line)
        if m:
            state = next((s for h, s in _REPAIRABLE.items() if m.group(1).startswith(h)), None)
            continue
        if not line.strip():
            state = None
        elif state and line.startswith(" ") and line.split():
            out.setdefault(state, []).append(line.split()[0])
    return out


def _held(ctx: Context) -> list[str]:
    return [p for p in LOCKS if not ctx.host.lock_is_free(p)]


def wait_for_lock(ctx: Context) -> None:
    """Wait, bounded by driver.dpkg_lock_timeout, until nobody holds either dpkg lock."""
    limit = ctx.config.driver.dpkg_lock_timeout
    waited = ctx.host.monotonic()
    held = _held(ctx)
    if not held:
        return
    ctx.warn(f"dpkg lock {' and '.join(held)} is held; waiting up to {limit:g} s")
    ctx.wait_until(
        lambda: True if not _held(ctx) else None,
        timeout=limit,
        interval=min(1.0, limit / 4),
        on_timeout=lambda: BootError(
            Code.DPKG_LOCK_TIMEOUT,
            f"dpkg lock {' and '.join(_held(ctx)) or ' and '.join(held)} still held after "
            f"{limit:g} s (driver.dpkg_lock_timeout)",
        ),
    )
    ctx.event("dpkg.lock_acquired", waited_s=round(ctx.host.monotonic() - waited, 3))


def interrupted(ctx: Context) -> str | None:
    """Why the dpkg database needs `dpkg --configure -a`, or None when it is sound."""
    journal = [n for n in ctx.host.listdir(UPDATES_DIR) if n.isdigit()]
    if journal:
        return f"dpkg was interrupted: {len(journal)} journal file(s) in {UPDATES_DIR}"
    r = ctx.run(["dpkg", "--audit"], timeout=60, probe=True)
    pending = parse_audit(r.output)
    if pending:
        listed = ", ".join(f"{p} ({s})" for s, ps in pending.items() for p in ps)
        return f"dpkg --audit lists packages left mid-install: {listed[:300]}"
    return None


def repair(ctx: Context) -> bool:
    """`dpkg --configure -a` after an interrupted dpkg; True if it ran; DPKG_REPAIR_FAILED."""
    reason = interrupted(ctx)
    if reason is None:
        return False
    ctx.warn(f"{reason}; running dpkg --configure -a")
    wait_for_lock(ctx)
    ctx.require(
        ["dpkg", "--configure", "-a"],
        code=Code.DPKG_REPAIR_FAILED,
        timeout=300,
        what="dpkg --configure -a (repairing an interrupted dpkg) failed",
    )
    ctx.event("dpkg.repaired", reason=reason)
    return True


def installed_version(ctx: Context, package: str) -> str | None:
    """The version of ``package`` when fully installed (``ii``; only unpacked is not), else None."""
    return installed_versions(ctx, [package])[package]


def asked_versions(ctx: Context, packages: Sequence[str]) -> dict[str, str | None]:
    """``installed_versions`` of ``packages`` from the one `dpkg-query` that names
    every package of the run, so inside ``ctx.asking`` the postconditions share one
    answer."""
    debs = [a.name for a in resolved(ctx) or () if a.filename.endswith(".deb")]
    every = sorted({*packages, *ctx.config.sources.toolkit_packages, *debs})
    found = installed_versions(ctx, every)
    return {p: found[p] for p in packages}


def installed_versions(ctx: Context, packages: Sequence[str]) -> dict[str, str | None]:
    """``installed_version`` of each package, from one `dpkg-query -W` for all of them."""
    argv = ["dpkg-query", "-W", "-f=${Package}|${db:Status-Abbrev}|${Version}\\n", *packages]
    # exits 1 when one is not known yet; it still prints the others (dpkg-query(1))
    r = ctx.run(argv, timeout=30, probe=True)
    return parse_query(r.output, packages)


def parse_query(output: str, packages: Sequence[str]) -> dict[str, str | None]:
    """Pure: `dpkg-query -W` lines ``name|status|version`` -> name -> version when
    ``ii``, else None; other lines (its stderr) are ignored."""
    found: dict[str, str | None] = dict.fromkeys(packages)
    for line in output.splitlines():
        name, sep, rest = line.partition("|")
        status, sep2, version = rest.partition("|")
        if sep and sep2 and name in found and status.strip() == "ii" and version.strip():
            found[name] = version.strip()
    return found


def debs_of(ctx: Context, verified: Sequence[tuple[Artifact, Path]]) -> list[tuple[str, str]]:
    """(node path in the cache, sha256) of verified artifacts, for ``install_debs``."""
    return [(cache_node_path(ctx.config, a), a.sha256) for a, _ in verified]


def install_debs(
    ctx: Context,
    debs: Sequence[tuple[str, str]],
    *,
    force: Sequence[str],
    code: Code,
    names: Sequence[str] = (),
) -> None:
    """`dpkg -i` the debs ((node path, sha256) pairs) once the locks are free and dpkg
    is repaired; a lock race is transient. Of ``names``, records the packages new here
    or bootfsm's own upgraded, never one that was on the node before."""
    wait_for_lock(ctx)
    repair(ctx)
    before = installed_versions(ctx, names) if names else {}
    _dpkg_install(ctx, debs, force, code)
    ours = {e["name"] for e in records.load(ctx.host, ctx.config) if e["kind"] == "package"}
    after = installed_versions(ctx, names) if names else {}
    records.add_many(  # new here, or bootfsm's own upgraded: the record follows the version
        ctx,
        [
            {"kind": "package", "name": name, "version": after[name]}
            for name in names
            if (before[name] is None or name in ours) and after[name] is not None
        ],
    )


def _dpkg_install(
    ctx: Context, debs: Sequence[tuple[str, str]], force: Sequence[str], code: Code
) -> None:
    """`dpkg -i` private copies of ``debs``, hashed as they are copied; removed after."""
    extract = f"{ctx.config.run.state_dir}/extract"
    ctx.host.own_dir(ctx.config.run.state_dir)
    copies: list[Path] = []
    try:
        for node_path, sha256 in debs:
            # dpkg reads what was verified: a private (0700) copy, hashed as it is copied
            copies.append(ctx.host.private_copy(node_path, extract, sha256))
        argv = ["dpkg", "-i", *(f"--force-{f}" for f in force), *(str(d) for d in copies)]
        ctx.require(argv, code=code, timeout=300, what="dpkg -i failed")
    except CommandError as exc:
        if "lock" in exc.output_tail and exc.returncode == 2:
            raise TransientError(
                Code.DPKG_LOCK_TIMEOUT, "dpkg lock taken by another process"
            ) from exc
        raise
    finally:
        for copy in copies:
            ctx.host.remove(f"{extract}/{copy.name}")
