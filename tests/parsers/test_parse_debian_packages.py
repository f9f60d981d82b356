"""Tests for bootfsm.parsers.debian_packages on NVIDIA's real libnvidia-container index."""

from __future__ import annotations

import contextlib
import itertools
import shutil
import subprocess
from functools import cmp_to_key

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import (
    PackageEntry,
    compare_debian_versions,
    parse_packages,
    safe_filename,
    select_package,
    select_packages,
)
from tests.samples import sample

PACKAGES = "apt/libnvidia-container_stable_deb_amd64_Packages_1.17.2_excerpt.deb822"

STANZA = """\
Package: nvidia-imex
Version: 580.95.05-1
Architecture: arm64
Filename: pool/main/n/nvidia-imex/nvidia-imex_580.95.05-1_arm64.deb
Size: 100
SHA256: {sha}
"""
SHA = "a" * 64


def entry(package: str, version: str, arch: str = "arm64") -> PackageEntry:
    return PackageEntry(package, version, arch, f"pool/{package}_{version}.deb", 1, SHA, "")


def test_real_index() -> None:
    entries = parse_packages(sample(PACKAGES))
    assert [e.package for e in entries] == [
        "libnvidia-container-tools",
        "libnvidia-container1",
        "nvidia-container-toolkit-base",
        "nvidia-container-toolkit",
    ]
    assert {(e.version, e.architecture) for e in entries} == {("1.17.2-1", "amd64")}
    assert entries[0] == PackageEntry(
        package="libnvidia-container-tools",
        version="1.17.2-1",
        architecture="amd64",
        filename="libnvidia-container-tools_1.17.2-1_amd64.deb",
        size=20128,
        sha256="33658ad1c54ee469757e63089f6a0986c44a8e7f1170f7cd1fcba02e8e455fad",
        depends="libc6 (>= 2.8), libcap2 (>= 1:2.10), libnvidia-container1 (>= 1.17.2)",
    )
    assert [e.size for e in entries] == [20128, 923636, 3662928, 1184584]
    assert entries[2].depends == ""  # toolkit-base has no Depends field
    assert entries[3].sha256 == "377cfd5665c3e50dcfc92cbf8b964f48a9524fa4d2f5b68a9e0839a07b1ff07d"


def test_select_from_real_index() -> None:
    entries = parse_packages(sample(PACKAGES))
    toolkit = select_package(entries, ["nvidia-container-toolkit"], "1.17.2", "amd64")
    assert toolkit is not None and toolkit.filename == "nvidia-container-toolkit_1.17.2-1_amd64.deb"
    assert select_package(entries, ["nvidia-container-toolkit"], "1.17.2-1") == toolkit
    assert select_package(entries, ["nvidia-container-toolkit"], "1.17.2", "arm64") is None
    assert select_package(entries, ["nvidia-container-toolkit"], "1.17") is None
    assert select_package(entries, ["nvidia-container-toolkit"], "1.17.2-") is None
    assert select_package(entries, ["nvidia-imex"], "1.17.2") is None


