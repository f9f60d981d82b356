"""The CSE exit code of each bootfsm code, for ``bootfsm run --exit-codes cse``.

bootfsm's own numbers mean other things to CSE (50 is ERR_OUTBOUND_CONN_FAIL there);
a code without ``cse=`` fails tests/test_cse_codes.py and exits :data:`CSE_FALLBACK`.
"""

from __future__ import annotations

from bootfsm.core.code_names import Code
from bootfsm.core.codes import CODES, CodeInfo

__all__ = ["CSE_FALLBACK", "CSE_NAMES", "cse_exit", "unmapped_codes"]

# The CSE codes the mapping uses, with AgentBaker's names (parts/linux/cloud-init/artifacts/
# cse_helpers.sh; tests/agentbaker_codes.py holds the list they are checked against).
CSE_NAMES: dict[int, str] = {
    0: "OK",
    4: "ERR_SYSTEMCTL_START_FAIL",
    34: "ERR_KUBELET_START_FAIL",
    83: "ERR_GPU_DOWNLOAD_TIMEOUT",
    84: "ERR_GPU_DRIVERS_START_FAIL",
    85: "ERR_GPU_DRIVERS_INSTALL_TIMEOUT",
    87: "ERR_GPU_INFO_ROM_CORRUPTED",
}

CSE_FALLBACK = 84
"""The exit code of a bootfsm code that has no ``cse`` yet: the GPU step failed."""


def cse_exit(code: Code, state: str = "") -> int:
    """The CSE exit code meaning what ``code`` (ended in ``state``) means."""
    row = CODES.get(code)
    if row is None or row.cse is None:
        return 0 if code is Code.OK else CSE_FALLBACK
    return dict(row.cse_in_state).get(state, row.cse)


def unmapped_codes(table: dict[Code, CodeInfo] | None = None) -> list[Code]:
    """Codes whose row has no ``cse`` (or no row at all): each must be mapped by hand."""
    rows = CODES if table is None else table
    return [c for c in Code if c not in rows or rows[c].cse is None]
