"""Parse `nvidia-smi -q -x`: the structured report verify judges the node by.

Any DTD but the ``nvsmi_device_vNN.dtd`` DOCTYPE, any entity or processing instruction is
refused before expat sees it (hence no defusedxml); an absent element reads as "".
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from bootfsm.core.excerpt import excerpt
from bootfsm.parsers import ParseError
from bootfsm.parsers.nvidia_smi import SmiGpu, SmiReport, device_id_of

# nvidia-smi prints this line (exit 14) on stdout whatever the format; it is not XML.
_INFOROM_WARNING = re.compile(r"^\s*WARNING: infoROM is corrupted at gpu\s*(.*?)\s*$", re.MULTILINE)

__all__ = ["parse_smi_xml"]

_DOCTYPE = re.compile(r'<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"nvsmi_device_v\d{1,3}\.dtd"\s*>')
_MARKUP_DECL = re.compile(r"<!(?!--)")
_PI = re.compile(r"<\?(?!xml[\s?])")
_COUNT = re.compile(r"[0-9]+")
_BUS_ID = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]")


def _root(text: str) -> ET.Element:
    """The ``<nvidia_smi_log>`` root; the known DOCTYPE is blanked, other markup refused."""
    known = _DOCTYPE.search(text)
    body = text
    if known is not None:
        body = text[: known.start()] + " " * (known.end() - known.start()) + text[known.end() :]
    for refused, what in ((_MARKUP_DECL, "markup declaration"), (_PI, "processing instruction")):
        if (found := refused.search(body)) is not None:
            quote = excerpt(body, 40, at=found.start())
            raise ParseError(f"nvidia-smi -q -x: refusing {what} {quote}")
    try:
        root = ET.fromstring(body)  # noqa: S314 - DTDs/entities refused above
    except ET.ParseError as exc:
        raise ParseError(f"nvidia-smi -q -x: not well-formed XML: {exc}") from exc
    if root.tag != "nvidia_smi_log":
        raise ParseError(
            f"nvidia-smi -q -x: root element is {excerpt(root.tag)}, not <nvidia_smi_log>"
        )
    return root


def _text(node: ET.Element | None, path: str) -> str:
    found = node.find(path) if node is not None else None
    return (found.text or "").strip() if found is not None else ""


def parse_smi_xml(text: str) -> SmiReport:
    """Parse `nvidia-smi -q -x`; ParseError on refused markup, bad XML or missing pieces.
    infoROM warnings printed around the XML land in ``inforom_corrupted``."""
    warnings = tuple(m[1] for m in _INFOROM_WARNING.finditer(text))
    root = _root(_INFOROM_WARNING.sub("", text).strip())
    # kmd_version: the name a 615 capture's comment announces as driver_version's successor
    driver = _text(root, "driver_version") or _text(root, "kmd_version")
    if not driver:
        raise ParseError("nvidia-smi -q -x: no <driver_version> (or <kmd_version>)")
    attached = _text(root, "attached_gpus")
    if _COUNT.fullmatch(attached) is None:
        raise ParseError(f"nvidia-smi -q -x: <attached_gpus> is not a number: {excerpt(attached)}")
    gpus = [_gpu(gpu) for gpu in root.findall("gpu")]
    if int(attached) != len(gpus):
        raise ParseError(
            f"nvidia-smi -q -x: <attached_gpus> says {int(attached)} but {len(gpus)} <gpu>"
            " elements were found (truncated output?)"
        )
    bus_ids = [g.bus_id for g in gpus]
    if len(set(bus_ids)) != len(bus_ids):
        raise ParseError(f"nvidia-smi -q -x: duplicate GPU bus ids in {bus_ids}")
    return SmiReport(
        driver_version=driver,
        cuda_version=_text(root, "cuda_version"),
        attached_gpus=int(attached),
        gpus=tuple(gpus),
        inforom_corrupted=warnings,
    )


def _gpu(gpu: ET.Element) -> SmiGpu:
    """One ``<gpu id=BUS>`` element; ParseError when its id is not a PCI bus id."""
    bus_id = gpu.get("id", "")
    if _BUS_ID.fullmatch(bus_id) is None:
        raise ParseError(f"nvidia-smi -q -x: <gpu id={excerpt(bus_id)}> is not a PCI bus id")
    fabric = gpu.find("fabric")
    return SmiGpu(
        bus_id=bus_id,
        product_name=_text(gpu, "product_name"),
        fabric_state=_text(fabric, "state"),
        fabric_status=_text(fabric, "status"),
        device_id=device_id_of(_text(gpu, "pci/pci_device_id")),
        clique_id=_text(fabric, "cliqueId"),
        cluster_uuid=_text(fabric, "clusterUuid"),
        health_summary=_text(fabric, "health/summary"),
        mig_current=_text(gpu, "mig_mode/current_mig"),
        mig_pending=_text(gpu, "mig_mode/pending_mig"),
        license_status=(
            _text(gpu, "vgpu_software_licensed_product/license_status")
            if gpu.find("vgpu_software_licensed_product") is not None
            else None
        ),
        virtualization_mode=_text(gpu, "gpu_virtualization_mode/virtualization_mode"),
    )
