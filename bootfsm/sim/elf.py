"""Minimal ELF shared objects for the simulator's driver libraries.

A real ldconfig (glibc's ldconfig(8), readelflib.c) puts a library in /etc/ld.so.cache
only when it is an ELF shared object (ET_DYN) with a PT_DYNAMIC segment; the cache entry
is named by the DT_SONAME it finds through DT_STRTAB. A text file named
libnvidia-ml.so.1 is silently skipped, so a node built from text "libraries" never
passes the driver's "libnvidia-ml.so.1 is in the linker cache" check under the real
tool (the booted-node lane runs it). These objects hold exactly that: an ELF header,
one PT_LOAD and one PT_DYNAMIC program header, a string table and a dynamic section
with DT_SONAME, DT_STRTAB, DT_STRSZ (layout from the System V ABI and elf(5)). They
have no code; nothing loads them.
"""

from __future__ import annotations

import struct

__all__ = ["MACHINES", "shared_object", "soname"]

#: e_machine per architecture (elf.h: EM_X86_64, EM_AARCH64)
MACHINES = {"x86_64": 62, "aarch64": 183}

_ET_DYN, _PT_LOAD, _PT_DYNAMIC = 3, 1, 2
_DT_NULL, _DT_STRTAB, _DT_STRSZ, _DT_SONAME = 0, 5, 10, 14
_EHDR, _PHDR = 64, 56


def shared_object(soname: str, arch: str) -> bytes:
    """A 64-bit little-endian ELF shared object whose DT_SONAME is ``soname``."""
    strtab = b"\0" + soname.encode() + b"\0"
    ph_num = 2
    str_off = _EHDR + _PHDR * ph_num
    dyn_off = (str_off + len(strtab) + 7) & ~7
    dyn = struct.pack(
        "<8q", _DT_SONAME, 1, _DT_STRTAB, str_off, _DT_STRSZ, len(strtab), _DT_NULL, 0
    )
    total = dyn_off + len(dyn)
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8)  # ELFCLASS64, LSB, EV_CURRENT
    ehdr = ident + struct.pack(
        "<HHIQQQIHHHHHH", _ET_DYN, MACHINES[arch], 1, 0, _EHDR, 0, 0, _EHDR, _PHDR, ph_num,
        64, 0, 0,
    )  # fmt: skip
    load = struct.pack("<IIQQQQQQ", _PT_LOAD, 4, 0, 0, 0, total, total, 0x1000)
    dynamic = struct.pack(
        "<IIQQQQQQ", _PT_DYNAMIC, 6, dyn_off, dyn_off, dyn_off, len(dyn), len(dyn), 8
    )
    head = ehdr + load + dynamic + strtab
    return head + bytes(dyn_off - len(head)) + dyn


def soname(data: bytes) -> str | None:
    """The DT_SONAME of a 64-bit little-endian ELF shared object, or None (not one, or
    none): what ldconfig's readelflib.c reads, for the objects ``shared_object`` makes."""
    if len(data) < _EHDR or data[:4] != b"\x7fELF" or data[4:6] != bytes([2, 1]):
        return None
    if struct.unpack_from("<H", data, 16)[0] != _ET_DYN:
        return None
    (phoff,) = struct.unpack_from("<Q", data, 32)
    (phnum,) = struct.unpack_from("<H", data, 56)
    for i in range(phnum):
        off = phoff + i * _PHDR
        if off + _PHDR > len(data) or struct.unpack_from("<I", data, off)[0] != _PT_DYNAMIC:
            continue
        (dyn_off,) = struct.unpack_from("<Q", data, off + 8)
        tags: dict[int, int] = {}
        while dyn_off + 16 <= len(data):
            tag, value = struct.unpack_from("<qq", data, dyn_off)
            if tag == _DT_NULL:
                break
            tags[tag] = value
            dyn_off += 16
        if _DT_SONAME not in tags or _DT_STRTAB not in tags:
            return None
        start = tags[_DT_STRTAB] + tags[_DT_SONAME]
        end = data.find(b"\0", start)
        return data[start:end].decode() if 0 <= start < end else None
    return None
