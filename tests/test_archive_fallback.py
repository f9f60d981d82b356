"""Python 3.11.2 (Debian 12's python3) has no tar extraction filters (PEP 706 arrived in
3.11.4): bootfsm detects the feature and falls back to its own member checks, which
still refuse every unsafe member."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.host import archive
from bootfsm.host.host import Host
from tests.test_security import MALICIOUS, OK_TOP, _tar_xz

F, S = tarfile.REGTYPE, tarfile.SYMTYPE


@pytest.fixture
def no_filter(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter as Debian 12 ships it: no ``filter=`` argument, no FilterError."""
    monkeypatch.setattr(archive, "HAS_EXTRACTION_FILTER", False)
    monkeypatch.setattr(archive, "FILTER_ERRORS", ())
    real = tarfile.TarFile.extractall
    real_has_filter = hasattr(tarfile, "data_filter")

    def extractall_3_11_2(self: tarfile.TarFile, path: str = ".", members: object = None,
                          *, numeric_owner: bool = False, **kw: object) -> None:  # fmt: skip
        if kw:  # 3.11.2's signature: extractall(path, members, *, numeric_owner)
            raise TypeError(f"extractall() got an unexpected keyword argument {next(iter(kw))!r}")
        if real_has_filter:  # this interpreter's own extractall, without PEP 706's check
            real(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")  # type: ignore[arg-type]
        else:  # an interpreter without filters (3.10 before 3.10.12, 3.11 before 3.11.4)
            real(self, path, members, numeric_owner=numeric_owner)

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall_3_11_2)


def test_feature_is_detected_not_the_version() -> None:
    present = hasattr(tarfile, "data_filter")
    assert archive.HAS_EXTRACTION_FILTER is (present and archive.filter_is_sound())
    src = Path(archive.__file__).read_text()
    assert "version_info" not in src and "python_version" not in src


def test_a_filter_that_refuses_inside_links_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPython gh-107845 (3.10.12 and 3.11.4, Ubuntu 22.04's python3): the data filter
    resolved a link's target against the destination, refusing ``lib/up -> ../bin/x``;
    the fixed filter resolves it against the link's directory."""

    class FilterError(Exception):
        pass

    def data_filter(fixed: bool) -> Callable[[tarfile.TarInfo, str], tarfile.TarInfo]:
        def check(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo:
            base = os.path.dirname(member.name) if fixed else ""
            target = os.path.normpath(os.path.join(dest, base, member.linkname))
            if not target.startswith(os.path.normpath(dest) + os.sep):
                raise FilterError(member.name)
            return member

        return check

    monkeypatch.setattr(tarfile, "FilterError", FilterError, raising=False)
    monkeypatch.setattr(tarfile, "data_filter", data_filter(fixed=False), raising=False)
    assert archive.filter_is_sound() is False
    monkeypatch.setattr(tarfile, "data_filter", data_filter(fixed=True), raising=False)
    assert archive.filter_is_sound() is True


@pytest.mark.parametrize("case", MALICIOUS)
def test_fallback_still_refuses_unsafe_members(tmp_path: Path, case: str, no_filter: None) -> None:
    node = tmp_path / "node"
    (node / "work").mkdir(parents=True)
    evil = _tar_xz(tmp_path / "evil.tar.xz", MALICIOUS[case])
    with pytest.raises(BootError) as err:
        Host(node).extract_tar(evil, "/work/extract")
    assert err.value.code is Code.UNSAFE_ARCHIVE, err.value.message
    assert not (node / "work/extract").exists() or not any((node / "work/extract").iterdir())
    assert not (tmp_path / "escape").exists() and not (node / "escape").exists()


def _setuid_tar(path: Path) -> Path:
    with tarfile.open(path, "w:xz") as tf:
        for name, kind, mode, data in [
            ("fm", tarfile.DIRTYPE, 0o777, b""),
            ("fm/bin", tarfile.DIRTYPE, 0o777, b""),
            ("fm/bin/tool", F, 0o6777, b"#!/bin/sh\n"),
            ("fm/lib.so", S, 0o777, b""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.mode, info.size = kind, mode, len(data)
            info.uid, info.gid, info.uname, info.gname = 1234, 1234, "evil", "evil"
            if kind == S:
                info.linkname = "bin/tool"
            tf.addfile(info, io.BytesIO(data) if data else None)
    return path


def test_fallback_extracts_safe_archive_and_clears_mode_bits(
    tmp_path: Path, no_filter: None
) -> None:
    """Like the data filter: setuid/setgid/sticky and group/other write are dropped."""
    names = Host(tmp_path).extract_tar(_setuid_tar(tmp_path / "a.tar.xz"), "/x")
    assert names == ["fm", "fm/bin", "fm/bin/tool", "fm/lib.so"]
    tool = tmp_path / "x/fm/bin/tool"
    assert tool.stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "x/fm/bin").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "x/fm/lib.so").resolve() == tool.resolve()


def test_fallback_safe_archive_with_inside_links(tmp_path: Path, no_filter: None) -> None:
    ok = _tar_xz(tmp_path / "ok.tar.xz", [*OK_TOP, ("fm/lib", S, "bin", b"")])
    assert "fm/lib" in Host(tmp_path).extract_tar(ok, "/extract")
