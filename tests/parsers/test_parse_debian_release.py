"""Release / InRelease and gpgv status parsing (pure), on hand-written inputs in the
formats apt-ftparchive and gnupg's doc/DETAILS define, and on this machine's own Debian
InRelease files when apt has fetched them (real captures, verified with the real gpgv)."""

from __future__ import annotations

import datetime as dt
import glob
import subprocess
from pathlib import Path

import pytest

from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_release import (
    clearsigned_body,
    parse_gpgv_status,
    parse_release,
)

RELEASE = """\
Origin: test
Label: test
Architecture: amd64
Date: Sat, 01 Feb 2025 10:20:30 UTC
Valid-Until: Sat, 08 Feb 2025 10:20:30 +0000
MD5Sum:
 d41d8cd98f00b204e9800998ecf8427e                0 Packages
SHA256:
 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855             1234 Packages
 ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789 99 Packages.gz
"""


def test_release_fields_dates_and_sha256() -> None:
    r = parse_release(RELEASE)
    assert r.date == dt.datetime(2025, 2, 1, 10, 20, 30, tzinfo=dt.timezone.utc)
    assert r.valid_until == dt.datetime(2025, 2, 8, 10, 20, 30, tzinfo=dt.timezone.utc)
    assert r.sha256["Packages"].sha256 == (
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert r.sha256["Packages"].size == 1234
    assert r.sha256["Packages.gz"].sha256.startswith("abcdef0123")  # lower-cased
    assert r.fields["origin"] == "test"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("Origin test\n", "not a 'Field: value'"),
        (" continuation\n", "continuation line without a field"),
        ("Date: yesterday\n", "not an RFC 2822 date"),
        ("Date: Sat, 01 Feb 2025 10:20:30\n", "without a time zone"),
        ("SHA256:\n nothex 12 Packages\n", "expected '<sha256> <size> <path>'"),
        ("Origin: a\nOrigin: b\n", "appears twice"),
        ("Origin: a\n\nOrigin: b\n", "second paragraph"),
        ("SHA256:\n " + "a" * 64 + " 1 P\n " + "b" * 64 + " 2 P\n", "lists P twice"),
        ("Origin: a\x00\n", "NUL"),
    ],
)
def test_bad_release_is_a_parse_error(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        parse_release(text)


SIGNED = """\
-----BEGIN PGP SIGNED MESSAGE-----
Hash: SHA512

Origin: test
- -dashed line
Label: x
-----BEGIN PGP SIGNATURE-----

iHUEARYKAB0WIQQ=
=abcd
-----END PGP SIGNATURE-----
"""


def test_clearsigned_body_undoes_dash_escaping() -> None:
    assert clearsigned_body(SIGNED) == "Origin: test\n-dashed line\nLabel: x\n"


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("Origin: x\n", "not a clear-signed message"),
        ("junk\n" + SIGNED, "not a clear-signed message"),
        (SIGNED + "SHA256:\n x\n", "text after the signature"),
        (SIGNED + SIGNED, "text after the signature"),
        (SIGNED.replace("- -dashed", "-dashed"), "unescaped dash line"),
        (SIGNED.split("-----BEGIN PGP SIGNATURE")[0], "no '-----BEGIN PGP SIGNATURE-----'"),
        (SIGNED.replace("-----END PGP SIGNATURE-----\n", ""), "no '-----END PGP SIGNATURE"),
        (SIGNED.replace("Hash: SHA512", "Hash SHA512"), "bad armor header"),
    ],
)
def test_bad_clearsigned_message_is_refused(text: str, why: str) -> None:
    with pytest.raises(ParseError, match=why):
        clearsigned_body(text)


FPR = "0123456789ABCDEF0123456789ABCDEF01234567"
VALIDSIG = f"[GNUPG:] VALIDSIG {FPR} 2025-02-01 1738405230 0 4 0 22 10 01 {FPR}"


