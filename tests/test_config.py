"""Config: defaults, validation that names the key, and docs/config.md in step."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bootfsm.cli import main
from bootfsm.core.config import DEFAULTS, ConfigError, parse_config
from bootfsm.core.config_files import load_config

DOCS = Path(__file__).resolve().parents[1] / "docs" / "config.md"


def test_empty_config_is_the_defaults() -> None:
    assert parse_config({}) == DEFAULTS
    assert DEFAULTS.run.deadline < 780


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"driver": {"kind": "vgpu"}}, "driver.kind"),
        ({"driver": {"version": "latest"}}, "driver.version"),
        ({"run": {"deadline": -1}}, "run.deadline"),
        ({"run": {"deadline": "10"}}, "run.deadline"),
        ({"fetch": {"allow_http_hosts": "127.0.0.1"}}, "fetch.allow_http_hosts"),
        ({"nope": {}}, "unknown section [nope]"),
        ({"driver": {"colour": "green"}}, "driver.colour"),
        ({"sources": {"runfile_sha256": "abc"}}, "sources.runfile_sha256"),
        ({"run": {"state_dir": "relative"}}, "run.state_dir"),
        ({"detect": {"imds": "yes"}}, "detect.imds"),
    ],
)
def test_invalid_values_name_the_key(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        parse_config(data)


def test_bad_toml_and_missing_required_file(tmp_path: Path) -> None:
    bad = tmp_path / "c.toml"
    bad.write_text("[driver\nversion=")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(bad, required=True)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path / "absent.toml", required=True)
    assert load_config(tmp_path / "absent.toml", required=False) == DEFAULTS


def test_validate_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.toml"
    good.write_text('[driver]\nversion = "580.95.05"\n')
    assert main(["validate", "--config", str(good)]) == 0
    bad = tmp_path / "bad.toml"
    bad.write_text('[driver]\nkind = "vgpu"\n')
    assert main(["validate", "--config", str(bad)]) == 10
    assert "driver.kind" in capsys.readouterr().err


def test_digest_changes_with_config() -> None:
    other = dataclasses.replace(
        DEFAULTS, driver=dataclasses.replace(DEFAULTS.driver, version="1.2")
    )
    assert other.digest() != DEFAULTS.digest()


def test_docs_list_every_key_with_its_default() -> None:
    text = DOCS.read_text()
    for section, values in DEFAULTS.to_dict().items():
        assert f"## [{section}]" in text
        for key, value in values.items():
            if isinstance(value, tuple):
                value = list(value)
            assert f"| `{key}` | `{json.dumps(value)}` |" in text, f"{section}.{key}"


A, B = "a" * 64, "B" * 64


def test_runfile_sha256_per_architecture() -> None:
    """One config for a mixed fleet: each runfile arch its own key, the single key the
    fallback (and still working alone)."""
    both = parse_config({"sources": {"runfile_sha256_x86_64": A, "runfile_sha256_aarch64": B}})
    assert both.runfile_sha256("x86_64") == A
    assert both.runfile_sha256("aarch64") == B.lower()
    single = parse_config({"sources": {"runfile_sha256": A}})
    assert single.runfile_sha256("aarch64") == A
    assert single.runfile_sha256("x86_64") == A
    mixed = parse_config({"sources": {"runfile_sha256": A, "runfile_sha256_aarch64": B}})
    assert mixed.runfile_sha256("x86_64") == A
    assert mixed.runfile_sha256("aarch64") == B.lower()
    assert DEFAULTS.runfile_sha256("x86_64") == ""


@pytest.mark.parametrize("key", ["runfile_sha256_x86_64", "runfile_sha256_aarch64"])
@pytest.mark.parametrize("value", ["abc", "g" * 64, 64])
def test_runfile_sha256_per_architecture_is_validated(key: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"sources.{key}"):
        parse_config({"sources": {key: value}})


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_numbers_are_refused(value: float) -> None:
    """nan passes every `<= 0` check; it must not become a deadline."""
    with pytest.raises(ConfigError, match=r"run\.deadline: expected a finite number"):
        parse_config({"run": {"deadline": value}})
