"""Signed repository metadata, attacked for real: a repository signed with a real gpg key
made here (gpg --quick-gen-key, no passphrase, a private GNUPGHOME), a hand-written
Release, InRelease from ``gpg --clearsign``; bootfsm checks it with the real gpgv.

The simulator's own key is replaced on the toolkit repository of an h100-pcie world
(PCIe: toolkit only), and the node's keyring at the default path holds this test's key.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.run.session import SessionResult
from bootfsm.sim.world import World
from tests.conftest import MakeWorld, run_in_process

pytestmark = pytest.mark.skipif(
    shutil.which("gpg") is None or shutil.which("gpgv") is None, reason="needs gpg and gpgv"
)

TOOLKIT_KEYRING = "usr/share/keyrings/nvidia-container-toolkit-keyring.gpg"
BATCH = ["--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", ""]


class Key:
    """A real ed25519 signing key in its own GNUPGHOME."""

    def __init__(self, uid: str, *, faked_time: str = "", expire: str = "0") -> None:
        self.home = Path(tempfile.mkdtemp(prefix="bootfsm-test-gpg-"))
        self.home.chmod(0o700)
        self.time = ["--faked-system-time", faked_time] if faked_time else []
        self.gpg(*self.time, "--quick-gen-key", uid, "ed25519", "sign", expire)
        cols = self.gpg("--with-colons", "--list-keys")
        self.fpr = next(ln.split(":")[9] for ln in cols.splitlines() if ln.startswith("fpr:"))

    def gpg(self, *args: str) -> str:
        p = subprocess.run(
            ["gpg", "--homedir", str(self.home), *BATCH, *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert p.returncode == 0, p.stderr
        return p.stdout

    def keyring(self, dest: Path) -> None:
        dest.parent.mkdir(parents=True, exist_ok=True)
        self.gpg("--yes", "--output", str(dest), "--export", self.fpr)

    def clearsign(self, src: Path, dest: Path, *extra: str) -> None:
        self.gpg(*self.time, "--yes", "--local-user", self.fpr, *extra,
                 "--output", str(dest), "--clearsign", str(src))  # fmt: skip

    def detach(self, src: Path, dest: Path) -> None:
        self.gpg(*self.time, "--yes", "--local-user", self.fpr, "--armor",
                 "--output", str(dest), "--detach-sign", str(src))  # fmt: skip

    def close(self) -> None:
        subprocess.run(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"], check=False)
        shutil.rmtree(self.home, ignore_errors=True)


@pytest.fixture(scope="module")
def key() -> Iterator[Key]:
    k = Key("test repository <repo@test.invalid>")
    yield k
    k.close()


@pytest.fixture(scope="module")
def other_key() -> Iterator[Key]:
    k = Key("someone else <other@test.invalid>")
    yield k
    k.close()


def _date(when: dt.datetime) -> str:
    return email.utils.format_datetime(when.astimezone(dt.timezone.utc))


def release_text(packages: bytes, *, valid_until: dt.datetime | None = None) -> str:
    """A flat repository's Release, written by hand (the fields apt reads)."""
    now = dt.datetime.now(dt.timezone.utc)
    lines = ["Origin: test", "Label: test", "Architecture: amd64", f"Date: {_date(now)}"]
    if valid_until is not None:
        lines.append(f"Valid-Until: {_date(valid_until)}")
    lines += [
        "SHA256:",
        f" {hashlib.sha256(packages).hexdigest()} {len(packages):>12} Packages",
        f" {'0' * 64} {12:>12} Packages.gz",
    ]
    return "\n".join(lines) + "\n"


def toolkit_repo(w: World) -> Path:
    return next((w.docroot / "toolkit").iterdir())