def test_gpgv_good_signature() -> None:
    out = "\n".join(
        [
            "gpgv: Signature made Sat Feb  1 10:20:30 2025 UTC",
            "[GNUPG:] NEWSIG",
            "[GNUPG:] KEY_CONSIDERED 0123456789ABCDEF0123456789ABCDEF01234567 0",
            "[GNUPG:] SIG_ID abc 2025-02-01 1738405230",
            "[GNUPG:] GOODSIG 89ABCDEF01234567 test <t@x>",
            VALIDSIG,
            'gpgv: Good signature from "test <t@x>"',
        ]
    )
    s = parse_gpgv_status(out)
    assert s.trusted and s.valid == (FPR,) and s.good == ("89ABCDEF01234567",)


def test_gpgv_one_good_one_unknown_key_is_trusted() -> None:
    """Key rotation: signed by the old and the new key, the keyring has only one."""
    out = "\n".join(
        [
            "[GNUPG:] NEWSIG",
            "[GNUPG:] ERRSIG 1111222233334444 22 10 01 1738405230 9 -",
            "[GNUPG:] NO_PUBKEY 1111222233334444",
            "[GNUPG:] NEWSIG",
            "[GNUPG:] GOODSIG 89ABCDEF01234567 test <t@x>",
            VALIDSIG,
        ]
    )
    s = parse_gpgv_status(out)
    assert s.trusted and s.missing_keys == ("1111222233334444",)


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        (["[GNUPG:] BADSIG 89ABCDEF01234567 test"], "bad signature"),
        (["[GNUPG:] EXPKEYSIG 89ABCDEF01234567 test", VALIDSIG], "key 89ABCDEF01234567 that"),
        (["[GNUPG:] EXPSIG 89ABCDEF01234567 test", VALIDSIG], "signature by key 89AB"),
        (["[GNUPG:] REVKEYSIG 89ABCDEF01234567 test", VALIDSIG], "revoked"),
        (["[GNUPG:] ERRSIG 89ABCDEF01234567 22 10 01 1738405230 4 -"], "rc 4"),
    ],
)
def test_gpgv_bad_signatures_are_not_trusted(lines: list[str], why: str) -> None:
    s = parse_gpgv_status("\n".join(["[GNUPG:] GOODSIG 89ABCDEF01234567 t", *lines]))
    assert not s.trusted
    assert any(why in p for p in s.problems), s.problems


def test_gpgv_sha1_signature_is_weak() -> None:
    s = parse_gpgv_status(
        f"[GNUPG:] GOODSIG 89ABCDEF01234567 t\n[GNUPG:] VALIDSIG {FPR} 2025-02-01 1 0 4 0 1 2 01"
    )
    assert not s.trusted and s.weak == (f"{FPR} (SHA1)",)


def test_gpgv_no_status_is_not_trusted() -> None:
    assert not parse_gpgv_status("gpgv: no valid OpenPGP data found.\n").trusted
    with pytest.raises(ParseError, match="VALIDSIG with 2 fields"):
        parse_gpgv_status("[GNUPG:] VALIDSIG a b\n")


# -- real captures: the Debian archive's InRelease that apt fetched on this machine --------
DEBIAN_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
REAL = sorted(glob.glob("/var/lib/apt/lists/deb.debian.org_debian_dists_*_InRelease"))


@pytest.mark.skipif(not REAL or not DEBIAN_KEYRING.is_file(), reason="no apt lists here")
@pytest.mark.parametrize("path", REAL)
def test_real_debian_inrelease(path: str, tmp_path: Path) -> None:
    """Debian signs each InRelease with several keys (archive and release keys): gpgv's
    real status output on it is trusted, and its body parses with the real fields."""
    text = Path(path).read_text()
    release = parse_release(clearsigned_body(text))
    assert release.fields["origin"] == "Debian"
    assert any(p.endswith("binary-amd64/Packages") for p in release.sha256)
    assert release.date is not None and release.date.year >= 2023
    p = subprocess.run(
        ["gpgv", "--homedir", str(tmp_path), "--status-fd", "1",
         "--keyring", str(DEBIAN_KEYRING), path],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    status = parse_gpgv_status(p.stdout)
    assert status.trusted, p.stdout + p.stderr
    assert len(status.valid) >= 2
