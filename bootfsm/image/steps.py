"""The states a partial run (`bake`, `fetch`) drives in place of the node's own.

An image root is not a booted node: detect takes its facts from the root's files, judged
by the detect state's rules; bake's driver builds the DKMS module and writes the marker,
never loading a module or starting a service. Fetch is the fetch state itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.install import coherent, prebuilt, records, signed_stack
from bootfsm.install import driver_steps as driver
from bootfsm.install.marker import Marker
from bootfsm.install.prebuilt import bake_module_type
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts
from bootfsm.node.verdict import judge

__all__ = ["BakeDriver", "Counted", "FactsDetect"]


class FactsDetect:
    """detect with facts from ``gather``, journaled and judged by the detect state's rules."""

    NAME = "detect"

    def __init__(self, gather: Callable[[Context], NodeFacts]) -> None:
        self.gather = gather

    def satisfied(self, ctx: Context) -> bool:
        """Detect has run in this process (facts are known)."""
        return ctx.facts_ is not None

    def run(self, ctx: Context) -> None:
        """Gather, journal and judge the facts; raise the first permanent problem."""
        facts = self.gather(ctx)
        ctx.journal.event("node.facts", durable=True, **facts.summary())
        judge(ctx.config, facts)
        ctx.facts_ = facts


class Counted:
    """A state module whose successful action is recorded in ``changed`` as ``label``."""

    def __init__(self, module: Any, changed: list[str], label: str) -> None:
        self.module, self.changed, self.label = module, changed, label
        self.NAME: str = module.NAME

    def satisfied(self, ctx: Context) -> bool:
        """The module's own postcondition."""
        return bool(self.module.satisfied(ctx))

    def run(self, ctx: Context) -> None:
        """The module's own action, then ``label`` in ``changed``."""
        self.module.run(ctx)
        if self.label not in self.changed:
            self.changed.append(self.label)


def _want(ctx: Context) -> Marker:
    # build-only: nothing registered with DKMS (Azure/aks-gpu#191)
    return prebuilt.new_marker(ctx, bake_module_type(ctx.config), dkms="no", source="bake")


def _same(old: Marker | None, want: Marker) -> bool:
    return old is not None and replace(old, baked_at="") == replace(want, baked_at="")


class BakeDriver:
    """The image's driver step: nouveau off, the toolkit, the DKMS module, the marker."""

    NAME = "driver"

    def __init__(self, changed: list[str]) -> None:
        self.changed = changed

    def satisfied(self, ctx: Context) -> bool:
        """Nouveau off, toolkit installed, and (driver.install) marker and module match."""
        if not (driver.nouveau_off(ctx) and driver.toolkit_ok(ctx) and coherent.conf_ok(ctx)):
            return False
        if not ctx.config.driver.install:
            return True
        if signed_stack.active(ctx):
            return signed_stack.installed(ctx)
        if not _same(prebuilt.current_marker(ctx.host, ctx.config), _want(ctx)):
            return False
        return driver.module_problem(ctx, bake_module_type(ctx.config), dkms=False) is None

    def skip_reason(self, ctx: Context) -> str | None:
        """Why nothing needs doing (called only when ``satisfied`` held)."""
        if not ctx.config.driver.install:
            return "driver.install = false: nouveau off, toolkit installed"
        if signed_stack.active(ctx):
            return f"Ubuntu's signed driver {signed_stack.userspace(ctx)} installed"
        return "marker and module match"

    def _note(self, changed: bool, label: str) -> None:
        if changed and label not in self.changed:
            self.changed.append(label)

    def run(self, ctx: Context) -> None:
        """Blacklist nouveau, install the toolkit; build the module and write the marker
        unless each already matches what this bake would make."""
        kernel = ctx.facts.kernel
        self._note(driver.blacklist_nouveau(ctx, kernel=kernel), "nouveau")
        self._note(coherent.write_conf(ctx, kernel=kernel), "coherent")
        self._note(driver.install_toolkit(ctx), "toolkit")
        if not ctx.config.driver.install:
            ctx.event("bake.driver", built=False, reason="driver.install = false")
            return
        if signed_stack.active(ctx):  # Canonical's prebuilt module: nothing to build
            signed_stack.install(ctx)
            self._note(True, "signed")
            ctx.event("bake.driver", built=False, reason="driver.source = ubuntu-signed")
            return
        want = _want(ctx)
        old, why = prebuilt.bake_reason(ctx, want)
        if why is not None:
            mt = want.module_type
            driver.build_module(ctx, module_type=mt, extra=("--skip-module-load",), dkms=False)
            after = driver.module_problem(ctx, mt, dkms=False)
            if after is not None:
                raise BootError(Code.DRIVER_INSTALL_FAILED, f"after the DKMS build: {after}")
            self.changed.append("module")
        ctx.event("bake.driver", built=why is not None, reason=why or "marker and module match")
        if not _same(old, want):
            records.write_markers(ctx, want)  # recorded: uninstall removes them
            self.changed.append("marker")
