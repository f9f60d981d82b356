"""Artifact factory: build small but REAL driver-stack artifacts for the simulator.

Every builder writes a genuine file format that the real tools accept: a makeself
runfile, ``.deb`` packages built by ``dpkg-deb``, an apt ``Packages`` index, the fabric
manager ``.tar.xz`` redist archive and NVIDIA's ``redistrib_<ver>.json`` manifest. Only
the payloads are stand-ins (scripts and placeholder text), so each artifact is a few KB
and builds in well under a second. External tools used: ``makeself``, ``dpkg-deb``,
``gpg`` (a real key signs each repository's Release: InRelease and Release.gpg).
Archive member times are fixed (:data:`EPOCH`) so that contents are reproducible.

This module is the one name the simulator and the tests use (``artifacts as art``); the
builders live in :mod:`artifacts_packages` (runfile, deb, apt index),
:mod:`artifacts_redist` (redist archives, manifest) and :mod:`artifacts_signing`
(Release, InRelease), their shared helpers in :mod:`artifacts_tools`.
"""

from __future__ import annotations

from bootfsm.sim.artifacts_packages import build_deb, build_runfile, write_packages_index
from bootfsm.sim.artifacts_redist import (
    build_fabricmanager_archive,
    build_nvlsm_archive,
    write_redistrib_manifest,
)
from bootfsm.sim.artifacts_signing import RepoSigner, shared_signer, sign_repository, write_release
from bootfsm.sim.artifacts_tools import EPOCH, ArtifactError, sha256_file

__all__ = [
    "EPOCH",
    "ArtifactError",
    "RepoSigner",
    "build_deb",
    "build_fabricmanager_archive",
    "build_nvlsm_archive",
    "build_runfile",
    "sha256_file",
    "shared_signer",
    "sign_repository",
    "write_packages_index",
    "write_redistrib_manifest",
    "write_release",
]
