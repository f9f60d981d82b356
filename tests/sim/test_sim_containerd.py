"""The containerd stand-in's `config dump` merges as the real containerd does: the same
files (node paths mapped to a test directory) dumped by the real containerd 1.6 give
the same value for every key the stand-in prints, and the same import list."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.compat import tomllib
from bootfsm.sim.node import SKUS, build_node

REAL = shutil.which("containerd", path="/usr/bin:/usr/sbin:/bin")
pytestmark = pytest.mark.skipif(REAL is None, reason="the real containerd is not installed")

CONFIG = """\
version = 2
imports = ["/etc/containerd/config.d/*.toml", "extra.toml"]
oom_score = -999
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
[metrics]
  address = "0.0.0.0:10257"
"""
FILES = {
    "etc/containerd/config.d/10-a.toml": (
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
    ),
    "etc/containerd/config.d/20-b.toml": (
        'version = 2\noom_score = 5\nimports = ["/etc/containerd/nested.toml"]\n'
    ),
    "etc/containerd/nested.toml": "version = 2\n[metrics]\n  grpc_histogram = true\n",
    "etc/containerd/extra.toml": (
        'version = 2\n[plugins."io.containerd.internal.v1.opt"]\n  path = "/opt/x"\n'
    ),
    "etc/containerd/config.d/not-toml.txt": "ignored: not matched by *.toml\n",
}


def _leaves(d: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_leaves(v, (*prefix, k)))
        else:
            out[(*prefix, k)] = v
    return out


def _lay(root: Path, mapped: str) -> None:
    for rel, text in {"etc/containerd/config.toml": CONFIG, **FILES}.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text.replace('"/etc/containerd/', f'"{mapped}/etc/containerd/'))


def test_dump_matches_the_real_containerd(tmp_path: Path) -> None:
    node_root = tmp_path / "node"
    bin_dir = build_node(node_root, SKUS["h100-pcie"], (), compile_seconds=0.01)
    _lay(node_root, "")
    real_root = tmp_path / "real"
    _lay(real_root, str(real_root))
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    ours = subprocess.run(
        ["containerd", "--config", str(node_root / "etc/containerd/config.toml"), "config", "dump"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    real = subprocess.run(
        [str(REAL), "--config", str(real_root / "etc/containerd/config.toml"), "config", "dump"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert ours.returncode == real.returncode == 0, ours.stderr + real.stderr
    mine, theirs = tomllib.loads(ours.stdout), tomllib.loads(real.stdout)
    # the real dump lists the loaded files in Go map order (it changes run to run)
    assert sorted(p.removeprefix(str(real_root)) for p in theirs.pop("imports")) == sorted(
        mine.pop("imports")
    )
    assert mine.pop("imports", None) is None
    want = _leaves(theirs)
    for key, value in _leaves(mine).items():
        assert want.get(key, "<absent>") == value, key
    assert ("metrics", "grpc_histogram") in _leaves(mine)  # nested import followed
    assert mine["oom_score"] == 5  # a later file wins


def test_not_toml_fails_like_the_real_containerd(tmp_path: Path) -> None:
    node_root = tmp_path / "node"
    bin_dir = build_node(node_root, SKUS["h100-pcie"], (), compile_seconds=0.01)
    cfg = node_root / "etc/containerd/config.toml"
    cfg.write_text("version = 2\nimports = [\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    ours = subprocess.run(
        ["containerd", "--config", str(cfg), "config", "dump"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    real = subprocess.run(
        [str(REAL), "--config", str(cfg), "config", "dump"], capture_output=True, text=True
    )
    assert ours.returncode == real.returncode == 1
    prefix = "containerd: failed to load TOML: /etc/containerd/config.toml"
    assert ours.stderr.startswith(prefix)
    assert real.stderr.startswith(prefix.replace("/etc", f"{node_root}/etc"))
