"""GETs to node-local plain-HTTP endpoints (IMDS, kubelet healthz).

A real loopback server (pytest-httpserver); the bounds are those of every other request:
timeouts, a body cap, error classes; never a proxy, and a redirect is refused.
"""

from __future__ import annotations

import socket
import time

import pytest
from pytest_httpserver import HTTPServer

from bootfsm.core.codes import Code
from bootfsm.core.errors import BootError, TransientError
from bootfsm.host.http import Http


def test_imds_style_get_reads_the_body_and_sends_the_header(httpserver: HTTPServer) -> None:
    httpserver.expect_request(
        "/metadata/instance", query_string="api-version=2021-02-01", headers={"Metadata": "true"}
    ).respond_with_data('{"compute": {"vmSize": "Standard_ND96isr_H100_v5"}}')
    url = httpserver.url_for("/metadata/instance?api-version=2021-02-01")
    r = Http().get(url, headers={"Metadata": "true"}, timeout=5)
    assert r.status == 200
    assert b"Standard_ND96isr_H100_v5" in r.body
    assert httpserver.log[0][0].headers["User-Agent"] == "bootfsm"


def test_proxy_settings_are_ignored_for_loopback(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/healthz").respond_with_data("ok")
    env = {"http_proxy": "http://192.0.2.1:3128", "all_proxy": "http://192.0.2.1:3128"}
    assert Http(env=env).get(httpserver.url_for("/healthz"), timeout=5).body == b"ok"


def test_a_503_is_transient_and_a_404_permanent(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/busy").respond_with_data("", status=503)
    httpserver.expect_request("/gone").respond_with_data("", status=404)
    with pytest.raises(TransientError, match="HTTP 503"):
        Http().get(httpserver.url_for("/busy"), timeout=5)
    with pytest.raises(BootError) as e:
        Http().get(httpserver.url_for("/gone"), timeout=5)
    assert e.value.code is Code.ARTIFACT_NOT_FOUND
    r = Http().get(httpserver.url_for("/gone"), timeout=5, check=False)
    assert r.status == 404


def test_a_redirect_is_refused_not_followed(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/a").respond_with_data(
        "", status=302, headers={"Location": "http://192.0.2.1/elsewhere"}
    )
    with pytest.raises(BootError, match="redirects are not followed") as e:
        Http().get(httpserver.url_for("/a"), timeout=5)
    assert e.value.code is Code.ARTIFACT_NOT_FOUND


def test_a_body_over_the_cap_is_refused(httpserver: HTTPServer) -> None:
    httpserver.expect_request("/big").respond_with_data(b"x" * 5000)
    with pytest.raises(BootError, match="larger than 4096 B") as e:
        Http().get(httpserver.url_for("/big"), timeout=5, max_bytes=4096)
    assert e.value.code is Code.INDEX_INVALID


def test_nothing_listening_is_transient() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(TransientError, match="Connection refused"):
        Http().get(f"http://127.0.0.1:{port}/healthz", timeout=2)


def test_a_silent_server_hits_the_time_limit() -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen(1)  # accepts (the kernel does), never answers
        t0 = time.monotonic()
        with pytest.raises(TransientError) as e:
            Http().get(f"http://127.0.0.1:{srv.getsockname()[1]}/x", timeout=0.5)
        took = time.monotonic() - t0
    assert e.value.code in (Code.DOWNLOAD_TIMEOUT, Code.DOWNLOAD_RETRIES_EXHAUSTED)
    assert took < 5, took  # bounded by the request's limit, not the 30 s read default


def test_an_index_fetch_from_loopback_keeps_the_redirect_policy(httpserver: HTTPServer) -> None:
    """Only a plain node-local GET refuses every redirect: an index fetch (allow_http_hosts
    given) follows them under the redirect policy, so an https-only refusal holds."""
    httpserver.expect_request("/r").respond_with_data(
        "", status=302, headers={"Location": "http://192.0.2.1/x"}
    )
    with pytest.raises(BootError) as e:
        Http().get(httpserver.url_for("/r"), timeout=5, allow_http_hosts=["localhost"])
    assert e.value.code is Code.INSECURE_URL_REFUSED
