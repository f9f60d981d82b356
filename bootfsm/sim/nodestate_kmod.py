"""The simulated kernel's module loader and udev, for :class:`nodestate_driver.NodeDriver`.

:class:`NodeKmod` finds the nvidia module file kmod would (DKMS's updates/dkms, else
Ubuntu's packaged kernel/nvidia-<branch>srv[-open]/), reads it as the kernel does (the
simulator's own text module, or a REAL ELF .ko through :mod:`bootfsm.sim.kmod_elf`),
refuses it as the kernel would (vermagic, signature under module.sig_enforce or
lockdown) and answers whether a udev rule runs a program on a uevent.
"""

from __future__ import annotations

from pathlib import Path

from bootfsm.sim.kmod_elf import ModuleFormatError, is_elf, read_module
from bootfsm.sim.nodestate_base import NodeBase

__all__ = ["DEVICE_CREATE", "TRUSTED_SIGNERS", "NodeKmod", "fields_of", "module_fields"]

_UDEV_DIRS = ("etc/udev/rules.d", "run/udev/rules.d", "lib/udev/rules.d", "usr/lib/udev/rules.d")
DEVICE_CREATE = "/sbin/ub-device-create"


# the module-signing CA Ubuntu's kernels trust (built in): the issuer of Canonical's
# packaged modules, as kmod's modinfo reads it from linux-modules-nvidia-580-server-open-
# 6.8.0-1073-azure's nvidia.ko ("signer: Canonical Ltd. Kernel Module Signing")
TRUSTED_SIGNERS = frozenset({"Canonical Ltd. Kernel Module Signing"})
# the kernel's VERMAGIC_STRING after its release (include/linux/vermagic.h) for the
# simulated Ubuntu kernels: SMP, MODULE_UNLOAD, MODVERSIONS (the real module's vermagic)
_VERMAGIC_TAIL = "SMP mod_unload modversions "
_LICENSES = {"Dual MIT/GPL": "open", "NVIDIA": "proprietary"}  # nv.c MODULE_LICENSE


def fields_of(text: str | None) -> dict[str, str]:
    """The ``key=value`` lines of a simulated .ko file."""
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)


def module_fields(data: bytes | None) -> dict[str, str] | None:
    """A module file's fields as the kernel reads them, or None (no file).

    A real ELF module (Canonical's packaged nvidia.ko): its ``.modinfo`` (first value of
    each key), ``module_type`` from its license (the open module is "Dual MIT/GPL", the
    proprietary one "NVIDIA": open-gpu-kernel-modules kernel-open/nvidia/nv.c), ``signer``
    from its appended PKCS#7 signature, ``elf`` and ``modversions`` set; an unreadable
    one only ``format_error``. The simulator's own text module: its ``key=value`` lines.
    """
    if data is None:
        return None
    if not is_elf(data):
        return fields_of(data.decode("utf-8", "replace"))
    try:
        module = read_module(data)
    except ModuleFormatError as exc:
        return {"elf": "1", "format_error": str(exc)}
    out: dict[str, str] = {}
    for key, value in module.info:
        out.setdefault(key, value)
    out["module_type"] = _LICENSES.get(out.get("license", ""), "proprietary")
    out["elf"] = "1"
    if module.has_versions:
        out["modversions"] = "1"
    if module.signature is not None:
        out["signer"] = module.signature.signer
    return out


