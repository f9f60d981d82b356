"""The simulated kernel and kmod stand-ins judging a REAL ELF kernel module (issue 39).

Two kinds of file: Canonical's packaged nvidia.ko (linux-modules-nvidia-580-server-open-
6.8.0-1073-azure 6.8.0-1073.82, the booted lane's cached, sha256-pinned .deb; skipped
when the cache is absent, a failure on CI), its expected values written from the file as
the host's real kmod 30 `modinfo` printed them on 2026-12-07; and small relocatable ELF
files this test writes, signed the way the kernel's scripts/sign-file signs (a detached
DER PKCS#7/CMS message by the real `openssl cms`, no attributes, no certificates, then
struct module_signature and "~Module signature appended~\\n").
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest

from bootfsm.sim.kmod_elf import MODULE_SIG_STRING, ModuleFormatError, read_module
from bootfsm.sim.node import SKUS, build_node
from tests.samples import on_ci, real_tool

KERNEL = "6.8.0-1073-azure"
REAL_DEB = (
    "ubuntu-archive/debs/8ef279a877f25841-linux-modules-nvidia-580-server-open-"
    "6.8.0-1073-azure_6.8.0-1073.82_amd64.deb"
)
REAL_KO = f"lib/modules/{KERNEL}/kernel/nvidia-580srv-open/nvidia.ko"
VERMAGIC = f"{KERNEL} SMP mod_unload modversions "
REJECTED = "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n"
ENOEXEC = "modprobe: ERROR: could not insert 'nvidia': Exec format error\n"


@pytest.fixture(scope="module")
def real_ko(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """Canonical's signed nvidia.ko, extracted from the cached .deb by the real dpkg-deb."""
    deb = Path(os.environ.get("BOOTED_CACHE", "/var/cache/bootfsm-booted")) / REAL_DEB
    if not deb.is_file():
        if on_ci():
            pytest.fail(f"{deb} is not cached (make test-booted fetches it)", pytrace=False)
        pytest.skip(f"{deb} is not cached (make test-booted fetches it)")
    out = tmp_path_factory.mktemp("deb")
    subprocess.run([real_tool("dpkg-deb"), "-x", str(deb), str(out)], check=True, timeout=120)
    return (out / REAL_KO).read_bytes()


# -- small ELF modules ------------------------------------------------------------------
def elf_module(info: dict[str, str], *, versions: bool = True) -> bytes:
    """A 64-bit little-endian relocatable ELF (x86_64) with a .modinfo section and, for
    modversions, a __versions section (elf(5); include/linux/moduleparam.h)."""
    modinfo = b"".join(f"{k}={v}".encode() + b"\0" for k, v in info.items())
    vers = struct.pack("<Q56s", 0x1234, b"module_layout") if versions else b""
    names = [b"", b".modinfo", b"__versions" if versions else b".comment", b".shstrtab"]
    shstr = b"\0".join(names) + b"\0"
    offsets = [0]
    for n in names[1:]:
        offsets.append(shstr.index(b"\0" + n + b"\0") + 1)
    body = modinfo + vers + shstr
    shoff = (64 + len(body) + 7) & ~7
    sections = [(0, 0, 0, 0), (offsets[1], 1, 64, len(modinfo))]
    sections.append((offsets[2], 1, 64 + len(modinfo), len(vers)))
    sections.append((offsets[3], 3, 64 + len(modinfo) + len(vers), len(shstr)))
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(sections), 3
    )
    shdrs = b"".join(
        struct.pack("<IIQQQQIIQQ", name, kind, 0, 0, off, size, 0, 0, 1, 0)
        for name, kind, off, size in sections
    )
    return ehdr + body + bytes(shoff - 64 - len(body)) + shdrs


