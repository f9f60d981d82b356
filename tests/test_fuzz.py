"""Fuzzing every reader of outside input with structured mutations of real samples.

tests/parsers/ already feeds each parser arbitrary text; here the inputs are the real
files (nvidia-smi, Packages, redistrib, lspci, dkms, IMDS, os-release, VPD bytes) with
lines deleted, duplicated, swapped, truncated or garbled, plus the config (tables and
file bytes) and journals (a real run's lines mutated, fields retyped). The contract
everywhere: a value or the module's documented error, never another exception; and
what passes keeps the security invariants (no index path leaves its repository).

`make fuzz` runs all of these (and tests/parsers' properties) round-robin for
FUZZ_SECONDS (default 300) and prints how many inputs each property tried.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bootfsm.core.compat import tomllib
from bootfsm.core.config import DEFAULTS, Config, ConfigError, parse_config
from bootfsm.core.config_files import load_config
from bootfsm.observe.trace import parse_events, render, to_json
from bootfsm.parsers import ParseError
from bootfsm.parsers.debian_packages import parse_packages, safe_filename
from bootfsm.parsers.driver_info import (
    parse_containerd_version,
    parse_dkms_status,
    parse_module_version,
    parse_proc_driver_version,
)
from bootfsm.parsers.nvidia_smi import SmiFailure, classify_smi_failure
from bootfsm.parsers.osrelease import parse_os_release
from bootfsm.parsers.pci import parse_sysfs_hex, vpd_has_sw_mng
from bootfsm.parsers.redistrib import parse_redistrib
from bootfsm.parsers.vmsize import parse_imds_vm_size
from tests.lspci import parse_lspci_nn
from tests.parsers.test_parse_osrelease import AZURE_LINUX_3, ROCKY_9, UBUNTU_2204
from tests.samples import sample
from tests.smi_text import parse_smi_query

COUNT: dict[str, int] = {}  # inputs tried per property in `make fuzz`


# -- structured mutations -------------------------------------------------------------
OPS = ("delete", "duplicate", "swap", "truncate", "garble", "indent", "join", "blank")
_op = st.tuples(
    st.sampled_from(OPS), st.integers(0, 1 << 16), st.text(max_size=12), st.integers(0, 1 << 16)
)


def mutate(lines: list[str], ops: list[tuple[str, int, str, int]]) -> list[str]:
    """Apply line operations (index and cut position taken modulo the current length)."""
    out = list(lines)
    for op, i, text, k in ops:
        if not out:
            out = [text]
            continue
        i %= len(out)
        line = out[i]
        if op == "delete":
            del out[i]
        elif op == "duplicate":
            out.insert(i, line)
        elif op == "swap" and i + 1 < len(out):
            out[i], out[i + 1] = out[i + 1], line
        elif op == "truncate":
            out[i] = line[: k % (len(line) + 1)]
        elif op == "garble":
            at = k % (len(line) + 1)
            out[i] = line[:at] + text + line[at + len(text) :]
        elif op == "indent":
            out[i] = " " * (k % 9) + line.lstrip() if k % 2 else line.lstrip()
        elif op == "join" and i + 1 < len(out):
            out[i : i + 2] = [line + out[i + 1]]
        elif op == "blank":
            out.insert(i, "")
    return out


def mutated(text: str) -> st.SearchStrategy[str]:
    """``text`` with up to 8 line operations, then maybe cut at any character."""
    lines = text.split("\n")

    def build(ops: list[tuple[str, int, str, int]], cut: int | None) -> str:
        out = "\n".join(mutate(lines, ops))
        return out if cut is None else out[: cut % (len(out) + 1)]

    return st.builds(build, st.lists(_op, max_size=8), st.none() | st.integers(0, 1 << 20))


def _json_values() -> st.SearchStrategy[Any]:
    leaf = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=16)
    return st.recursive(
        leaf,
        lambda kids: (
            st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=8), kids, max_size=3)
        ),
        max_leaves=8,
    )


def _json_paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _json_paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _json_paths(v, (*prefix, i))
    return out


def json_mutated(text: str) -> st.SearchStrategy[str]:
    """A JSON document with values replaced by any JSON, keys dropped, then re-dumped."""
    doc = json.loads(text)
    paths = _json_paths(doc)[1:]

    def build(edits: list[tuple[int, bool, Any]]) -> str:
        d = json.loads(text)
        for which, drop, value in edits:
            *head, last = paths[which % len(paths)]
            node = d
            try:
                for key in head:
                    node = node[key]
                if drop and isinstance(node, dict):
                    node.pop(last, None)
                else:
                    node[last] = value
            except (KeyError, IndexError, TypeError):
                continue
        return json.dumps(d)

    return st.builds(
        build,
        st.lists(st.tuples(st.integers(0, 1 << 16), st.booleans(), _json_values()), max_size=6),
    )


def parses_or_parse_error(fn: Callable[[str], Any], text: str) -> Any:
    """The parser's value, or None when it raised ParseError; anything else fails."""
    try:
        return fn(text)
    except ParseError:
        return None


