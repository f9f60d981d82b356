"""driver: nouveau off, the NVIDIA driver built by DKMS, initialized this boot, then the
toolkit.

Satisfied when the configured version is DKMS-built for the running kernel and loaded
(under a matching marker, with Grace's coherent mode), the per-boot init is done and the
toolkit installed. It compiles only when install/prebuilt.py says so, unloading any other
loaded driver first; with driver.keep_image_driver, only when the image's driver does not
load (AgentBaker's validateGPUDrivers, checked by detect: node/verdict.py kept_image_driver).
"""

from __future__ import annotations

from dataclasses import asdict

from bootfsm.install import coherent, persistenced, prebuilt, records, signed_stack, teardown
from bootfsm.install import driver_steps as steps
from bootfsm.install.driver_init import (
    init_missing,
    initialize,
    modules_present,
    record_loaded,
    unload_driver,
)
from bootfsm.machine.context import Context
from bootfsm.node.facts import loaded_module_version
from bootfsm.node.verdict import installs_driver, kept_image_driver

NAME = "driver"


def satisfied(ctx: Context) -> bool:
    """Blacklist, module, bake marker, this boot's init and the toolkit match the config."""
    if not steps.nouveau_off(ctx) or not steps.toolkit_ok(ctx) or not coherent.conf_ok(ctx):
        return False
    loaded = loaded_module_version(ctx.host)
    kept = kept_image_driver(ctx.config, ctx.facts)
    if kept is not None:  # detect found it loaded, or loaded it (validateGPUDrivers)
        module_ok = loaded == kept
    elif not ctx.config.driver.install:
        module_ok = loaded is not None
    elif signed_stack.active(ctx):  # Canonical's packages, at the version of the kernel's
        module_ok = loaded == signed_stack.userspace(ctx) and signed_stack.installed(ctx)
    else:
        module_ok = loaded == ctx.config.driver.version and prebuilt.ready(ctx)
    module_ok = module_ok and coherent.applied(ctx)
    return module_ok and not init_missing(ctx) and persistenced.ready(ctx)


def skip_reason(ctx: Context) -> str | None:
    """Why the state was skipped (read-only; called only after ``satisfied`` held)."""
    cfg = ctx.config.driver
    loaded = loaded_module_version(ctx.host)
    if (kept := kept_image_driver(ctx.config, ctx.facts)) is not None:
        return f"driver.keep_image_driver: the image's driver {kept} is kept, initialized this boot"
    if not cfg.install:
        return f"driver.install = false: the image's driver {loaded} is loaded"
    if signed_stack.active(ctx):
        return (
            f"Ubuntu's signed driver {signed_stack.userspace(ctx)} for {ctx.facts.kernel}"
            " installed, loaded and initialized this boot"
        )
    m = prebuilt.current_marker(ctx.host, ctx.config)
    where = f"built by {m.source} for {m.kernel}" if m is not None else "DKMS-built"
    return f"driver {cfg.version} ({cfg.kind}) {where}, loaded and initialized this boot"


def _unload_other(ctx: Context, rebuild: bool = False) -> None:
    """Unload a loaded driver of another version, or one to rebuild (``unload_driver``)."""
    loaded = loaded_module_version(ctx.host)
    want = signed_stack.userspace(ctx) if signed_stack.active(ctx) else ctx.config.driver.version
    if loaded is None or (loaded == want and not rebuild):
        return
    unload_driver(ctx, loaded)


def _needs_build(ctx: Context) -> bool:
    """Compile or not (install/prebuilt.py); journaled as ``driver.prebaked``."""
    d = prebuilt.decide(ctx)
    ctx.event(
        "driver.prebaked",
        match=not d.build and d.marker is not None,
        field=d.field,
        reason=d.reason,
        build=d.build,
        via=d.via,
        **({"marker": asdict(d.marker)} if d.marker is not None else {}),
    )
    return d.build


def run(ctx: Context) -> None:
    """Blacklist nouveau, compile unless prebaked, initialize, then install the toolkit."""
    steps.blacklist_nouveau(ctx)
    coherent.write_conf(ctx)  # before any load: modprobe reads it
    before = modules_present(ctx)
    if signed_stack.active(ctx):  # no compile: dpkg installs the kernel's signed module
        signed_stack.install(ctx)
        _unload_other(ctx, not coherent.applied(ctx))
        before = modules_present(ctx)
    elif installs_driver(ctx.config, ctx.facts):  # not with the image's driver kept (detect)
        rebuild = _needs_build(ctx)
        teardown.supersede(ctx)  # an aks-gpu prebake of another kind or version: its libraries go
        _unload_other(ctx, rebuild or not coherent.applied(ctx))  # loaded without it: reload
        before = modules_present(ctx)
        if rebuild:  # the marker then describes this build
            built = steps.build_module(ctx)
            records.write_markers(ctx, prebuilt.new_marker(ctx, built, dkms="yes", source="boot"))
    elif not ctx.config.driver.install:
        ctx.event("driver.skipped", reason="driver.install = false: the image ships a driver")
    try:
        initialize(ctx)
    finally:
        record_loaded(ctx, modules_present(ctx) - before)
    coherent.require_applied(ctx)
    persistenced.ensure(ctx)
    steps.install_toolkit(ctx)  # last, after the driver's libraries (aks-gpu's order)
