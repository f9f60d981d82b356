"""A simulated world: one node directory, a loopback mirror in real formats, a config.

``World`` is the Python API the demo, the tests and the benchmarks share. It builds the
node for a SKU (stand-in commands included), fills the mirror with a makeself runfile,
dpkg-deb packages with their ``Packages`` indexes, a fabric manager tar.xz with its
``redistrib_<ver>.json``, serves IMDS and kubelet health, and injects faults.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess  # noqa: TID251 - the simulator runs the real CLI as a child
import sys
import tempfile
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bootfsm.core.archnames import normalize_arch
from bootfsm.sim import artifacts as art
from bootfsm.sim.mirror import Corrupt, DropMidBody, Fault, Mirror, NotFound, Status
from bootfsm.sim.node import FAULTS as NODE_FAULTS
from bootfsm.sim.node import (
    SKUS,
    VM_SIZE,
    VM_TAGS,
    DpkgLockHolder,
    build_node,
    calls,
    imds_instance,
    kubelet_healthz,
    standin_script,
)

__all__ = ["DRIVER_VERSION", "FAULTS", "TOOLKIT_VERSION", "World"]

DRIVER_VERSION = "580.159.04"
TOOLKIT_VERSION = "1.19.0-1"
NVLSM_VERSION = "2025.06.6"  # the redist 13.0.2 manifest's nvlsm
TOOLKIT_PACKAGES = (
    "libnvidia-container1",
    "libnvidia-container-tools",
    "nvidia-container-toolkit-base",
    "nvidia-container-toolkit",
)

MIRROR_FAULTS: Mapping[str, str] = {
    "artifact-404": "the mirror answers 404 for the driver runfile",
    "checksum-mismatch": "the mirror serves a runfile whose bytes differ from its sha256",
    "http-503x3": "the mirror answers 503 three times for the runfile, then serves it",
    "drop-mid-body": "the connection drops halfway through the runfile, once",
    "dpkg-lock-held": "another process holds the dpkg lock for the whole run",
    "dpkg-db-lock-held": "another process holds only dpkg's database lock (var/lib/dpkg/lock)",
    "dpkg-interrupted": "a dpkg killed mid-upgrade left a package half-configured in its journal",
}
FAULTS: Mapping[str, str] = {**MIRROR_FAULTS, **NODE_FAULTS}


@dataclass
class World:
    """A node plus its mirror; use as a context manager (the mirror runs while inside)."""

    base: Path
    sku_name: str = "gb300"
    faults: Collection[str] = ()
    driver_kind: str = "cuda"
    driver_version: str = DRIVER_VERSION
    compile_seconds: float = 0.05
    runfile_blob_bytes: int = 1 << 20
    config_overrides: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    vm_tags: Mapping[str, str] = field(default_factory=dict)
    vm_size: str = ""  # the VM size IMDS reports, when not the SKU's
    # driver.source = "ubuntu-signed": the archive's kernels (kernel -> the user-space
    # version its module depends on) and the user-space versions it lists; empty: off
    ubuntu_kernels: Mapping[str, str] = field(default_factory=dict)
    ubuntu_userspace: Sequence[str] = ()
    root: Path = field(init=False)
    docroot: Path = field(init=False)
    config_path: Path = field(init=False)
    bin_dir: Path = field(init=False)
    mirror: Mirror = field(init=False)
    runfile_sha256: str = field(init=False, default="")
    _stack: contextlib.ExitStack = field(init=False, default_factory=contextlib.ExitStack)

    def __post_init__(self) -> None:
        unknown = [f for f in self.faults if f not in FAULTS]
        if unknown:
            raise ValueError(f"unknown fault(s): {', '.join(unknown)}; known: {', '.join(FAULTS)}")
        if self.sku_name not in SKUS:
            raise ValueError(f"unknown SKU {self.sku_name!r}; known: {', '.join(SKUS)}")
        self.root = self.base / "node"
        self.docroot = self.base / "mirror"
        self.config_path = self.root / "etc/bootfsm/config.toml"

    # -- building ----------------------------------------------------------------------
    def __enter__(self) -> World:
        sku = SKUS[self.sku_name]
        node_faults = [f for f in self.faults if f in NODE_FAULTS]
        self.bin_dir = build_node(self.root, sku, node_faults, compile_seconds=self.compile_seconds)
        if self.vm_tags:
            (self.root / VM_TAGS).write_text(json.dumps([list(t) for t in self.vm_tags.items()]))
        if self.vm_size:
            (self.root / VM_SIZE).write_text(self.vm_size + "\n")
        self._build_mirror()
        self.mirror = self._stack.enter_context(Mirror(self.docroot))
        self.mirror.add_route(
            "/metadata/instance", lambda: imds_instance(self.root), require=("Metadata", "true")
        )
        self.mirror.add_route("/healthz", lambda: kubelet_healthz(self.root))
        self._inject()
        self.write_config()
        if "dpkg-lock-held" in self.faults:
            self._stack.enter_context(DpkgLockHolder(self.root))
        if "dpkg-db-lock-held" in self.faults:
            holder = DpkgLockHolder(self.root)
            holder.path = self.root / "var/lib/dpkg/lock"  # as dpkg holds it mid-transaction
            self._stack.enter_context(holder)
        if "dpkg-interrupted" in self.faults:
            self._interrupted_dpkg()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def _build_mirror(self) -> None:
        sku = SKUS[self.sku_name]
        names = normalize_arch(sku.arch)
        assert names is not None
        v = self.driver_version
        tesla = self.docroot / ("grid" if self.driver_kind == "grid" else f"tesla/{v}")
        tesla.mkdir(parents=True, exist_ok=True)
        runfile = art.build_runfile(
            tesla,
            version=v,
            runfile_arch=names.runfile,
            installer_source=standin_script("nvidia-installer", self.root),
            blob_bytes=self.runfile_blob_bytes,
        )
        if self.driver_kind == "grid":  # GRID runfiles are named -grid (aks-gpu's -grid-azure)
            runfile = runfile.rename(runfile.with_name(runfile.name.replace(".run", "-grid.run")))
        self.runfile_sha256 = art.sha256_file(runfile)
        tk = self.docroot / "toolkit" / names.debian
        tk.mkdir(parents=True, exist_ok=True)
        debs = [
            art.build_deb(
                tk,
                package=p,
                version=TOOLKIT_VERSION,
                arch=names.debian,
                files={
                    f"/usr/share/doc/{p}/copyright": b"NVIDIA container toolkit\n",
                    # -base ships /usr/bin/nvidia-ctk (units condition on it, e.g. the
                    # toolkit's nvidia-cdi-refresh.service); here the simulator's stand-in
                    **(
                        {"/usr/bin/nvidia-ctk": standin_script("nvidia-ctk", self.root).encode()}
                        if p == "nvidia-container-toolkit-base"
                        else {}
                    ),
                },
                description=f"{p} (simulated)",
            )
            for p in TOOLKIT_PACKAGES
        ]
        art.write_packages_index(tk, debs)
        # every repository is signed by this process's simulator key, whose public
        # keyring the node has where NVIDIA's keyring packages install theirs
        signer = art.shared_signer()
        art.sign_repository(tk, signer, arch=names.debian)
        keyrings = self.root / "usr/share/keyrings"
        ring = signer.export_keyring(keyrings / "nvidia-container-toolkit-keyring.gpg")
        shutil.copyfile(ring, keyrings / "cuda-archive-keyring.gpg")
        redist = self.docroot / "redist"
        fm_dir = redist / "fabricmanager" / f"linux-{names.redist}"
        fm_dir.mkdir(parents=True, exist_ok=True)
        fm = art.build_fabricmanager_archive(
            fm_dir,
            version=v,
            platform=f"linux-{names.redist}",
            start_script_source=standin_script("nvidia-fabricmanager-start.sh", self.root),
        )
        components = {"fabricmanager": {f"linux-{names.redist}": fm}}
        if SKUS[self.sku_name].nvlink5:
            nvlsm = art.build_nvlsm_archive(
                redist / "nvlsm" / f"linux-{names.redist}",
                version=NVLSM_VERSION,
                platform=f"linux-{names.redist}",
            )
            components["nvlsm"] = {f"linux-{names.redist}": nvlsm}
        art.write_redistrib_manifest(
            redist, version=v, components=components, versions={"nvlsm": NVLSM_VERSION}
        )
        osdir = f"{sku.os_id}{sku.os_version.replace('.', '')}"
        cuda = self.docroot / "cuda" / osdir / names.redist
        cuda.mkdir(parents=True, exist_ok=True)
        imex = art.build_deb(
            cuda,
            package="nvidia-imex",
            version=f"{v}-1ubuntu1",
            arch=names.debian,
            files={
                "/usr/bin/nvidia-imex": b"#!/bin/sh\necho nvidia-imex\n",
                "/usr/bin/nvidia-imex-ctl": b"#!/bin/sh\necho READY\n",
                "/lib/systemd/system/nvidia-imex.service": (
                    b"[Unit]\nDescription=NVIDIA IMEX service\n\n[Service]\n"
                    b"ExecStart=/usr/bin/nvidia-imex -c /etc/nvidia-imex/config.cfg\n\n"
                    b"[Install]\nWantedBy=multi-user.target\n"
                ),
                "/etc/nvidia-imex/config.cfg": b"SERVER_PORT=50000\n",
            },
            depends="nvidia-modprobe",
            description="NVIDIA IMEX daemon (simulated)",
        )
        art.write_packages_index(cuda, [imex])
        art.sign_repository(cuda, signer, arch=names.debian)
        if self.ubuntu_kernels:
            self._build_ubuntu_archive(signer)

    def _build_ubuntu_archive(self, signer: art.RepoSigner) -> None:
        """Ubuntu's archive (bootfsm/sim/artifacts_ubuntu.py), its keyring where the
        ubuntu-keyring package installs it, and the base packages in dpkg's status."""
        from bootfsm.sim.artifacts_ubuntu import base_status

        sku = SKUS[self.sku_name]
        names = normalize_arch(sku.arch)
        assert names is not None
        self.publish_ubuntu_archive(signer)
        signer.export_keyring(self.root / "usr/share/keyrings/ubuntu-archive-keyring.gpg")
        (self.root / "var/lib/dpkg/status").write_text(base_status(sku.kernel, names.debian))

    def publish_ubuntu_archive(self, signer: art.RepoSigner | None = None) -> None:
        """(Re)publish Ubuntu's archive from ``ubuntu_kernels`` and ``ubuntu_userspace``,
        as the archive is after an upload: what it no longer lists is gone from its pool
        too. The node is untouched."""
        import shutil

        from bootfsm.sim.artifacts_ubuntu import build_ubuntu_archive

        sku = SKUS[self.sku_name]
        names = normalize_arch(sku.arch)
        assert names is not None
        scripts = {n: standin_script(n, self.root) for n in ("nvidia-smi", "nvidia-persistenced")}
        scripts["fm-start"] = standin_script("nvidia-fabricmanager-start.sh", self.root)
        shutil.rmtree(self.docroot / "ubuntu", ignore_errors=True)
        build_ubuntu_archive(
            self.docroot / "ubuntu",
            signer or art.shared_signer(),
            codename={"22.04": "jammy", "24.04": "noble"}[sku.os_version],
            release=sku.os_version,
            arch=names.debian,
            libdir=names.runfile,
            kernels=self.ubuntu_kernels,
            userspace=self.ubuntu_userspace or sorted(set(self.ubuntu_kernels.values())),
            scripts=scripts,
        )

    def _inject(self) -> None:
        names = normalize_arch(SKUS[self.sku_name].arch)
        assert names is not None
        grid = "-grid" if self.driver_kind == "grid" else ""
        runfile = f"NVIDIA-Linux-{names.runfile}-{self.driver_version}{grid}.run"
        rules: dict[str, Fault] = {
            "artifact-404": NotFound(),
            "checksum-mismatch": Corrupt(),
            "http-503x3": Status(503, times=3),
            "drop-mid-body": DropMidBody(times=1, fraction=0.5),
        }
        for name, fault in rules.items():
            if name in self.faults:
                self.mirror.add_fault(runfile, fault)

    def _interrupted_dpkg(self) -> None:
        """What a dpkg killed while configuring an upgrade leaves: the package's new
        stanza, half-configured, in the journal (var/lib/dpkg/updates/0000; dpkg folds
        the journal into the status file only at its checkpoints)."""
        updates = self.root / "var/lib/dpkg/updates"
        updates.mkdir(parents=True, exist_ok=True)
        (updates / "0000").write_text(
            "Package: unattended-upgrades\nStatus: install ok half-configured\n"
            "Priority: optional\nSection: admin\nMaintainer: Michael Vogt <mvo@debian.org>\n"
            "Architecture: all\nVersion: 2.9.1+nmu4ubuntu1\n"
            "Description: automatic installation of security upgrades\n"
        )

    def config_text(self) -> str:
        """The node's config.toml: the real defaults, pointed at the loopback mirror."""
        u = self.mirror.url
        sections: dict[str, dict[str, Any]] = {
            "run": {"deadline": 120.0, "backoff_scale": 0.05},
            "detect": {"imds_url": f"{u}/metadata/instance?api-version=2021-02-01"},
            "driver": {
                "version": self.driver_version,
                "kind": self.driver_kind,
                "dpkg_lock_timeout": 2.0,
                "command_timeout": 10.0,
            },
            "sources": {
                "runfile_base": f"{u}/tesla",
                "runfile_sha256": self.runfile_sha256,
                "grid_runfile_url": (
                    f"{u}/grid/NVIDIA-Linux-x86_64-{self.driver_version}-grid.run"
                ),
                "redist_base": f"{u}/redist",
                "cuda_repo": f"{u}/cuda/{{os_id}}{{os_version_nodot}}/{{redist_arch}}",
                "toolkit_repo": f"{u}/toolkit/{{debian_arch}}",
                "toolkit_version": TOOLKIT_VERSION,
            },
            "fetch": {"allow_http_hosts": ["127.0.0.1"], "read_timeout": 10.0},
            "verify": {"fabric_timeout": 5.0, "fabric_poll_interval": 0.1},
            "join": {
                "kubelet_healthz_url": f"{u}/healthz",
                "kubelet_timeout": 3.0,
                "kubelet_poll_interval": 0.1,
            },
        }
        if self.ubuntu_kernels:
            sections["driver"]["source"] = "ubuntu-signed"
            sections["sources"]["ubuntu_archive"] = f"{u}/ubuntu"
            sections["sources"]["ubuntu_ports"] = f"{u}/ubuntu"
        for sec, values in self.config_overrides.items():
            sections.setdefault(sec, {}).update(values)
        return "".join(
            f"[{sec}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in kv.items()) + "\n"
            for sec, kv in sections.items()
        )

    def write_config(self) -> None:
        """(Re)write the node's config file."""
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config_text())

    # -- running -----------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment of a run on this node: stand-ins first on PATH."""
        return {**os.environ, "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def argv(self, *extra: str) -> list[str]:
        """`bootfsm run` for this node, as argv."""
        return [sys.executable, "-m", "bootfsm", "run", "--root", str(self.root), *extra]

    def run_cli(self, *extra: str, timeout: float = 180.0) -> subprocess.CompletedProcess[str]:
        """Run the real CLI as a child process on this node."""
        return subprocess.run(
            self.argv(*extra),
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def calls(self) -> list[dict[str, Any]]:
        """Every stand-in command invocation so far."""
        return calls(self.root)

    def journals(self) -> list[Path]:
        """This node's run journals, oldest first: in /var/log/bootfsm, and where the
        provisioning hook puts them (/var/log/azure/bootfsm, AKS's log collector's)."""
        found = [
            *(self.root / "var/log/bootfsm").glob("run-*.jsonl"),
            *(self.root / "var/log/azure/bootfsm").glob("run-*.jsonl"),
        ]
        return sorted(found, key=lambda p: p.name)


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    s = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{s}"'


@contextlib.contextmanager
def world(sku: str = "gb300", faults: Collection[str] = (), **kw: Any) -> Iterator[World]:
    """A World in a fresh temporary directory, removed afterwards."""
    with (
        tempfile.TemporaryDirectory(prefix="bootfsm-sim-") as d,
        World(Path(d), sku, faults, **kw) as w,
    ):
        yield w