# -- parsers of node and mirror output ------------------------------------------------
SMI_SAMPLES = (
    "nvidia-smi/q_8xH100-HBM3_hgx_535.161.08_gpud.txt",
    "nvidia-smi/q_1xA10_535.129.03_gpud.txt",
    "nvidia-smi/q_1xTITANV_560.35.03_gpud.txt",
    "nvidia-smi/thamada/H200x1_gls_q.txt",
    "nvidia-smi/q_H100_truncated_invalid_535.183.01_gpud.txt",
)
PACKAGES = "apt/libnvidia-container_stable_deb_amd64_Packages_1.17.2_excerpt.deb822"
REDISTRIB = "redistrib/redistrib_cuda_12.8.2_driver-components_trimmed.json"
LSPCI = "lspci/lspci-nn_azure_nd96asr_a100_gpud.txt"
DRIVER = "driver/proc_version_modinfo_dkms_excerpts.txt"
IMDS = "azure-imds/imds_compute_docs_sample_linux.json"
NVML = "nvidia-smi/nvml_error_excerpts.txt"


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SMI_SAMPLES), st.data())
def test_fuzz_nvidia_smi_query(name: str, data: st.DataObject) -> None:
    """Mutated real `nvidia-smi -q`: a report with sane counts, or ParseError."""
    text = data.draw(mutated(sample(name)))
    report = parses_or_parse_error(parse_smi_query, text)
    if report is not None:
        assert report.attached_gpus >= 0 and all(isinstance(g.bus_id, str) for g in report.gpus)
    # a healthy report, however mangled, is never read as a driver failure
    assert classify_smi_failure(text) is None


MISMATCH_LINE = "Failed to initialize NVML: Driver/library version mismatch"
INFOROM_LINE = "infoROM is corrupted"


@given(st.deferred(lambda: mutated(sample(NVML))))
def test_fuzz_nvml_failure_classifier(text: str) -> None:
    """Real NVML failure outputs (the excerpts file: mismatch lines under shell prompts
    and kernel log lines, infoROM warnings after a table), lines mangled: nvidia-smi's
    mismatch line, wherever it survives, makes a mismatch, even beside an infoROM
    warning (the driver is unusable, the infoROM only warned); an infoROM warning
    alone makes INFOROM_CORRUPTED; with neither line intact there is no verdict (the
    file holds no other failure nvidia-smi prints)."""
    if MISMATCH_LINE in text:
        want: SmiFailure | None = SmiFailure.DRIVER_LIBRARY_MISMATCH
    elif INFOROM_LINE in text:
        want = SmiFailure.INFOROM_CORRUPTED
    else:
        want = None
    assert classify_smi_failure(text) is want


@given(st.deferred(lambda: mutated(sample(PACKAGES))))
@example("Package: x\nVersion: 1\nArchitecture: all\nFilename: a/../../b.deb\nSize: 1\nSHA256: "
         + "a" * 64 + "\n")  # fmt: skip
def test_fuzz_packages_index(text: str) -> None:
    """Mutated real Packages index: entries whose Filename stays in the repository."""
    for e in parses_or_parse_error(parse_packages, text) or []:
        assert safe_filename(e.filename) == e.filename
        parts = e.filename.split("/")
        assert ".." not in parts and not e.filename.startswith("/") and "\\" not in e.filename
        assert isinstance(e.size, int) and e.size >= 0


def _check_redistrib(text: str) -> None:
    manifest = parses_or_parse_error(parse_redistrib, text)
    for comp in manifest.components.values() if manifest else []:
        for art in comp.platforms.values():
            parts = art.relative_path.split("/")
            assert ".." not in parts and "" not in parts and not art.relative_path.startswith("/")


@given(st.deferred(lambda: json_mutated(sample(REDISTRIB))))
def test_fuzz_redistrib_structure(text: str) -> None:
    """Real redistrib JSON with values retyped or dropped: safe paths, or ParseError."""
    _check_redistrib(text)


@given(st.deferred(lambda: mutated(sample(REDISTRIB))))
def test_fuzz_redistrib_lines(text: str) -> None:
    """Real redistrib JSON with lines cut or shuffled (torn downloads): same contract."""
    _check_redistrib(text)


@given(st.deferred(lambda: mutated(sample(LSPCI))))
def test_fuzz_lspci(text: str) -> None:
    """Mutated real `lspci -nn`: devices with 16-bit ids, or ParseError."""
    for d in parses_or_parse_error(parse_lspci_nn, text) or []:
        assert 0 <= d.vendor <= 0xFFFF and 0 <= d.device <= 0xFFFF


