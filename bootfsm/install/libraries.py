"""The NVIDIA libraries the dynamic loader resolves, against the loaded module's version.

Read through `ldconfig -p` (bootfsm/parsers/ldconfig.py): for each of NVML's and CUDA's
SONAMEs the first cache entry is what a process loads (ld.so takes the first), and every
directory the cache names for them is searched by file name too (a
``libnvidia-ml.so.<version>`` there is reachable by its full name). A node whose driver
kind or version changed must end with only the loaded driver's files there: two drivers'
libraries side by side is how Azure/AKS#5860, #5869 and #5871 ended ("Failed to initialize
NVML: Driver/library version mismatch": the newer name wins the SONAME link, ldconfig(8)).
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.machine.context import Context
from bootfsm.node.facts import loaded_module_version
from bootfsm.parsers import ParseError
from bootfsm.parsers.ldconfig import CacheEntry, parse_ldconfig_p, version_of

__all__ = ["SONAMES", "cache_entries", "require_one_driver", "stale_libraries"]

SONAMES = ("libnvidia-ml.so.1", "libcuda.so.1")
"""What NVML and CUDA users load (nvidia-smi, the device plugin, the container toolkit)."""
_FILES = ("libnvidia-ml.so.", "libcuda.so.")


def cache_entries(ctx: Context) -> list[CacheEntry]:
    """The linker cache (`ldconfig -p`, only reads); DRIVER_NOT_STARTED (transient) when
    it cannot be read."""
    r = ctx.run(["ldconfig", "-p"], timeout=60, probe=True, die_with_bootfsm=False)
    try:
        if not r.ok:
            raise ParseError(f"exit {r.returncode}: {r.tail.strip()[-200:]}")
        return parse_ldconfig_p(r.output)
    except ParseError as exc:
        raise TransientError(Code.DRIVER_NOT_STARTED, f"linker cache unreadable: {exc}") from exc


def _real_name(ctx: Context, path: str) -> str:
    """The file a cache path leads to (links followed inside the node, at most 8)."""
    for _ in range(8):
        target = ctx.host.readlink(path) if ctx.host.is_symlink(path) else None
        if target is None:
            break
        path = target if target.startswith("/") else f"{path.rsplit('/', 1)[0]}/{target}"
    return path


def stale_libraries(ctx: Context, version: str) -> list[str]:
    """What resolves to another driver than ``version``: the first entry of each SONAME,
    then every other version's ``libnvidia-ml.so.<v>``/``libcuda.so.<v>`` in a directory
    the cache names for them (empty: only ``version``'s libraries resolve)."""
    entries = [e for e in cache_entries(ctx) if e.name in SONAMES]
    problems: list[str] = []
    dirs: list[str] = []
    for e in entries:
        d = e.path.rsplit("/", 1)[0]
        dirs += [d] if d not in dirs else []
        if e is next(x for x in entries if x.name == e.name):  # the one ld.so loads
            real = _real_name(ctx, e.path)
            found = version_of(real)
            if found != version:
                problems.append(f"{e.name} resolves to {real} ({found or 'no version'})")
    for d in dirs:
        for path in sorted(p for f in _FILES for p in ctx.host.glob(f"{d}/{f}*")):
            found = version_of(path)
            if found is not None and found != version:
                problems.append(f"{path} (driver {found}) is resolvable")
    return problems


def require_one_driver(ctx: Context) -> None:
    """DRIVER_LIBRARY_MISMATCH unless only the loaded module's libraries resolve."""
    loaded = loaded_module_version(ctx.host)
    if loaded is None:
        return  # no module: the driver checks before this one say so
    problems = stale_libraries(ctx, loaded)
    if problems:
        shown = "; ".join(problems[:6]) + (
            f"; and {len(problems) - 6} more" if len(problems) > 6 else ""
        )
        raise BootError(
            Code.DRIVER_LIBRARY_MISMATCH,
            f"the loaded module is {loaded}, but another driver's libraries resolve: {shown}",
        )
