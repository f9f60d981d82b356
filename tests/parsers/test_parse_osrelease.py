"""Tests for bootfsm.parsers.osrelease."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.osrelease import OsRelease, parse_os_release
from tests.samples import sample

# /etc/os-release as shipped by Ubuntu 22.04.4 (jammy).
UBUNTU_2204 = """\
PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
VERSION="22.04.4 LTS (Jammy Jellyfish)"
VERSION_CODENAME=jammy
ID=ubuntu
ID_LIKE=debian
HOME_URL="https://www.ubuntu.com/"
SUPPORT_URL="https://help.ubuntu.com/"
BUG_REPORT_URL="https://bugs.launchpad.net/ubuntu/"
PRIVACY_POLICY_URL="https://www.ubuntu.com/legal/terms-and-policies/privacy-policy"
UBUNTU_CODENAME=jammy
"""

# /etc/os-release as shipped by Azure Linux 3.0 (no VERSION_CODENAME, no ID_LIKE).
AZURE_LINUX_3 = """\
NAME="Microsoft Azure Linux"
VERSION="3.0.20240727"
ID=azurelinux
VERSION_ID="3.0"
PRETTY_NAME="Microsoft Azure Linux 3.0"
ANSI_COLOR="1;34"
HOME_URL="https://aka.ms/azurelinux"
BUG_REPORT_URL="https://aka.ms/azurelinux"
SUPPORT_URL="https://aka.ms/azurelinux"
"""

# RHEL 9 style: everything double-quoted, multi-word ID_LIKE.
ROCKY_9 = """\
NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PLATFORM_ID="platform:el9"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
"""


def test_ubuntu() -> None:
    assert parse_os_release(UBUNTU_2204) == OsRelease(
        id="ubuntu",
        version_id="22.04",
        id_like=("debian",),
        pretty_name="Ubuntu 22.04.4 LTS",
        version_codename="jammy",
    )


def test_azure_linux_without_codename() -> None:
    info = parse_os_release(AZURE_LINUX_3)
    assert (info.id, info.version_id, info.id_like) == ("azurelinux", "3.0", ())
    assert info.version_codename == ""
    assert info.pretty_name == "Microsoft Azure Linux 3.0"


def test_quoted_id_and_multi_word_id_like() -> None:
    info = parse_os_release(ROCKY_9)
    assert info.id == "rocky"
    assert info.id_like == ("rhel", "centos", "fedora")


def test_quoting_escapes_comments_and_blank_lines() -> None:
    text = (
        "# comment line\n"
        "\n"
        "   \n"
        "ID='arch'\n"
        'PRETTY_NAME="A \\"quoted\\" \\$name \\\\ and \\n kept"\n'
        "VERSION_CODENAME=rolling\\ release\n"
    )
    info = parse_os_release(text)
    assert info.id == "arch"
    assert info.pretty_name == 'A "quoted" $name \\ and \\n kept'
    assert info.version_codename == "rolling release"


def test_missing_version_id_is_allowed() -> None:
    assert parse_os_release("ID=arch\n").version_id == ""


def test_later_assignment_wins_and_crlf() -> None:
    assert parse_os_release("ID=a\r\nID=b\r\n").id == "b"


# Expected values read by hand from the real captures in samples/osrelease/.
REAL_CAPTURES = [
    (
        "osrelease/os-release_ubuntu-22.04.5_container.txt",
        OsRelease("ubuntu", "22.04", ("debian",), "Ubuntu 22.04.5 LTS", "jammy"),
    ),
    (
        "osrelease/os-release_ubuntu-24.04.3_azure-runner.txt",
        OsRelease("ubuntu", "24.04", ("debian",), "Ubuntu 24.04.3 LTS", "noble"),
    ),
]


@pytest.mark.parametrize(("relpath", "expected"), REAL_CAPTURES, ids=["22.04.5", "24.04.3"])
def test_real_captures(relpath: str, expected: OsRelease) -> None:
    """Every real os-release capture parses to the values its lines state."""
    assert parse_os_release(sample(relpath)) == expected


def test_this_machine_if_present() -> None:
    path = Path("/etc/os-release")
    if not path.is_file():
        pytest.skip("no /etc/os-release here")
    assert parse_os_release(path.read_text(encoding="utf-8")).id


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("NAME=Ubuntu\n", "ID is missing"),
        ('ID=""\n', "ID is missing"),
        ("", "ID is missing"),
        ("ID=ubuntu\nthis is not an assignment\n", "line 2: not a KEY=value"),
        ("1ID=x\n", "line 1: not a KEY=value"),
        ('ID="ubuntu\n', "line 1: unterminated double quote"),
        ("ID='ubuntu\n", "line 1: unterminated single quote"),
        ("ID=ubuntu\\", "line 1: trailing backslash"),
    ],
)
def test_garbage(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_os_release(text)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        info = parse_os_release(text)
    except ParseError:
        return
    assert info.id


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"))))
def test_double_quoted_value_round_trips(value: str) -> None:
    escaped = "".join("\\" + c if c in '"\\$`' else c for c in value)
    info = parse_os_release(f'ID=x\nPRETTY_NAME="{escaped}"\n')
    assert info.pretty_name == value
