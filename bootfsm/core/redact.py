"""Keep secrets out of journals and consoles: URL credentials and signatures."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_text", "redact_url", "redact_urls"]


def redact_url(url: str) -> str:
    """Drop user:password and replace a query string (SAS tokens, signatures) by a marker."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable url>"
    netloc = parts.netloc.rsplit("@", 1)[-1]
    query = "<redacted>" if parts.query else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, ""))


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://(?:[^\s'\"<>]|<redacted>)+")  # idempotent
_SECRET_PARAM = re.compile(
    r"(?i)\b(sig|signature|sv|se|sp|token|access_token|password|passwd|secret|key|"
    r"x-amz-signature|x-amz-credential|x-goog-signature)=[^&\s'\"]+"
)


def redact_urls(text: str) -> str:
    """Every URL in ``text`` redacted (``redact_url``); idempotent."""
    return _URL.sub(lambda m: redact_url(m.group(0)), text) if "://" in text else text


def redact_text(text: str) -> str:
    """``redact_urls``, plus any stray ``sig=...``-like parameter outside a URL."""
    text = redact_urls(text)
    return _SECRET_PARAM.sub(lambda m: f"{m.group(1)}=<redacted>", text)
