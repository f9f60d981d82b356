"""The network half of the I/O boundary: small GETs and resumable streaming downloads.

``requests`` is imported lazily so commands that never touch the network start fast.
Failures are classified here once: connection errors, timeouts, short bodies and
408/429/5xx are ``TransientError``; 404 and other client errors are permanent.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from bootfsm.codes import Code
from bootfsm.errors import BootError, TransientError
from bootfsm.redact import redact_url

if TYPE_CHECKING:
    import requests  # noqa: TID251

__all__ = ["Http", "HttpResult", "StreamResult", "check_url"]

CHUNK = 256 << 10  # a drop loses at most one chunk; 1 MiB was no faster on loopback
_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class HttpResult:
    """A small response read whole."""

    status: int
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True)
class StreamResult:
    """A finished download: size, sha256 of the whole file, bytes resumed from disk."""

    size: int
    sha256: str
    resumed_bytes: int
    transferred: int


def check_url(url: str, allow_http_hosts: Sequence[str]) -> None:
    """Refuse any URL that is not HTTPS unless its host is explicitly allowed."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        return
    if parts.scheme == "http" and (parts.hostname or "") in set(allow_http_hosts):
        return
    raise BootError(
        Code.INSECURE_URL_REFUSED,
        f"refusing {parts.scheme or 'schemeless'} URL {redact_url(url)}: HTTPS required "
        f"(host {parts.hostname!r} is not in fetch.allow_http_hosts)",
    )