def resign(
    w: World,
    key: Key,
    *,
    trusted: Key | None = None,
    valid_until: dt.datetime | None = None,
    inrelease: bool = True,
    detached: bool = False,
    sign_args: tuple[str, ...] = (),
) -> Path:
    """Replace the simulator's Release/InRelease/Release.gpg of the toolkit repo by this
    test's, signed by ``key``; the node trusts ``trusted`` (default: ``key``)."""
    repo = toolkit_repo(w)
    for name in ("InRelease", "Release", "Release.gpg"):
        (repo / name).unlink(missing_ok=True)
    release = repo / "Release"
    release.write_text(release_text((repo / "Packages").read_bytes(), valid_until=valid_until))
    if inrelease:
        key.clearsign(release, repo / "InRelease", *sign_args)
    if detached:
        key.detach(release, repo / "Release.gpg")
    else:
        release.unlink()
    (trusted or key).keyring(w.root / TOOLKIT_KEYRING)
    return repo


def events(result: SessionResult, name: str) -> list[dict[str, Any]]:
    assert result.journal is not None
    evs = [json.loads(x) for x in result.journal.read_text().splitlines()]
    return [e for e in evs if e["event"] == name]


def gpgv_calls(result: SessionResult) -> list[list[str]]:
    return [e["argv"] for e in events(result, "command") if e["argv"][0] == "gpgv"]


def debs_fetched(w: World) -> list[str]:
    return [e.path for e in w.mirror.log if e.path.endswith(".deb")]


def refused(result: SessionResult, code: Code) -> str:
    assert (result.outcome.code, result.outcome.state) == (code, "fetch"), result.outcome
    return result.outcome.message


