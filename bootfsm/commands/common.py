"""Helpers shared by commands: locating the node and loading its config."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bootfsm.core.codes import Code
from bootfsm.core.config import DEFAULT_PATH, Config, ConfigError
from bootfsm.core.config_files import load_config

__all__ = ["config_path", "load_or_exit", "node_env"]


def config_path(args: argparse.Namespace) -> tuple[Path, bool]:
    """The config file to read and whether it must exist (explicit --config)."""
    if args.config:
        return Path(args.config), True
    return Path(args.root) / DEFAULT_PATH.lstrip("/"), False


def load_or_exit(args: argparse.Namespace) -> Config | int:
    """The validated config, or the config-invalid exit code after a clear message."""
    path, required = config_path(args)
    try:
        return load_config(path, required=required)
    except ConfigError as exc:
        print(f"bootfsm: config invalid: {exc}", file=sys.stderr)
        return int(Code.CONFIG_INVALID)


def node_env() -> dict[str, str]:
    """The environment for commands bootfsm runs: no NOTIFY_SOCKET (never systemd's voice)."""
    return {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
