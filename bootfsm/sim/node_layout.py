"""The static files of a freshly built simulated node, and the faults baked into its image.

:func:`write_layout` writes, for one :class:`Sku`, what the GPU VM image holds before
bootfsm runs (paths as docs/node-contract.md lists them): kernel and os-release, the
PCI functions under sys/bus/pci, a ConnectX-7's binary PCI VPD (:func:`vpd`), the
kernel headers, boot files, an empty dpkg database, the containerd and kubelet units
and containerd's config. :func:`apply_build_faults` adds what an image fault asks for
(a stale driver, a stale fabric manager unit). Used by :func:`node.build_node`.
"""

from __future__ import annotations

from collections.abc import Collection

from bootfsm.sim.nodestate import Node
from bootfsm.sim.skus import STALE_DRIVER_VERSION, Sku, pci_layout
from bootfsm.sim.standin_installer import install_driver_files

__all__ = [
    "EFIVARS",
    "KUBELET_BIN",
    "MOK_LIST_VAR",
    "SECURE_BOOT_VAR",
    "SHIM_VENDOR_CERT",
    "apply_build_faults",
    "signature_list",
    "vpd",
    "write_layout",
]

_OS_RELEASE = {
    "22.04": (
        'PRETTY_NAME="Ubuntu 22.04.5 LTS"\nNAME="Ubuntu"\nVERSION_ID="22.04"\n'
        'VERSION="22.04.5 LTS (Jammy Jellyfish)"\nVERSION_CODENAME=jammy\nID=ubuntu\n'
        'ID_LIKE=debian\nHOME_URL="https://www.ubuntu.com/"\n'
        'SUPPORT_URL="https://help.ubuntu.com/"\nBUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
        'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
        "UBUNTU_CODENAME=jammy\n"
    ),
    "24.04": (
        'PRETTY_NAME="Ubuntu 24.04.2 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
        'VERSION="24.04.2 LTS (Noble Numbat)"\nVERSION_CODENAME=noble\nID=ubuntu\n'
        'ID_LIKE=debian\nHOME_URL="https://www.ubuntu.com/"\n'
        'SUPPORT_URL="https://help.ubuntu.com/"\nBUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"\n'
        'PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"\n'
        "UBUNTU_CODENAME=noble\nLOGO=ubuntu-logo\n"
    ),
}

_CONTAINERD_UNIT = """\
# Copyright The containerd Authors.
# Licensed under the Apache License, Version 2.0 (the "License");

[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=network.target local-fs.target dbus.service

[Service]
ExecStartPre=-/sbin/modprobe overlay
ExecStart=/usr/bin/containerd

Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"""

KUBELET_STANDIN = (
    "#!/bin/sh\n# kubelet of the bootfsm simulator: the sim's systemctl runs nothing\nexit 0\n"
)
KUBELET_DEFAULTS = (
    "KUBELET_FLAGS=--node-labels=kubernetes.azure.com/role=agent\n"
    "KUBELET_NODE_LABELS=kubernetes.azure.com/accelerator=nvidia\n"
)

KUBELET_BIN = "/opt/bin/kubelet"
"""Where AgentBaker's configureKubeletAndKubectl installs kubelet (AgentBaker #7125)."""

# AgentBaker's parts/linux/cloud-init/artifacts/kubelet.service (Azure/AgentBaker
# 06836ee2301e362039418c3a7ed0fe6004a641fd), less the ExecStartPre= lines that run
# AgentBaker's own scripts: the condition on the binary, EnvironmentFile= without a "-"
# (only ensureKubelet writes it), Restart=always
_KUBELET_UNIT = """\
[Unit]
Description=Kubelet
ConditionPathExists=/opt/bin/kubelet
Wants=network-online.target containerd.service
After=network-online.target containerd.service

[Service]
Restart=always
RestartSec=2
EnvironmentFile=/etc/default/kubelet
SuccessExitStatus=143
ExecStart=/opt/bin/kubelet \\
        --enable-server \\
        --node-labels="${KUBELET_NODE_LABELS}" \\
        --v=2 \\
        $KUBELET_CONFIG_FILE_FLAGS \\
        $KUBELET_CONTAINERD_FLAGS \\
        $KUBELET_FLAGS

[Install]
WantedBy=multi-user.target
"""