def test_select_highest_revision_epoch_and_arch_all() -> None:
    entries = [
        entry("nvidia-imex", "580.95.05-1"),
        entry("nvidia-imex-580", "580.95.05-1ubuntu1"),
        entry("nvidia-imex", "580.95.050-1"),  # a different upstream, not a revision
        entry("nvidia-imex", "580.95.05-1", arch="amd64"),
        entry("other", "580.95.05-9"),
    ]
    best = select_package(entries, ["nvidia-imex", "nvidia-imex-580"], "580.95.05", "arm64")
    assert best == entries[1]
    with_epoch = [*entries, entry("nvidia-imex", "1:580.95.05-0"), entry("x", "580.95.05", "all")]
    assert select_package(with_epoch, ["nvidia-imex"], "580.95.05", "arm64") == with_epoch[-2]
    assert select_package(with_epoch, ["x"], "580.95.05", "arm64") == with_epoch[-1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (STANZA.format(sha=SHA).replace("SHA256", "SHA1"), "stanza 1: missing sha256"),
        (
            STANZA.format(sha=SHA) + "\n" + STANZA.format(sha=SHA).replace("Version", "V"),
            "stanza 2: missing version",
        ),
        (STANZA.format(sha="abc"), r"stanza 1 \(nvidia-imex\): SHA256 is not 64 hex"),
        (STANZA.format(sha=SHA).replace("Size: 100", "Size: 1e3"), "Size is not a number"),
        (STANZA.format(sha=SHA).replace("pool/main", "../../etc"), "climbs out"),
        (STANZA.format(sha=SHA).replace("pool/main", "/etc"), "is absolute"),
        (STANZA.format(sha=SHA).replace("580.95.05-1", "abc"), "upstream must start"),
        (" leading continuation\n", "line 1: continuation line before any field"),
        ("Package: a\nPackage: b\n", "field 'Package' appears twice"),
        ("Package: a\nno colon here\n", r"line 2 \(stanza 1\): not a field"),
    ],
)
def test_broken_indexes(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_packages(text)


def test_fields_are_case_insensitive_and_crlf_tolerated() -> None:
    text = STANZA.format(sha=SHA.upper()).replace("SHA256", "sha256").replace("\n", "\r\n")
    (only,) = parse_packages("# comment\n\n\n" + text + "\r\n \t\n")
    assert (only.sha256, only.size) == (SHA, 100)


@pytest.mark.parametrize(
    ("given_name", "normalised"),
    [
        ("./pool/x.deb", "pool/x.deb"),
        ("pool/./x.deb", "pool/x.deb"),
        ("x.deb", "x.deb"),
        ("././x.deb", "x.deb"),
    ],
)
def test_safe_filename(given_name: str, normalised: str) -> None:
    assert safe_filename(given_name) == normalised


@pytest.mark.parametrize(
    "bad", ["", ".", "/pool/x.deb", "../x.deb", "pool/../../x.deb", "pool\\x.deb", "a\0b", "a//b"]
)
def test_unsafe_filename(bad: str) -> None:
    with pytest.raises(ParseError, match="Filename"):
        safe_filename(bad)


# Orderings dpkg documents or is known for: (lower, higher).
ORDERED = [
    ("1.0~rc1", "1.0"),
    ("2.0", "1:0.1"),
    ("580.95.05-1", "580.95.05-1ubuntu1"),
    ("1.0~rc1~", "1.0~rc1"),
    ("1.0", "1.0a"),
    ("1.0a", "1.0+"),
    ("1.0", "1.0.1"),
    ("1.9", "1.10"),
    ("1.2.3-1", "1.2.3-2"),
    ("1.2.3-9", "1.2.3-10"),
    ("1:1.0", "2:0.0"),
    ("0.0.0~20120605", "0.0.1"),
    ("1.17.2-1", "2.0.0"),
    ("535.288.01-0ubuntu1", "570.211.01-0ubuntu1"),
    ("1.0-1~bpo1", "1.0-1"),
    ("1.0+dfsg", "1.0.1"),
]
EQUAL = [("1.0", "1.0-0"), ("0:1.0", "1.0"), ("1.01", "1.1"), ("1.0-1", "01.0-01")]


@pytest.mark.parametrize(("lower", "higher"), ORDERED)
def test_ordering(lower: str, higher: str) -> None:
    assert compare_debian_versions(lower, higher) == -1
    assert compare_debian_versions(higher, lower) == 1


@pytest.mark.parametrize(("a", "b"), EQUAL)
def test_equal(a: str, b: str) -> None:
    assert compare_debian_versions(a, b) == 0


@pytest.mark.parametrize("bad", ["", "abc", "1.0-", "x:1.0", "1:", "1.0-a_b", "1 0"])
def test_invalid_versions(bad: str) -> None:
    with pytest.raises(ParseError, match="Debian version"):
        compare_debian_versions(bad, "1.0")


def _dpkg_sign(a: str, b: str) -> int:
    for op, sign in (("lt", -1), ("eq", 0), ("gt", 1)):
        done = subprocess.run(["dpkg", "--compare-versions", a, op, b], check=False)
        if done.returncode == 0:
            return sign
    raise AssertionError(f"dpkg gave no answer for {a!r} {b!r}")


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg not on PATH")


@needs_dpkg
def test_matches_dpkg_on_known_pairs() -> None:
    for a, b in ORDERED + EQUAL:
        assert compare_debian_versions(a, b) == _dpkg_sign(a, b), (a, b)


_VERSION = st.builds(
    lambda epoch, up, rev: f"{epoch}{up}{rev}",
    st.sampled_from(["", "0:", "1:", "2:"]),
    st.from_regex(r"[0-9][0-9a-z.+~]{0,6}", fullmatch=True),
    st.sampled_from(["", "-1", "-0ubuntu1", "-1~bpo", "-10", "-1a"]),
)


@needs_dpkg
@settings(max_examples=40, deadline=None)
@given(_VERSION, _VERSION)
def test_matches_dpkg_on_generated_pairs(a: str, b: str) -> None:
    assert compare_debian_versions(a, b) == _dpkg_sign(a, b)


@given(st.lists(_VERSION, min_size=1, max_size=8))
def test_comparison_is_a_consistent_order(versions: list[str]) -> None:
    ordered = sorted(versions, key=cmp_to_key(compare_debian_versions))
    for lower, higher in itertools.pairwise(ordered):
        assert compare_debian_versions(lower, higher) <= 0
        assert compare_debian_versions(higher, lower) >= 0


@given(st.text(), st.text())
def test_compare_any_text_or_parse_error(a: str, b: str) -> None:
    with contextlib.suppress(ParseError):
        assert compare_debian_versions(a, b) in (-1, 0, 1)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        entries = parse_packages(text)
    except ParseError:
        return
    assert all(len(e.sha256) == 64 for e in entries)


def test_select_with_a_bare_string_name_is_not_substring_matching() -> None:
    entries = [entry("nvidia-imex", "580.95.05-1")]
    assert select_package(entries, "nvidia-imex", "580.95.05") == entries[0]
    assert select_package(entries, "imex", "580.95.05") is None


@given(st.text(alphabet="./\\a\0 ", max_size=12))
def test_safe_filename_result_is_always_relative_and_contained(name: str) -> None:
    try:
        result = safe_filename(name)
    except ParseError:
        return
    assert not result.startswith("/")
    assert ".." not in result.split("/") and "\\" not in result and "\0" not in result


# -- one pass, only the wanted stanzas (issue 16: big indexes) ---------------------------

TEMPLATE = """\
Package: {name}
Version: {version}
Architecture: {arch}
Filename: pool/{name}_{version}_{arch}.deb
Size: 100
SHA256: {sha}
"""


def stanza(name: str, version: str, sha: str = SHA, arch: str = "arm64") -> str:
    return TEMPLATE.format(name=name, version=version, arch=arch, sha=sha)


def test_select_packages_on_the_real_index() -> None:
    """Values read from the capture: the 1.17.2-1 amd64 stanzas of two packages."""
    picked = select_packages(
        sample(PACKAGES),
        {
            "lib": (["libnvidia-container1"], "1.17.2", "amd64"),
            "tk": (["nvidia-container-toolkit"], "1.17.2", "amd64"),
            "absent": (["nvidia-imex"], "1.17.2", "amd64"),
            "other-arch": (["nvidia-container-toolkit"], "1.17.2", "arm64"),
        },
    )
    lib, tk = picked["lib"], picked["tk"]
    assert lib is not None and tk is not None
    assert (lib.filename, lib.size) == ("libnvidia-container1_1.17.2-1_amd64.deb", 923636)
    assert lib.sha256 == "cff84b1045fb79a7378d096bd142d23233fb1179ca595bcc023a41130a836556"
    assert (tk.version, tk.size) == ("1.17.2-1", 1184584)
    assert picked["absent"] is None and picked["other-arch"] is None


def test_only_wanted_stanzas_are_read_but_garbage_still_fails() -> None:
    wanted = stanza("nvidia-imex", "580.95.05-1")
    # another package's stanza with a broken SHA256 is never read ...
    other = stanza("cuda-toolkit", "12.8-1", sha="zz")
    want = {"imex": (["nvidia-imex"], "580.95.05", "arm64")}
    assert select_packages(other + "\n" + wanted, want)["imex"] is not None
    with pytest.raises(ParseError, match="SHA256"):
        parse_packages(other + "\n" + wanted)  # ... the full parse reads it
    # a wanted stanza's defect fails, with its line number in the whole index
    broken = stanza("nvidia-imex", "580.95.05-1", sha="zz")
    with pytest.raises(ParseError, match=r"stanza 2 \(nvidia-imex\)"):
        select_packages(other + "\n" + broken, want)
    # a page that is not an index at all (no Package field anywhere) fails
    with pytest.raises(ParseError, match="not a field"):
        select_packages("<html>\n<body>503</body>\n</html>\n", want)
    with pytest.raises(ParseError, match="line 10 "):  # 6 stanza lines, 3 blank ones
        select_packages(other + "\n\n \t\nnot a field\n", want)


_NAMES = ["nvidia-imex", "nvidia-imex-580", "cuda-toolkit", "libnvidia-container1"]
_VERSIONS = ["580.95.05-1", "580.95.05-2", "1:580.95.05-1", "580.95.050-1", "12.8-1"]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(_NAMES),
            st.sampled_from(_VERSIONS),
            st.sampled_from(["arm64", "amd64", "all"]),
        ),
        max_size=12,
    ),
    st.sampled_from(["\n", "\n\n", "\n \t\n", "\r\n\r\n"]),
)
@settings(max_examples=200, deadline=None)
def test_one_pass_equals_a_full_parse_per_want(
    stanzas: list[tuple[str, str, str]], gap: str
) -> None:
    text = gap.join(stanza(n, v, arch=a) for n, v, a in stanzas)
    wants = {
        "imex": (["nvidia-imex", "nvidia-imex-580"], "580.95.05", "arm64"),
        "cuda": (["cuda-toolkit"], "12.8", None),
        "lib": (["libnvidia-container1"], "580.95.05", "amd64"),
    }
    full = parse_packages(text)
    assert select_packages(text, wants) == {
        k: select_package(full, ns, v, a) for k, (ns, v, a) in wants.items()
    }
