"""A GRID (vGPU) guest's `nvidia-smi -q` and `-q -x` values: virtualization mode and licence.

A node whose GRID runfile installed /usr/bin/nvidia-gridd is a vGPU guest: "GPU
Virtualization Mode / Virtualization Mode : VGPU" and a "vGPU Software Licensed Product"
block (the layout of a real 535.216.01 `-q` of a GRID V100D-8C guest quoted in a public
GPU Operator vGPU guide; ``License Status`` words from NVIDIA's vGPU licensing guides,
``Licensed (Expiry: ...)``, and NVIDIA/gpu-operator #220, ``Unlicensed``). nvidia-gridd
takes a moment: the licence is acquired after the second report (`-q` or `-q -x`) this boot, never
under the grid-unlicensed fault ("Unlicensed (Unrestricted)", the grace period's state).
Under the grid-passthrough fault the GPU is passed through whole: "Pass-Through" and no
licence block, as the real passthrough captures show (samples/nvidia-smi
k8s-test-infra_hardware_xml qx-l40s.xml, qx-t4.xml: no vgpu_software_licensed_product).
"""

from __future__ import annotations

from bootfsm.sim.nodestate import RUN_DIR, Node

__all__ = ["count_license_query", "vgpu_values"]

_QUERIES = f"{RUN_DIR}/grid-license-queries"
_GRIDD = "usr/bin/nvidia-gridd"


def _seen(node: Node) -> int:
    counter = node.p(_QUERIES)
    return int(counter.read_text()) if counter.exists() else 0


def count_license_query(node: Node) -> None:
    """One more report (`-q` or `-q -x`) nvidia-gridd had time for (a vGPU guest only)."""
    if node.p(_GRIDD).exists():
        node.write(_QUERIES, str(_seen(node) + 1))


def vgpu_values(node: Node) -> dict[str, str]:
    """The template values of the virtualization mode and the licence block ("" status:
    no block, not a vGPU guest)."""
    if not node.p(_GRIDD).exists():
        return {"virtualization_mode": "None", "licensed_product": "", "license_status": ""}
    if node.fault("grid-passthrough"):
        return {"virtualization_mode": "Pass-Through", "licensed_product": "", "license_status": ""}
    if node.fault("grid-unlicensed") or _seen(node) < 2:
        status = "Unlicensed (Unrestricted)"
    else:
        status = "Licensed (Expiry: 2027-1-4 11:22:33 GMT)"
    return {
        "virtualization_mode": "VGPU",
        "licensed_product": "NVIDIA RTX Virtual Workstation",
        "license_status": status,
    }
