"""Self-tests of the S3 test server (tests/_servers.py, tests/_s3_fixtures.py).

Besides checking the fixtures, these pin the SeaweedFS behaviour that the
object-store tests rely on: signed access only, exact ranges, ETag on range
responses, If-Match honoured on GET, data surviving a restart.
"""
from __future__ import annotations

import hashlib
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from _servers import S3Server

DATA = bytes(range(256)) * 40  # 10240 bytes, every offset distinguishable


def test_signed_round_trip(s3_server: S3Server, s3_bucket: str) -> None:
    assert s3_server.list_objects(s3_bucket) == []  # a fresh bucket per test
    etag = s3_server.put_object(s3_bucket, "dir/a b+c.bin", DATA)
    assert etag == f'"{hashlib.md5(DATA).hexdigest()}"'
    assert s3_server.get_object(s3_bucket, "dir/a b+c.bin") == DATA
    assert s3_server.list_objects(s3_bucket) == ["dir/a b+c.bin"]
    s3_server.delete_object(s3_bucket, "dir/a b+c.bin")
    assert s3_server.list_objects(s3_bucket) == []


def test_unsigned_and_badly_signed_requests_refused(
        s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_server.put_object(s3_bucket, "k", b"private")
    path = f"/{s3_bucket}/k"
    assert s3_server.request("GET", path, sign=False)[0] == 403
    assert s3_server.request("PUT", path, body=b"x", sign=False)[0] == 403
    assert s3_server.request("GET", "/", sign=False)[0] == 403
    monkeypatch.setattr(s3_server, "secret_key", "wrong-secret")
    status, _, body = s3_server.request("GET", path)
    assert status == 403 and b"SignatureDoesNotMatch" in body
    monkeypatch.setattr(s3_server, "access_key", "NOSUCHACCESSKEY")
    status, _, body = s3_server.request("GET", path)
    assert status == 403 and b"InvalidAccessKeyId" in body


def test_range_get(s3_server: S3Server, s3_bucket: str) -> None:
    etag = s3_server.put_object(s3_bucket, "obj", DATA)
    assert s3_server.get_object(s3_bucket, "obj", (1000, 1099)) == DATA[1000:1100]
    status, headers, body = s3_server.request(
        "GET", f"/{s3_bucket}/obj", headers={"Range": "bytes=-5"})
    assert (status, body) == (206, DATA[-5:])
    assert headers["content-range"] == f"bytes {len(DATA) - 5}-{len(DATA) - 1}/{len(DATA)}"
    assert headers["etag"] == etag  # range responses carry the whole object's ETag
    status, headers, _ = s3_server.request(
        "GET", f"/{s3_bucket}/obj", headers={"Range": f"bytes={len(DATA)}-"})
    assert status == 416 and headers["content-range"] == f"bytes */{len(DATA)}"


def test_if_match_on_get(s3_server: S3Server, s3_bucket: str) -> None:
    old = s3_server.put_object(s3_bucket, "obj", b"old")
    new = s3_server.put_object(s3_bucket, "obj", b"new")

    def ranged_get(if_match: str) -> tuple[int, bytes]:
        status, _, body = s3_server.request(
            "GET", f"/{s3_bucket}/obj", headers={"If-Match": if_match, "Range": "bytes=0-1"})
        return status, body

    assert ranged_get(old)[0] == 412  # the object changed under the reader
    assert ranged_get(new) == (206, b"ne")


def test_restart_keeps_data(s3_server: S3Server, s3_bucket: str) -> None:
    s3_server.put_object(s3_bucket, "before", DATA)
    s3_server.restart()
    assert s3_server.get_object(s3_bucket, "before") == DATA
    s3_server.put_object(s3_bucket, "after", b"still writable")
    assert s3_server.list_objects(s3_bucket) == ["after", "before"]


def test_http_base_serves_ranges(s3_server: S3Server, s3_bucket: str) -> None:
    etag = s3_server.put_object(s3_bucket, "dir/obj.bin", DATA)
    url = f"{s3_server.http_base(s3_bucket)}/dir/obj.bin"
    with urllib.request.urlopen(urllib.request.Request(url, method="HEAD")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Length"] == str(len(DATA))
        assert resp.headers["ETag"] == etag
    ranged = urllib.request.Request(url, headers={"Range": "bytes=4090-4105"})
    with urllib.request.urlopen(ranged) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes 4090-4105/{len(DATA)}"
        assert resp.read() == DATA[4090:4106]
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{s3_server.http_base(s3_bucket)}/nope")
    assert missing.value.code == 404


def test_env(s3_server: S3Server) -> None:
    assert s3_server.env() == {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{s3_server.s3_port}",
        "AWS_ACCESS_KEY_ID": s3_server.access_key,
        "AWS_SECRET_ACCESS_KEY": s3_server.secret_key,
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def test_failed_start_reports_log_and_cleans_up(tmp_path: Path) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'fake weed: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("loaderx-s3-*"))
    with pytest.raises(RuntimeError, match=r"status 3(.|\n)*fake weed: cannot start"):
        S3Server(str(fake))
    assert set(scratch.glob("loaderx-s3-*")) == before  # temp dir removed
