"""Which requests go through a proxy: the environment's ``*_proxy`` settings and
``no_proxy``, and the hosts that are always reached directly (pure functions)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["bypass", "env_proxies", "never_proxied"]


def never_proxied(url: str) -> bool:
    """Link-local (IMDS) and loopback (kubelet) hosts are always reached directly."""
    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    return ip.is_link_local or ip.is_loopback


def env_proxies(env: Mapping[str, str]) -> dict[str, str]:
    """``{all, http, https, no}`` from ``*_proxy`` / ``*_PROXY`` (lower case wins)."""
    out = {}
    for name in ("all", "http", "https", "no"):
        value = env.get(f"{name}_proxy") or env.get(f"{name.upper()}_PROXY")
        if value:
            out[name] = value
    return out


def bypass(host: str, port: int | None, no_proxy: str) -> bool:
    """``no_proxy`` semantics: ``*``, host or domain suffix (``.example.com``), optional
    ``:port``, and IP networks in CIDR form (``10.0.0.0/8``)."""
    host = host.lower()
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if entry == "*":
            return True
        if not entry:
            continue
        if "/" in entry:
            try:
                if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, _, want_port = entry.rpartition(":") if entry.count(":") == 1 else (entry, "", "")
        if want_port and (not want_port.isdigit() or int(want_port) != port):
            continue
        name = name.lstrip("*").lstrip(".")
        if host == name or host.endswith("." + name):
            return True
    return False