class NodeKmod(NodeBase):
    """A node's module files, the kernel's judgement of them and its udev rules."""

    def module_path(self, kernel: str) -> str:
        """Node path of the DKMS-installed nvidia.ko for a kernel."""
        return f"lib/modules/{kernel}/updates/dkms/nvidia.ko"

    def module_file(self, kernel: str | None = None, name: str = "nvidia") -> Path | None:
        """The file kmod finds for a module of a kernel: DKMS's updates/dkms first (depmod's
        search order puts updates before the kernel's own tree), else a packaged one,
        Ubuntu's kernel/nvidia-<branch>srv[-open]/; None when there is none."""
        kernel = kernel or self.kernel
        dkms = self.p(f"lib/modules/{kernel}/updates/dkms/{name}.ko")
        if dkms.is_file():
            return dkms
        found = sorted(self.p(f"lib/modules/{kernel}/kernel").glob(f"nvidia-*srv*/{name}.ko"))
        return found[0] if found else None

    def module_info(self, kernel: str | None = None) -> dict[str, str] | None:
        """module_fields of the nvidia module file for a kernel, or None without one."""
        path = self.module_file(kernel)
        return module_fields(path.read_bytes()) if path is not None else None

    def udev_runs(self, devpath: str, program: str) -> bool:
        """Whether udev runs ``program`` on the kernel's "add" uevent of ``devpath``: a rule
        of the rules files (udev(7): *.rules of /etc, /run, /lib and /usr/lib/udev/rules.d,
        a name in /etc hiding the same name further down) matching ACTION "add" and that
        DEVPATH with RUN+= the program, and the program installed."""
        files: dict[str, Path] = {}
        for base in _UDEV_DIRS:
            for rules in sorted(self.p(base).glob("*.rules")):
                files.setdefault(rules.name, rules)
        want = ('ACTION=="add"', f'DEVPATH=="{devpath}"', f'RUN+="{program}"')
        for name in sorted(files):
            for line in files[name].read_text(errors="replace").splitlines():
                if not line.lstrip().startswith("#") and all(w in line for w in want):
                    return self.p(program).is_file()
        return False

    def signatures_enforced(self) -> tuple[bool, str]:
        """(module.sig_enforce, the lockdown mode) as this kernel shows them in sysfs."""
        enforce = (self.read("sys/module/module/parameters/sig_enforce") or "N").strip()
        lockdown = self.read("sys/kernel/security/lockdown") or "[none]"
        mode = next((w[1:-1] for w in lockdown.split() if w.startswith("[")), "none")
        return enforce == "Y", mode

    def _format_refused(self, module: dict[str, str]) -> str | None:
        """modprobe's error when the kernel cannot take a real ELF module for this kernel
        (-ENOEXEC), else None.

        Reference: Linux kernel/module/main.c: an unreadable ELF fails elf_validity_check;
        check_modinfo compares the module's vermagic with the kernel's (same_magic: with
        modversions the release word is skipped there) and logs "%s: version magic '%s'
        should be '%s'"; a module with modversions built for another kernel release fails
        the symbol CRC check first (kernel/module/version.c check_version: "%s: disagrees
        about version of symbol %s", module_layout being checked first). kmod 30 prints
        strerror(ENOEXEC): "Exec format error". The simulator's text module is not judged.
        """
        if "elf" not in module:
            return None
        error = "modprobe: ERROR: could not insert 'nvidia': Exec format error\n"
        if "format_error" in module:
            return error
        name = module.get("name", "nvidia")
        magic = module.get("vermagic", "")
        kernel_magic = f"{self.kernel} {_VERMAGIC_TAIL}"
        release, _, tail = magic.partition(" ")
        if magic == kernel_magic:
            return None
        if "modversions" in module and tail == _VERMAGIC_TAIL and release != self.kernel:
            self.kernel_log(f"{name}: disagrees about version of symbol module_layout")
        else:
            self.kernel_log(f"{name}: version magic '{magic}' should be '{kernel_magic}'")
        return error

    def _signature_refused(self, module: dict[str, str]) -> str | None:
        """modprobe's error when this kernel refuses a module for its signature, else None.

        Reference: Linux kernel/module/signing.c, module_sig_check: an unsigned module
        (-ENODATA, "unsigned module") or one signed by a key the kernel does not hold
        (-ENOKEY, "module with unavailable key") under module.sig_enforce is "Loading of
        %s is rejected" (pr_notice) and -EKEYREJECTED; without it, under lockdown,
        security_locked_down() logs "Lockdown: modprobe: unsigned module loading is
        restricted; see man kernel_lockdown.7" (security/lockdown/lockdown.c) and returns
        -EPERM. kmod 30 tools/modprobe.c prints "could not insert '%s': %s" with
        strerror(-err). The simulator's text module with a ``signer`` loads; a real ELF
        one loads when its PKCS#7 issuer is a key this kernel trusts (TRUSTED_SIGNERS:
        the simulator does not check the signature's mathematics, only who signed).
        """
        enforce, lockdown = self.signatures_enforced()
        signer = module.get("signer", "")
        trusted = signer in TRUSTED_SIGNERS if "elf" in module else bool(signer)
        if trusted or not (enforce or lockdown != "none"):
            return None
        if enforce:
            reason = "module with unavailable key" if signer else "unsigned module"
            self.kernel_log(f"Loading of {reason} is rejected")
            return "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n"
        self.kernel_log(
            "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"
        )
        return "modprobe: ERROR: could not insert 'nvidia': Operation not permitted\n"
