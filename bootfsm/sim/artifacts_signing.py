"""Repository signing for the simulated mirror: a real gpg key, Release, InRelease.

:class:`RepoSigner` holds a real OpenPGP key (ed25519) in a private GNUPGHOME;
:func:`write_release` writes a flat repository's ``Release`` in the field order
``apt-ftparchive release`` writes; :func:`sign_repository` signs it with the real
``gpg`` into ``InRelease`` (clear-signed) and ``Release.gpg`` (detached), which apt and
gpgv verify. :mod:`artifacts` re-exports these names.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import email.utils
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bootfsm.sim.artifacts_tools import ArtifactError, digests, run_tool

__all__ = ["RepoSigner", "close_shared", "shared_signer", "sign_repository", "write_release"]

_SIGNER_UID = "bootfsm simulator mirror <mirror@bootfsm.invalid>"
_GPG_BATCH = ("--batch", "--quiet", "--no-tty", "--pinentry-mode", "loopback", "--passphrase", "")


class RepoSigner:
    """A real OpenPGP signing key (ed25519, no passphrase) in a private GNUPGHOME, made
    with the real ``gpg --quick-gen-key``; signs Release files the way a repository
    publisher does (``gpg --clearsign`` for InRelease, ``--detach-sign`` for Release.gpg).

    ``faked_time`` (gpg's ``--faked-system-time``, e.g. "20200101T000000") makes the key
    and every signature as of that time; with ``expire`` ("1d") the key then expires a
    day later, and ``sig_expire`` makes signatures that expire (tests of expired keys and
    signatures). Stop with ``close()`` (the agent is killed, the home removed).
    """

    def __init__(
        self,
        home: Path | None = None,
        *,
        faked_time: str = "",
        expire: str = "0",
        uid: str = _SIGNER_UID,
    ) -> None:
        self.home = Path(home or tempfile.mkdtemp(prefix="bootfsm-sim-gpg-"))
        self.home.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.home.chmod(0o700)
        self._time = ("--faked-system-time", faked_time) if faked_time else ()
        run_tool(
            ["gpg", "--homedir", str(self.home), *_GPG_BATCH, *self._time,
             "--quick-gen-key", uid, "ed25519", "sign", expire]
        )  # fmt: skip
        listing = run_tool(["gpg", "--homedir", str(self.home), "--with-colons", "--list-keys"])
        fprs = [ln.split(":")[9] for ln in listing.splitlines() if ln.startswith("fpr:")]
        if not fprs:
            raise ArtifactError(f"gpg made no key in {self.home}")
        self.fingerprint = fprs[0]

    def export_keyring(self, dest: Path) -> Path:
        """The public key as a binary keyring (the format of the keyring packages'
        /usr/share/keyrings/*.gpg, which gpgv --keyring reads)."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        run_tool(["gpg", "--homedir", str(self.home), "--batch", "--yes", "--output", str(dest),
              "--export", self.fingerprint])  # fmt: skip
        return dest

    def sign(self, release: Path, *, sig_expire: str = "", time: str = "") -> None:
        """Write InRelease (clear-signed) and Release.gpg (detached, armored) beside
        ``release``."""
        extra = [*(("--default-sig-expire", sig_expire) if sig_expire else ())]
        when = ("--faked-system-time", time) if time else self._time
        for flag, out in (("--clearsign", "InRelease"), ("--detach-sign", "Release.gpg")):
            run_tool(
                ["gpg", "--homedir", str(self.home), *_GPG_BATCH, *when, "--yes",
                 "--digest-algo", "SHA512", "--local-user", self.fingerprint, *extra,
                 "--armor", "--output", str(release.parent / out), flag, str(release)]
            )  # fmt: skip

    def close(self) -> None:
        """Kill this home's gpg-agent and remove the home."""
        with contextlib.suppress(ArtifactError):
            run_tool(["gpgconf", "--homedir", str(self.home), "--kill", "gpg-agent"])
        shutil.rmtree(self.home, ignore_errors=True)


_SHARED: RepoSigner | None = None


def shared_signer() -> RepoSigner:
    """One signing key per process, made on first use (key generation and the agent's
    start cost ~0.3 s; every world of a test session or the demo reuses it). Its
    gpg-agent is a daemon that outlives the process: ``close_shared`` ends it (the demo
    and the test session call it; atexit is only a fallback, which a process ending in
    os._exit, as the console script does, never runs)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = RepoSigner()
        atexit.register(close_shared)
    return _SHARED


def close_shared() -> None:
    """Kill the shared signer's gpg-agent and remove its home, if one was made."""
    global _SHARED
    if _SHARED is not None:
        _SHARED.close()
        _SHARED = None


def write_release(
    repo_dir: Path,
    *,
    arch: str,
    date: datetime.datetime | None = None,
    valid_until: datetime.datetime | None = None,
    files: Sequence[str] = ("Packages",),
) -> Path:
    """Write ``repo_dir/Release`` for a flat repository, in the field order
    ``apt-ftparchive release`` writes (Origin, Label, Architecture, Date, Valid-Until,
    then the MD5Sum/SHA1/SHA256/SHA512 lists of `` <hash> <size> <path>``)."""
    utc = datetime.timezone.utc
    when = date or datetime.datetime.now(utc)
    lines = [
        "Origin: bootfsm simulator",
        "Label: bootfsm simulator",
        f"Architecture: {arch}",
        f"Date: {email.utils.format_datetime(when.astimezone(utc), usegmt=False)}",
    ]
    if valid_until is not None:
        until = valid_until.astimezone(utc)
        lines.append(f"Valid-Until: {email.utils.format_datetime(until, usegmt=False)}")
    sums = {name: digests(repo_dir / name, "md5", "sha1", "sha256", "sha512") for name in files}
    for field_name, algo in (("MD5Sum", "md5"), ("SHA1", "sha1"), ("SHA256", "sha256"),
                             ("SHA512", "sha512")):  # fmt: skip
        lines.append(f"{field_name}:")
        for name in files:
            size = (repo_dir / name).stat().st_size
            lines.append(f" {sums[name][algo]} {size:>16} {name}")
    release = repo_dir / "Release"
    release.write_text("\n".join(lines) + "\n")
    return release


def sign_repository(repo_dir: Path, signer: RepoSigner, *, arch: str, **release: Any) -> Path:
    """Release for ``repo_dir``'s Packages, then InRelease and Release.gpg by ``signer``."""
    path = write_release(repo_dir, arch=arch, **release)
    signer.sign(path)
    return path
