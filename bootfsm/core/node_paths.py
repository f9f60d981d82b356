"""Node paths that more than one layer names (the writer and the readers agree here)."""

from __future__ import annotations

__all__ = ["INSTALLER_LOG"]

#: nvidia-installer's log (its --log-file-name; the driver state passes it explicitly)
INSTALLER_LOG = "/var/log/nvidia-installer.log"
