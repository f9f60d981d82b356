"""How a failed request is named: 408/429/5xx transient (with Retry-After), other 4xx
permanent, a spent watch the time limit's, a bad certificate ``TLS_VERIFY_FAILED``
(naming the trust store); never a URL query string."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.core.redact import redact_url
from bootfsm.host.http_wire import Watch, short, too_slow

__all__ = ["check_status", "classify", "retry_after"]

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds: delta-seconds or an HTTP-date; None when absent or bad."""
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def check_status(status: int, headers: Mapping[str, str], url: str) -> None:
    """Raise for an HTTP error status (see the module docstring); nothing below 400."""
    if status < 400:
        return
    if status in _TRANSIENT_STATUS:
        raise TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"HTTP {status} from {redact_url(url)}",
            retry_after=retry_after(headers),
        )
    raise BootError(Code.ARTIFACT_NOT_FOUND, f"HTTP {status} from {redact_url(url)}", status=status)


def classify(
    exc: BaseException, url: str, verify: str | bool, watch: Watch | None = None
) -> TransientError | BootError:
    """The error for ``exc`` raised by a request to ``url`` (``verify``: its trust store)."""
    if watch is not None and watch.spent():
        return too_slow(url, watch)
    text = str(exc)
    if "TLS CA certificate bundle" in text:  # requests: the CA file does not exist
        return BootError(
            Code.TLS_VERIFY_FAILED,
            f"cannot verify {redact_url(url)}: CA file {verify} does not exist",
        )
    if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
        why = short(exc)
        clock = " (the clock may not be synced yet)" if "not yet valid" in text else ""
        return BootError(
            Code.TLS_VERIFY_FAILED,
            f"TLS certificate of {redact_url(url)} did not verify{clock}: {why}; "
            f"trust store: {verify if isinstance(verify, str) else 'certifi'}",
        )
    return TransientError(
        Code.DOWNLOAD_RETRIES_EXHAUSTED,
        f"{type(exc).__name__} fetching {redact_url(url)}: {short(exc)}",
    )
