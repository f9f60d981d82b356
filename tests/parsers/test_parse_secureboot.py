"""Tests for bootfsm.parsers.secureboot: the EFI variable, lockdown, sig_enforce, IMDS's
securityProfile, MokListRT and the words of a module refused for its signature.

The byte layouts are written from their specifications, not from the code: efivarfs
(Documentation/filesystems/efivarfs.rst: a 4-byte little-endian attribute word, then the
data), UEFI 2.10 section 3.3 (SecureBoot: one UINT8) and section 32.4.1
(EFI_SIGNATURE_LIST). NVIDIA's installer reads the same variable's last byte
(NVIDIA/nvidia-installer misc.c secure_boot_enabled, at 00aaa9f).
"""

from __future__ import annotations

import json
import struct
import uuid

import pytest

from bootfsm.parsers import ParseError
from bootfsm.parsers.secureboot import (
    imds_secure_boot,
    mok_certificates,
    parse_efi_secure_boot,
    parse_lockdown,
    parse_sig_enforce,
    signature_refusal,
)
from tests.samples import sample

COMPUTE = "azure-imds/imds_compute_docs_sample_linux.json"
REAL_2017 = (
    "azure-imds/imds_instance_real_2017-08-01_terraform-azurerm-consul-issue38.json",
    "azure-imds/imds_instance_real_2017-04-02_terraform-azurerm-vault-pr2.json",
)
# EFI_VARIABLE_BOOTSERVICE_ACCESS (0x2) | EFI_VARIABLE_RUNTIME_ACCESS (0x4)
BS_RT = b"\x06\x00\x00\x00"
# EFI_VARIABLE_NON_VOLATILE (0x1) as well: the attribute word is not the value
NV_BS_RT = b"\x07\x00\x00\x00"


