"""The verified cache on simulated nodes: free space, corrupt entries, prefetch, offline."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bootfsm.cli import main
from bootfsm.core.codes import Code
from bootfsm.core.config import ConfigError, parse_config
from bootfsm.run.session import SessionResult
from bootfsm.sim import artifacts as art
from bootfsm.sim.mirror import Mirror
from bootfsm.sim.world import TOOLKIT_VERSION, World
from tests.conftest import MakeWorld, no_gpus, run_in_process

CACHE = "var/cache/bootfsm"


def _events(result: SessionResult | Path, name: str | None = None) -> list[dict[str, Any]]:
    path = result if isinstance(result, Path) else result.journal
    assert path is not None
    evs = [json.loads(x) for x in path.read_text().splitlines()]
    return [e for e in evs if name is None or e["event"] == name]


def bulk_up_deb(w: World, package: str, size: int) -> Path:
    """Rebuild one toolkit deb on the mirror with ``size`` random bytes inside; reindex."""
    repo = next((w.docroot / "toolkit").iterdir())
    deb = art.build_deb(
        repo,
        package=package,
        version=TOOLKIT_VERSION,
        arch=repo.name,
        files={f"/usr/share/{package}/blob": os.urandom(size)},
        description=f"{package} (simulated, large)",
    )
    art.write_packages_index(repo, sorted(repo.glob("*.deb")))
    art.sign_repository(repo, art.shared_signer(), arch=repo.name)  # as a publisher does
    return deb


@contextmanager
def small_fs(where: Path, size: str) -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``where``; skip when mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_too_little_space_fails_before_any_byte_is_written(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    bulk_up_deb(w, "libnvidia-container1", 2 << 20)  # the index lists 2 MiB
    with small_fs(w.root / CACHE, "1m") as cache:
        result = run_in_process(w)
        left = list(cache.iterdir())
    assert (result.outcome.code, result.outcome.state) == (Code.INSUFFICIENT_SPACE, "fetch")
    assert "free" in result.outcome.message
    assert left == []  # not an index copy, not a .part, not a meta file
    assert [e.path for e in w.mirror.log if e.path.endswith((".deb", ".run"))] == []
    assert _events(result, "state.retry") == []  # permanent: no retry


def test_corrupt_cache_entry_is_replaced_not_trusted(make_world: MakeWorld) -> None:
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    [runfile] = (w.root / CACHE).glob("*/NVIDIA-Linux-*.run")
    good = runfile.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    runfile.write_bytes(bytes(bad))
    second = run_in_process(w)
    assert second.outcome.ok, second.outcome.message
    [fetched] = _events(second, "artifact.fetched")
    assert fetched["artifact"] == "runfile" and fetched["resumed_bytes"] == 0
    assert runfile.read_bytes() == good
    side = runfile.with_name(runfile.name + ".sha256")
    assert sorted(p.name for p in runfile.parent.iterdir()) == [runfile.name, side.name]
    assert json.loads(side.read_text())["sha256"] == hashlib.sha256(good).hexdigest()


def _count_hashing(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every artifact bootfsm hashes from now on (what it reads of the cache)."""
    from bootfsm.fetch import indexes, store
    from bootfsm.host.host import Host

    read: list[str] = []
    real_sha, real_copy = indexes.sha256_of, Host.private_copy

    def sha256_of(path: Path) -> str:
        read.append(Path(path).name)
        return real_sha(path)

    def private_copy(self: Host, src: str, dst_dir: str, sha256: str) -> Path:
        read.append(Path(src).name)
        return real_copy(self, src, dst_dir, sha256)

    monkeypatch.setattr(indexes, "sha256_of", sha256_of)
    monkeypatch.setattr(store, "sha256_of", sha256_of)
    monkeypatch.setattr(Host, "private_copy", private_copy)
    return read


