"""Debian packages through `dpkg`: a bounded wait for the lock, installed versions, installs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bootfsm.codes import Code
from bootfsm.context import Context
from bootfsm.errors import BootError, CommandError, TransientError

__all__ = ["LOCK", "install_debs", "installed_version", "wait_for_lock"]

LOCK = "/var/lib/dpkg/lock-frontend"


def wait_for_lock(ctx: Context) -> None:
    """Wait, bounded by driver.dpkg_lock_timeout, until nobody holds the dpkg lock."""
    limit = ctx.config.driver.dpkg_lock_timeout
    waited = ctx.host.monotonic()

    def free() -> bool | None:
        return True if ctx.host.lock_is_free(LOCK) else None

    if free():
        return
    ctx.warn(f"dpkg lock {LOCK} is held; waiting up to {limit:g} s")
    ctx.wait_until(
        free,
        timeout=limit,
        interval=min(1.0, limit / 4),
        on_timeout=lambda: BootError(
            Code.DPKG_LOCK_TIMEOUT,
            f"dpkg lock {LOCK} still held after {limit:g} s (driver.dpkg_lock_timeout)",
        ),
    )
    ctx.event("dpkg.lock_acquired", waited_s=round(ctx.host.monotonic() - waited, 3))


def installed_version(ctx: Context, package: str) -> str | None:
    """The version of ``package`` when fully installed (status ``ii``), else None.

    A package dpkg only unpacked (failed configure, unmet dependencies) is not installed.
    """
    r = ctx.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${Version}", package], timeout=30)
    if not r.ok:
        return None
    status, _, version = r.output.strip().partition("|")
    return version.strip() or None if status.strip() == "ii" else None


def install_debs(ctx: Context, debs: Sequence[Path], *, force: Sequence[str], code: Code) -> None:
    """`dpkg -i` the given verified files after the lock is free; a lock race is transient."""
    wait_for_lock(ctx)
    argv = ["dpkg", "-i", *(f"--force-{f}" for f in force), *(str(d) for d in debs)]
    try:
        ctx.require(argv, code=code, timeout=300, what="dpkg -i failed")
    except CommandError as exc:
        if "lock" in exc.output_tail and exc.returncode == 2:
            raise TransientError(
                Code.DPKG_LOCK_TIMEOUT, "dpkg lock taken by another process"
            ) from exc
        raise
