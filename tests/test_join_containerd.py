"""containerd wiring: config.toml must import the drop-in, and the drop-in must carry the
CRI plugin table whole. Checked with the REAL containerd (`containerd --config FILE
config dump` needs no daemon; Debian 12's containerd 1.6 here)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.compat import tomllib
from bootfsm.install import containerd as c
from tests.conftest import MakeWorld, run_in_process

REAL = shutil.which("containerd", path="/usr/bin:/usr/sbin:/bin")
needs_containerd = pytest.mark.skipif(REAL is None, reason="the real containerd is not installed")

# config.toml as AgentBaker's containerd template renders it for a GPU-less node: no imports
AKS = """\
version = 2
oom_score = -999
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "mcr.microsoft.com/oss/kubernetes/pause:3.6"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = "/usr/bin/runc"
      SystemdCgroup = true
[metrics]
  address = "0.0.0.0:10257"
"""


def _dump(config: Path) -> tuple[int, str, str]:
    r = subprocess.run(
        [str(REAL), "--config", str(config), "config", "dump"], capture_output=True, text=True
    )
    return r.returncode, r.stdout, r.stderr


def _wire(tmp_path: Path, config_text: str, dropin_text: str, major: int = 1) -> Path:
    """config.toml and a drop-in under tmp_path, the import pointing there."""
    (tmp_path / "config.d").mkdir(exist_ok=True)
    (tmp_path / "config.d/10-nvidia-runtime.toml").write_text(dropin_text)
    edited = c.ensure_import(
        config_text,
        str(tmp_path / "config.d/*.toml"),
        major,
        dropin=str(tmp_path / "config.d/10-nvidia-runtime.toml"),
        config=str(tmp_path / "config.toml"),
    )
    (tmp_path / "config.toml").write_text(edited if edited is not None else config_text)
    return tmp_path / "config.toml"


@needs_containerd
def test_without_the_import_containerd_never_sees_the_dropin(tmp_path: Path) -> None:
    """The bug: the drop-in alone does nothing."""
    (tmp_path / "config.d").mkdir()
    (tmp_path / "config.d/10-nvidia-runtime.toml").write_text(c.dropin_text(AKS, 1))
    (tmp_path / "config.toml").write_text(AKS)
    rc, out, _ = _dump(tmp_path / "config.toml")
    assert rc == 0
    assert c.runtime_problem(out, 1) == (
        "the merged config has no plugins.io.containerd.grpc.v1.cri.containerd.runtimes.nvidia"
    )


@needs_containerd
def test_import_added_and_the_real_containerd_merges_the_runtime(tmp_path: Path) -> None:
    config = _wire(tmp_path, AKS, c.dropin_text(AKS, 1))
    text = config.read_text()
    assert text.splitlines()[1] == f'imports = ["{tmp_path}/config.d/*.toml"]'
    assert text.replace(text.splitlines()[1] + "\n", "", 1) == AKS  # nothing else changed
    rc, out, err = _dump(config)
    assert rc == 0, err
    assert c.runtime_problem(out, 1, AKS) is None
    merged = tomllib.loads(out)
    cri = merged["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] == "mcr.microsoft.com/oss/kubernetes/pause:3.6"
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is True
    assert merged["metrics"]["address"] == "0.0.0.0:10257"


@needs_containerd
def test_a_runtime_only_dropin_loses_runc_in_the_real_merge(tmp_path: Path) -> None:
    """containerd replaces an imported plugin table whole: a drop-in with only the
    nvidia runtime (what bootfsm wrote before) drops runc and the sandbox image."""
    only_nvidia = (
        "version = 2\n"
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
        '  runtime_type = "io.containerd.runc.v2"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]\n'
        '  BinaryName = "/usr/bin/nvidia-container-runtime"\n'
    )
    rc, out, _ = _dump(_wire(tmp_path, AKS, only_nvidia))
    assert rc == 0
    assert c.runtime_problem(out, 1, AKS) == "the merged config lost config.toml's runtime(s) runc"
    cri = tomllib.loads(out)["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["sandbox_image"] != "mcr.microsoft.com/oss/kubernetes/pause:3.6"


@needs_containerd
def test_invalid_config_is_refused_by_both(tmp_path: Path) -> None:
    bad = 'version = 2\nimports = ["/x"\n'
    with pytest.raises(c.ContainerdConfigError, match="not valid TOML"):
        c.ensure_import(bad)
    (tmp_path / "config.toml").write_text(bad)
    rc, _, err = _dump(tmp_path / "config.toml")
    assert rc == 1 and err.startswith(f"containerd: failed to load TOML: {tmp_path}/config.toml")


# -- the imports editor, pure --------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            'version = 2\nimports = ["/etc/other/*.toml"] # keep me\n[a]\nb = 1\n',
            'version = 2\nimports = ["/etc/other/*.toml", "/etc/containerd/config.d/*.toml"]'
            " # keep me\n[a]\nb = 1\n",
        ),
        (
            'version = 2\nimports = [\n  "/a.toml", # one ]\n  \'/b].toml\',\n]\n[x]\ny = "]"\n',
            'version = 2\nimports = ["/a.toml", "/b].toml", "/etc/containerd/config.d/*.toml"]\n'
            '[x]\ny = "]"\n',
        ),
        ("# header\n\n[x]\n", '# header\n\nimports = ["/etc/containerd/config.d/*.toml"]\n[x]\n'),
        (
            "version = 2\r\n[x]\r\n",
            'version = 2\r\nimports = ["/etc/containerd/config.d/*.toml"]\r\n[x]\r\n',
        ),
        ("", 'imports = ["/etc/containerd/config.d/*.toml"]\n'),
    ],
    ids=["one-line", "multi-line", "none", "crlf", "empty"],
)
def test_ensure_import_edits_only_the_imports_line(text: str, expected: str) -> None:
    assert c.ensure_import(text) == expected
    before, after = tomllib.loads(text), tomllib.loads(expected)
    assert {**before, "imports": 0} == {**after, "imports": 0}


@pytest.mark.parametrize(
    "imports",
    [
        '["/etc/containerd/config.d/*.toml"]',
        '["config.d/*.toml"]',  # relative to config.toml's directory
        '["/etc/containerd/config.d/10-nvidia-runtime.toml"]',
        '["/etc/containerd/*/*.toml"]',
    ],
)
def test_import_already_there_changes_nothing(imports: str) -> None:
    assert c.ensure_import(f"version = 2\nimports = {imports}\n") is None


def test_star_does_not_cross_a_slash() -> None:
    """Go's filepath.Glob: /etc/* does not name /etc/containerd/config.d/x.toml."""
    assert not c.imports_cover(["/etc/*.toml"], c.DROPIN)
    assert c.ensure_import('imports = ["/etc/*.toml"]\n') is not None


