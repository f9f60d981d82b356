"""Parse what a node says about Secure Boot and module signatures; pure.

- The EFI variable ``SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c`` as efivarfs shows
  it (Documentation/filesystems/efivarfs.rst: the 4-byte little-endian attributes, then
  the data; UEFI 2.10 section 3.3: SecureBoot is one UINT8, 1 on and 0 off).
- ``/sys/kernel/security/lockdown``: every mode, the active one bracketed
  (security/lockdown/lockdown.c, lockdown_read: ``none [integrity] confidentiality``).
- ``/sys/module/module/parameters/sig_enforce``: ``Y`` or ``N`` (kernel/module/signing.c,
  a bool module_param).
- IMDS ``compute.securityProfile.secureBootEnabled``: the string ``"true"`` or ``"false"``
  (Microsoft's IMDS reference, samples azure-imds/imds_compute_docs_sample_linux.json).
- ``MokListRT-605dab50-e046-4300-abb6-3dd810dd8b23``: shim's enrolled Machine Owner Keys,
  EFI_SIGNATURE_LISTs (UEFI 2.10 section 32.4.1) after the 4 attribute bytes.
- A refused module load: kmod's ``could not insert 'nvidia': Key was rejected by service``
  (tools/modprobe.c: strerror(EKEYREJECTED)) and the kernel's ``Loading of unsigned module
  is rejected`` (kernel/module/signing.c, module_sig_check, when signatures are enforced),
  or under lockdown alone ``Lockdown: modprobe: unsigned module loading is restricted``
  (security/lockdown/lockdown.c) with kmod's ``Operation not permitted``.
"""

from __future__ import annotations

import re
import uuid

from bootfsm.parsers import ParseError
from bootfsm.parsers.imds_tags import imds_compute

__all__ = [
    "EFI_GLOBAL_GUID",
    "LOCKDOWN_MODES",
    "MOK_GUID",
    "imds_secure_boot",
    "mok_certificates",
    "parse_efi_secure_boot",
    "parse_lockdown",
    "parse_sig_enforce",
    "signature_refusal",
]

EFI_GLOBAL_GUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"
MOK_GUID = "605dab50-e046-4300-abb6-3dd810dd8b23"
LOCKDOWN_MODES = ("none", "integrity", "confidentiality")
_ATTRS = 4
_X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le  # EFI_CERT_X509_GUID
_ESL_HEADER = 28  # SignatureType GUID, ListSize, HeaderSize, SignatureSize
_OWNER = 16  # each EFI_SIGNATURE_DATA starts with its owner's GUID


def parse_efi_secure_boot(data: bytes) -> bool:
    """The SecureBoot variable's value from its efivarfs file: 4 attribute bytes, then
    one byte, 1 (on) or 0 (off); ParseError on any other shape."""
    if len(data) != _ATTRS + 1:
        raise ParseError(
            f"EFI variable SecureBoot: expected 4 attribute bytes and 1 value byte, "
            f"got {len(data)} bytes"
        )
    value = data[_ATTRS]
    if value not in (0, 1):
        raise ParseError(f"EFI variable SecureBoot: value byte is {value}, not 0 or 1")
    return value == 1


def parse_lockdown(text: str) -> str:
    """The active lockdown mode (the bracketed word of /sys/kernel/security/lockdown)."""
    words = text.split()
    active = [w[1:-1] for w in words if w.startswith("[") and w.endswith("]")]
    if len(active) != 1 or active[0] not in LOCKDOWN_MODES:
        raise ParseError(f"lockdown: no single bracketed mode in {text.strip()[:80]!r}")
    return active[0]


def parse_sig_enforce(text: str) -> bool:
    """module.sig_enforce as sysfs prints a bool parameter: ``Y`` or ``N``."""
    value = text.strip()
    if value not in ("Y", "N"):
        raise ParseError(f"sig_enforce: expected Y or N, got {value[:20]!r}")
    return value == "Y"


def imds_secure_boot(text: str) -> bool | None:
    """``compute.securityProfile.secureBootEnabled`` of an IMDS instance (or compute)
    document: True, False, or None when the document has no securityProfile (api-versions
    before 2020-06-01); ParseError on a value that is not "true"/"false"."""
    profile = imds_compute(text).get("securityProfile")
    if profile is None:
        return None
    value = profile.get("secureBootEnabled") if isinstance(profile, dict) else profile
    if value is None:
        return None
    if not isinstance(value, str) or value.lower() not in ("true", "false"):
        raise ParseError(
            f"IMDS document: compute.securityProfile.secureBootEnabled is {value!r:.40}"
        )
    return value.lower() == "true"


def mok_certificates(data: bytes) -> list[bytes]:
    """The X.509 certificates (DER) enrolled in the MokListRT efivarfs file: the 4
    attribute bytes, then EFI_SIGNATURE_LISTs; other signature types are skipped."""
    body, certs, at = data[_ATTRS:], [], 0
    while at < len(body):
        if len(body) - at < _ESL_HEADER:
            raise ParseError(f"MokListRT: truncated signature list at byte {at}")
        kind = body[at : at + 16]
        size, header, each = (
            int.from_bytes(body[at + o : at + o + 4], "little") for o in (16, 20, 24)
        )
        if size < _ESL_HEADER + header or at + size > len(body) or each <= _OWNER:
            raise ParseError(f"MokListRT: bad signature list at byte {at} (size {size})")
        entries = body[at + _ESL_HEADER + header : at + size]
        if len(entries) % each:
            raise ParseError(f"MokListRT: list at byte {at} is not whole {each}-byte entries")
        if kind == _X509:
            certs += [entries[i + _OWNER : i + each] for i in range(0, len(entries), each)]
        at += size
    return certs


_REFUSALS = (
    re.compile(r"could not insert '[^']*': Key was rejected by service"),
    re.compile(r"Loading of .{1,60} is rejected"),  # unsigned module, unavailable key...
    re.compile(r"Lockdown: \S+: unsigned module loading is restricted"),
    re.compile(r"could not insert '[^']*': Required key not available"),
)


def signature_refusal(text: str) -> str | None:
    """The last line of ``text`` (kmod's output or the kernel log, oldest first) saying a
    module was refused for its signature, stripped and cut to 200 characters; None
    without one."""
    for line in reversed(text.splitlines()):
        if any(p.search(line) for p in _REFUSALS):
            return line.strip()[:200]
    return None