_OLD_FABRICMANAGER_UNIT = """\
[Unit]
Description=NVIDIA fabric manager service
After=network-online.target
Requires=network-online.target

[Service]
User=root
PrivateTmp=false
Type=forking

ExecStart=/usr/bin/nv-fabricmanager -c /usr/share/nvidia/nvswitch/fabricmanager.cfg

LimitCORE=infinity

[Install]
WantedBy=multi-user.target
"""

_CONTAINERD_CONFIG = {
    "1": (
        # as AgentBaker writes it: no imports line (the drop-in needs one added)
        'version = 2\noom_score = -999\n\n[plugins."io.containerd.grpc.v1.cri"]\n'
        '  sandbox_image = "mcr.microsoft.com/oss/kubernetes/pause:3.6"\n'
        '  [plugins."io.containerd.grpc.v1.cri".containerd]\n    default_runtime_name = "runc"\n'
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]\n'
        '      runtime_type = "io.containerd.runc.v2"\n'
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]\n'
        '      BinaryName = "/usr/bin/runc"\n      SystemdCgroup = true\n'
    ),
    "2": (
        'version = 3\noom_score = -999\n\n[plugins."io.containerd.cri.v1.images".pinned_images]\n'
        '  sandbox = "mcr.microsoft.com/oss/kubernetes/pause:3.6"\n\n'
        '[plugins."io.containerd.cri.v1.runtime".containerd]\n  default_runtime_name = "runc"\n'
        '  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]\n'
        '    runtime_type = "io.containerd.runc.v2"\n'
        '  [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
        '    BinaryName = "/usr/bin/runc"\n    SystemdCgroup = true\n'
    ),
}


_IB_PORT = {
    "node_type": "1: CA",
    "fw_ver": "28.39.1002",
    "hw_rev": "0x0",
    "hca_type": "MT4129",
    "board_id": "MT_0000000838",
    "node_guid": "0820:e703:007b:9d9a",  # IB_PORT_GUID, as sysfs writes it
    "sys_image_guid": "0820:e703:007b:9d9a",
    "ports/1/state": "4: ACTIVE",
    "ports/1/phys_state": "5: LinkUp",
    "ports/1/rate": "400 Gb/sec (4X NDR)",
    "ports/1/lid": "0x1",
    "ports/1/lid_mask_count": "0",
    "ports/1/sm_lid": "0x1",
    "ports/1/sm_sl": "0",
    # bit 10 (IsSMDisabled) clear: the start script takes this port's GUID for NVLSM
    "ports/1/cap_mask": "0xa751e848",
    "ports/1/link_layer": "InfiniBand",
    "ports/1/gids/0": "fe80:0000:0000:0000:0820:e703:007b:9d9a",
    "ports/1/pkeys/0": "0xffff",
}


def vpd(sw_mng: bool) -> bytes:
    """Binary PCI VPD of a ConnectX-7: ident string, VPD-R keywords, RV checksum, end tag."""
    ident = b"NVIDIA ConnectX-7 HHHL adapter card, 400Gb/s NDR IB, single-port OSFP"
    model = b"SW_MNG" if sw_mng else b"CX75310A"
    keywords = [
        (b"PN", b"MCX75310AAS-NEAT"),
        (b"EC", b"A7"),
        (b"V2", b"MCX75310AAS-NEAT"),
        (b"SN", b"MT2412X00001"),
        (b"V3", b"4b1c8e3a0f2d11efa9f27cfe90c31a42"),
        (b"VA", b"MLX:MN=MLNX:CSKU=V2:UUID=V3:PCI=V0:MODL=" + model),
        (b"V0", b"PCIeGen5 x16"),
    ]
    body = b"".join(k + bytes([len(v)]) + v for k, v in keywords)
    head = b"\x82" + len(ident).to_bytes(2, "little") + ident
    rv_len = 1
    vpd_r_len = len(body) + 3 + rv_len
    partial = head + b"\x90" + vpd_r_len.to_bytes(2, "little") + body + b"RV" + bytes([rv_len])
    checksum = (-sum(partial)) & 0xFF
    return partial + bytes([checksum]) + b"\x78"


