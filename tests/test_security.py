"""What runs is what was verified, archives and indexes cannot escape, secrets stay out
of every output, and what bootfsm keeps on the node is readable by root only.

docs/security.md states the threat model these tests hold bootfsm to.
"""

from __future__ import annotations

import ast
import io
import json
import lzma
import os
import stat
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError
from bootfsm.fetch.artifacts import sha256_of
from bootfsm.host.archive import check_member
from bootfsm.host.host import Host
from bootfsm.sim import artifacts as art
from bootfsm.sim.world import DRIVER_VERSION, TOOLKIT_VERSION, World
from tests.conftest import MakeWorld

REPO = Path(__file__).resolve().parents[1]
STATE_DIR = "var/lib/bootfsm"
CACHE_DIR = "var/cache/bootfsm"
LOG_DIR = "var/log/bootfsm"


def cli(
    w: World, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """A bootfsm command on the world's node (`run` when no args)."""
    argv = w.argv() if not args else [sys.executable, "-m", "bootfsm", *args, "--root", str(w.root)]
    return subprocess.run(
        argv, env=env or w.env(), capture_output=True, text=True, timeout=120, check=False
    )


# -- no shell -------------------------------------------------------------------------
def _product_sources() -> list[Path]:
    return sorted([*(REPO / "bootfsm").rglob("*.py"), *(REPO / "states").glob("*.py")])


def _shell_uses(path: Path) -> list[str]:
    """Calls that hand a string to a shell: shell=True, os.system/popen, sh -c argv."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            f = node.func
            name = f"{getattr(f.value, 'id', '')}.{f.attr}" if isinstance(f, ast.Attribute) else ""
            if name in (
                "os.system",
                "os.popen",
                "subprocess.getoutput",
                "subprocess.getstatusoutput",
            ):
                found.append(f"{path.name}:{node.lineno} {name}")
            if name.startswith("os.spawn") or name.startswith("pty.spawn"):
                found.append(f"{path.name}:{node.lineno} {name}")
            for kw in node.keywords:
                if kw.arg == "shell" and not (
                    isinstance(kw.value, ast.Constant) and kw.value.value is False
                ):
                    found.append(f"{path.name}:{node.lineno} shell=")
        if isinstance(node, ast.List | ast.Tuple) and len(node.elts) >= 2:
            first, second = node.elts[0], node.elts[1]
            if (
                isinstance(first, ast.Constant)
                and first.value in ("sh", "bash", "/bin/sh", "/bin/bash")
                and isinstance(second, ast.Constant)
                and second.value == "-c"
            ):
                found.append(f"{path.name}:{node.lineno} {first.value} -c")
    return found


def test_no_subprocess_uses_a_shell() -> None:
    """Every command is an argv list run without a shell, in the product and the sim."""
    sources = _product_sources()
    assert len(sources) > 40
    uses = [u for p in sources for u in _shell_uses(p)]
    assert not uses, uses


def test_the_shell_check_finds_shells(tmp_path: Path) -> None:
    """The check above can fail: it finds each way of reaching a shell."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import os, subprocess\n"
        "subprocess.run('ls', shell=True)\n"
        "os.system('ls')\n"
        "os.popen('ls')\n"
        "subprocess.run(['sh', '-c', 'ls'])\n"
    )
    assert len(_shell_uses(bad)) == 4


# -- archives -------------------------------------------------------------------------
Member = tuple[str, bytes, str, bytes]  # name, type, linkname, content


