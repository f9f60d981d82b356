"""Parse the VM's tags from an Azure IMDS document; decide ``SkipGpuDriverInstall``.

The decision matches AgentBaker's ``should_skip_nvidia_drivers`` (cse_helpers.sh, a jq
regex ``test``): name and value are case-insensitive substring matches.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError

__all__ = ["SKIP_TAG", "imds_compute", "parse_imds_tags", "skip_gpu_install", "tag_value"]

SKIP_TAG = "SkipGpuDriverInstall"
_SKIP_NAME = re.compile(SKIP_TAG, re.IGNORECASE)
_TRUE = re.compile("true", re.IGNORECASE)


def imds_compute(text: str) -> dict[str, Any]:
    """The ``compute`` object of an IMDS instance document (or the bare compute document)."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ParseError(f"IMDS document: not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ParseError(f"IMDS document: top level must be an object, got {type(doc).__name__}")
    compute = doc.get("compute", doc)
    if not isinstance(compute, dict):
        raise ParseError(f"IMDS document: 'compute' must be an object, got {excerpt(compute)}")
    return compute


def parse_imds_tags(text: str) -> list[tuple[str, str]]:
    """The VM's tags as (name, value) pairs in document order; [] when there are none.
    ``compute.tagsList`` (api-version 2019-06-04+) wins over ``compute.tags`` ("n:v;n:v")."""
    compute = imds_compute(text)
    tags_list = compute.get("tagsList")
    if tags_list is not None:
        if not isinstance(tags_list, list):
            raise ParseError(
                f"IMDS document: compute.tagsList must be a list: {excerpt(tags_list)}"
            )
        out: list[tuple[str, str]] = []
        for item in tags_list:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise ParseError(f"IMDS document: bad compute.tagsList entry {excerpt(item)}")
            value = item.get("value", "")
            if not isinstance(value, str):
                raise ParseError(
                    f"IMDS document: tag {excerpt(item['name'])} value is not a string"
                )
            out.append((item["name"], value))
        return out
    tags = compute.get("tags", "")
    if not isinstance(tags, str):
        raise ParseError(f"IMDS document: compute.tags must be a string: {excerpt(tags)}")
    pairs = []
    for part in tags.split(";"):
        if part:
            name, _, value = part.partition(":")
            pairs.append((name, value))
    return pairs


def skip_gpu_install(tags: list[tuple[str, str]]) -> str | None:
    """The reason to skip the GPU install, or None; only the first matching tag counts."""
    for name, value in tags:
        if _SKIP_NAME.search(name):
            return f"VM tag {name}={value}" if _TRUE.search(value) else None
    return None


def tag_value(tags: list[tuple[str, str]], name: str) -> tuple[str, str] | None:
    """(name as tagged, value) of the first non-empty tag named ``name`` (any case), or None."""
    for tag, value in tags:
        if tag.casefold() == name.casefold() and value.strip():
            return tag, value.strip()
    return None