@pytest.mark.parametrize(
    "bad", ['imports = "/x"\n', "imports = [1]\n", "version = 9\n", "version = true\n"]
)
def test_bad_config_is_a_clear_error(bad: str) -> None:
    with pytest.raises(c.ContainerdConfigError):
        c.ensure_import(bad)
        c.dropin_text(bad, 1)


def test_no_config_toml_gets_a_minimal_one() -> None:
    assert c.ensure_import(None, major=2) == (
        'version = 3\nimports = ["/etc/containerd/config.d/*.toml"]\n'
    )


def test_dropin_follows_the_files_schema_version() -> None:
    v3 = (
        'version = 3\n[plugins."io.containerd.cri.v1.runtime".containerd]\n'
        'default_runtime_name = "runc"\n'
    )
    data = tomllib.loads(c.dropin_text(v3, 2))
    assert data["version"] == 3
    rt = data["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert rt["default_runtime_name"] == "runc"
    assert rt["runtimes"]["nvidia"]["options"]["BinaryName"] == c.RUNTIME_BINARY
    with pytest.raises(c.ContainerdConfigError, match=r"containerd 1\.x reads 1-2"):
        c.dropin_text(v3, 1)


def test_render_toml_round_trips() -> None:
    data = {
        "a": {"b.c": {"s": 'q"\\\n\u00e9', "i": -3, "f": 1.5, "t": True, "l": [1, "x", [2]]}},
        "top": "v",
        "empty": {},
        "tbl": {"inline": [{"k": 1}]},
    }
    assert tomllib.loads(c.render_toml(data)) == data


# -- on a simulated node -------------------------------------------------------------------


@pytest.mark.parametrize("sku", ["h100-pcie", "gb300"])
def test_node_config_toml_gets_the_import(make_world: MakeWorld, sku: str) -> None:
    w = make_world(sku)
    cfg = w.root / "etc/containerd/config.toml"
    before = cfg.read_text()
    assert "imports" not in before
    cfg.chmod(0o640)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    after = cfg.read_text()
    assert 'imports = ["/etc/containerd/config.d/*.toml"]\n' in after
    assert after.replace('imports = ["/etc/containerd/config.d/*.toml"]\n', "", 1) == before
    assert cfg.stat().st_mode & 0o777 == 0o640
    again = run_in_process(w)
    assert again.outcome.ok and cfg.read_text() == after  # idempotent


def test_node_with_broken_config_toml_fails_93(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    (w.root / "etc/containerd/config.toml").write_text("version = 2\n[plugins\n")
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.CONTAINERD_CONFIG_INVALID, "join")


def test_a_later_import_that_replaces_the_cri_table_fails_94(make_world: MakeWorld) -> None:
    """Another drop-in imported after bootfsm's replaces the CRI plugin table: containerd's
    merged view has no nvidia runtime, and the run says so instead of joining."""
    w = make_world("h100-pcie")
    cfg = w.root / "etc/containerd/config.toml"
    cfg.write_text(
        cfg.read_text().replace(
            "oom_score",
            'imports = ["/etc/containerd/config.d/*.toml", "/etc/containerd/zz.toml"]\noom_score',
        )
    )
    (w.root / "etc/containerd/zz.toml").write_text(
        'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
        'default_runtime_name = "runc"\n'
    )
    result = run_in_process(w)
    assert (result.outcome.code, result.outcome.state) == (Code.CONTAINERD_RUNTIME_MISSING, "join")
    assert (
        "no plugins.io.containerd.grpc.v1.cri.containerd.runtimes.nvidia" in result.outcome.message
    )