@given(mutated("0x10de\n") | mutated("0x030200\n") | mutated("0x2330\n"))
def test_fuzz_sysfs_hex(text: str) -> None:
    """Mutated sysfs vendor/class/device values: a non-negative int, or ParseError."""
    value = parses_or_parse_error(lambda t: parse_sysfs_hex(t, what="vendor"), text)
    assert value is None or value >= 0


@functools.cache
def _vpd() -> bytes:
    from bootfsm.sim.node_layout import vpd as real_layout  # a ConnectX-7 VPD, SW_MNG keyword set

    return real_layout(True)


@given(
    st.lists(st.tuples(st.integers(0, 1 << 16), st.integers(0, 255)), max_size=6),
    st.integers(0, 1 << 16),
)
def test_fuzz_vpd_bytes(flips: list[tuple[int, int]], cut: int) -> None:
    """Binary PCI VPD (a ConnectX-7's, SW_MNG keyword set) with bytes changed and cut
    anywhere: NVLink5 management is seen exactly while the keyword's six bytes are
    read whole and unchanged; a VPD read short of it, or with a byte of it flipped,
    never claims it."""
    genuine = _vpd()
    at_kw = genuine.index(b"SW_MNG")
    data = bytearray(genuine)
    for at, value in flips:
        data[at % len(data)] = value
    read = bytes(data[: cut % (len(data) + 1)])
    intact = read[at_kw : at_kw + 6] == b"SW_MNG"
    assert vpd_has_sw_mng(read) is intact or b"SW_MNG" in read.replace(b"SW_MNG", b"", 1)


@given(st.sampled_from([UBUNTU_2204, AZURE_LINUX_3, ROCKY_9]).flatmap(mutated))
def test_fuzz_os_release(text: str) -> None:
    """Mutated real /etc/os-release files: an OsRelease, or ParseError."""
    parses_or_parse_error(parse_os_release, text)


@given(st.deferred(lambda: mutated(sample(DRIVER))))
def test_fuzz_driver_info(text: str) -> None:
    """Mutated /proc/driver/nvidia/version, modinfo, dkms and containerd outputs."""
    for fn in (
        parse_proc_driver_version,
        parse_dkms_status,
        parse_module_version,
        parse_containerd_version,
    ):
        parses_or_parse_error(fn, text)


@given(st.deferred(lambda: json_mutated(sample(IMDS)) | mutated(sample(IMDS))))
def test_fuzz_imds(text: str) -> None:
    """Real IMDS documents retyped, dropped or torn: a VM size string, or ParseError."""
    size = parses_or_parse_error(parse_imds_vm_size, text)
    assert size is None or isinstance(size, str)


# -- the config -----------------------------------------------------------------------
_SECTIONS = {f.name: [k.name for k in fields(getattr(DEFAULTS, f.name))] for f in fields(Config)}
_toml_leaf = (
    st.booleans()
    | st.integers(-(1 << 70), 1 << 70)
    | st.floats()
    | st.text(max_size=20)
    | st.lists(st.text(max_size=8), max_size=3)
    | st.lists(st.integers(), max_size=2)
)


@st.composite
def config_tables(draw: st.DrawFn) -> dict[str, Any]:
    """Tables shaped like the real config: known and unknown sections, keys and types."""
    out: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from([*_SECTIONS, "extra"]), max_size=4)):
        keys = _SECTIONS.get(section, ["x"])
        table = draw(
            st.dictionaries(st.sampled_from([*keys, "unknown_key"]), _toml_leaf, max_size=4)
        )
        out[section] = draw(st.sampled_from([table, table, [table], "not a table"]))
    return out


@given(config_tables())
def test_fuzz_config_tables(data: dict[str, Any]) -> None:
    """Any tables: a Config that survives a JSON round trip unchanged, or ConfigError."""
    try:
        cfg = parse_config(data)
    except ConfigError:
        return
    again = parse_config(json.loads(json.dumps(cfg.to_dict())))
    assert again == cfg and again.digest() == cfg.digest()


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return json.dumps(v)


REAL_CONFIG = "".join(
    f"[{sec}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in table.items()) + "\n"
    for sec, table in DEFAULTS.to_dict().items()
)


def test_the_rendered_default_config_is_the_defaults() -> None:
    """The config the file fuzzers mutate is a real, complete one."""
    assert parse_config(tomllib.loads(REAL_CONFIG)) == DEFAULTS