@pytest.mark.parametrize(
    ("raw", "on"),
    [
        (BS_RT + b"\x01", True),
        (BS_RT + b"\x00", False),
        (NV_BS_RT + b"\x00", False),  # attribute bit 0 set, value off
        (b"\x00\x00\x00\x00\x01", True),
    ],
)
def test_the_value_is_the_byte_after_the_four_attribute_bytes(raw: bytes, on: bool) -> None:
    assert parse_efi_secure_boot(raw) is on


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"", "got 0 bytes"),
        (b"\x01", "got 1 bytes"),  # the data alone (the old sysfs efivars .../data)
        (BS_RT, "got 4 bytes"),
        (BS_RT + b"\x01\x00", "got 6 bytes"),
        (BS_RT + b"\x02", "value byte is 2"),
        (BS_RT + b"\xff", "value byte is 255"),
    ],
)
def test_any_other_shape_is_refused(raw: bytes, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_efi_secure_boot(raw)


@pytest.mark.parametrize(
    ("text", "mode"),
    [
        ("[none] integrity confidentiality\n", "none"),
        ("none [integrity] confidentiality\n", "integrity"),
        ("none integrity [confidentiality]\n", "confidentiality"),
    ],
)
def test_lockdown_is_the_bracketed_mode(text: str, mode: str) -> None:
    assert parse_lockdown(text) == mode


@pytest.mark.parametrize(
    "text", ["", "none integrity confidentiality\n", "[none] [integrity]\n", "[bogus]\n"]
)
def test_lockdown_without_one_known_bracketed_mode_is_refused(text: str) -> None:
    with pytest.raises(ParseError):
        parse_lockdown(text)


def test_sig_enforce_is_a_sysfs_bool() -> None:
    assert parse_sig_enforce("Y\n") is True
    assert parse_sig_enforce("N\n") is False
    with pytest.raises(ParseError):
        parse_sig_enforce("1\n")


def test_imds_published_example_says_secure_boot_on() -> None:
    # the Linux compute document of Microsoft's IMDS reference: "secureBootEnabled": "true"
    assert imds_secure_boot(sample(COMPUTE)) is True
    instance = {"compute": json.loads(sample(COMPUTE)), "network": {"interface": []}}
    assert imds_secure_boot(json.dumps(instance)) is True


@pytest.mark.parametrize("path", REAL_2017)
def test_real_old_api_documents_have_no_security_profile(path: str) -> None:
    assert imds_secure_boot(sample(path)) is None


@pytest.mark.parametrize(
    ("value", "on"), [("false", False), ("true", True), ("True", True), ("FALSE", False)]
)
def test_imds_strings_are_read_case_insensitively(value: str, on: bool) -> None:
    doc = {"compute": {"securityProfile": {"secureBootEnabled": value}}}
    assert imds_secure_boot(json.dumps(doc)) is on


@pytest.mark.parametrize("value", ["yes", "", True, 1])
def test_imds_other_values_are_refused(value: object) -> None:
    doc = {"compute": {"securityProfile": {"secureBootEnabled": value}}}
    with pytest.raises(ParseError, match="secureBootEnabled"):
        imds_secure_boot(json.dumps(doc))


X509 = uuid.UUID("a5c059a1-94e4-4aa7-87b5-ab155c2bf072").bytes_le
SHA256 = uuid.UUID("c1c41626-504c-4092-aca9-41f936934328").bytes_le  # EFI_CERT_SHA256_GUID
OWNER = uuid.UUID("605dab50-e046-4300-abb6-3dd810dd8b23").bytes_le


def _esl(kind: bytes, entries: list[bytes]) -> bytes:
    each = 16 + len(entries[0])
    body = b"".join(OWNER + e for e in entries)
    return kind + struct.pack("<III", 28 + len(body), 0, each) + body


def test_mok_list_yields_each_x509_certificate_and_skips_hashes() -> None:
    canonical, dkms = b"0\x82\x01\x0acanonical-der", b"0\x82\x02\x00dkms-der!!"
    raw = BS_RT + _esl(X509, [canonical]) + _esl(SHA256, [b"h" * 32]) + _esl(X509, [dkms])
    assert mok_certificates(raw) == [canonical, dkms]


@pytest.mark.parametrize(
    "raw",
    [
        BS_RT + _esl(X509, [b"cert"])[:-1],  # list longer than the file
        BS_RT + X509 + b"\x00" * 4,  # truncated header
        BS_RT + X509 + struct.pack("<III", 28 + 20, 0, 16) + b"\x00" * 20,  # 0-byte entries
    ],
)
def test_a_broken_mok_list_is_refused(raw: bytes) -> None:
    with pytest.raises(ParseError, match="MokListRT"):
        mok_certificates(raw)


@pytest.mark.parametrize(
    "text",
    [
        # kmod tools/modprobe.c: "could not insert '%s': %s", strerror(EKEYREJECTED)
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n",
        "insmod: ERROR: could not insert module nvidia.ko: Key was rejected by service\n"
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n",
        # kernel/module/signing.c module_sig_check under module.sig_enforce
        "nvidia: loading out-of-tree module taints kernel.\n"
        "Loading of unsigned module is rejected\n",
        "Loading of module with unavailable key is rejected\n",
        # security/lockdown/lockdown.c under lockdown without sig_enforce (EPERM)
        "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7\n",
    ],
)
def test_signature_refusals_are_recognised(text: str) -> None:
    found = signature_refusal(text)
    assert found is not None and found in text and "\n" not in found


@pytest.mark.parametrize(
    "text",
    [
        "",
        "modprobe: ERROR: could not insert 'nvidia': No such device\n",
        "modprobe: FATAL: Module nvidia not found in directory /lib/modules/6.8.0-1020-azure\n",
        # a kernel that does not enforce: the module loads, tainted (not a refusal)
        "nvidia: module verification failed: signature and/or required key missing - "
        "tainting kernel\n",
        "modprobe: ERROR: could not insert 'nvidia': Operation not permitted\n",  # alone: EPERM
    ],
)
def test_other_load_failures_are_not_signature_refusals(text: str) -> None:
    assert signature_refusal(text) is None