def _link_local(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    try:
        return ipaddress.ip_address(host).is_link_local
    except ValueError:
        return False


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class Http:
    """HTTP with bounded timeouts; proxies from the environment except for link-local."""

    def __init__(
        self,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._env = dict(os.environ if env is None else env)
        self._session: requests.Session | None = None

    def _sess(self) -> requests.Session:
        if self._session is None:
            import requests  # noqa: TID251 - lazy: keeps CLI start-up fast

            s = requests.Session()
            s.headers["User-Agent"] = "bootfsm"
            self._session = s
        return self._session

    def _kwargs(self, url: str, timeout: float | None) -> dict[str, Any]:
        read = self.read_timeout if timeout is None else min(self.read_timeout, timeout)
        conn = self.connect_timeout if timeout is None else min(self.connect_timeout, timeout)
        kw: dict[str, Any] = {"timeout": (max(conn, 0.05), max(read, 0.05))}
        if _link_local(url):
            kw["proxies"] = {"http": "", "https": "", "no_proxy": "*"}
        return kw

    def _classify(self, exc: Exception, url: str) -> TransientError:
        return TransientError(
            Code.DOWNLOAD_RETRIES_EXHAUSTED,
            f"{type(exc).__name__} fetching {redact_url(url)}: {_short(exc)}",
        )

    def _check_status(self, status: int, headers: Mapping[str, str], url: str) -> None:
        if status < 400:
            return
        if status in _TRANSIENT_STATUS:
            raise TransientError(
                Code.DOWNLOAD_RETRIES_EXHAUSTED,
                f"HTTP {status} from {redact_url(url)}",
                retry_after=_retry_after(headers),
            )
        raise BootError(
            Code.ARTIFACT_NOT_FOUND, f"HTTP {status} from {redact_url(url)}", status=status
        )

    def get(
        self,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float | None = None,
        max_bytes: int = 64 << 20,
        check: bool = True,
    ) -> HttpResult:
        """GET a small resource whole; raise Transient/BootError on failure when ``check``."""
        import requests  # noqa: TID251

        try:
            with self._sess().get(
                url, headers=dict(headers or {}), stream=True, **self._kwargs(url, timeout)
            ) as r:
                hdrs = dict(r.headers)
                if check:
                    self._check_status(r.status_code, hdrs, url)
                body = bytearray()
                for chunk in r.iter_content(CHUNK):
                    body += chunk
                    if len(body) > max_bytes:
                        raise BootError(
                            Code.INDEX_INVALID, f"{redact_url(url)} is larger than {max_bytes} B"
                        )
                return HttpResult(r.status_code, hdrs, bytes(body))
        except requests.RequestException as exc:
            raise self._classify(exc, url) from exc

    def stream_to(
        self,
        url: str,
        part: Path,
        *,
        timeout: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> StreamResult:
        """Download ``url`` into ``part``, resuming from bytes already there.

        A sidecar ``<part>.meta`` holds the validator (ETag or Last-Modified) of the bytes
        on disk; a resume sends ``Range`` with ``If-Range`` and accepts only a ``206``
        whose Content-Range starts where the file ends. ``200`` (Range ignored or the
        artifact changed) restarts from zero; ``416`` discards the partial file. The
        sha256 returned covers the whole file, the resumed prefix included.
        """
        import requests  # noqa: TID251

        meta = part.with_name(part.name + ".meta")
        have = part.stat().st_size if part.exists() else 0
        validator = _read_validator(meta) if have else None
        headers: dict[str, str] = {}
        if have and validator:
            headers = {"Range": f"bytes={have}-", "If-Range": validator}
        elif have:
            have = 0
        try:
            with self._sess().get(
                url, headers=headers, stream=True, **self._kwargs(url, timeout)
            ) as r:
                hdrs = dict(r.headers)
                if r.status_code == 416:
                    part.unlink(missing_ok=True)
                    meta.unlink(missing_ok=True)
                    raise TransientError(
                        Code.DOWNLOAD_RETRIES_EXHAUSTED,
                        f"HTTP 416 resuming {redact_url(url)}: partial file discarded",
                    )
                self._check_status(r.status_code, hdrs, url)
                resumed = have if r.status_code == 206 and _range_start(hdrs) == have else 0
                if r.status_code == 206 and resumed == 0:
                    part.unlink(missing_ok=True)
                    raise TransientError(
                        Code.DOWNLOAD_RETRIES_EXHAUSTED,
                        f"unexpected Content-Range from {redact_url(url)}; restarting",
                    )
                new_validator = hdrs.get("ETag") or hdrs.get("Last-Modified")
                _write_validator(meta, new_validator)
                digest = hashlib.sha256()
                mode = "r+b" if resumed else "wb"
                with part.open(mode) as fh:
                    if resumed:
                        while block := fh.read(CHUNK):
                            digest.update(block)
                        fh.seek(resumed)
                        fh.truncate()
                    transferred = 0
                    for chunk in r.iter_content(CHUNK):
                        fh.write(chunk)
                        digest.update(chunk)
                        transferred += len(chunk)
                        if progress is not None:
                            progress(resumed + transferred)
                    fh.flush()
                    os.fsync(fh.fileno())
                expected = hdrs.get("Content-Length")
                if expected is not None and int(expected) != transferred:
                    raise TransientError(
                        Code.DOWNLOAD_RETRIES_EXHAUSTED,
                        f"short body from {redact_url(url)}: {transferred} of {expected} B",
                    )
                return StreamResult(resumed + transferred, digest.hexdigest(), resumed, transferred)
        except requests.RequestException as exc:
            raise self._classify(exc, url) from exc


def _range_start(headers: Mapping[str, str]) -> int | None:
    value = headers.get("Content-Range", "")
    try:
        unit, rest = value.split(" ", 1)
        return int(rest.split("-", 1)[0]) if unit == "bytes" else None
    except ValueError:
        return None


def _read_validator(meta: Path) -> str | None:
    try:
        value = json.loads(meta.read_text()).get("validator")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) and value else None


def _write_validator(meta: Path, validator: str | None) -> None:
    meta.write_text(json.dumps({"validator": validator}))


def _short(exc: Exception) -> str:
    text = str(exc)
    return text if len(text) < 300 else text[:300] + "..."