def sign(module: bytes, work: Path, cn: str) -> bytes:
    """``module`` signed as scripts/sign-file signs: `openssl cms -sign -binary -noattr
    -nocerts -outform DER` (issuerAndSerialNumber), then the trailer."""
    openssl = real_tool("openssl")
    key, cert, data = work / "key.pem", work / "cert.pem", work / "mod.bin"
    subprocess.run(
        [openssl, "req", "-new", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
         "-out", str(cert), "-subj", f"/CN={cn}/O=bootfsm test", "-days", "1",
         "-set_serial", "0x00C0FFEE"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    data.write_bytes(module)
    der = subprocess.run(
        [openssl, "cms", "-sign", "-in", str(data), "-signer", str(cert), "-inkey", str(key),
         "-binary", "-noattr", "-nocerts", "-outform", "DER", "-md", "sha256"],
        check=True, capture_output=True, timeout=120,
    ).stdout  # fmt: skip
    trailer = struct.pack(">BBBBB3xI", 0, 0, 2, 0, 0, len(der))
    return module + der + trailer + MODULE_SIG_STRING


def unsigned(data: bytes) -> bytes:
    """The module without its appended signature (what `strip --strip-debug` leaves too)."""
    (sig_len,) = struct.unpack_from(">I", data, len(data) - len(MODULE_SIG_STRING) - 4)
    return data[: len(data) - len(MODULE_SIG_STRING) - 12 - sig_len]


class Node:
    """A simulated Secure Boot node (or not) running KERNEL, its stand-ins on PATH."""

    def __init__(self, root: Path, *faults: str) -> None:
        self.root = root
        self.bin = build_node(root, SKUS["h100-pcie"], faults, compile_seconds=0.01)
        (root / "proc/sys/kernel/osrelease").write_text(f"{KERNEL}\n")

    def place(self, data: bytes) -> None:
        path = self.root / REAL_KO
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}"}
        return subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=60, check=False
        )

    def kernel_log(self) -> str:
        return self.run("journalctl", "-k", "-o", "cat", "--no-pager", "-n", "1").stdout


# -- the reader on Canonical's real file ------------------------------------------------
def test_reads_canonicals_real_module(real_ko: bytes) -> None:
    module = read_module(real_ko)
    assert module.field("version") == "580.178.04"
    assert module.field("license") == "Dual MIT/GPL"  # the open module's
    assert module.field("vermagic") == VERMAGIC
    assert module.field("name") == "nvidia"
    assert module.field("srcversion") == "54CEF6329B59073EDA00372"
    assert [v for k, v in module.info if k == "firmware"] == [
        "nvidia/580.178.04/gsp_tu10x.bin",
        "nvidia/580.178.04/gsp_ga10x.bin",
    ]
    assert module.has_versions
    assert module.signature is not None
    assert module.signature.signer == "Canonical Ltd. Kernel Module Signing"
    assert module.signature.key_id == "E9:DF:13:0F:92:92:A9:B7"
    assert module.signature.hash_algo == "sha512"
    assert module.signature.signature[:4] == bytes.fromhex("ADA33744")
    assert module.signature.signature[-4:] == bytes.fromhex("EFC5FF18")


def test_a_secure_boot_node_loads_the_real_signed_module(real_ko: bytes, tmp_path: Path) -> None:
    node = Node(tmp_path / "n", "secure-boot")
    node.place(real_ko)
    load = node.run("modprobe", "nvidia")
    assert (load.returncode, load.stderr) == (0, "")
    assert (node.root / "sys/module/nvidia/version").read_text() == "580.178.04\n"
    proc = (node.root / "proc/driver/nvidia/version").read_text()
    assert "NVIDIA UNIX Open Kernel Module for x86_64  580.178.04" in proc


