"""Outside text that is long, odd or hostile: bounded before it is quoted or searched.

A repository that signs what it serves (its key is the attacker's, or its owner signed a
corrupted file) passes the signature check; what it serves must still end with its own
code, quickly and with a short message. Redaction reads any text in linear time. Each
fault names its real cause, and what is extracted is what was hashed.
"""

from __future__ import annotations

import io
import json
import lzma
import tarfile
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.excerpt import excerpt
from bootfsm.core.redact import redact_text, redact_urls
from bootfsm.fetch.artifacts import sha256_of
from bootfsm.observe.trace import load_run
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import parse_packages
from bootfsm.sim import artifacts as art
from bootfsm.sim.world import DRIVER_VERSION, World
from tests.conftest import MakeWorld, run_in_process

SECRET = "s3cr3t-S1GNATURE"


# -- redaction ----------------------------------------------------------------------------
def test_redaction_keeps_its_meaning() -> None:
    """URLs lose credentials and queries; digits before a scheme stay; a scheme with no
    body, a run without "://" and a stray ``sig=`` outside a URL are handled as before."""
    cases = {
        f"GET https://u:{SECRET}@m.example/x.run?sv=1&sig={SECRET} failed":
            "GET https://m.example/x.run?<redacted> failed",
        f"12http://m.example/a?token={SECRET}": "12http://m.example/a?<redacted>",
        "see x:// and ftp:// here": "see x:// and ftp:// here",
        f"'https://m.example/p?k={SECRET}'": "'https://m.example/p?<redacted>'",
        f"retry with se=2030&sig={SECRET}": "retry with se=<redacted>&sig=<redacted>",
        "https://m.example/x?<redacted>": "https://m.example/x?<redacted>",
    }  # fmt: skip
    for text, want in cases.items():
        assert redact_text(text) == want, text
        assert redact_text(want) == want  # idempotent


def test_redaction_of_ten_megabytes_of_adversarial_text() -> None:
    """Runs of scheme characters millions long, thousands of "://" with and without a
    scheme, and a URL with credentials in the middle: every secret goes, the rest stays.
    Before the fix the letters' run alone took hours (quadratic); figures live in
    docs/benchmarks.md, not here."""
    url = f"https://user:{SECRET}@m.example/x.run?sv=1&sig={SECRET}"
    parts = [
        "h" * 4_000_000,
        f" {url} ",
        ("+" * 996 + "a:// ") * 1000,  # a scheme and "://" with no body: no URL
        "1" * 1_000_000 + "://x ",  # no letter in the scheme: no URL
        "://" * 1_000_000,
        " " + "a.b-c+d" * 143_000 + "://host/p?token=" + SECRET,
    ]
    text = "".join(parts)
    assert len(text) > 10_000_000
    out = redact_text(text)
    assert SECRET not in out
    assert out.startswith("h" * 4_000_000 + " https://m.example/x.run?<redacted> ")
    assert "".join(parts[2:5]) in out
    assert out.endswith("a.b-c+d://host/p?<redacted>")
    assert redact_urls(out) == out


# -- quotes -------------------------------------------------------------------------------
def test_an_excerpt_is_short_and_says_where_it_is() -> None:
    assert excerpt("Packages") == "'Packages'"
    assert excerpt("x" * 1_048_576) == f"'{'x' * 60}'... (characters 1-60 of 1048576)"
    assert excerpt("ab" * 100, 4, at=10) == "...'abab'... (characters 11-14 of 200)"
    assert excerpt({"a": [1] * 10**6}) == "an object of 1 members"
    assert excerpt([0] * 10**6) == "a list of 1000000 items"
    assert excerpt(10**400) == "an integer of 1329 bits"
    assert excerpt(None) == "None"


def test_a_parse_error_quotes_a_long_line_as_an_excerpt() -> None:
    """One 1 MiB line that is not a field: the message is short, names the line and its
    length; it never holds the line."""
    text = "Package: a\nVersion: 1\n" + "x" * 1_048_576 + "\n"
    with pytest.raises(ParseError) as info:
        parse_packages(text)
    msg = str(info.value)
    assert msg.startswith("Packages line 3 (stanza 1): not a field: 'xxx")
    assert msg.endswith("... (characters 1-60 of 1048576)")
    assert len(msg) < 200


def test_a_signed_index_with_a_60_mb_line_ends_index_invalid(make_world: MakeWorld) -> None:
    """The toolkit repository's Packages gets one 60 MB line and is signed again by the
    repository's own key (the simulator's real gpg signing path): gpgv, the Release's
    SHA256 and size all pass; the index does not parse. The run ends 35 with a short
    message, and the journal stays small."""
    w = make_world("h100-pcie")
    [index] = (w.docroot / "toolkit").glob("*/Packages")
    line = "a" * 60_000_000 + " https://evil.example/"  # one run of scheme letters
    index.write_text(index.read_text() + "\n" + line + "\n")
    art.sign_repository(index.parent, art.shared_signer(), arch=index.parent.name)
    result = run_in_process(w)
    assert result.outcome.code is Code.INDEX_INVALID, result.outcome
    msg = result.outcome.message
    assert f"not a field: '{'a' * 60}'..." in msg, msg
    assert f"(characters 1-60 of {len(line)})" in msg
    assert len(msg) < 500
    assert result.journal is not None and result.journal.stat().st_size < 200_000


