"""Whether a directory bootfsm owns is safe: not a symlink, root-owned, not group/other
writable, nor any directory above it (a sticky 1777 parent is not trusted; group write
by a system group is, above our own: Ubuntu's /var/log is 0775 root:syslog)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError

__all__ = ["check_chain", "check_dir"]


_SYS_GID_MAX = 1000
"""Above bootfsm's own directory, group write is allowed for a system group (gid below
1000, login.defs' SYS_GID_MAX default): Ubuntu ships /var/log 0775 root:syslog. The own
directory itself must never be group-writable."""


def check_dir(st: os.stat_result, node_path: str, above: str) -> None:
    where = f"{above} (above {node_path})" if above else node_path
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symlink"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid not in (0, os.geteuid()):
        problem = f"is owned by uid {st.st_uid}, not root"
    elif st.st_mode & 0o002 or (st.st_mode & 0o020 and not (above and st.st_gid < _SYS_GID_MAX)):
        sticky = " (sticky, but its owner is not bootfsm)" if st.st_mode & stat.S_ISVTX else ""
        problem = f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}){sticky}"
    else:
        return
    raise BootError(
        Code.UNSAFE_STATE_DIR,
        f"{where} {problem}: another user could plant or swap what bootfsm runs as root",
    )


def check_chain(root: Path, real_parent: Path, node_path: str) -> None:
    """Every directory from the root down to ``real_parent`` is closed to other users
    (the part above the root is the caller's, as is the root itself)."""
    try:
        rel = real_parent.relative_to(root)
        base, parts = root, rel.parts
    except ValueError:  # a root-owned link left the root: check the whole real chain
        base, parts = Path("/"), real_parent.parts[1:]
    cur = base
    for part in parts:
        cur = cur / part
        check_dir(os.stat(cur), node_path, "/" + os.path.relpath(cur, root))
