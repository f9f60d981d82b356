"""Tests for bootfsm.parsers.redistrib on the real CUDA 12.8.2 manifest (driver components)."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.redistrib import RedistArtifact, parse_redistrib
from tests.samples import sample

MANIFEST = "redistrib/redistrib_cuda_12.8.2_driver-components_trimmed.json"


def test_header_and_components() -> None:
    manifest = parse_redistrib(sample(MANIFEST))
    assert (manifest.release_date, manifest.release_label, manifest.release_product) == (
        "2026-04-21",
        "12.8.2",
        "cuda",
    )
    assert set(manifest.components) == {
        "driver_assistant",
        "fabricmanager",
        "imex",
        "libnvidia_nscq",
        "libnvsdm",
        "nvidia_driver",
    }
    assert set(manifest.components["libnvsdm"].platforms) == {"linux-x86_64"}
    assert set(manifest.components["driver_assistant"].platforms) == {"linux-all"}
    assert manifest.components["nvidia_driver"].platforms["linux-x86_64"].size == 450164200


def test_fabricmanager_both_platforms() -> None:
    fm = parse_redistrib(sample(MANIFEST)).components["fabricmanager"]
    assert (fm.key, fm.name, fm.version) == ("fabricmanager", "NVIDIA Fabric Manager", "570.211.01")
    assert fm.platforms == {
        "linux-x86_64": RedistArtifact(
            relative_path="fabricmanager/linux-x86_64/fabricmanager-linux-x86_64-570.211.01-archive.tar.xz",
            sha256="ca18525b22546e26e26687637b87e492c6dab6477df681abbb6be942f9e5e944",
            md5="648409fa2f68cf579f383ec06d666ed6",
            size=8178396,
        ),
        "linux-sbsa": RedistArtifact(
            relative_path="fabricmanager/linux-sbsa/fabricmanager-linux-sbsa-570.211.01-archive.tar.xz",
            sha256="38ba0d26e2c02db349e858164455d916cc09d51a728accefe71413547efc0278",
            md5="c324bc15d9bec385ac950029868cc2ef",
            size=7420840,
        ),
    }


def test_result_is_read_only() -> None:
    manifest = parse_redistrib(sample(MANIFEST))
    with pytest.raises(TypeError):
        manifest.components["imex"] = manifest.components["fabricmanager"]  # type: ignore[index]


def _mutated(edit: str) -> str:
    doc: dict[str, Any] = json.loads(sample(MANIFEST))
    fm = doc["fabricmanager"]["linux-sbsa"]
    if edit == "no-sha256":
        del fm["sha256"]
    elif edit == "short-sha256":
        fm["sha256"] = "ca18525b"
    elif edit == "traversal":
        fm["relative_path"] = "fabricmanager/../../../etc/shadow"
    elif edit == "absolute":
        fm["relative_path"] = "/etc/shadow"
    elif edit == "size-text":
        fm["size"] = "eight megabytes"
    elif edit == "size-negative":
        fm["size"] = -1
    elif edit == "no-version":
        del doc["fabricmanager"]["version"]
    elif edit == "platform-not-object":
        doc["fabricmanager"]["linux-sbsa"] = "fabricmanager.tar.xz"
    elif edit == "no-release-label":
        del doc["release_label"]
    return json.dumps(doc)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("no-sha256", "fabricmanager/linux-sbsa: 'sha256' must be a non-empty string"),
        ("short-sha256", "fabricmanager/linux-sbsa: sha256 is not 64 hex digits"),
        ("traversal", "fabricmanager/linux-sbsa: unsafe relative_path"),
        ("absolute", "unsafe relative_path '/etc/shadow'"),
        ("size-text", "size is not a byte count: 'eight megabytes'"),
        ("size-negative", "size is not a byte count: -1"),
        ("no-version", "redistrib fabricmanager: 'version'"),
        ("platform-not-object", "fabricmanager/linux-sbsa: expected an object"),
        ("no-release-label", "header: 'release_label'"),
    ],
)
def test_broken_manifests(edit: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_redistrib(_mutated(edit))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not valid JSON"),
        ('{"release_date": ', "not valid JSON"),
        ("[]", "top level must be an object"),
        ("[" * 100_000, "not valid JSON"),
    ],
)
def test_not_a_manifest(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_redistrib(text)


def test_integer_size_is_accepted() -> None:
    doc = json.loads(sample(MANIFEST))
    doc["imex"]["linux-sbsa"]["size"] = 7568272
    artifact = parse_redistrib(json.dumps(doc)).components["imex"].platforms["linux-sbsa"]
    assert artifact.size == 7568272


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        parse_redistrib(text)


@given(st.dictionaries(st.text(max_size=12), _JSON, max_size=4))
def test_any_json_object_parses_or_raises_parse_error(doc: dict[str, object]) -> None:
    with contextlib.suppress(ParseError):
        parse_redistrib(json.dumps(doc))


@given(st.sampled_from(["relative_path", "sha256", "md5", "size", "name"]), _JSON)
def test_any_field_value_parses_or_raises_parse_error(field: str, value: object) -> None:
    doc = json.loads(sample(MANIFEST))
    target = doc["fabricmanager"] if field == "name" else doc["fabricmanager"]["linux-x86_64"]
    target[field] = value
    with contextlib.suppress(ParseError):
        parse_redistrib(json.dumps(doc))
