"""Tests for bootfsm.parsers.vmsize on Azure's published IMDS example."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bootfsm.parsers import ParseError
from bootfsm.parsers.vmsize import parse_imds_vm_size
from tests.samples import sample

COMPUTE = "azure-imds/imds_compute_docs_sample_linux.json"


def test_compute_document() -> None:
    # The sample is the /metadata/instance/compute document: vmSize at top level.
    assert parse_imds_vm_size(sample(COMPUTE)) == "standard_a3"


def test_instance_document() -> None:
    instance = {"compute": json.loads(sample(COMPUTE)), "network": {"interface": []}}
    assert parse_imds_vm_size(json.dumps(instance)) == "standard_a3"


@pytest.mark.parametrize(
    "size", ["Standard_ND96isr_H100_v5", "Standard_ND128isr_NDR_GB200_v6", "Standard_ND96asr_v4"]
)
def test_gpu_sizes_are_lower_cased(size: str) -> None:
    text = json.dumps({"compute": {"vmSize": size}})
    assert parse_imds_vm_size(text) == size.lower()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not valid JSON"),
        ("<html>502 Bad Gateway</html>", "not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"compute": "x"}', "'compute' must be an object"),
        ('{"compute": {}}', "vmSize is missing"),
        ('{"compute": {"vmSize": ""}}', "vmSize is missing or malformed"),
        ('{"compute": {"vmSize": 3}}', "vmSize is missing or malformed: 3"),
        ('{"compute": {"vmSize": "Standard A3\\n"}}', "malformed"),
    ],
)
def test_garbage(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_imds_vm_size(text)


@given(st.text())
def test_any_text_parses_or_raises_parse_error(text: str) -> None:
    with contextlib.suppress(ParseError):
        assert parse_imds_vm_size(text) == parse_imds_vm_size(text).lower()


@given(st.dictionaries(st.sampled_from(["compute", "vmSize", "x"]), st.none() | st.text()))
def test_any_shape_parses_or_raises_parse_error(doc: dict[str, object]) -> None:
    with contextlib.suppress(ParseError):
        parse_imds_vm_size(json.dumps(doc))