EFIVARS = "sys/firmware/efi/efivars"
SECURE_BOOT_VAR = f"{EFIVARS}/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
MOK_LIST_VAR = f"{EFIVARS}/MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23"
_EFI_BS_RT = (0x06).to_bytes(4, "little")  # EFI_VARIABLE_BOOTSERVICE_ACCESS | RUNTIME_ACCESS
_X509_GUID = bytes.fromhex("a159c0a5e494a74a87b5ab155c2bf072")  # a5c059a1-..., little-endian
SHIM_VENDOR_CERT = b"0\x82\x04\x00 Canonical Ltd. Master Certificate Authority (simulated)"
"""The one certificate shim mirrors into MokListRT on an Ubuntu image with no MOK
enrolled: its vendor certificate (simulated bytes; the list's layout is real)."""


def signature_list(certs: list[bytes], owner: bytes = bytes(16)) -> bytes:
    """An EFI_SIGNATURE_LIST of X.509 entries (UEFI 2.10 section 32.4.1): SignatureType,
    ListSize, HeaderSize 0, SignatureSize, then each entry's owner GUID and DER bytes;
    one list per certificate, as shim writes them (certificates differ in size)."""
    out = b""
    for cert in certs:
        size = 16 + len(cert)
        head = _X509_GUID + (28 + size).to_bytes(4, "little") + bytes(4)
        out += head + size.to_bytes(4, "little") + owner + cert
    return out


def _write_firmware(node: Node, *, secure_boot: bool) -> None:
    """A Generation 2 (UEFI) Azure VM as Linux shows its firmware and lockdown state.

    efivarfs (Documentation/filesystems/efivarfs.rst): each variable is its 4 attribute
    bytes then its data; SecureBoot is one byte (UEFI 2.10 section 3.3), 06 00 00 00 01
    on a Trusted Launch VM with Secure Boot on. The kernel's lockdown file lists the
    modes, the active one bracketed (security/lockdown/lockdown.c); Ubuntu's kernels
    lock down to integrity under Secure Boot and enforce module signatures, the
    enforcement that makes kmod print "Key was rejected by service" (EKEYREJECTED comes
    only from module.sig_enforce: kernel/module/signing.c)."""
    node.write(SECURE_BOOT_VAR, _EFI_BS_RT + bytes([1 if secure_boot else 0]))
    node.write(MOK_LIST_VAR, _EFI_BS_RT + signature_list([SHIM_VENDOR_CERT]))
    modes = (
        "none [integrity] confidentiality" if secure_boot else "[none] integrity confidentiality"
    )
    node.write("sys/kernel/security/lockdown", modes + "\n")
    node.write("sys/module/module/parameters/sig_enforce", "Y\n" if secure_boot else "N\n")