def _tar_xz(path: Path, members: list[Member]) -> Path:
    """A real .tar.xz with exactly these members (tarfile writes what it is told)."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tf:
        for name, type_, linkname, data in members:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode, info.mtime = type_, linkname, 0o755, 1
            info.size = len(data) if type_ == tarfile.REGTYPE else 0
            tf.addfile(info, io.BytesIO(data) if type_ == tarfile.REGTYPE else None)
    path.write_bytes(lzma.compress(raw.getvalue(), format=lzma.FORMAT_XZ))
    return path


F, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
OK_TOP = [("fm", D, "", b""), ("fm/bin", D, "", b""), ("fm/bin/x", F, "", b"ok\n")]
MALICIOUS: dict[str, list[Member]] = {
    "absolute name": [*OK_TOP, ("/tmp/escape", F, "", b"pwned\n")],
    "dot-dot name": [*OK_TOP, ("../escape", F, "", b"pwned\n")],
    "dot-dot inside": [*OK_TOP, ("fm/../../escape", F, "", b"pwned\n")],
    "dot-dot that stays inside": [*OK_TOP, ("fm/bin/../x2", F, "", b"odd\n")],
    "symlink to absolute": [*OK_TOP, ("fm/etc", S, "/etc", b""), ("fm/etc/passwd", F, "", b"r\n")],
    "symlink up and out": [*OK_TOP, ("fm/up", S, "../..", b"")],
    "write through symlink": [
        *OK_TOP,
        ("fm/up", S, "..", b""),  # points at the target itself: inside
        ("fm/up/../escape", F, "", b"pwned\n"),  # lexically fm/escape, really ../escape
    ],
    "file under a symlink": [*OK_TOP, ("fm/lnk", S, "bin", b""), ("fm/lnk/y", F, "", b"y\n")],
    "symlink chain out": [
        *OK_TOP,
        ("fm/bin/s1", S, "../..", b""),  # lexically the target dir: inside
        ("fm/s2", S, "bin/s1/..", b""),  # lexically fm, really the target's parent
    ],
    "hard link to absolute": [*OK_TOP, ("fm/pw", H, "/etc/passwd", b"")],
    "hard link up": [*OK_TOP, ("fm/pw", H, "../outside", b"")],
    "device": [*OK_TOP, ("fm/dev", tarfile.CHRTYPE, "", b"")],
    "fifo": [*OK_TOP, ("fm/fifo", tarfile.FIFOTYPE, "", b"")],
}


@pytest.mark.parametrize("case", MALICIOUS)
def test_malicious_archive_is_refused_before_writing(tmp_path: Path, case: str) -> None:
    """Each archive is refused with UNSAFE_ARCHIVE and nothing at all is extracted."""
    node = tmp_path / "node"
    (node / "work").mkdir(parents=True)
    archive = _tar_xz(tmp_path / "evil.tar.xz", MALICIOUS[case])
    with pytest.raises(BootError) as err:
        Host(node).extract_tar(archive, "/work/extract")
    assert err.value.code is Code.UNSAFE_ARCHIVE, err.value.message
    assert "refusing archive evil.tar.xz" in err.value.message
    assert not (node / "work/extract").exists() or not any((node / "work/extract").iterdir())
    assert not (node / "work/escape").exists() and not (node / "escape").exists()
    assert not (tmp_path / "escape").exists()


def test_safe_archive_extracts_with_inside_links(tmp_path: Path) -> None:
    """The refusals above are not blanket: inside links (as the FM archive has) extract."""
    archive = _tar_xz(
        tmp_path / "ok.tar.xz",
        [
            *OK_TOP,
            ("fm/lib", D, "", b""),
            ("fm/lib/libnvfm.so.1", F, "", b"\x7fELF"),
            ("fm/lib/libnvfm.so", S, "libnvfm.so.1", b""),
            ("fm/lib/up", S, "../bin/x", b""),
            ("fm/bin/x.hard", H, "fm/bin/x", b""),
        ],
    )
    names = Host(tmp_path).extract_tar(archive, "/extract")
    assert "fm/lib/libnvfm.so" in names
    out = tmp_path / "extract/fm"
    assert (out / "lib/libnvfm.so").resolve() == (out / "lib/libnvfm.so.1").resolve()
    assert (out / "bin/x.hard").read_bytes() == b"ok\n"
    assert (tmp_path / "extract").stat().st_mode & 0o777 == 0o700
    assert not (out / "bin/x").stat().st_mode & 0o022  # no group/other write (data filter)


def test_check_member_rules() -> None:
    """The pure rule: names and link targets stay inside; devices and FIFOs never pass."""
    assert check_member("a/b", F) is None
    assert check_member("a/link", S, "../b") is None
    assert check_member("a/../../b", F) is not None
    assert check_member("a/link", S, "../../b") is not None
    assert check_member("", F) is not None
    assert check_member("a\x00b", F) is not None


def test_malicious_fabric_manager_archive_from_the_mirror(make_world: MakeWorld) -> None:
    """A mirror serving an escaping FM archive (with a manifest that vouches for it) makes
    the run fail UNSAFE_ARCHIVE in fabric; nothing lands outside the extract directory."""
    w = make_world("h100-hgx")
    [fm] = (w.docroot / "redist/fabricmanager").glob("*/*.tar.xz")
    top = fm.name.removesuffix(".tar.xz")
    _tar_xz(
        fm,
        [
            (top, D, "", b""),
            (f"{top}/up", S, "..", b""),
            (f"{top}/up/../../../../etc/cron.d/evil", F, "", b"* * * * * root sh\n"),
        ],
    )
    manifest = w.docroot / f"redist/redistrib_{DRIVER_VERSION}.json"
    doc = json.loads(manifest.read_text())
    for comp in doc.values():
        for plat in comp.values() if isinstance(comp, dict) else []:
            if isinstance(plat, dict) and plat.get("relative_path", "").endswith(fm.name):
                plat.update(sha256=sha256_of(fm), size=str(fm.stat().st_size))
    manifest.write_text(json.dumps(doc))
    r = cli(w)
    assert r.returncode == Code.UNSAFE_ARCHIVE, r.stdout + r.stderr
    assert "state=fabric" in r.stdout and "refusing archive" in r.stdout
    assert not list(w.base.rglob("cron.d/evil"))


# -- indexes that try to leave the repository -----------------------------------------
def _poison_packages(w: World, filename: str) -> None:
    [index] = (w.docroot / "toolkit").glob("*/Packages")
    text = index.read_text()
    first = next(line for line in text.splitlines() if line.startswith("Filename:"))
    index.write_text(text.replace(first, f"Filename: {filename}", 1))
    # signed by the repository's own key: a publisher (or its key) gone bad, so the
    # signature and Release checks pass and the Filename check is what refuses it
    art.sign_repository(index.parent, art.shared_signer(), arch=index.parent.name)


def _poison_redistrib(w: World, path: str) -> None:
    manifest = w.docroot / f"redist/redistrib_{DRIVER_VERSION}.json"
    doc = json.loads(manifest.read_text())
    for comp in doc.values():
        for plat in comp.values() if isinstance(comp, dict) else []:
            if isinstance(plat, dict) and "relative_path" in plat:
                plat["relative_path"] = path
    manifest.write_text(json.dumps(doc))


POISON: dict[str, tuple[Callable[[World, str], None], str, str]] = {
    "Packages ../": (_poison_packages, "../../../../etc/shadow", "climbs out of the repository"),
    "Packages absolute": (_poison_packages, "/etc/shadow", "is absolute"),
    "Packages URL": (_poison_packages, "https://evil.example/x.deb", "empty path component"),
    "Packages backslash": (_poison_packages, "pool\\..\\..\\x.deb", "backslash"),
    "redistrib ../": (_poison_redistrib, "../../../etc/fm.tar.xz", "unsafe relative_path"),
    "redistrib absolute": (_poison_redistrib, "/srv/evil.tar.xz", "unsafe relative_path"),
    "redistrib URL": (_poison_redistrib, "https://evil.example/fm.tar.xz", "unsafe relative_path"),
}


@pytest.mark.parametrize("case", POISON)
def test_index_path_leaving_the_repository_is_refused(make_world: MakeWorld, case: str) -> None:
    """The fetch fails INDEX_INVALID naming the problem, before any artifact is requested."""
    poison, value, needle = POISON[case]
    w = make_world("h100-hgx")
    poison(w, value)
    r = cli(w)
    assert r.returncode == Code.INDEX_INVALID, r.stdout + r.stderr
    assert "state=fetch" in r.stdout and needle in r.stdout, r.stdout
    fetched = [e.path for e in w.mirror.log if e.path.endswith((".deb", ".run", ".tar.xz"))]
    assert not fetched, f"downloaded before the index was judged: {fetched}"
    assert not [c for c in w.calls() if c["cmd"] in ("dpkg", "nvidia-installer")]


# -- verify, then use the verified file -----------------------------------------------
def test_corrupt_download_is_never_used(make_world: MakeWorld) -> None:
    """A runfile that does not hash to its sha256 fails CHECKSUM_MISMATCH; nothing ran."""
    w = make_world("h100-pcie", faults=("checksum-mismatch",))
    r = cli(w)
    assert r.returncode == Code.CHECKSUM_MISMATCH, r.stdout + r.stderr
    assert not [
        c for c in w.calls() if c["cmd"] in ("dpkg", "nvidia-installer", "update-initramfs")
    ]
    assert not list((w.root / CACHE_DIR).glob("*/*.run")), "unverified runfile under its name"


_HOLD = """\
#!{python}
import os, sys, time
open({reached!r}, "w").close()
while not os.path.exists({release!r}):
    time.sleep(0.01)
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
"""


def test_cache_swapped_after_fetch_is_caught_before_use(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """Between fetch and driver the cached runfile changes (bit rot, or root on the node):
    it is hashed again right before it runs, so the run fails and it never executes."""
    w = make_world("h100-pcie")
    hold = tmp_path / "hold"
    hold.mkdir()
    reached, release = hold / "reached", hold / "release"
    gate = hold / "update-initramfs"
    gate.write_text(
        _HOLD.format(
            python=sys.executable,
            reached=str(reached),
            release=str(release),
            real=str(w.bin_dir / "update-initramfs"),
        )
    )
    gate.chmod(0o755)
    env = w.env()
    env["PATH"] = f"{hold}{os.pathsep}{env['PATH']}"
    child = subprocess.Popen(w.argv(), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        while not reached.exists():
            assert child.poll() is None and time.monotonic() < end
            time.sleep(0.01)
        [runfile] = (w.root / CACHE_DIR).glob("*/*.run")
        data = bytearray(runfile.read_bytes())
        data[-100] ^= 0x01
        runfile.write_bytes(bytes(data))
        release.touch()
        out, _ = child.communicate(timeout=120)
    finally:
        child.kill()
    text = out.decode()
    assert child.returncode == Code.CHECKSUM_MISMATCH, text
    assert "state=driver" in text and "no longer matches" in text
    assert not [c for c in w.calls() if c["cmd"] == "nvidia-installer"]
    [journal] = w.journals()
    argv0 = [json.loads(x).get("argv", [""])[0] for x in journal.read_text().splitlines()]
    assert not [a for a in argv0 if a.endswith(".run")], "the swapped runfile was executed"


# -- what bootfsm keeps on the node is root's only ------------------------------------
def _mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


def test_state_cache_and_journal_modes(make_world: MakeWorld) -> None:
    """Directories 0700, files 0600 (the cached runfile too: what runs is its private
    0700 copy in <state_dir>/extract); no directory on the way to what bootfsm executes
    is writable by anyone but root."""
    w = make_world("h100-hgx")
    r = cli(w)
    assert r.returncode == 0, r.stdout + r.stderr
    state, cache, logs = w.root / STATE_DIR, w.root / CACHE_DIR, w.root / LOG_DIR
    subdirs = [p for p in (*cache.iterdir(), *(state / "extract").iterdir()) if p.is_dir()]
    for d in (state, cache, logs, state / "extract", *subdirs):
        assert _mode(d) == 0o700, f"{d}: {oct(_mode(d))}"
    for f in [*state.glob("*"), *logs.glob("*"), *cache.glob("*"), *cache.glob("*/*")]:
        if f.is_dir():
            continue
        assert _mode(f) == 0o600, f"{f}: {oct(_mode(f))}"
    [copy] = state.glob("extract/*.run")
    assert _mode(copy) == 0o700
    [metrics] = w.root.glob("var/lib/node_exporter/textfile_collector/bootfsm.prom")
    assert _mode(metrics) == 0o644  # node_exporter runs unprivileged; only root writes it
    used = [p for p in cache.glob("*/*")] + [state / "extract"]
    for p in used:
        for parent in p.relative_to(w.root).parents:
            d = w.root / parent
            assert not _mode(d) & 0o022, f"{d} is writable by group or others"
            assert d.stat().st_uid == 0 or os.geteuid() != 0


# -- secrets --------------------------------------------------------------------------
SECRETS = ("SeCrEtSiG1", "SeCrEtSiG2", "SeCrEtSiG3", "SeCrEtPaSs")


def _sign(w: World, scenario: str) -> None:
    """Point every source at signed URLs; a scenario adds where a signed URL fails: a
    dead primary with its own token, a URL template with a typo next to its token
    (CONFIG_INVALID), a kubelet /healthz URL with a signature that never answers ok."""
    u = w.mirror.url
    host = u.split("//", 1)[1]
    src: dict[str, Any] = {
        "runfile_base": f"{u}/tesla?sv=2024&sig={SECRETS[0]}",
        "redist_base": f"http://nobody:{SECRETS[3]}@{host}/redist?sig={SECRETS[1]}",
        "toolkit_repo": f"{u}/toolkit/{{debian_arch}}?se=2030&sig={SECRETS[2]}",
    }
    over: dict[str, dict[str, Any]] = {"sources": src, "run": {"cse_events_dir": "/var/log/cse"}}
    if scenario == "dead-primary":
        src["runfile_mirrors"] = [src["runfile_base"]]
        src["runfile_base"] = f"http://127.0.0.1:9/tesla?sig={SECRETS[0]}"
    if scenario == "template-typo":
        src["toolkit_repo"] = f"{u}/toolkit/{{debian_archh}}?se=2030&sig={SECRETS[2]}"
    if scenario == "kubelet-signature":
        over["join"] = {"kubelet_healthz_url": f"{u}/healthz?sig={SECRETS[1]}"}
    w.config_overrides = over
    w.write_config()


def _leaks(text: str) -> list[str]:
    return [s for s in SECRETS if s in text]


SCENARIOS = [  # (scenario, simulated fault, exit code)
    ("dead-primary", "", Code.OK),
    ("checksum-mismatch", "checksum-mismatch", Code.CHECKSUM_MISMATCH),
    ("template-typo", "", Code.CONFIG_INVALID),
    ("kubelet-signature", "kubelet-unhealthy", Code.KUBELET_NOT_HEALTHY),
]


@pytest.mark.parametrize(("scenario", "fault", "code"), SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_url_tokens_never_printed(
    make_world: MakeWorld, httpserver: Any, scenario: str, fault: str, code: Code
) -> None:
    """Signed URLs (query and user:password) never reach anything a run leaves: its
    output, the journal, trace (text, JSON, HTML, history), status, plan, the checkpoint,
    the metrics textfile, the CSE events and the OTLP export it sends; only root's
    config and resolved.json hold them. Also when a signed URL is what fails."""
    exported: list[bytes] = []
    httpserver.expect_request("/v1/traces", method="POST").respond_with_handler(
        lambda request: exported.append(request.get_data()) or _ok()
    )
    w = make_world("h100-hgx", faults=(fault,) if fault else ())
    _sign(w, scenario)
    env = {**w.env(), "OTEL_EXPORTER_OTLP_ENDPOINT": httpserver.url_for("/").rstrip("/")}
    run = cli(w, env=env)
    assert run.returncode == code, run.stdout + run.stderr
    assert exported, "the run sent no OTLP export"
    outputs = {"run": run.stdout + run.stderr}
    outputs |= {f"otlp {i}": body.decode("utf-8", "replace") for i, body in enumerate(exported)}
    for name, args in {
        "trace": ("trace",),
        "trace --json": ("trace", "--json"),
        "trace --history": ("trace", "--history"),
        "status": ("status",),
        "status --json": ("status", "--json"),
        "plan": ("plan",),
        "plan --json": ("plan", "--json"),
    }.items():
        r = cli(w, *args)
        assert "Traceback" not in r.stderr, f"{name}: {r.stderr}"
        outputs[name] = r.stdout + r.stderr
    html = w.base / "trace.html"
    assert cli(w, "trace", "--html", str(html)).returncode == 0
    outputs["trace --html"] = html.read_text()
    for name, text in outputs.items():
        assert not _leaks(text), f"{name} shows {_leaks(text)}"
    allowed = {w.config_path, w.root / STATE_DIR / "resolved.json"}
    scanned = set()
    for f in w.root.rglob("*"):
        if f.is_file() and not f.is_symlink() and f not in allowed:
            found = _leaks(f.read_bytes().decode("utf-8", "replace"))
            assert not found, f"{f.relative_to(w.root)} holds {found}"
            scanned.add(f.relative_to(w.root).parts[:3])
    for kind in (("var", "log", "bootfsm"), ("var", "log", "cse"), ("var", "lib", "bootfsm")):
        assert kind in scanned, f"nothing under {'/'.join(kind)} was scanned"
    assert list(w.root.glob("var/lib/node_exporter/textfile_collector/*.prom"))
    resolved = w.root / STATE_DIR / "resolved.json"
    if resolved.exists():
        assert _mode(resolved) == 0o600


def test_the_journal_redacts_every_field_it_writes(tmp_path: Path) -> None:
    """Not only error messages: any field of any event (a command's argv and output, a
    reason, a list, a nested map) reaches the file and the console with its URLs'
    queries and credentials and any sig=-like parameter redacted."""
    from bootfsm.observe.journal import Journal

    console = io.StringIO()
    j = Journal(tmp_path / "run.jsonl", run_id="t", console=console, color=False)
    j.event(
        "warning",
        argv=["fetch", f"https://m.example/x.run?sv=1&sig={SECRETS[0]}"],
        output=f"GET https://nobody:{SECRETS[3]}@m.example/y failed",
        detail={"query": [f"token={SECRETS[1]}"]},
        message=f"retrying with se=2030&sig={SECRETS[2]}",
    )
    j.close()
    text = (tmp_path / "run.jsonl").read_text()
    assert not _leaks(text) and not _leaks(console.getvalue())
    [e] = [json.loads(line) for line in text.splitlines()]
    assert e["argv"] == ["fetch", "https://m.example/x.run?<redacted>"]
    assert e["output"] == "GET https://m.example/y failed"
    assert e["detail"] == {"query": ["token=<redacted>"]}


def _ok() -> Any:
    from werkzeug import Response

    return Response("{}", status=200, content_type="application/json")


# -- what dpkg installs is what was hashed ------------------------------------------------
def test_a_deb_swapped_in_the_cache_after_its_hash_is_refused(
    make_world: MakeWorld, tmp_path: Path
) -> None:
    """Fetch hashed the toolkit debs; then, as the driver state asks `dpkg --audit` just
    before installing them, another root process swaps a cached .deb for a payload
    package of the same name. What dpkg gets is a private copy hashed as it is copied:
    the swap is refused (CHECKSUM_MISMATCH) and the payload never reaches dpkg."""
    w = make_world("h100-pcie")
    payload = art.build_deb(
        tmp_path / "payload",
        package="nvidia-container-toolkit",
        version=TOOLKIT_VERSION,
        arch="amd64",
        files={"/usr/bin/payload-ran": b"#!/bin/sh\necho owned\n"},
    )
    real = w.bin_dir / "dpkg"
    cache = w.root / "var/cache/bootfsm"
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    (attacker / "dpkg").write_text(
        f"#!{sys.executable}\n"
        "import glob, os, shutil, sys\n"
        "if '--audit' in sys.argv:\n"
        f"    for cached in glob.glob({str(cache)!r} + '/*/nvidia-container-toolkit_*.deb'):\n"
        f"        shutil.copyfile({str(payload)!r}, cached + '.swap')\n"
        "        os.replace(cached + '.swap', cached)\n"
        f"os.execv({str(real)!r}, [{str(real)!r}, *sys.argv[1:]])\n"
    )
    (attacker / "dpkg").chmod(0o755)
    env = w.env()
    env["PATH"] = f"{attacker}{os.pathsep}{env['PATH']}"
    run = cli(w, env=env)
    assert run.returncode == Code.CHECKSUM_MISMATCH, run.stdout + run.stderr
    assert "changed while it was copied" in run.stdout + run.stderr
    assert any(c["argv"] == ["--audit"] for c in w.calls() if c["cmd"] == "dpkg")
    assert not (w.root / "usr/bin/payload-ran").exists()
    assert [c for c in w.calls() if c["cmd"] == "dpkg" and "-i" in c["argv"]] == []


# -- bad input is a clear error ----------------------------------------------------------
def _validate(tmp_path: Path, text: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    """`bootfsm <cmd> --config FILE` (validate by default) on a node root of its own."""
    cfg = tmp_path / "config.toml"
    cfg.write_text(text)
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "bootfsm", *(cmd or ("validate",)), "--config", str(cfg)]
    return subprocess.run(
        [*argv, "--root", str(root)], capture_output=True, text=True, timeout=60, check=False
    )


def test_every_number_in_the_config_has_a_finite_range() -> None:
    from dataclasses import fields as dc_fields

    from bootfsm.core.config import DEFAULTS, RANGES

    numbers = {
        (sec.name, f.name)
        for sec in dc_fields(DEFAULTS)
        for f in dc_fields(getattr(DEFAULTS, sec.name))
        if isinstance(getattr(getattr(DEFAULTS, sec.name), f.name), int | float)
        and not isinstance(getattr(getattr(DEFAULTS, sec.name), f.name), bool)
    }
    assert numbers == set(RANGES)
    for lo, hi, _ in RANGES.values():
        assert lo < hi < float("inf")


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309", "-1", "1e12"])
def test_config_numbers_out_of_range_are_config_invalid(tmp_path: Path, value: str) -> None:
    """nan, inf, 1e309 (inf in TOML), negatives and absurd values, for every number."""
    from bootfsm.core.config import RANGES, ConfigError
    from bootfsm.core.config_files import load_config

    for section, key in RANGES:
        path = tmp_path / f"{section}-{key}.toml"
        path.write_text(f"[{section}]\n{key} = {value}\n")
        with pytest.raises(ConfigError, match=rf"{section}\.{key}: "):
            load_config(path, required=True)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[run]\ndeadline = nan\n", "run.deadline: expected a finite number"),
        ("[run]\nbackoff_scale = -1\n", "run.backoff_scale: must be >= 0"),
        ("[verify]\nfabric_poll_interval = nan\n", "verify.fabric_poll_interval"),
        ("[fetch]\nparallel = 2.5\n", "fetch.parallel: expected an integer"),
        (
            '[run]\nstate_dir = "/var/lib/../../tmp"\n',
            "run.state_dir: a path must not contain '..'",
        ),
        (
            '[fetch]\ncache_dir = "/var/cache/a\\u0000b"\n',
            "fetch.cache_dir: a path must not contain NUL",
        ),
        ('[run]\nlog_dir = "/var/./log"\n', "run.log_dir: a path must not contain '..' or '.'"),
        ("a = " + "[" * 100_000 + "]" * 100_000 + "\n", "nested too deeply"),
    ],
)
def test_bad_config_is_a_clear_error_never_a_traceback(
    tmp_path: Path, text: str, says: str
) -> None:
    for cmd in (("validate",), ("run",)):
        r = _validate(tmp_path, text, *cmd)
        assert r.returncode == Code.CONFIG_INVALID, (cmd, r.stderr[-2000:])
        assert says in r.stderr, r.stderr[-2000:]
        assert "Traceback" not in r.stdout + r.stderr


SECRET_CONFIGS = [
    '[sources]\nrunfile_mirrors = ["ftp://bob:hunter2@mirror.example/tesla?sig=S3CR3T"]\n',
    '[run]\ndeadline = "https://bob:hunter2@mirror.example/x?sv=2020&sig=S3CR3T"\n',
    '[fetch]\nallow_http_hosts = "https://bob:hunter2@h.example/?sig=S3CR3T"\n',
]


@pytest.mark.parametrize("text", SECRET_CONFIGS)
@pytest.mark.parametrize("cmd", [("validate",), ("plan",), ("status",), ("trace",), ("run",)])
def test_rejected_config_never_prints_its_secrets(
    tmp_path: Path, text: str, cmd: tuple[str, ...]
) -> None:
    r = _validate(tmp_path, text, *cmd)
    assert r.returncode == Code.CONFIG_INVALID, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "hunter2" not in out and "S3CR3T" not in out, out
    assert "config invalid" in out
    journals = list((tmp_path / "root").rglob("*.jsonl"))
    assert all("hunter2" not in p.read_text() for p in journals)


BAD_CHECKPOINTS = [
    "[]",
    '"running"',
    '{"outcome": 5}',
    '{"run_id": "r", "journal": "", "state": "fetch", "outcome": "failed", "code": [31]}',
    '{"run_id": "r", "journal": "", "state": "fetch", "outcome": "nonsense"}',
    '{"run_id": 1, "journal": "", "state": "fetch", "outcome": "running", "pid": "x"}',
    '{"run_id": "r", "journal": "", "state": "join", "outcome": "done", "code_name": {}}',
]


@pytest.mark.parametrize("text", BAD_CHECKPOINTS)
def test_checkpoint_of_the_wrong_shape_is_discarded_with_a_warning(
    make_world: MakeWorld, text: str
) -> None:
    w = make_world("h100-hgx")
    state = w.root / STATE_DIR
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    (state / "checkpoint.json").write_text(text)
    r = cli(w, "status", "--json")
    assert "Traceback" not in r.stderr, r.stderr
    assert "checkpoint.json is unreadable" in r.stderr
    assert json.loads(r.stdout)["status"] == "never-started"
    r = cli(w)  # the run rewrites it
    assert r.returncode == 0, r.stdout + r.stderr
    r = cli(w, "status", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["status"] == "done", r.stdout + r.stderr


BAD_RESOLUTIONS = [
    "[]",
    '{"key": 5, "artifacts": []}',
    '{"key": "k", "artifacts": {}}',
    '{"key": "k", "artifacts": ["x"]}',
    '{"key": "k", "artifacts": [{"name": "n", "role": "runfile", "url": "u", "sha256": 7,'
    ' "size": 1, "filename": "f"}]}',
    '{"key": "k", "artifacts": [{"name": "n", "role": "runfile", "url": "u", "sha256": "",'
    ' "size": 1, "filename": "../../../../etc/passwd"}]}',
    '{"key": "k", "artifacts": [{"name": "n", "role": "runfile", "url": "u", "sha256": "",'
    ' "size": -1, "filename": "f", "mirrors": [3]}]}',
]


@pytest.mark.parametrize("text", BAD_RESOLUTIONS)
def test_resolved_json_of_the_wrong_shape_is_rebuilt(make_world: MakeWorld, text: str) -> None:
    """Not a permanent INTERNAL_ERROR: discarded with a warning, fetch resolves again."""
    from bootfsm.fetch.store import resolution_problem

    w = make_world("h100-hgx")
    state = w.root / STATE_DIR
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    (state / "resolved.json").write_text(text)
    assert resolution_problem(text)
    r = cli(w)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resolved.json is invalid" in r.stdout + r.stderr
    assert resolution_problem((state / "resolved.json").read_text()) == ""
