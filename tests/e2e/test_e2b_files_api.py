"""The E2B door's `/files` refusals (SPEC §16, issue #28), on a real `rift serve` over
libvirt's test driver (no guest behind its VMs): a URL signed as E2B's SDK signs a
secured sandbox's `download_url`/`upload_url` (at the server's root: the SDK joins
`/files` onto E2B_SANDBOX_URL) is let in without the access token when its
signature holds (an expired or wrong one is E2B's 401 with E2B's
message), bad file metadata is E2B's 400 before the guest is asked, and an unknown
watcher is `not_found`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import Sandbox

from tests.support.e2b import e2b_opts
from tests.support.servers import Server, start_server, stop_server


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Sandbox]]:
    proc, srv = start_server(tmp_path_factory.mktemp("e2b-files"))
    try:
        sbx = Sandbox.create(secure=True, **e2b_opts(srv.url, srv.token))  # type: ignore[arg-type]
        yield srv, sbx
    finally:
        stop_server(proc)


def _status(url: str, method: str = "GET") -> tuple[int, object]:
    """A plain request to a signed URL, as a browser or `urllib` makes it: no headers."""
    answer = httpx.request(method, url, content=b"x" if method == "POST" else None,
                           headers={"Content-Type": "application/octet-stream"}, timeout=30)
    try:
        return answer.status_code, answer.json()
    except ValueError:
        return answer.status_code, answer.text


def test_signed_urls_are_let_in_by_their_signature_only(door: tuple[Server, Sandbox]) -> None:
    _srv, sbx = door
    expired = sbx.download_url("a.txt", "user", use_signature_expiration=-120)
    assert _status(expired) == (401, {"code": 401, "message": "signature is already expired"})
    good = sbx.download_url("a.txt", "user", 120)
    for wrong in (good.replace("path=a.txt", "path=b.txt"),  # signed for another file
                  good.replace("signature=v1_", "signature=v1_x")):
        assert _status(wrong) == (401, {"code": 401, "message": "invalid signature"})
    assert _status(good, "POST")[0] == 401  # a read's signature does not write
    status, body = _status(good)  # let in: then it is the guest's to answer (none here)
    assert status != 401 and "signature" not in str(body), (status, body)
    unsigned = good.partition("&signature=")[0]
    assert _status(unsigned)[0] == 404  # at the root, only signed URLs are served
    assert _status(unsigned.replace("/files?", "/e2b/files?"))[0] == 401  # no token either


def test_bad_metadata_is_refused_before_the_guest_is_asked(door: tuple[Server, Sandbox]) -> None:
    srv, sbx = door
    headers = {"X-Access-Token": sbx._envd_access_token or "", "E2b-Sandbox-Id": sbx.sandbox_id,
               "Content-Type": "application/octet-stream"}
    for name, value in (("X-Metadata-" + "k" * 200, "v"), ("X-Metadata-K", "\x7f")):
        answer = httpx.post(f"{srv.url}/e2b/files", params={"path": "/tmp/m"}, content=b"x",
                            headers={**headers, name: value}, timeout=30)
        assert answer.status_code == 400 and "metadata" in answer.json()["message"], answer.text
    started = time.monotonic()
    unknown = httpx.post(f"{srv.url}/e2b/filesystem.Filesystem/GetWatcherEvents",
                         json={"watcherId": "wnope"}, timeout=30,
                         headers={**headers, "Content-Type": "application/json"})
    assert unknown.status_code == 404 and unknown.json()["code"] == "not_found"
    assert time.monotonic() - started < 10