def test_rerun_on_a_provisioned_node_reads_no_artifact(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The downloads' own hashes are kept beside the files (stat stamp + sha256), so the
    fetch postcondition of a rerun is one stat per artifact: not one byte is read."""
    w = make_world("h100-hgx")
    assert run_in_process(w).outcome.ok
    arts = [p for p in (w.root / CACHE).glob("*/*") if p.suffix in (".run", ".deb")]
    assert len(arts) == 5 and all(p.with_name(p.name + ".sha256").is_file() for p in arts)
    read = _count_hashing(monkeypatch)
    again = run_in_process(w)
    assert again.outcome.ok
    assert [e["state"] for e in _events(again, "state.skip")] == [
        "fetch", "driver", "fabric", "verify", "join"
    ]  # fmt: skip
    assert read == []


def test_bytes_changed_behind_a_sidecar_are_hashed_and_replaced(
    make_world: MakeWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same size, mtime put back: the inode's ctime still moved, so the sidecar no longer
    vouches for the file; it is hashed, found wrong, and downloaded again."""
    w = make_world("h100-pcie")
    assert run_in_process(w).outcome.ok
    [deb] = (w.root / CACHE).glob("*/libnvidia-container1_*.deb")
    good, st = deb.read_bytes(), deb.stat()
    bad = bytearray(good)
    bad[-1] ^= 0xFF
    with deb.open("r+b") as fh:  # in place: same inode, same size
        fh.write(bytes(bad))
    os.utime(deb, ns=(st.st_atime_ns, st.st_mtime_ns))
    read = _count_hashing(monkeypatch)
    again = run_in_process(w)
    assert again.outcome.ok, again.outcome.message
    assert deb.name in read
    assert [e["artifact"] for e in _events(again, "artifact.fetched")] == ["libnvidia-container1"]
    assert deb.read_bytes() == good


def _point_sources_at(w: World, base: str) -> None:
    w.config_overrides = {
        **w.config_overrides,
        "sources": {
            "runfile_base": f"{base}/tesla",
            "redist_base": f"{base}/redist",
            "cuda_repo": f"{base}/cuda/{{os_id}}{{os_version_nodot}}/{{redist_arch}}",
            "toolkit_repo": f"{base}/toolkit/{{debian_arch}}",
        },
    }
    w.write_config()


def test_prefetch_without_gpus_then_offline_boot_is_done(
    make_world: MakeWorld, capsys: pytest.CaptureFixture[str]
) -> None:
    w = make_world("h100-pcie")
    artifacts = Mirror(w.docroot).start()  # the artifact mirror; IMDS/kubelet stay up
    try:
        _point_sources_at(w, artifacts.url)
        with no_gpus(w):
            assert main(["fetch", "--root", str(w.root)]) == Code.NO_GPU  # a node needs GPUs
            assert main(["fetch", "--prefetch", "--root", str(w.root)]) == 0
        out = capsys.readouterr().out
        assert "bootfsm: prefetch OK: 6 artifacts verified" in out  # x86_64: + fabric manager
        served = len(artifacts.log)
    finally:
        artifacts.stop()
    # the boot config differs from the image's (another deadline): a new resolution,
    # made from the cached indexes, with every mirror down
    w.config_overrides = {**w.config_overrides, "run": {"deadline": 300.0, "backoff_scale": 0.05}}
    w.write_config()
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    assert _events(result, "artifact.fetched") == [] and _events(result, "index.fetched") == []
    [offline] = _events(result, "fetch.offline")
    assert offline["artifacts"] == 5  # this node: runfile + four toolkit debs
    assert len(artifacts.log) == served


def test_prefetch_again_downloads_nothing(make_world: MakeWorld, capsys: Any) -> None:
    w = make_world("h100-pcie")
    with no_gpus(w):
        assert main(["fetch", "--prefetch", "--root", str(w.root)]) == 0
        n = len(w.mirror.log)
        assert main(["fetch", "--prefetch", "--root", str(w.root)]) == 0
    assert len(w.mirror.log) == n
    lines = capsys.readouterr().out.splitlines()
    assert "(6 downloaded)" in lines[0] and "(0 downloaded)" in lines[1]
    journals = sorted((w.root / "var/log/bootfsm").glob("fetch-*.jsonl"))
    assert [e["code"] for j in journals for e in _events(j, "run.end")] == [0, 0]


def test_offline_without_a_complete_cache_fails_with_a_download_code(
    make_world: MakeWorld,
) -> None:
    w = make_world("h100-pcie")
    artifacts = Mirror(w.docroot).start()
    _point_sources_at(w, artifacts.url)
    artifacts.stop()
    result = run_in_process(w)
    assert result.outcome.code is Code.DOWNLOAD_RETRIES_EXHAUSTED
    assert "ConnectionError" in result.outcome.message


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"sources": {"runfile_mirrors": ["ftp://m.example/x?sig=S3CRET"]}}, "runfile_mirrors"),
        ({"sources": {"toolkit_repo_mirrors": "https://m.example"}}, "toolkit_repo_mirrors"),
        ({"fetch": {"parallel": 0}}, "fetch.parallel"),
        ({"fetch": {"parallel": 64}}, "fetch.parallel"),
        ({"fetch": {"artifact_timeout": -1}}, "fetch.artifact_timeout"),
        ({"fetch": {"fsync": "yes"}}, "fetch.fsync"),
        ({"fetch": {"segments": 0}}, "fetch.segments"),
        ({"fetch": {"segments": 17}}, "fetch.segments"),
        ({"fetch": {"segments": 2.5}}, "fetch.segments"),
        ({"fetch": {"segment_min_size": 4096}}, "fetch.segment_min_size"),
        ({"fetch": {"segment_min_size": 1 << 41}}, "fetch.segment_min_size"),
        ({"fetch": {"segment_min_size": "64M"}}, "fetch.segment_min_size"),
        ({"fetch": {"segment_below_rate": -1}}, "fetch.segment_below_rate"),
        ({"fetch": {"segment_below_rate": 1 << 41}}, "fetch.segment_below_rate"),
        ({"fetch": {"segment_below_rate": "200MB/s"}}, "fetch.segment_below_rate"),
    ],
)
def test_fetch_config_is_validated_by_key(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as info:
        parse_config(data)
    assert "S3CRET" not in str(info.value)


def test_segment_keys_default_and_bounds() -> None:
    assert (parse_config({}).fetch.segments, parse_config({}).fetch.segment_min_size) == (
        8,
        64 << 20,
    )
    edge = parse_config({"fetch": {"segments": 16, "segment_min_size": 1 << 20}}).fetch
    assert (edge.segments, edge.segment_min_size) == (16, 1 << 20)
    assert parse_config({"fetch": {"segments": 1}}).fetch.segments == 1  # 1: off
    assert parse_config({}).fetch.segment_below_rate == 200_000_000
    assert parse_config({"fetch": {"segment_below_rate": 0}}).fetch.segment_below_rate == 0


def test_an_index_past_the_old_64_mib_cap_resolves(make_world: MakeWorld) -> None:
    """A toolkit index of 70 MiB (the four packages among ~110,000 other stanzas, as a
    CUDA repository grows) is fetched, verified through its signed Release and read in
    one pass; the node boots. 64 MiB used to fail it with INDEX_INVALID (35)."""
    w = make_world("h100-pcie")
    repo = next((w.docroot / "toolkit").iterdir())
    index = repo / "Packages"
    filler = "".join(
        f"\nPackage: cuda-filler-{i}\nVersion: 12.{i % 10}-1\nArchitecture: {repo.name}\n"
        f"Filename: ./cuda-filler-{i}.deb\nSize: 1\nSHA256: {'b' * 64}\n"
        "Description: a stanza no node here needs\n"
        for i in range(520_000)
    )
    index.write_text(filler.lstrip("\n") + "\n" + index.read_text())
    assert index.stat().st_size > 70 << 20
    art.sign_repository(repo, art.shared_signer(), arch=repo.name)
    result = run_in_process(w)
    assert result.outcome.ok, result.outcome.message
    [fetched] = [e for e in _events(result, "index.fetched") if e["index"] == "toolkit_packages"]
    assert fetched["size"] == index.stat().st_size
