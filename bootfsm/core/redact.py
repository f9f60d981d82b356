"""Keep secrets out of journals and consoles: URL credentials and signatures.

Linear in the text's length whatever it holds: every message passes through here, and
outside text (a command's output, a header, an index line) is not trusted to be short
or kind. No pattern may retry a long run from each of its positions (docs/security.md).
"""

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


# A URL: a scheme (a letter, then letters, digits, "+", "." or "-"), "://" and a body of
# at least one character up to a blank, a quote or an angle bracket (a "<redacted>"
# marker stays in it: idempotent). A match starts only where a run of scheme characters
# starts (the look-behind); the digits and "+.-" before the run's first letter are kept
# as they are. So a run is read once, not again from each of its characters: a long run
# of letters made the pattern without the look-behind quadratic (docs/security.md).
_URL = re.compile(
    r"(?<![A-Za-z0-9+.-])([0-9+.-]*)"
    r"([A-Za-z][A-Za-z0-9+.-]*://(?:[^\s'\"<>]|<redacted>)[^\s'\"<>]*(?:<redacted>[^\s'\"<>]*)*)"
)
_SECRET_PARAM = re.compile(
    r"(?i)\b(sig|signature|sv|se|sp|token|access_token|password|passwd|secret|key|"
    r"x-amz-signature|x-amz-credential|x-goog-signature)=[^&\s'\"]+"
)


def redact_urls(text: str) -> str:
    """Every URL in ``text`` redacted (``redact_url``); idempotent; linear time."""
    return _URL.sub(lambda m: m[1] + redact_url(m[2]), text) if "://" in text else text


def redact_text(text: str) -> str:
    """``redact_urls``, plus any stray ``sig=...``-like parameter outside a URL."""
    text = redact_urls(text)
    return _SECRET_PARAM.sub(lambda m: f"{m.group(1)}=<redacted>", text)