def test_the_real_module_stripped_of_its_signature_is_rejected(
    real_ko: bytes, tmp_path: Path
) -> None:
    node = Node(tmp_path / "n", "secure-boot")
    node.place(unsigned(real_ko))
    load = node.run("modprobe", "nvidia")
    assert (load.returncode, load.stderr) == (1, REJECTED)
    assert node.kernel_log() == "Loading of unsigned module is rejected\n"
    assert not (node.root / "sys/module/nvidia").exists()
    plain = Node(tmp_path / "plain")  # no Secure Boot: the unsigned module loads
    plain.place(unsigned(real_ko))
    assert plain.run("modprobe", "nvidia").returncode == 0


def test_the_real_module_on_another_kernel_is_refused(real_ko: bytes, tmp_path: Path) -> None:
    """With modversions the kernel skips the release in vermagic (same_magic) and the
    symbol CRCs refuse the module; the load fails ENOEXEC either way."""
    node = Node(tmp_path / "n")
    node.place(real_ko)
    (node.root / "proc/sys/kernel/osrelease").write_text("6.8.0-1074-azure\n")
    real = node.root / REAL_KO
    target = node.root / "lib/modules/6.8.0-1074-azure/kernel/nvidia-580srv-open/nvidia.ko"
    target.parent.mkdir(parents=True)
    real.rename(target)
    load = node.run("modprobe", "nvidia")
    assert (load.returncode, load.stderr) == (1, ENOEXEC)
    assert node.kernel_log() == "nvidia: disagrees about version of symbol module_layout\n"


def test_modinfo_standin_prints_what_real_kmod_prints(real_ko: bytes, tmp_path: Path) -> None:
    node = Node(tmp_path / "n")
    node.place(real_ko)
    real = subprocess.run(
        [real_tool("modinfo"), str(node.root / REAL_KO)], capture_output=True, text=True, timeout=60
    )
    ours = node.run("modinfo", "nvidia")
    assert ours.returncode == real.returncode == 0
    assert ours.stdout.splitlines()[0] == f"filename:       /{REAL_KO}"
    assert ours.stdout.splitlines()[1:] == real.stdout.splitlines()[1:]
    signer = node.run("modinfo", "-F", "signer", "nvidia").stdout
    assert signer == "Canonical Ltd. Kernel Module Signing\n"


# -- the reader and the kernel on files this test builds --------------------------------
INFO = {"version": "580.178.04", "license": "NVIDIA", "name": "nvidia", "vermagic": VERMAGIC}


def test_small_modules_read_as_written(tmp_path: Path) -> None:
    plain = read_module(elf_module(INFO, versions=False))
    assert plain.info == tuple(INFO.items())
    assert (plain.signature, plain.has_versions) == (None, False)
    signed = read_module(sign(elf_module(INFO), tmp_path, "bootfsm test signing key"))
    assert signed.signature is not None
    assert signed.signature.signer == "bootfsm test signing key"
    assert signed.signature.key_id == "C0:FF:EE"  # serial 0x00C0FFEE, leading zeros gone
    assert signed.signature.hash_algo == "sha256"
    assert signed.field("license") == "NVIDIA"
    with pytest.raises(ModuleFormatError):
        read_module(elf_module(INFO)[:100])
    with pytest.raises(ModuleFormatError):
        read_module(b"\x7fELF" + bytes(60))


def test_host_kmod_reads_the_test_signature_alike(tmp_path: Path) -> None:
    """The real kmod modinfo names the same signer and key in the file this test signs."""
    ko = tmp_path / "nvidia.ko"
    ko.write_bytes(sign(elf_module(INFO), tmp_path, "bootfsm test signing key"))
    modinfo = real_tool("modinfo")
    got = {
        f: subprocess.run(
            [modinfo, "-F", f, str(ko)], capture_output=True, text=True, timeout=60
        ).stdout.strip()
        for f in ("signer", "sig_key", "sig_hashalgo", "version", "license")
    }
    assert got == {
        "signer": "bootfsm test signing key",
        "sig_key": "C0:FF:EE",
        "sig_hashalgo": "sha256",
        "version": "580.178.04",
        "license": "NVIDIA",
    }


