"""`bootfsm validate`: check a config file; exit 0 or the config-invalid code."""

from __future__ import annotations

import argparse

from bootfsm.commands.common import config_path, load_or_exit

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    """Load and validate; print the digest on success."""
    if isinstance(cfg := load_or_exit(args), int):
        return cfg
    path, _ = config_path(args)
    where = str(path) if path.exists() else f"{path} (absent: defaults)"
    print(f"bootfsm: config ok: {where} digest {cfg.digest()}")
    return 0
