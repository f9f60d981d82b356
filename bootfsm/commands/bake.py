"""`bootfsm bake`: prefetch verified artifacts and prebuild the driver module into an image;
exits with the bake's code (0: baked or already baked). docs/image-build.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bootfsm.commands.common import config_path, load_or_exit
from bootfsm.core.codes import verdict_line
from bootfsm.image.bake import BakeOptions, BakeResult, bake
from bootfsm.install.marker import marker_path

__all__ = ["main", "summary_line"]


def summary_line(result: BakeResult, marker: str) -> str:
    """The one line a build log shows at the end."""
    if not result.ok:
        return verdict_line(result.code, result.message, command="bake")
    m = result.marker
    what = (
        f"driver {m.driver_version} ({m.driver_kind}, {m.module_type}) for kernel {m.kernel}"
        f" [{m.arch}], marker {marker}"
        if m
        else "driver.install = false: artifacts only, no module"
    )
    did = ", ".join(result.changed) if result.changed else "nothing (already baked)"
    return f"bootfsm: baked {what}; did: {did}"


def main(args: argparse.Namespace) -> int:
    """Bake the image root ``--root`` for ``--kernel`` (default: newest with headers)."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    result = bake(
        cfg,
        BakeOptions(
            root=Path(args.root),
            kernel=args.kernel,
            config_path=str(config_path(args)[0]),
            console=sys.stderr,
        ),
    )
    print(summary_line(result, marker_path(cfg)))
    return int(result.code)