# -- the repository as published --------------------------------------------------------
def test_signed_repository_verifies_with_gpgv(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [verified] = events(result, "index.verified")
    assert verified["signed"] is True and verified["index"] == "toolkit_packages"
    [argv] = gpgv_calls(result)
    assert argv[argv.index("--status-fd") + 1] == "1"
    assert argv[argv.index("--keyring") + 1] == str(w.root / TOOLKIT_KEYRING)
    assert argv[-1].endswith("toolkit_packages.InRelease")


def test_release_with_detached_signature_verifies(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key, inrelease=False, detached=True)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [argv] = gpgv_calls(result)
    assert argv[-2].endswith("Release.gpg") and argv[-1].endswith("toolkit_packages.Release")


def test_simulator_repositories_are_signed_by_default(make_world: MakeWorld) -> None:
    """The world's own mirror: every Packages (toolkit and CUDA on gb300) is verified."""
    w = make_world("gb300")
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert {e["index"] for e in events(result, "index.verified") if e["signed"]} == {
        "toolkit_packages",
        "cuda_packages",
    }


# -- attacks ------------------------------------------------------------------------------
def test_tampered_packages_is_refused_before_any_deb(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    repo = resign(w, key)
    packages = repo / "Packages"
    packages.write_text(packages.read_text().replace("(simulated)", "(simulated!)", 1))
    msg = refused(run_in_process(w), Code.REPO_INDEX_MISMATCH)
    assert "Packages" in msg and "InRelease lists" in msg
    assert debs_fetched(w) == []


def test_edited_inrelease_is_a_bad_signature(make_world: MakeWorld, key: Key) -> None:
    """The attacker rewrites the hash in InRelease to match a tampered Packages."""
    w = make_world("h100-pcie")
    repo = resign(w, key)
    old = hashlib.sha256((repo / "Packages").read_bytes()).hexdigest()
    packages = repo / "Packages"
    packages.write_text(packages.read_text().replace("(simulated)", "(simulated!)", 1))
    new = hashlib.sha256(packages.read_bytes()).hexdigest()
    inrelease = repo / "InRelease"
    text = inrelease.read_text().replace(old, new)
    size = packages.stat().st_size
    inrelease.write_text(text.replace(f"{size - 1:>12} Packages\n", f"{size:>12} Packages\n"))
    msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    assert "bad signature" in msg
    assert debs_fetched(w) == []


def test_signature_by_a_key_not_in_the_keyring(
    make_world: MakeWorld, key: Key, other_key: Key
) -> None:
    w = make_world("h100-pcie")
    resign(w, other_key, trusted=key)
    msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    assert "not in /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg" in msg
    assert other_key.fpr[-16:] in msg


def test_expired_key_is_refused(make_world: MakeWorld) -> None:
    """A key made (and used) in 2020 that expired a day later: gpgv says EXPKEYSIG."""
    old = Key("expired <old@test.invalid>", faked_time="20200101T000000", expire="1d")
    try:
        w = make_world("h100-pcie")
        resign(w, old)
        msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    finally:
        old.close()
    assert "has expired" in msg and "key" in msg


def test_expired_signature_is_refused(make_world: MakeWorld) -> None:
    """A signature made in 2020 that expired after a day (EXPSIG), by a key still valid."""
    k = Key("sig expires <sig@test.invalid>", faked_time="20200101T000000")
    try:
        w = make_world("h100-pcie")
        resign(w, k, sign_args=("--default-sig-expire", "1d"))
        msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    finally:
        k.close()
    assert "signature by key" in msg and "has expired" in msg


def test_release_past_valid_until_is_refused(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key, valid_until=dt.datetime.now(dt.timezone.utc) - dt.timedelta(hours=1))
    msg = refused(run_in_process(w), Code.REPO_INDEX_MISMATCH)
    assert "Valid-Until" in msg


def test_release_within_valid_until_is_used(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key, valid_until=dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=7))
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [verified] = events(result, "index.verified")
    assert verified["valid_until"] is not None


def test_unsigned_text_after_the_signature_is_refused(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    repo = resign(w, key)
    with (repo / "InRelease").open("a") as fh:
        fh.write("SHA256:\n " + "0" * 64 + " 1 Packages\n")
    msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    assert "text after the signature" in msg


def test_unsigned_repository_needs_explicit_opt_in(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    repo = resign(w, key)
    (repo / "InRelease").unlink()
    msg = refused(run_in_process(w), Code.REPO_SIGNATURE_INVALID)
    assert "no InRelease and no Release" in msg
    w.config_overrides = {**w.config_overrides, "sources": {"allow_unsigned_repos": True}}
    w.write_config()
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    warnings = [e["message"] for e in events(result, "warning")]
    assert any("allow_unsigned_repos" in m for m in warnings)


def test_missing_keyring_is_refused(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key)
    (w.root / TOOLKIT_KEYRING).unlink()
    # refused before the index is even downloaded: nothing could verify it
    msg = refused(run_in_process(w), Code.REPO_KEYRING_MISSING)
    assert "its keyring /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg is not" in msg
    assert gpgv_calls(run_in_process(w)) == []
    assert [e.path for e in w.mirror.log if "/toolkit/" in e.path] == []


def test_configured_keyring_path_is_used(make_world: MakeWorld, key: Key) -> None:
    w = make_world("h100-pcie")
    resign(w, key)
    (w.root / TOOLKIT_KEYRING).rename(w.root / "etc/toolkit.gpg")
    w.config_overrides = {
        **w.config_overrides,
        "sources": {"toolkit_repo_keyring": "/etc/toolkit.gpg"},
    }
    w.write_config()
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [argv] = gpgv_calls(result)
    assert argv[argv.index("--keyring") + 1] == str(w.root / "etc/toolkit.gpg")


# -- the redist manifest pin -------------------------------------------------------------
def _pin(w: World, sha: str) -> None:
    w.config_overrides = {**w.config_overrides, "sources": {"redist_manifest_sha256": sha}}
    w.write_config()


def test_redist_manifest_pin(make_world: MakeWorld) -> None:
    w = make_world("h100-hgx")  # fabric manager: the redist manifest is read
    [manifest] = (w.docroot / "redist").glob("redistrib_*.json")
    _pin(w, "ab" * 32)
    msg = refused(run_in_process(w), Code.REPO_INDEX_MISMATCH)
    assert "sources.redist_manifest_sha256 pins abab" in msg
    _pin(w, hashlib.sha256(manifest.read_bytes()).hexdigest())
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
