"""A node image prebaked by aks-gpu, staged as its install.sh leaves it (not bootfsm's bake).

Reference: Azure/aks-gpu install.sh and config.sh at dde3239 (main, 2026-05-14) and its
build-only variant (``AKSGPU_BUILD_ONLY``, the ``build_kernel_module`` and
``write_dkms_marker`` functions, Azure/aks-gpu#191), which AgentBaker's image build runs
(vhdbuilder/packer/install-dependencies.sh, ``buildNVIDIAKernelModule``, AgentBaker 06836ee):

- ``cp /opt/gpu/blacklist-nouveau.conf /etc/modprobe.d/blacklist-nouveau.conf``;
- ``nvidia-installer -s -k=<kernel> -a --no-drm --dkms`` under an overlay mounted on
  /usr/lib/<arch>-linux-gnu: the module is DKMS-built and registered, the binaries land
  in /usr/bin, the libraries only in the overlay's upper directory;
- ``GPU_DEST=/usr/bin``; ``mkdir -p /usr/bin/lib64`` then ``cp -a /tmp/overlay/lib64
  /usr/bin/lib64``: the libraries end in /usr/bin/lib64/lib64 (cp into an existing
  directory), and ``echo /usr/bin/lib64 > /etc/ld.so.conf.d/nvidia.conf``; ``ldconfig``;
- the marker /opt/azure/aks-gpu/dkms-marker: ``kernel=``, ``driver_version=``,
  ``driver_kind=``, ``arch=``.

``initialized``: a node that booted through aks-gpu once (``initialize_nvidia_driver``:
``cp -r /usr/bin/lib64/lib64/* /usr/lib/<arch>-linux-gnu/``, then ``ldconfig``), the copy
Azure/AKS#5869 found beside the GRID driver's libraries. /etc/ld.so.conf and the libc6
files under /etc/ld.so.conf.d are written as Ubuntu ships them when the node lacks them.
"""

from __future__ import annotations

import os
import shutil

from bootfsm.sim.nodestate import Node
from bootfsm.sim.standin_installer import install_driver_files
from bootfsm.sim.standin_ldconfig import ldconfig

__all__ = ["MARKER", "NVIDIA_CONF", "STAGED", "stage_aks_gpu_prebake"]

MARKER = "opt/azure/aks-gpu/dkms-marker"
NVIDIA_CONF = "etc/ld.so.conf.d/nvidia.conf"
STAGED = "usr/bin/lib64/lib64"
_LIBC_CONF = {  # libc-bin's /etc/ld.so.conf and libc6's files (Ubuntu 22.04 and 24.04)
    "etc/ld.so.conf": "include /etc/ld.so.conf.d/*.conf\n\n",
    "etc/ld.so.conf.d/libc.conf": "# libc default configuration\n/usr/local/lib\n",
    "etc/ld.so.conf.d/{arch}-linux-gnu.conf": (
        "# Multiarch support\n/usr/local/lib/{arch}-linux-gnu\n/lib/{arch}-linux-gnu\n"
        "/usr/lib/{arch}-linux-gnu\n"
    ),
}


def stage_aks_gpu_prebake(
    node: Node,
    version: str,
    kind: str = "cuda",
    module_type: str = "open",
    *,
    initialized: bool = False,
) -> None:
    """Leave on ``node`` what aks-gpu's build (and, ``initialized``, one boot) leaves."""
    for path, text in _LIBC_CONF.items():
        path = path.format(arch=node.arch)
        if not node.p(path).exists():
            node.write(path, text.format(arch=node.arch))
    node.write(
        "etc/modprobe.d/blacklist-nouveau.conf", "blacklist nouveau\noptions nouveau modeset=0\n"
    )
    libdir = node.p(node.libdir)
    before = {p.name for p in libdir.glob("*")} if libdir.is_dir() else set()
    install_driver_files(node, version, node.kernel, module_type, dkms=True)
    staged = node.p(STAGED)
    staged.mkdir(parents=True, exist_ok=True)
    for p in sorted(libdir.glob("*")):  # what the overlay's upper directory caught
        if p.name not in before:
            os.replace(p, staged / p.name)
    if kind == "grid":
        node.write("usr/bin/nvidia-gridd", "#!/bin/sh\n# nvidia-gridd (bootfsm simulator)\n", 0o755)
    node.write(NVIDIA_CONF, "/usr/bin/lib64\n")
    node.write(
        MARKER,
        f"kernel={node.kernel}\ndriver_version={version}\ndriver_kind={kind}\narch={node.arch}\n",
    )
    if initialized:
        for p in sorted(staged.iterdir()):  # cp -r: links stay links
            dst = libdir / p.name
            dst.unlink(missing_ok=True)
            if p.is_symlink():
                dst.symlink_to(os.readlink(p))
            else:
                shutil.copy2(p, dst)
    ldconfig(node, [])