def test_secure_boot_kernel_judges_small_modules(tmp_path: Path) -> None:
    node = Node(tmp_path / "n", "secure-boot")
    node.place(sign(elf_module(INFO), tmp_path, "bootfsm test signing key"))
    load = node.run("modprobe", "nvidia")  # signed, by a key the kernel does not hold
    assert (load.returncode, load.stderr) == (1, REJECTED)
    assert node.kernel_log() == "Loading of module with unavailable key is rejected\n"
    node.place(sign(elf_module(INFO), tmp_path, "Canonical Ltd. Kernel Module Signing"))
    load = node.run("modprobe", "nvidia")
    assert (load.returncode, load.stderr) == (0, "")
    proc = (node.root / "proc/driver/nvidia/version").read_text()
    assert proc.startswith("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.178.04")


def test_wrong_vermagic_is_refused_as_the_kernel_words_it(tmp_path: Path) -> None:
    node = Node(tmp_path / "n")
    other = "6.8.0-1073-azure SMP preempt mod_unload modversions "
    node.place(elf_module({**INFO, "vermagic": other}))
    load = node.run("modprobe", "nvidia")
    assert (load.returncode, load.stderr) == (1, ENOEXEC)
    assert node.kernel_log() == f"nvidia: version magic '{other}' should be '{VERMAGIC}'\n"
    release = "6.5.0-1025-azure SMP mod_unload modversions "
    node.place(elf_module({**INFO, "vermagic": release}, versions=False))
    load = node.run("modprobe", "nvidia")  # no modversions: the release is compared
    assert (load.returncode, load.stderr) == (1, ENOEXEC)
    assert node.kernel_log() == f"nvidia: version magic '{release}' should be '{VERMAGIC}'\n"
    node.place(elf_module(INFO))
    assert node.run("modprobe", "nvidia").returncode == 0


# -- Ubuntu's udev rule and ub-device-create --------------------------------------------
RULES = (  # nvidia-kernel-common-580-server 580.178.04, lib/udev/rules.d/71-nvidia.rules
    'ACTION=="add", DEVPATH=="/bus/pci/drivers/nvidia", RUN+="/sbin/ub-device-create"\n'
    'ACTION=="add", DEVPATH=="/module/nvidia_uvm", SUBSYSTEM=="module",'
    ' RUN+="/sbin/ub-device-create"\n'
)


def test_ubuntus_udev_rule_makes_the_uvm_device_files(tmp_path: Path) -> None:
    """Without nvidia-modprobe (Canonical's server user-space ships none), `modprobe
    nvidia-uvm` on an Ubuntu node gets /dev/nvidia-uvm from udev running ub-device-create;
    without the rule (or the program) nothing makes it."""
    bare = Node(tmp_path / "bare")
    bare.place(elf_module(INFO))
    assert bare.run("modprobe", "nvidia").returncode == 0
    assert bare.run("modprobe", "nvidia-uvm").returncode == 0
    assert not (bare.root / "dev/nvidia-uvm").exists()
    node = Node(tmp_path / "ubuntu")
    node.place(elf_module(INFO))
    (node.root / "lib/udev/rules.d").mkdir(parents=True, exist_ok=True)
    (node.root / "lib/udev/rules.d/71-nvidia.rules").write_text(RULES)
    (node.root / "sbin").mkdir(exist_ok=True)
    (node.root / "sbin/ub-device-create").write_bytes(b"\x7fELF")
    assert node.run("modprobe", "nvidia").returncode == 0
    assert (node.root / "dev/nvidia0").exists() and (node.root / "dev/nvidiactl").exists()
    assert not (node.root / "dev/nvidia-uvm").exists()  # nvidia_uvm not loaded yet
    assert node.run("modprobe", "nvidia-uvm").returncode == 0
    assert (node.root / "dev/nvidia-uvm").exists()
    assert (node.root / "dev/nvidia-uvm-tools").exists()
