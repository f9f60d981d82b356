"""A real kernel module file (.ko) as the kernel and kmod read it: its ``.modinfo`` and
its appended signature. Pure functions over the file's bytes; the simulator's kernel
(nodestate_driver) and its modinfo stand-in use them to judge a REAL module (Canonical's
packaged nvidia.ko) as a real kernel would.

References:
- the ELF file (System V ABI, elf(5)): a kernel module is a 64-bit relocatable object
  (ET_REL); the section headers at e_shoff, e_shnum of e_shentsize bytes, their names in
  section e_shstrndx.
- ``.modinfo`` (Linux include/linux/moduleparam.h __MODULE_INFO, scripts/mod/modpost.c):
  NUL-separated ``key=value`` strings (version, license, vermagic, name, ...), a key
  possibly repeated (alias, firmware, parm).
- the appended signature (Linux include/linux/module_signature.h, kernel/module/
  signing.c mod_verify_sig, scripts/sign-file.c): the module, then the signature data,
  then ``struct module_signature`` (algo, hash, id_type, signer_len, key_id_len u8; 3 pad
  bytes; sig_len big-endian u32), then ``MODULE_SIG_STRING``. Module signing writes
  id_type PKEY_ID_PKCS7 (2) with a DER PKCS#7 SignedData and signer_len = key_id_len = 0.
- the signer kmod prints (kmod libkmod/libkmod-signature.c, fill_pkcs7 and
  x509_name_to_str): from the first SignerInfo, the first commonName of its issuer
  (``signer``), its serial number's bytes (``sig_key``) and its digest algorithm
  (``sig_hashalgo``).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "MODULE_SIG_STRING",
    "PKEY_ID_PKCS7",
    "KernelModule",
    "ModuleFormatError",
    "Signature",
    "is_elf",
    "read_module",
]

MODULE_SIG_STRING = b"~Module signature appended~\n"
PKEY_ID_PKCS7 = 2
_SIG_STRUCT = struct.Struct(">BBBBB3xI")  # struct module_signature, 12 bytes
_ET_REL = 1
_SHDR = 64
_OID_CN = bytes.fromhex("550403")  # 2.5.4.3 commonName
_HASHES = {  # digest algorithm OIDs (RFC 5754, RFC 3279) as OpenSSL short names
    bytes.fromhex("2b0e03021a"): "sha1",
    bytes.fromhex("608648016503040204"): "sha224",
    bytes.fromhex("608648016503040201"): "sha256",
    bytes.fromhex("608648016503040202"): "sha384",
    bytes.fromhex("608648016503040203"): "sha512",
}


class ModuleFormatError(ValueError):
    """Not a module the kernel can read (the kernel's -ENOEXEC, "Exec format error")."""


@dataclass(frozen=True)
class Signature:
    """The appended PKCS#7 signature as kmod's modinfo shows it."""

    signer: str  # the issuer's commonName ("" when it has none)
    key_id: str  # the serial number, "E9:DF:13:..." as modinfo prints sig_key
    hash_algo: str  # "sha512"
    signature: bytes  # the SignerInfo's encryptedDigest


@dataclass(frozen=True)
class KernelModule:
    """A real .ko: its ``.modinfo`` strings in file order and its signature, if any."""

    info: tuple[tuple[str, str], ...]
    signature: Signature | None
    has_versions: bool  # a __versions section: built with CONFIG_MODVERSIONS

    def field(self, key: str) -> str | None:
        """The first value of a ``.modinfo`` key (kmod's get_modinfo), or None."""
        return next((v for k, v in self.info if k == key), None)


def is_elf(data: bytes) -> bool:
    """Whether the bytes start with the ELF magic."""
    return data[:4] == b"\x7fELF"


def read_module(data: bytes) -> KernelModule:
    """The module in ``data`` (a whole .ko file, uncompressed); ModuleFormatError when
    it is no 64-bit little-endian relocatable ELF or its sections or signature are cut."""
    body, signature = _split_signature(data)
    if not is_elf(body) or body[4:6] != bytes([2, 1]) or len(body) < 64:
        raise ModuleFormatError("not a 64-bit little-endian ELF file")
    if struct.unpack_from("<H", body, 16)[0] != _ET_REL:
        raise ModuleFormatError("not a relocatable object (ET_REL)")
    (shoff,) = struct.unpack_from("<Q", body, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", body, 0x3A)
    if shentsize != _SHDR or shstrndx >= shnum or shoff + shnum * _SHDR > len(body):
        raise ModuleFormatError("section headers out of the file")
    sections = []
    for i in range(shnum):
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", body, shoff + i * _SHDR
        )
        if offset + size > len(body) and _type != 8:  # SHT_NOBITS has no bytes in the file
            raise ModuleFormatError(f"section {i} out of the file")
        sections.append((name, offset, size))
    _n, str_off, str_size = sections[shstrndx]
    names = body[str_off : str_off + str_size]

    def name_of(index: int) -> bytes:
        end = names.find(b"\0", index)
        return names[index:end] if end >= 0 else b""

    info: list[tuple[str, str]] = []
    versions = False
    for name, offset, size in sections:
        section = name_of(name)
        versions = versions or section == b"__versions"
        if section != b".modinfo":
            continue
        for raw in body[offset : offset + size].split(b"\0"):
            key, eq, value = raw.decode("utf-8", "replace").partition("=")
            if eq:
                info.append((key, value))
    return KernelModule(tuple(info), signature, versions)


def _split_signature(data: bytes) -> tuple[bytes, Signature | None]:
    """(the module without its signature, the signature or None)."""
    if not data.endswith(MODULE_SIG_STRING):
        return data, None
    end = len(data) - len(MODULE_SIG_STRING) - _SIG_STRUCT.size
    if end < 0:
        raise ModuleFormatError("signature trailer cut")
    _algo, _hash, id_type, signer_len, key_len, sig_len = _SIG_STRUCT.unpack_from(data, end)
    start = end - sig_len - signer_len - key_len
    if start < 0 or id_type != PKEY_ID_PKCS7:
        raise ModuleFormatError("signature block is no PKCS#7 message")
    return data[:start], _pkcs7_signer(data[end - sig_len : end])


def _tlv(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, content start, content end) of the DER element at pos."""
    if pos + 2 > len(data):
        raise ModuleFormatError("PKCS#7 message cut")
    tag, length = data[pos], data[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        if count == 0 or count > 4 or pos + count > len(data):
            raise ModuleFormatError("PKCS#7 length unreadable")
        length = int.from_bytes(data[pos : pos + count], "big")
        pos += count
    if pos + length > len(data):
        raise ModuleFormatError("PKCS#7 element runs past the message")
    return tag, pos, pos + length


def _children(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    out = []
    while start < end:
        element = _tlv(data, start)
        out.append(element)
        start = element[2]
    return out


def _pkcs7_signer(der: bytes) -> Signature:
    """The first SignerInfo's issuer commonName, serial and digest algorithm."""
    _t, s, e = _tlv(der, 0)  # ContentInfo
    content = _children(der, s, e)
    if len(content) < 2 or content[1][0] != 0xA0:
        raise ModuleFormatError("PKCS#7 ContentInfo without content")
    _t, s, e = _tlv(der, content[1][1])  # SignedData
    signed = _children(der, s, e)
    signer_infos = signed[-1]
    if signer_infos[0] != 0x31:
        raise ModuleFormatError("PKCS#7 SignedData without signerInfos")
    infos = _children(der, signer_infos[1], signer_infos[2])
    if not infos:
        raise ModuleFormatError("PKCS#7 message with no signer")
    first = _children(der, infos[0][1], infos[0][2])  # version, issuerAndSerial, digestAlg
    if len(first) < 3 or first[1][0] != 0x30:
        raise ModuleFormatError("PKCS#7 SignerInfo without issuerAndSerialNumber")
    issuer, serial = _children(der, first[1][1], first[1][2])[:2]
    signer = ""
    for _set, rs, re_ in _children(der, issuer[1], issuer[2]):
        for _seq, as_, ae in _children(der, rs, re_):
            oid, value = _children(der, as_, ae)[:2]
            if not signer and der[oid[1] : oid[2]] == _OID_CN:
                signer = der[value[1] : value[2]].decode("utf-8", "replace")
    key = der[serial[1] : serial[2]].lstrip(b"\0")  # BN_bn2bin: no leading zeros
    algo = _children(der, first[2][1], first[2][2])[0]
    hash_algo = _HASHES.get(der[algo[1] : algo[2]], "unknown")
    digest = next((der[s:e] for tag, s, e in first[3:] if tag == 0x04), b"")  # OCTET STRING
    return Signature(signer, ":".join(f"{b:02X}" for b in key), hash_algo, digest)