# -- manifests ----------------------------------------------------------------------------
def _manifest(w: World) -> tuple[Path, dict[str, Any]]:
    path = w.docroot / f"redist/redistrib_{DRIVER_VERSION}.json"
    return path, json.loads(path.read_text())


def _fm_entry(doc: dict[str, Any]) -> dict[str, Any]:
    return next(
        p
        for comp in doc.values()
        if isinstance(comp, dict)
        for p in comp.values()
        if isinstance(p, dict) and "fabricmanager" in p.get("relative_path", "")
    )


@pytest.mark.parametrize("path", [".", "fabricmanager/.", "fabricmanager/linux-x86_64/"])
def test_a_relative_path_naming_no_file_is_refused_when_read(
    make_world: MakeWorld, path: str
) -> None:
    """The manifest is read and refused (35, fetch), not later as a failed rename in the
    cache (102 HOST_IO_ERROR: the node's disk is fine)."""
    w = make_world("h100-hgx")
    manifest, doc = _manifest(w)
    _fm_entry(doc)["relative_path"] = path
    manifest.write_text(json.dumps(doc))
    result = run_in_process(w)
    assert result.outcome.code is Code.INDEX_INVALID, result.outcome
    assert result.outcome.state == "fetch"
    assert f"relative_path {path!r} names no file" in result.outcome.message


# -- the fabric manager archive -----------------------------------------------------------
def _vouch(w: World, fm: Path) -> None:
    """The manifest's sha256 and size made to match the archive as it is now."""
    manifest, doc = _manifest(w)
    _fm_entry(doc).update(sha256=sha256_of(fm), size=str(fm.stat().st_size))
    manifest.write_text(json.dumps(doc))


@pytest.mark.parametrize("broken", ["not an archive", "truncated"])
def test_a_hashed_archive_that_is_not_a_tar_xz_is_archive_invalid(
    make_world: MakeWorld, broken: str
) -> None:
    """Its sha256 matches the manifest (the publisher hashed broken bytes): the run ends
    ARCHIVE_INVALID in fabric, saying so, not HOST_IO_ERROR (the disk is fine)."""
    w = make_world("h100-hgx")
    [fm] = (w.docroot / "redist/fabricmanager").glob("*/*.tar.xz")
    data = fm.read_bytes()
    fm.write_bytes(
        b"<html>not found</html>\n" if broken == "not an archive" else data[: len(data) // 2]
    )
    _vouch(w, fm)
    result = run_in_process(w)
    assert result.outcome.code is Code.ARCHIVE_INVALID, result.outcome
    assert result.outcome.state == "fabric"
    assert f"{fm.name} is not a readable archive" in result.outcome.message


def test_the_archive_swapped_after_its_hash_is_refused(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fabric's look-up hashed the cached archive; right then another root process swaps
    it for one of the same name that installs its own nv-fabricmanager. What is extracted
    is a private copy hashed as it is copied: CHECKSUM_MISMATCH, nothing installed."""
    from bootfsm.states import fabric

    w = make_world("h100-hgx")
    [fm] = (w.docroot / "redist/fabricmanager").glob("*/*.tar.xz")
    top = fm.name.removesuffix(".tar.xz")
    raw = io.BytesIO()  # the genuine archive, links and all, with one binary replaced
    with tarfile.open(fm) as tf, tarfile.open(fileobj=raw, mode="w") as out:
        for m in tf:
            data = (tf.extractfile(m) or io.BytesIO()).read() if m.isreg() else b""
            if m.name == f"{top}/bin/nv-fabricmanager":
                data = b"#!/bin/sh\necho payload\n"
            m.size = len(data)
            out.addfile(m, io.BytesIO(data) if m.isreg() else None)
    payload = lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ)
    real = fabric.verified

    def verified_then_swapped(ctx: Any, role: str) -> Any:
        found = real(ctx, role)
        for _art, cached in found:
            cached.write_bytes(payload)  # after the hash, before the extraction
        return found

    monkeypatch.setattr(fabric, "verified", verified_then_swapped)
    result = run_in_process(w)
    assert result.outcome.code is Code.CHECKSUM_MISMATCH, result.outcome
    assert "changed while it was copied" in result.outcome.message
    installed = w.root / "usr/bin/nv-fabricmanager"
    assert not installed.exists() or b"payload" not in installed.read_bytes()


# -- journals -----------------------------------------------------------------------------
def test_keep_journals_0_never_prunes_the_run_being_written(make_world: MakeWorld) -> None:
    """``run.keep_journals = 0`` keeps only the run being written: two runs leave the
    second's journal, whole, and `trace` reads it."""
    w = make_world("h100-pcie", config_overrides={"run": {"keep_journals": 0}})
    first = run_in_process(w)
    second = run_in_process(w)
    assert first.journal is not None and second.journal is not None
    assert sorted((w.root / "var/log/bootfsm").glob("run-*.jsonl")) == [second.journal]
    report = load_run(second.journal)
    assert report.outcome == "done" and report.run_id == second.run_id
    assert report.duration_s is not None and report.duration_s > 0
