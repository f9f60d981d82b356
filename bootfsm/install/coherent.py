"""Grace's coherent GPU memory: the nvidia option NVreg_CoherentGPUMemoryMode.

Without it a 580+ driver onlines the GPU memory as NUMA nodes that the kubelet counts as
node memory. Written to modprobe.d before the module loads; what the loaded module took
is read back from /proc/driver/nvidia/params (``""`` when unset).
"""

from __future__ import annotations

from bootfsm.core.codes import Code
from bootfsm.core.config import Config
from bootfsm.core.errors import BootError
from bootfsm.install.driver_steps import modprobe_conf_ok, write_modprobe_conf
from bootfsm.machine.context import Context
from bootfsm.node.facts import NodeFacts, loaded_module_version
from bootfsm.parsers import ParseError
from bootfsm.parsers.driver_info import parse_nvidia_params

__all__ = ["CONF", "FIRST_BRANCH", "PARAMS", "applied", "conf_ok", "require_applied",
           "wanted", "write_conf"]  # fmt: skip

CONF = "/etc/modprobe.d/nvidia-coherent-memory.conf"
PARAMS = "/proc/driver/nvidia/params"
FIRST_BRANCH = 580
_KEY = "CoherentGPUMemoryMode"


def wanted(cfg: Config, facts: NodeFacts) -> str:
    """The mode this node's module must take: ``driver.coherent_memory_mode`` on a
    Grace GPU with a 580+ driver, else ""."""
    branch = cfg.driver.version.split(".", 1)[0]
    grace = any(g.model.grace for g in facts.gpus)
    new = branch.isdigit() and int(branch) >= FIRST_BRANCH
    return cfg.driver.coherent_memory_mode if grace and new else ""


def _text(mode: str) -> str:
    return (
        "# Written by bootfsm (docs/node-contract.md): Grace coherent GPU memory managed by the"
        " driver\n"
        f"options nvidia NVreg_{_KEY}={mode}\n"
    )


def conf_ok(ctx: Context) -> bool:
    """Nothing wanted, or the modprobe.d file says the mode and the initramfs was rebuilt since."""
    mode = wanted(ctx.config, ctx.facts)
    return not mode or modprobe_conf_ok(ctx, CONF, _text(mode))


def write_conf(ctx: Context, kernel: str | None = None) -> bool:
    """Write the modprobe.d file and rebuild the initramfs (of ``kernel`` when given);
    True when it changed something."""
    mode = wanted(ctx.config, ctx.facts)
    if not mode or conf_ok(ctx):
        return False
    write_modprobe_conf(ctx, CONF, _text(mode), kernel)
    ctx.event("driver.coherent_memory", mode=mode, conf=CONF)
    return True


def _loaded_mode(ctx: Context) -> str | None:
    """What the loaded module took ("" unset), or None when the params do not say."""
    try:
        return parse_nvidia_params(ctx.host.read_text(PARAMS) or "").get(_KEY)
    except ParseError:
        return None


def applied(ctx: Context) -> bool:
    """Nothing wanted or no module loaded, or the loaded module shows the mode."""
    mode = wanted(ctx.config, ctx.facts)
    if not mode or loaded_module_version(ctx.host) is None:
        return True
    return _loaded_mode(ctx) == mode


def require_applied(ctx: Context) -> None:
    """COHERENT_MEMORY_MODE_NOT_APPLIED when the loaded module does not show the mode."""
    if applied(ctx):
        return
    mode, seen = wanted(ctx.config, ctx.facts), _loaded_mode(ctx)
    shown = f'{_KEY}: "{seen}"' if seen is not None else f"no {_KEY} line"
    raise BootError(
        Code.COHERENT_MEMORY_MODE_NOT_APPLIED,
        f'{PARAMS} shows {shown}, not "{mode}": the nvidia module was loaded without'
        f" NVreg_{_KEY}={mode} ({CONF})",
    )