def write_layout(node: Node, sku: Sku, faults: Collection[str]) -> None:
    """Write the static node files for a SKU."""
    node.write("proc/sys/kernel/arch", f"{sku.arch}\n")
    node.write("proc/sys/kernel/osrelease", f"{sku.kernel}\n")
    node.write("usr/lib/os-release", _OS_RELEASE[sku.os_version])
    node.symlink("../usr/lib/os-release", "etc/os-release")
    for func in pci_layout(sku):
        if "gpus-off-bus" in faults and func.pci_class == 0x030200:
            continue
        base = f"sys/bus/pci/devices/{func.address}"
        node.write(f"{base}/vendor", f"0x{func.vendor:04x}\n")
        node.write(f"{base}/device", f"0x{func.device:04x}\n")
        node.write(f"{base}/class", f"0x{func.pci_class:06x}\n")
    node.write("sys/class/infiniband/mlx5_0/device/vpd", vpd(sku.nvlink5))
    # the port as the kernel's sysfs shows it (Documentation/ABI/stable/sysfs-class-infiniband):
    # what ibstat reads, and through it nvidia-fabricmanager-start.sh the port GUID
    for rel, text in _IB_PORT.items():
        node.write(f"sys/class/infiniband/mlx5_0/{rel}", text + "\n")
    _write_firmware(node, secure_boot="secure-boot" in faults)
    modules = f"lib/modules/{sku.kernel}"
    node.write(
        f"{modules}/modules.dep", "kernel/drivers/net/ethernet/mellanox/mlx5/core/mlx5_core.ko:\n"
    )
    if "kernel-headers-missing" not in faults:
        node.write(
            f"{modules}/build/Makefile",
            f"# Linux kernel headers for {sku.kernel}\nVERSION = {sku.kernel.split('.')[0]}\n",
        )
        node.write(f"{modules}/build/.config", "CONFIG_MODULES=y\nCONFIG_MODULE_UNLOAD=y\n")
    node.write(f"boot/vmlinuz-{sku.kernel}", "")
    node.write(f"boot/initrd.img-{sku.kernel}", f"initramfs for {sku.kernel} (bootfsm simulator)\n")
    node.write("var/lib/dpkg/status", "")
    node.write("var/lib/dpkg/lock-frontend", "", 0o640)
    node.write("var/lib/dpkg/lock", "", 0o640)
    node.write("lib/systemd/system/containerd.service", _CONTAINERD_UNIT)
    node.write("lib/systemd/system/kubelet.service", _KUBELET_UNIT)
    # kubelet as a provisioned node has it (AgentBaker's configureKubeletAndKubectl and
    # ensureKubelet write these); a test playing CSE's order removes them first
    node.write(KUBELET_BIN.lstrip("/"), KUBELET_STANDIN, 0o755)
    node.write("etc/default/kubelet", KUBELET_DEFAULTS)
    node.write("etc/containerd/config.toml", _CONTAINERD_CONFIG[sku.containerd_version[0]])
    for directory in ("etc/systemd/system/multi-user.target.wants", "etc/modprobe.d",
                      "etc/udev/rules.d", "var/lib/dpkg/info", "var/log", "dev", "run",
                      f"usr/lib/{sku.arch}-linux-gnu", "usr/bin", "usr/src"):  # fmt: skip
        node.p(directory).mkdir(parents=True, exist_ok=True)
    node.symlink(
        "/lib/systemd/system/containerd.service",
        "etc/systemd/system/multi-user.target.wants/containerd.service",
    )


_CUDA_JOB_PID = 4242


def apply_build_faults(node: Node, faults: Collection[str]) -> None:
    """Faults that are part of the image: a stale driver, a stale fabric manager unit."""
    if "stale-driver" in faults or "stale-driver-in-use" in faults:
        install_driver_files(node, STALE_DRIVER_VERSION, node.kernel, "proprietary")
        node.load_module(force=True)
    if "stale-driver-in-use" in faults:  # a CUDA job nobody told bootfsm about
        node.write(f"proc/{_CUDA_JOB_PID}/comm", "python3\n")
        node.symlink("/dev/nvidia0", f"proc/{_CUDA_JOB_PID}/fd/7")
    if "stale-fabricmanager-unit" in faults:
        node.write("lib/systemd/system/nvidia-fabricmanager.service", _OLD_FABRICMANAGER_UNIT)
        node.symlink(
            "/lib/systemd/system/nvidia-fabricmanager.service",
            "etc/systemd/system/multi-user.target.wants/nvidia-fabricmanager.service",
        )
