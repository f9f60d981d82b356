"""Tests for bootfsm.parsers.imds_tags on the real IMDS captures (values read by hand
from the files) and on the tagsList shape AgentBaker's should_skip_nvidia_drivers reads."""

from __future__ import annotations

import json

import pytest

from bootfsm.parsers import ParseError
from bootfsm.parsers.imds_tags import parse_imds_tags, skip_gpu_install
from tests.samples import sample

DOCS = "azure-imds/imds_compute_docs_sample_linux.json"
CONSUL = "azure-imds/imds_instance_real_2017-08-01_terraform-azurerm-consul-issue38.json"
VAULT = "azure-imds/imds_instance_real_2017-04-02_terraform-azurerm-vault-pr2.json"


def test_docs_sample_tags_string() -> None:
    # the file's compute document has "tags": "baz:bash;foo:bar" and no tagsList
    assert parse_imds_tags(sample(DOCS)) == [("baz", "bash"), ("foo", "bar")]


def test_real_capture_one_tag() -> None:
    # "tags":"scaleSetName:vault-example" in the captured instance document
    assert parse_imds_tags(sample(CONSUL)) == [("scaleSetName", "vault-example")]


def test_real_capture_without_tags() -> None:
    # api-version 2017-04-02: no tags key at all
    assert parse_imds_tags(sample(VAULT)) == []


def _with_list(tags_list: object, tags: str = "") -> str:
    compute = json.loads(sample(DOCS))
    compute["tags"] = tags
    compute["tagsList"] = tags_list
    return json.dumps({"compute": compute})


def test_tags_list_wins_over_the_string() -> None:
    doc = _with_list([{"name": "SkipGpuDriverInstall", "value": "true"}], "other:x")
    assert parse_imds_tags(doc) == [("SkipGpuDriverInstall", "true")]


@pytest.mark.parametrize(
    ("tags", "skip"),
    [
        ([("SkipGpuDriverInstall", "true")], "VM tag SkipGpuDriverInstall=true"),
        ([("skipgpudriverinstall", "TRUE")], "VM tag skipgpudriverinstall=TRUE"),  # both "i"
        ([("aks-SkipGpuDriverInstall-x", "True")], "VM tag aks-SkipGpuDriverInstall-x=True"),
        ([("SkipGpuDriverInstall", "false")], None),
        ([("SkipGpuDriverInstall", "")], None),
        # jq's [0]: only the first matching tag counts
        ([("SkipGpuDriverInstall", "no"), ("SkipGpuDriverInstallToo", "true")], None),
        ([("foo", "true")], None),
        ([], None),
    ],
)
def test_skip_decision_as_agentbaker_takes_it(tags: list[tuple[str, str]], skip: str) -> None:
    assert skip_gpu_install(tags) == skip


@pytest.mark.parametrize(
    "doc",
    ["not json", "[]", '{"compute": 3}', '{"compute": {"tags": 5}}', '{"tagsList": {}}',
     '{"tagsList": [{"value": "x"}]}', '{"tagsList": [{"name": "a", "value": 1}]}'],
)  # fmt: skip
def test_garbage_is_a_parse_error(doc: str) -> None:
    with pytest.raises(ParseError):
        parse_imds_tags(doc)
