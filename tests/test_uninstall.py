"""`bootfsm uninstall`: what bootfsm installed goes, from its install records, and nothing
else; `detect.cleanup_on_no_gpu` does the same on a VM size without a GPU.

A simulated H100 HGX node boots through the machine with the real dpkg (``--root`` on
the node directory, so `dpkg -i` and `dpkg --purge` are dpkg's own), then is uninstalled
with the real CLI. The expected states are read from the tree before the boot.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bootfsm.core.codes import Code, info
from bootfsm.core.config import parse_config
from bootfsm.host.host import Host
from bootfsm.install.records import parse_records
from bootfsm.machine.context import Context
from bootfsm.observe.journal import Journal
from bootfsm.sim.node import VM_SIZE
from bootfsm.sim.nodestate import Node
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, no_gpus, run_in_process

REAL_DPKG = shutil.which("dpkg", path="/usr/bin:/bin")
REAL_QUERY = shutil.which("dpkg-query", path="/usr/bin:/bin")
HEADER = '{"kind":"bootfsm.installed","schema":2}\n'  # line 1 of installed.jsonl
needs_dpkg = pytest.mark.skipif(
    REAL_DPKG is None or REAL_QUERY is None, reason="the real dpkg is not installed"
)
SIM = "var/lib/bootfsm-sim"  # the simulator's own bookkeeping (its call log), not the node
TOOLKIT = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)


def tree(root: Path, under: str = "") -> dict[str, bytes | str]:
    """Every file (its bytes) and link (its target) under ``root/under``, directories left
    out, the simulator's own files and bootfsm's journals too."""
    out: dict[str, bytes | str] = {}
    base = root / under if under else root
    for dirpath, dirnames, filenames in os.walk(base):
        rel_dir = os.path.relpath(dirpath, root)
        names = filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        for name in names:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel.startswith((SIM, "var/log/bootfsm/")):
                continue
            p = root / rel
            out[rel] = os.readlink(p) if p.is_symlink() else p.read_bytes()
    return out


def real_dpkg_path(w: World, tmp: Path) -> str:
    """PATH with the real dpkg and dpkg-query (``--root`` = the node) before the stand-ins."""
    shims = tmp / "real-dpkg"
    shims.mkdir(exist_ok=True)
    for name, real in (("dpkg", REAL_DPKG), ("dpkg-query", REAL_QUERY)):
        shim = shims / name
        shim.write_text(
            f"#!{sys.executable}\nimport os, sys\n"
            f"os.execv({real!r}, [{name!r}, '--root={w.root}', *sys.argv[1:]])\n"
        )
        shim.chmod(0o755)
    admin = w.root / "var/lib/dpkg"
    (admin / "updates").mkdir(exist_ok=True)
    (admin / "available").touch()
    return f"{shims}:{w.env()['PATH']}"


def env_of(w: World, path: str) -> dict[str, str]:
    return {**w.env(), "PATH": path}


def cli(w: World, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "bootfsm", *args, "--root", str(w.root)]
    return subprocess.run(
        argv, env=env_of(w, path), capture_output=True, text=True, timeout=300, check=False
    )


def query(w: World, package: str) -> str:
    """The real dpkg-query's status and version of ``package`` ('' when unknown)."""
    assert REAL_QUERY is not None
    r = subprocess.run(
        [REAL_QUERY, f"--root={w.root}", "-W", "-f=${db:Status-Abbrev}${Version}", package],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip() if r.returncode == 0 else ""


def unit_active(w: World, unit: str) -> bool:
    return Node(w.root).unit_state(unit) == "active"


def records(w: World) -> list[dict[str, object]]:
    path = w.root / "var/lib/bootfsm/installed.jsonl"
    return parse_records(path.read_text()) if path.exists() else []


@pytest.fixture
def booted(make_world: MakeWorld, tmp_path: Path) -> tuple[World, str, dict[str, bytes | str]]:
    """An H100 HGX node booted with the real dpkg: (world, PATH, the tree before boot)."""
    w = make_world("h100-hgx")
    path = real_dpkg_path(w, tmp_path)
    before = tree(w.root)
    result = run_in_process(w, env=env_of(w, path))
    assert result.outcome.ok, result.outcome.message
    return w, path, before


@needs_dpkg
def test_plan_lists_and_changes_nothing_then_uninstall_restores_the_node(
    booted: tuple[World, str, dict[str, bytes | str]],
) -> None:
    w, path, before = booted
    kernel = Node(w.root).kernel
    assert all(query(w, p) == "ii 1.19.0-1" for p in TOOLKIT)  # the real dpkg installed them
    assert (w.root / f"var/lib/dkms/nvidia/{DRIVER_VERSION}/source").is_symlink()
    config = "etc/containerd/config.toml"
    assert tree(w.root)[config] != before[config]  # the imports line bootfsm added
    entries = records(w)
    assert {"kind": "dkms", "module": "nvidia", "version": DRIVER_VERSION, "kernel": kernel} in [
        {k: e[k] for k in ("kind", "module", "version", "kernel")}
        for e in entries
        if e["kind"] == "dkms"
    ]
    assert (w.root / "var/lib/bootfsm/installed.jsonl").stat().st_mode & 0o777 == 0o600

    booted_tree = tree(w.root)
    plan = cli(w, path, "uninstall", "--plan")
    assert plan.returncode == 0, plan.stderr
    assert tree(w.root) == booted_tree  # --plan changed nothing, byte for byte
    lines = plan.stdout.splitlines()
    dkms = f"dkms-remove nvidia/{DRIVER_VERSION} (dkms remove -m nvidia -v {DRIVER_VERSION} --all)"
    assert dkms in lines
    assert (
        "purge nvidia-container-toolkit nvidia-container-toolkit-base libnvidia-container-tools"
        " libnvidia-container1 (dpkg --purge nvidia-container-toolkit"
        " nvidia-container-toolkit-base libnvidia-container-tools libnvidia-container1)"
    ) in lines
    assert "restore /etc/containerd/config.toml: the bytes it had before bootfsm" in lines
    fm = "nvidia-fabricmanager.service"
    assert f"stop {fm} (systemctl stop {fm})" in lines
    assert lines[-1] == "remove /var/lib/bootfsm/bake.marker"  # the marker last
    as_json = json.loads(cli(w, path, "uninstall", "--plan", "--json").stdout)
    assert as_json["kind"] == "uninstall.plan"
    assert [f"{s['action']} {s['target']}" for s in as_json["steps"]] == [
        line.split(" (")[0].split(":")[0] for line in lines
    ]
    assert tree(w.root) == booted_tree

    r = cli(w, path, "uninstall")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "bootfsm: uninstall OK:" in r.stderr
    after = tree(w.root)
    # what the records listed is gone, or back to its bytes before the boot
    for e in entries:
        if e["kind"] in ("file", "link"):
            rel = str(e["path"]).lstrip("/")
            assert after.get(rel) == before.get(rel), rel
    assert after[config] == before[config]  # config.toml: its original bytes
    assert all(query(w, p) in ("", "pn") for p in TOOLKIT)  # purged, per the real dpkg
    assert "Package: nvidia-container" not in (w.root / "var/lib/dpkg/status").read_text()
    assert not (w.root / "var/lib/dkms/nvidia").exists()
    assert not list((w.root / f"lib/modules/{kernel}/updates/dkms").glob("*.ko"))
    assert not (w.root / "var/lib/bootfsm/bake.marker").exists()
    assert not (w.root / "var/lib/bootfsm/installed.jsonl").exists()
    assert not unit_active(w, "nvidia-fabricmanager.service")
    assert not unit_active(w, "nvidia-persistenced.service")
    assert after[f"boot/initrd.img-{kernel}"] == before[f"boot/initrd.img-{kernel}"]
    etc = {k: v for k, v in after.items() if k.startswith("etc/") and k != "etc/ld.so.cache"}
    assert etc == {k: v for k, v in before.items() if k.startswith("etc/")}  # /etc as it was

    # journaled like the other commands: bootfsm trace reads it
    [journal] = sorted((w.root / "var/log/bootfsm").glob("uninstall-*.jsonl"))
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    names = [e["event"] for e in events]
    assert names[0] == "run.start" and names[-1] == "run.end"  # the run session's
    assert events[0]["kind"] == events[-1]["kind"] == "uninstall"
    assert events[-1]["code"] == 0 and "uninstall.done" in names
    argvs = [e["argv"] for e in events if e["event"] == "command"]
    assert ["dkms", "remove", "-m", "nvidia", "-v", DRIVER_VERSION, "--all"] in argvs
    shown = cli(w, path, "trace", str(journal))
    assert shown.returncode == 0, shown.stderr

    # a second run finds nothing to do, exits 0 and changes nothing but its own journal
    again = cli(w, path, "uninstall")
    assert again.returncode == 0 and "nothing to do" in again.stderr
    lock = "var/lib/bootfsm/lock"  # the node lock's holder pid
    assert {k: v for k, v in tree(w.root).items() if k != lock} == {
        k: v for k, v in after.items() if k != lock
    }


@needs_dpkg
def test_a_file_edited_since_is_kept_with_a_warning(
    booted: tuple[World, str, dict[str, bytes | str]],
) -> None:
    w, path, _ = booted
    rule = w.root / "etc/udev/rules.d/71-nvidia-dev-char.rules"
    edited = rule.read_bytes() + b"# the admin's own line\n"
    rule.write_bytes(edited)
    r = cli(w, path, "uninstall")
    assert r.returncode == 0, r.stderr
    assert rule.read_bytes() == edited
    assert (
        "keep /etc/udev/rules.d/71-nvidia-dev-char.rules: changed since bootfsm wrote it"
        in r.stdout
    )
    [journal] = sorted((w.root / "var/log/bootfsm").glob("uninstall-*.jsonl"))
    warnings = [json.loads(x) for x in journal.read_text().splitlines() if '"warning"' in x]
    assert any("71-nvidia-dev-char.rules" in e.get("message", "") for e in warnings)
    assert not (w.root / "etc/containerd/config.d/10-nvidia-runtime.toml").exists()
    assert cli(w, path, "uninstall").returncode == 0 and rule.read_bytes() == edited


@needs_dpkg
def test_a_package_that_was_there_before_is_never_purged(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    w = make_world("h100-hgx")
    path = real_dpkg_path(w, tmp_path)
    [deb] = (w.docroot / "toolkit/amd64").glob("libnvidia-container1_*.deb")
    assert REAL_DPKG is not None
    pre = subprocess.run(
        [REAL_DPKG, f"--root={w.root}", "-i", str(deb)], capture_output=True, text=True
    )
    assert pre.returncode == 0, pre.stderr
    result = run_in_process(w, env=env_of(w, path))
    assert result.outcome.ok, result.outcome.message
    recorded = [e["name"] for e in records(w) if e["kind"] == "package"]
    assert recorded == [p for p in TOOLKIT if p != "libnvidia-container1"]
    r = cli(w, path, "uninstall")
    assert r.returncode == 0, r.stderr
    assert query(w, "libnvidia-container1") == "ii 1.19.0-1"
    assert all(query(w, p) in ("", "pn") for p in TOOLKIT[1:])


def _boot_as(w: World, vm_size: str, cleanup: bool) -> int:
    """Boot the baked node again as a VM of ``vm_size`` without GPUs on its PCI bus."""
    w.config_overrides = {**w.config_overrides, "detect": {"cleanup_on_no_gpu": cleanup}}
    w.write_config()
    (w.root / VM_SIZE).write_text(f"{vm_size}\n")
    with no_gpus(w):
        result = run_in_process(w)
    return int(result.outcome.code)


def test_a_cpu_vm_size_with_cleanup_removes_and_exits_0(make_world: MakeWorld) -> None:
    """A GPU image (booted once on a GPU VM) now on a CPU VM size of the same image:
    nothing to provision, and with the key what bootfsm installed goes (AgentBaker's
    cleanUpGPUDrivers for its own prebake)."""
    w = make_world("gb300")
    assert run_in_process(w).outcome.ok
    before_records = records(w)
    assert any(e["kind"] == "unit" and e["action"] == "mask" for e in before_records)  # imex
    assert (w.root / "var/lib/dkms/nvidia").is_dir()
    assert _boot_as(w, "Standard_D8ps_v5", cleanup=True) == 0
    assert not (w.root / "var/lib/dkms/nvidia").exists()
    assert not (w.root / "var/lib/bootfsm/bake.marker").exists()
    assert not (w.root / "var/lib/bootfsm/installed.jsonl").exists()
    assert "nvidia-imex" not in (w.root / "var/lib/dpkg/status").read_text()
    assert not os.path.lexists(w.root / "etc/systemd/system/nvidia-imex.service")  # unmasked
    journal = w.journals()[-1].read_text()
    events = [json.loads(line) for line in journal.splitlines()]
    done = [e for e in events if e["event"] == "uninstall.done"]
    assert len(done) == 1 and done[0]["state"] == "uninstall"
    assert events[-1]["event"] == "run.end" and events[-1]["code"] == 0
    assert (
        events[-1]["message"] == "nothing to provision: VM size standard_d8ps_v5 has no NVIDIA GPU"
    )
    dkms = [e for e in events if e["event"] == "command" and e["argv"][:2] == ["dkms", "remove"]]
    assert dkms and dkms[0]["rc"] == 0


def _changed_by_a_boot(w: World, vm_size: str) -> tuple[int, set[str]]:
    booted = tree(w.root)
    code = _boot_as(w, vm_size, cleanup=vm_size.endswith("_v6"))
    after = tree(w.root)
    changed = {k for k in booted.keys() | after.keys() if booted.get(k) != after.get(k)}
    return code, changed


@pytest.mark.parametrize(
    ("vm_size", "code"),
    [
        ("Standard_D8ps_v5", 0),  # a CPU VM size, the key off: nothing to provision
        ("Standard_ND128isr_GB300_v6", 22),  # the GPUs fell off the bus: key on, yet kept
    ],
)
def test_a_boot_without_gpus_removes_nothing_unless_asked(
    make_world: MakeWorld, vm_size: str, code: int
) -> None:
    w = make_world("gb300")
    assert run_in_process(w).outcome.ok
    got, changed = _changed_by_a_boot(w, vm_size)
    assert got == code
    own = {  # the config this test rewrote, the VM size it set, the run's own files
        "etc/bootfsm/config.toml",
        VM_SIZE,
        "var/lib/bootfsm/checkpoint.json",
        "var/lib/node_exporter/textfile_collector/bootfsm.prom",
    }
    assert changed <= own, sorted(changed)
    assert (w.root / "var/lib/bootfsm/installed.jsonl").exists()


def test_unreadable_records_are_108_with_a_message(make_world: MakeWorld) -> None:
    w = make_world("gb300")
    records_file = w.root / "var/lib/bootfsm/installed.jsonl"
    records_file.parent.mkdir(parents=True, exist_ok=True)
    records_file.write_text(HEADER + '{"kind": "bogus"}\n')
    out = subprocess.run(
        [sys.executable, "-m", "bootfsm", "uninstall", "--root", str(w.root)],
        env=w.env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert out.returncode == 108
    line = next(ln for ln in out.stderr.splitlines() if " FAILED " in ln)
    assert line.startswith("bootfsm: uninstall FAILED code=108 UNINSTALL_FAILED: ")
    assert "unknown kind 'bogus'" in line and line.endswith(f" | hint: {info(108).hint}")
    assert "Traceback" not in out.stderr


def test_a_failing_step_is_108_and_what_is_left_stays_recorded(make_world: MakeWorld) -> None:
    w = make_world("gb300")
    assert run_in_process(w).outcome.ok
    # the DKMS tree's source link gone: the real dkms refuses ("not located in the tree")
    (w.root / f"var/lib/dkms/nvidia/{DRIVER_VERSION}/source").unlink()
    r = subprocess.run(
        [sys.executable, "-m", "bootfsm", "uninstall", "--root", str(w.root)],
        env=w.env(), capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert r.returncode == 108, r.stderr
    assert f"dkms-remove nvidia/{DRIVER_VERSION} failed" in r.stderr
    assert "is not located in the DKMS tree" in r.stderr
    left = records(w)
    assert any(e["kind"] == "dkms" for e in left)
    assert (w.root / "var/lib/bootfsm/bake.marker").exists()  # the marker goes last
    assert not any(e["kind"] == "package" for e in left)  # done before the failure


# -- the stand-ins are as strict as dkms 3.0.10 and dpkg 1.21.23 -----------------------------


def _standin(bin_dir: Path, name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(bin_dir / name), *argv], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def dkms_node(tmp_path: Path) -> tuple[Path, Path, str]:
    """A node with nvidia/580.159.04 built and installed by DKMS: (root, bin dir, kernel)."""
    from bootfsm.sim.node import SKUS, build_node
    from bootfsm.sim.standin_installer import install_driver_files

    root = tmp_path / "node"
    bin_dir = build_node(root, SKUS["h100-hgx"])
    node = Node(root)
    install_driver_files(node, DRIVER_VERSION, node.kernel, "open")
    return root, bin_dir, node.kernel


def test_dkms_remove_as_dkms_3_words_it(dkms_node: tuple[Path, Path, str]) -> None:
    """Expected text written from dkms 3.0.10's remove_module/do_uninstall (Debian 12)."""
    root, bin_dir, kernel = dkms_node
    r = _standin(bin_dir, "dkms", "remove", f"nvidia/{DRIVER_VERSION}", "--all")
    assert r.returncode == 0, r.stderr
    block = [
        " - Uninstallation",
        f"   - Deleting from: /lib/modules/{kernel}/updates/dkms/",
        " - Original module",
        "   - No original module was found for this module on this kernel.",
        "   - Use the dkms install command to reinstall any previous module version.",
    ]
    assert r.stdout.splitlines() == [
        f"Module nvidia-{DRIVER_VERSION} for kernel {kernel} (x86_64).",
        "Before uninstall, this module version was ACTIVE on this kernel.",
        *("", "nvidia.ko:", *block),
        *("", "nvidia-uvm.ko:", *block),
        *("", "nvidia-modeset.ko:", *block),
        "depmod...",
        f"Deleting module nvidia-{DRIVER_VERSION} completely from the DKMS tree.",
    ]
    assert not (root / "var/lib/dkms/nvidia").exists()
    assert not list((root / f"lib/modules/{kernel}/updates/dkms").glob("*.ko"))
    again = _standin(bin_dir, "dkms", "remove", "-m", "nvidia", "-v", DRIVER_VERSION, "--all")
    assert again.returncode == 3
    assert again.stderr == (
        f"Error! The module/version combo: nvidia-{DRIVER_VERSION} is not located in the"
        " DKMS tree.\n"
    )


@pytest.mark.parametrize(
    ("argv", "rc", "stderr"),
    [
        (
            ["remove", "-m", "nvidia", "-v", DRIVER_VERSION, "-k", "6.8.0-1", "--all"],
            2,
            "Error!  You cannot specify a kernel version and also specify\n"
            "--all on the command line.\n",
        ),
        (
            ["remove", "-m", "nvidia", "--all"],
            1,
            "Error! Arguments <module> and <module-version> are not specified.\n"
            "Usage: remove <module>/<module-version> or\n"
            "       remove -m <module>/<module-version> or\n"
            "       remove -m <module> -v <module-version>\n",
        ),
        (["remove", "--bogus"], 2, "Error!  Unknown option: --bogus\n"),
        (["remove", "status", "nvidia/1"], 4, "Error! Cannot specify more than one action.\n"),
    ],
)
def test_dkms_remove_refuses_what_dkms_refuses(
    dkms_node: tuple[Path, Path, str], argv: list[str], rc: int, stderr: str
) -> None:
    root, bin_dir, _ = dkms_node
    r = _standin(bin_dir, "dkms", *argv)
    assert (r.returncode, r.stderr) == (rc, stderr)
    assert (root / f"var/lib/dkms/nvidia/{DRIVER_VERSION}/source").is_symlink()  # untouched


@needs_dpkg
def test_dpkg_purge_standin_matches_the_real_dpkg(tmp_path: Path) -> None:
    """The same debs, the same purges: the stand-in's exit codes and words are dpkg's
    (the "(Reading database ... N files" count aside: dpkg counts directories too)."""
    from bootfsm.sim import artifacts as art
    from bootfsm.sim.node import SKUS, build_node

    debs = tmp_path / "debs"
    foo = art.build_deb(
        debs, package="foo", version="1.0-1", arch="all",
        files={"/usr/share/doc/foo/copyright": b"foo\n"},
    )  # fmt: skip
    conf = "/etc/bar/bar.conf"
    bar = art.build_deb(
        debs, package="bar", version="2.0", arch="all", depends="foo",
        files={conf: b"x = 1\n"}, conffiles=[conf],
    )  # fmt: skip
    real = tmp_path / "real"
    for d in ("var/lib/dpkg/info", "var/lib/dpkg/updates"):
        (real / d).mkdir(parents=True)
    (real / "var/lib/dpkg/status").touch()
    (real / "var/lib/dpkg/available").touch()
    assert REAL_DPKG is not None
    sim_bin = build_node(tmp_path / "sim", SKUS["h100-hgx"])

    def both(*argv: str) -> tuple[tuple[int, list[str], str], tuple[int, list[str], str]]:
        out = []
        for cmd in ([REAL_DPKG, f"--root={real}", *argv], [str(sim_bin / "dpkg"), *argv]):
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            lines = [x for x in r.stdout.splitlines() if not x.startswith("(Reading database")]
            out.append((r.returncode, lines, r.stderr))
        return out[0], out[1]

    installed = both("-i", str(foo), str(bar))
    assert installed[0][0] == installed[1][0] == 0
    for argv in (
        ["--purge", "foo"],  # bar depends on foo: refused, exit 1
        ["-P"],  # no package: exit 2
        ["--purge", "--bogus", "foo"],
        ["--purge", "-i", "foo"],
        ["--purge", "foo", "nothere", "bar"],  # bar first; nothere ignored with a warning
        ["-P", "foo"],  # no longer installed: a warning, exit 0
    ):
        real_out, sim_out = both(*argv)
        assert sim_out == real_out, argv
    for root in (real, tmp_path / "sim"):
        assert not (root / "usr/share/doc/foo/copyright").exists()
        assert not (root / "etc/bar/bar.conf").exists()
        assert "Package: bar" not in (root / "var/lib/dpkg/status").read_text()


def test_an_image_baked_then_booted_without_a_gpu_is_cleaned(make_world: MakeWorld) -> None:
    """The teardown the issue names: `bootfsm bake` built the module into the image (no
    GPU on the build VM), the image boots on a CPU VM size (AKS shares one image)."""
    from bootfsm.core.config_files import load_config
    from bootfsm.image.bake import BakeOptions, bake

    w = make_world("h100-hgx")
    before = tree(w.root)
    with no_gpus(w):
        baked = bake(
            load_config(w.config_path, required=True), BakeOptions(root=w.root, env=w.env())
        )
    assert baked.ok, baked.message
    kinds = {e["kind"] for e in records(w)}
    # the toolkit, the blacklist, the marker and the module files: bake registers
    # nothing with DKMS (Azure/aks-gpu#191), so its modules are files of its own
    assert {"package", "file"} <= kinds and "dkms" not in kinds
    kernel = Node(w.root).kernel
    modules = w.root / f"lib/modules/{kernel}/updates/dkms"
    assert sorted(p.name for p in modules.glob("*.ko")) == [
        "nvidia-modeset.ko", "nvidia-uvm.ko", "nvidia.ko"
    ]  # fmt: skip
    assert (w.root / "var/lib/bootfsm/bake.marker").exists()
    assert _boot_as(w, "Standard_D4s_v5", cleanup=True) == 0
    after = tree(w.root)
    assert not (w.root / "var/lib/dkms/nvidia").exists()
    assert list(modules.glob("*.ko")) == []
    assert not (w.root / "var/lib/bootfsm/bake.marker").exists()
    assert "etc/modprobe.d/blacklist-nouveau.conf" not in after
    assert after[f"boot/initrd.img-{kernel}"] == before[f"boot/initrd.img-{kernel}"]
    assert "Package: nvidia-container-toolkit" not in (w.root / "var/lib/dpkg/status").read_text()


def test_a_node_without_records_has_nothing_to_undo(make_world: MakeWorld) -> None:
    w = make_world("gb300")
    argv = [sys.executable, "-m", "bootfsm", "uninstall", "--root", str(w.root)]
    plan = subprocess.run([*argv, "--plan"], env=w.env(), capture_output=True, text=True)
    assert plan.returncode == 0 and "nothing to do" in plan.stdout
    r = subprocess.run([*argv, "--json"], env=w.env(), capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["schema"], doc["kind"], doc["code"], doc["steps"]) == (1, "uninstall", 0, [])


# -- the records themselves ------------------------------------------------------------------


def _ctx(root: Path) -> Context:
    return Context.create(parse_config({}), Host(root), Journal(None, run_id="t"))


def test_a_rewritten_file_keeps_what_was_there_before_bootfsm(tmp_path: Path) -> None:
    from bootfsm.install import records as rec

    ctx = _ctx(tmp_path)
    target = tmp_path / "etc/containerd/config.toml"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"version = 2\n")
    target.chmod(0o640)
    rec.write_file(ctx, "/etc/containerd/config.toml", "version = 2\nimports = []\n")
    rec.write_file(ctx, "/etc/containerd/config.toml", "version = 2\nimports = [1]\n")
    [entry] = records_of(tmp_path)
    assert entry["before"]["b64"] == "dmVyc2lvbiA9IDIK"  # base64 of b"version = 2\n"
    assert entry["before"]["mode"] == 0o640
    assert entry["sha256"] == hashlib.sha256(b"version = 2\nimports = [1]\n").hexdigest()
    assert (tmp_path / "var/lib/bootfsm/installed.jsonl").stat().st_mode & 0o777 == 0o600


def records_of(root: Path) -> list[dict[str, object]]:
    return parse_records((root / "var/lib/bootfsm/installed.jsonl").read_text())


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("not json\n", "line 1: not JSON"),
        ('{"schema": 1, "entries": []}\n', "not the schema 2 bootfsm.installed header"),
        (HEADER + "[]\n", "line 2: unknown kind"),
        (HEADER + '{"kind": "file", "path": "etc/x", "sha256": "a"}\n', "is not absolute"),
        (HEADER + '{"kind": "package", "name": "x"}\n', "'version' is not a string"),
        (HEADER + '{"kind": "unit", "unit": "u", "action": "enable"}\n{"kind": "unit"',
         None),  # a torn last line (no newline) is an append a crash cut short: dropped
        (HEADER + '{"kind": "unit", "unit": "u", "action": "reboot"}\n',
         "unknown unit action"),
        (HEADER + '{"kind": "module", "name": "a"}\n{torn\n{"kind": "module", "name": "b"}\n',
         "line 3: not JSON"),
    ],
)  # fmt: skip
def test_records_garbage_is_refused_with_the_reason(text: str, why: str | None) -> None:
    from bootfsm.install.records import RecordsError

    if why is None:
        assert parse_records(text) == [{"kind": "unit", "unit": "u", "action": "enable"}]
        return
    with pytest.raises(RecordsError, match=why):
        parse_records(text)


@needs_dpkg
def test_config_toml_edited_since_gets_only_the_imports_edit_undone(
    booted: tuple[World, str, dict[str, bytes | str]],
) -> None:
    """The admin added a line to config.toml after bootfsm's imports edit: uninstall puts
    the imports back as they were and keeps the admin's line."""
    w, path, before = booted
    config = w.root / "etc/containerd/config.toml"
    admin = b'\n[plugins."io.containerd.internal.v1.opt"]\n  path = "/opt/containerd"\n'
    config.write_bytes(config.read_bytes() + admin)
    plan = cli(w, path, "uninstall", "--plan")
    assert (
        "unedit /etc/containerd/config.toml: edited since: only bootfsm's imports edit is undone"
        in plan.stdout.splitlines()
    )
    r = cli(w, path, "uninstall")
    assert r.returncode == 0, r.stderr
    assert config.read_bytes() == before["etc/containerd/config.toml"] + admin


@pytest.mark.parametrize(
    "original",
    [
        'version = 2\n\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "x"\n',
        'version = 2\nimports = ["/etc/containerd/other.toml"]\n[plugins.x]\n  a = 1\n',
        "# comment\r\nversion = 3\r\n",
    ],
)
def test_undo_import_puts_back_what_ensure_import_changed(original: str) -> None:
    from bootfsm.install.containerd import ensure_import, import_edit, undo_import

    edited = ensure_import(original, major=2)
    assert edited is not None
    edit = import_edit(original, edited)
    assert undo_import(edited, edit) == original
    later = edited + "# the admin's line\n"
    assert undo_import(later, edit) == original + "# the admin's line\n"
    spaced = undo_import(later.replace("imports = [", "imports = [ ", 1), edit)
    assert spaced is None or "config.d" not in spaced  # undone right, or not at all
    changed = later.replace("config.d/*.toml", "config.d/*.conf")  # bootfsm's entry edited
    assert undo_import(changed, edit) is None


def test_garbage_records_met_while_installing_are_set_aside(tmp_path: Path) -> None:
    from bootfsm.install import records as rec

    state = tmp_path / "var/lib/bootfsm"
    state.mkdir(parents=True, mode=0o700)
    (state / "installed.jsonl").write_text("{torn")
    ctx = _ctx(tmp_path)
    rec.record_module(ctx, "ib_umad")
    assert (state / "installed.jsonl.bad").read_text() == "{torn"
    assert [e["kind"] for e in records_of(tmp_path)] == ["module"]


def test_records_are_appended_a_line_at_a_time_in_place(tmp_path: Path) -> None:
    """Each record is one line appended to the same file (no rewrite, no new inode); a
    file written twice is two lines that read as one record keeping the first before."""
    from bootfsm.install import records as rec

    ctx = _ctx(tmp_path)
    path = tmp_path / "var/lib/bootfsm/installed.jsonl"
    rec.record_module(ctx, "ib_umad")
    inode = path.stat().st_ino
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/x.conf").write_text("admin\n")
    rec.write_file(ctx, "/etc/x.conf", "one\n")
    rec.write_file(ctx, "/etc/x.conf", "two\n")
    rec.record_dkms(ctx, "nvidia", "570.1", "6.8.0")
    assert path.stat().st_ino == inode
    lines = path.read_text().splitlines()
    assert lines[0] == HEADER.strip() and len(lines) == 5
    assert [json.loads(ln)["kind"] for ln in lines[1:]] == ["module", "file", "file", "dkms"]
    [_, f, _] = records_of(tmp_path)
    assert f["sha256"] == hashlib.sha256(b"two\n").hexdigest()
    assert f["before"]["b64"] == "YWRtaW4K"  # base64 of b"admin\n": the first before


def test_a_torn_last_record_is_dropped_and_the_next_record_rewrites(tmp_path: Path) -> None:
    """A crash mid-append leaves a last line without its newline: it is not a record,
    and the next record rewrites the file whole instead of appending after it. A
    change made by anything else is seen (the file is read again)."""
    from bootfsm.install import records as rec

    state = tmp_path / "var/lib/bootfsm"
    state.mkdir(parents=True, mode=0o700)
    path = state / "installed.jsonl"
    ctx = _ctx(tmp_path)
    rec.record_module(ctx, "a")
    with path.open("a") as fh:
        fh.write('{"kind": "module", "na')
    assert [e["name"] for e in rec.load(Host(tmp_path), parse_config({}))] == ["a"]
    rec.record_module(ctx, "b")
    assert path.read_text() == HEADER + (
        '{"by":"","kind":"module","name":"a"}\n{"by":"","kind":"module","name":"b"}\n'
    )
    with path.open("a") as fh:
        fh.write('{"kind":"module","name":"c"}\n')
    rec.record_module(ctx, "d")
    assert [e["name"] for e in records_of(tmp_path)] == ["a", "b", "c", "d"]


def test_a_link_planted_as_the_records_is_never_followed(tmp_path: Path) -> None:
    from bootfsm.core.errors import BootError
    from bootfsm.install import records as rec

    state = tmp_path / "var/lib/bootfsm"
    state.mkdir(parents=True, mode=0o700)
    (tmp_path / "elsewhere.json").write_text(HEADER)
    (state / "installed.jsonl").symlink_to(tmp_path / "elsewhere.json")
    with pytest.raises(BootError) as err:
        rec.load(Host(tmp_path), parse_config({}))
    assert err.value.code is Code.UNSAFE_STATE_FILE


@needs_dpkg
def test_uninstall_shares_the_run_session_lock_and_trace(
    booted: tuple[World, str, dict[str, bytes | str]],
) -> None:
    """The node lock held by another bootfsm gives uninstall the same code and words as
    run, bake and fetch; its journal is found by `bootfsm trace RUN-ID` like a run's."""
    import fcntl

    w, path, _ = booted
    lock = w.root / "var/lib/bootfsm/lock"
    with lock.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held = cli(w, path, "uninstall")
    assert held.returncode == 11, held.stderr
    assert "another bootfsm run (pid" in held.stderr and str(lock) in held.stderr
    assert not list((w.root / "var/log/bootfsm").glob("uninstall-*.jsonl"))
    done = cli(w, path, "uninstall")
    assert done.returncode == 0, done.stderr
    [journal] = (w.root / "var/log/bootfsm").glob("uninstall-*.jsonl")
    run_id = journal.stem.rsplit("-", 1)[-1]
    shown = cli(w, path, "trace", run_id)
    assert shown.returncode == 0, shown.stderr
    assert "uninstall" in shown.stdout and run_id in shown.stdout