@given(mutated(REAL_CONFIG).map(str.encode) | st.binary(max_size=200))
@example(b"\xff\xfe[run]\n")  # not UTF-8: was a UnicodeDecodeError traceback
def test_fuzz_config_file(body: bytes) -> None:
    """Any config file bytes: a Config, or ConfigError naming the file."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.toml"
        path.write_bytes(body)
        try:
            load_config(path, required=True)
        except ConfigError as exc:
            assert str(path) in str(exc)


# -- journals -------------------------------------------------------------------------
@functools.cache
def real_journal() -> tuple[str, ...]:
    """The journal lines of one real, successful run (every state, 503s retried)."""
    from bootfsm.sim.world import World
    from tests.conftest import run_in_process

    with tempfile.TemporaryDirectory() as d, World(Path(d), "h100-pcie", ("http-503x3",)) as w:
        result = run_in_process(w)
        assert result.outcome.ok and result.journal is not None
        return tuple(result.journal.read_text().splitlines())


def _fold(lines: list[str]) -> None:
    """parse_events, then every view of the report: none may raise."""
    from bootfsm.observe.trace_html import render_html

    report = parse_events(lines, source="fuzz.jsonl")
    render(report)
    json.dumps(to_json(report), default=str)
    render_html(report)


@st.composite
def retyped_journal(draw: st.DrawFn) -> list[str]:
    """Real journal lines, each edit giving one field of one event a value of any type."""
    lines = list(real_journal())
    for _ in range(draw(st.integers(0, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        ev = json.loads(lines[i]) if lines[i].startswith("{") else {}
        if not isinstance(ev, dict) or not ev:
            continue
        key = draw(st.sampled_from(sorted(ev)))
        ev[key] = draw(_json_values())
        lines[i] = json.dumps(ev)
    return lines


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(_op, max_size=8), retyped_journal())
def test_fuzz_journal_lines(ops: list[tuple[str, int, str, int]], lines: list[str]) -> None:
    """A real journal with fields retyped and lines deleted, duplicated, torn or garbled:
    the trace, its JSON and its HTML always come out."""
    _fold(mutate(lines, ops))


@settings(suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.integers(0, 1 << 20))
def test_fuzz_journal_cut_anywhere(cut: int) -> None:
    """A journal cut at any byte (a crash or power loss mid-write) reads as a run that did
    not end, with a warning that says so; the full one reads as done."""
    text = "\n".join(real_journal())
    cut %= len(text) + 1
    report = parse_events(text[:cut].split("\n"))
    if cut == len(text):
        assert report.outcome == "done"
    elif report.events:
        ended = '"run.end"' in text[:cut].rsplit("\n", 1)[0]
        assert ended or any("no run.end" in w for w in report.warnings)


# -- `make fuzz`: every property above and in tests/parsers, for a set time -----------
FUZZ_SECONDS = float(os.environ.get("FUZZ_SECONDS", "0") or 0)


def _properties() -> dict[str, Callable[[], None]]:
    """Every fixture-free hypothesis test of outside input, by name."""
    import importlib

    mods = [importlib.import_module(__name__)]
    for p in sorted((Path(__file__).parent / "parsers").glob("test_*.py")):
        mods.append(importlib.import_module(f"tests.parsers.{p.stem}"))
    mods.append(importlib.import_module("tests.test_trace_read"))  # arbitrary journal lines
    props: dict[str, Callable[[], None]] = {}
    for mod in mods:
        for name, fn in vars(mod).items():
            if not (name.startswith("test_") and hasattr(fn, "hypothesis")):
                continue
            if not inspect.signature(fn).parameters:  # no pytest fixtures needed
                props[f"{mod.__name__.rsplit('.', 1)[-1]}::{name}"] = fn
    return props


def _count_calls(name: str, fn: Callable[[], None]) -> None:
    inner = fn.hypothesis.inner_test  # type: ignore[attr-defined]
    if getattr(inner, "_fuzz_counted", False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> None:
        COUNT[name] = COUNT.get(name, 0) + 1
        inner(*args, **kwargs)

    wrapper._fuzz_counted = True  # type: ignore[attr-defined]
    fn.hypothesis.inner_test = wrapper  # type: ignore[attr-defined]


@pytest.mark.skipif(not FUZZ_SECONDS, reason="`make fuzz` (FUZZ_SECONDS=N) runs the timed fuzz")
def test_fuzz_for_a_set_time() -> None:
    """Round-robin over every property, each call a fresh random batch, until the time is
    up; a failure stops it (and Hypothesis keeps the input for the normal suite)."""
    props = _properties()
    for name, fn in props.items():
        _count_calls(name, fn)
    COUNT.clear()
    end = time.monotonic() + FUZZ_SECONDS
    start, rounds = time.monotonic(), 0
    while time.monotonic() < end:
        for fn in props.values():
            if time.monotonic() >= end:
                break
            fn()
        rounds += 1
    took = time.monotonic() - start
    total = sum(COUNT.values())
    width = max(len(n) for n in COUNT)
    print(f"\nfuzzed {len(props)} properties for {took:.0f} s ({rounds} rounds): {total} inputs")
    for name, n in sorted(COUNT.items()):
        print(f"  {name:<{width}}  {n:>9}")
    assert total > 0
