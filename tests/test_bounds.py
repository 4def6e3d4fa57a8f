"""Resource bounds under hostile stores: a forged table entry or shape prefix
must not make a gather allocate (touch) more than the logical sizes it was
asked for, nor take long, and absurd ranks and dims are refused.

Each probe runs in a fresh interpreter and reports the growth of its peak
resident set (``ru_maxrss``) across the hostile calls, measured after a
warm-up gather, so allocations made and freed between two samples still
count.
"""
from __future__ import annotations

import json
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from loaderx.zrecord import Dense, Ragged

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss is in KiB on Linux only")

PAGE = 4096
ENTRY = 16
DECODE_FAILED = -7
INVALID_FORMAT = -8
OUT_OF_MEMORY = -1
MAX_GROWTH_MIB = 100
MAX_SECONDS = 5.0
# One zstd frame byte decodes to at most this many bytes (a 3-byte RLE block
# header yields a 128 KiB block); a table entry claiming more is refused
# outright, so the largest claim that gets as far as an allocation is this.
MAX_EXPANSION = (128 << 10) // 3 + 1

PROBE_PRELUDE = textwrap.dedent(
    r"""
    import json, resource, sys, time
    import numpy as np
    from loaderx.zrecord import Dense, Ragged, ZrecordError

    def maxrss_kib():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    results = {}

    def attempt(name, fn):
        t = time.perf_counter()
        try:
            fn()
            outcome = "ok"
        except ZrecordError as e:
            outcome = [e.code, str(e)]
        except Exception as e:
            outcome = [type(e).__name__, str(e)]
        results[name] = {"outcome": outcome, "seconds": time.perf_counter() - t}
    """
)


def run_probe(body: str, timeout: float = 120) -> dict:
    """Runs ``body`` after the prelude; it must set ``base`` (maxrss after
    warm-up) and fill ``results`` via ``attempt``."""
    code = PROBE_PRELUDE + textwrap.dedent(body) + textwrap.dedent(
        """
        growth = (maxrss_kib() - base) / 1024
        print(json.dumps({"growth_mib": growth, "results": results}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def zstd_raw_frame(payload: bytes, declared: int | None = None) -> bytes:
    """A valid zstd frame of raw blocks, declaring ``declared`` content bytes."""
    n = len(payload) if declared is None else declared
    out = bytearray(b"\x28\xb5\x2f\xfd")
    out += bytes([0xA0]) + struct.pack("<I", n)  # single segment, 4-byte content size
    chunks = [payload[i:i + (128 << 10)] for i in range(0, len(payload), 128 << 10)]
    for k, chunk in enumerate(chunks):
        last = int(k == len(chunks) - 1)
        out += struct.pack("<I", (len(chunk) << 3) | last)[:3] + chunk
    return bytes(out)


def set_entry(store: Path, i: int, offset: int, phys: int, logic: int) -> None:
    meta = bytearray((store / "meta.zr").read_bytes())
    struct.pack_into("<QII", meta, PAGE + ENTRY * i, offset, phys, logic)
    (store / "meta.zr").write_bytes(bytes(meta))


def entry(store: Path, i: int) -> tuple[int, int, int]:
    return struct.unpack_from("<QII", (store / "meta.zr").read_bytes(), PAGE + ENTRY * i)


def append_frame(store: Path, frame: bytes) -> int:
    """Appends ``frame`` to data.zr, moves the committed tail past it, and
    returns its offset."""
    data = store / "data.zr"
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(frame)
    meta = bytearray((store / "meta.zr").read_bytes())
    struct.pack_into("<Q", meta, 8, offset + len(frame))
    (store / "meta.zr").write_bytes(bytes(meta))
    return offset


def ragged_store(path: Path, codec: str, n: int = 3) -> Path:
    with Ragged.create(path, np.int32, codec=codec) as w:
        w.append([np.arange(4, dtype=np.int32) + 10 * i for i in range(n)])
    return path


def test_forged_2gib_record_in_ragged_zstd_store_is_bounded(tmp_path):
    store = ragged_store(tmp_path / "forged", "zstd")
    phys = -(-(1 << 31) // MAX_EXPANSION)  # the smallest frame allowed to claim 2^31 bytes
    # Record 1: a real frame of `phys` bytes that decodes to far less than claimed.
    body = bytes(range(256)) * (phys // 256 + 1)
    frame = zstd_raw_frame(body[: phys - 12])
    assert len(frame) == phys
    set_entry(store, 1, append_frame(store, frame), phys, 1 << 31)
    # Record 2: a frame that itself declares 2^31 bytes of content but holds few.
    frame2 = zstd_raw_frame(body[: phys - 12], declared=1 << 31)
    set_entry(store, 2, append_frame(store, frame2), len(frame2), 1 << 31)

    report = run_probe(
        f"""
        ds = Ragged.open({str(store)!r})
        ds[0]; ds[[0, 0]]  # warm-up
        base = maxrss_kib()
        attempt("one", lambda: ds[1])
        attempt("declared", lambda: ds[2])
        attempt("batch", lambda: ds[[0, 1, 0]])
        attempt("packed", lambda: ds.gather_packed([0, 2]))
        attempt("repeated", lambda: ds[[1] * 1000])  # asks for 2 TiB
        attempt("good", lambda: ds[0])
        """
    )
    res = report["results"]
    for name in ("one", "declared", "batch", "packed"):
        assert res[name]["outcome"][0] == DECODE_FAILED, (name, res[name])
    assert res["repeated"]["outcome"][0] in (OUT_OF_MEMORY, DECODE_FAILED), res["repeated"]
    assert res["good"]["outcome"] == "ok"
    for name, r in res.items():
        assert r["seconds"] < MAX_SECONDS, (name, r)
    assert report["growth_mib"] < MAX_GROWTH_MIB, report


def test_claims_beyond_the_frame_bound_are_refused_before_allocating(tmp_path):
    store = ragged_store(tmp_path / "claims", "zstd")
    off, phys, _ = entry(store, 1)
    set_entry(store, 1, off, phys, 1 << 31)  # a ~30-byte frame cannot decode to 2 GiB
    report = run_probe(
        f"""
        ds = Ragged.open({str(store)!r})
        ds[0]
        base = maxrss_kib()
        attempt("one", lambda: ds[1])
        attempt("many", lambda: ds[[1] * 10000])
        """
    )
    for name, r in report["results"].items():
        assert r["outcome"][0] == DECODE_FAILED, (name, r)
        assert "cannot decode" in r["outcome"][1], r
        assert r["seconds"] < MAX_SECONDS
    assert report["growth_mib"] < MAX_GROWTH_MIB, report


HOSTILE_PREFIXES = {
    "rank_2^63": struct.pack("<Q", 1 << 63) + bytes(8),
    "rank_2^64-1": struct.pack("<Q", (1 << 64) - 1) + bytes(8),
    "rank_65": struct.pack("<Q", 65) + bytes(8),
    "dim_2^62": struct.pack("<QQ", 1, 1 << 62),
    "dims_overflow": struct.pack("<QQQ", 2, 1 << 32, 1 << 32),
    "dim_2^64-1": struct.pack("<QQ", 1, (1 << 64) - 1),
    "dim_zero": struct.pack("<QQ", 1, 0),
}


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_huge_ragged_ranks_and_dims_are_refused(tmp_path, codec):
    store = ragged_store(tmp_path / "shapes", codec, n=1)
    good = struct.pack("<QQ", 1, 4) + np.arange(4, dtype=np.int32).tobytes()
    names = list(HOSTILE_PREFIXES)
    for k, name in enumerate(names):
        # Each hostile record: the prefix, padded to the 32 bytes the good
        # record has, so only the shape lies.
        record = (HOSTILE_PREFIXES[name] + bytes(32))[:32]
        payload = zstd_raw_frame(record) if codec == "zstd" else record
        # Grow the table by one entry per hostile record.
        meta = bytearray((store / "meta.zr").read_bytes())
        struct.pack_into("<Q", meta, 0, k + 2)
        meta += bytes(ENTRY)
        (store / "meta.zr").write_bytes(bytes(meta))
        set_entry(store, k + 1, append_frame(store, payload), len(payload), len(record))
    report = run_probe(
        f"""
        ds = Ragged.open({str(store)!r})
        assert len(ds) == {len(names) + 1}
        ds[0]; ds.gather_packed([0, 0])
        base = maxrss_kib()
        for k, name in enumerate({names!r}):
            attempt(name, lambda k=k: ds[k + 1])
            attempt(name + "+batch", lambda k=k: ds[[0, k + 1, 0]])
            attempt(name + "+packed", lambda k=k: ds.gather_packed([0, k + 1]))
        attempt("good", lambda: np.testing.assert_array_equal(ds[0], np.arange(4, dtype=np.int32)))
        """
    )
    res = report["results"]
    assert res.pop("good")["outcome"] == "ok"
    for name, r in res.items():
        assert r["outcome"][0] == DECODE_FAILED, (name, r)
        assert "ragged record" in r["outcome"][1], (name, r)
        assert r["seconds"] < MAX_SECONDS, (name, r)
    assert report["growth_mib"] < MAX_GROWTH_MIB, report


def test_huge_dense_schema_width_with_tiny_data_is_bounded(tmp_path):
    """A Dense schema claiming 2^31-byte records over a few data bytes: the
    gather fails on the first table entry without touching the output."""
    store = tmp_path / "wide"
    with Dense.create(store, np.uint8, (1 << 31,), codec="zstd") as w:
        pass  # empty but committed: schema of width 2^31
    meta = bytearray((store / "meta.zr").read_bytes())
    frame = zstd_raw_frame(b"x" * 64)
    (store / "data.zr").write_bytes(frame)
    struct.pack_into("<QQ", meta, 0, 1, len(frame))
    meta += struct.pack("<QII", 0, len(frame), 1 << 31)
    (store / "meta.zr").write_bytes(bytes(meta))
    report = run_probe(
        f"""
        ds = Dense.open({str(store)!r})
        base = maxrss_kib()
        attempt("one", lambda: ds[0])
        """
    )
    r = report["results"]["one"]
    assert r["outcome"][0] in (DECODE_FAILED, OUT_OF_MEMORY), r
    assert r["seconds"] < MAX_SECONDS
    assert report["growth_mib"] < MAX_GROWTH_MIB, report


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_large_dict_file_is_refused_without_reading_it(tmp_path, codec):
    """A stray dict.zr beside a raw/zstd store, or one far larger than any
    zstd dictionary beside a zstd_dict store, is refused (-8) at open without
    being read into memory."""
    store = tmp_path / "stray"
    dict_bytes = bytes(range(256)) * 16 if codec == "zstd_dict" else None
    with Dense.create(store, np.int64, (4,), codec=codec, dict_bytes=dict_bytes) as w:
        w.append(np.arange(40, dtype=np.int64).reshape(10, 4))
    mode = "r+b" if codec == "zstd_dict" else "wb"
    with open(store / "dict.zr", mode) as f:
        f.truncate(256 << 20)  # sparse: costs no disk
    report = run_probe(
        f"""
        base = maxrss_kib()
        attempt("open", lambda: Dense.open({str(store)!r}))
        """
    )
    r = report["results"]["open"]
    assert r["outcome"][0] == INVALID_FORMAT, r
    assert "dict.zr" in r["outcome"][1], r
    assert r["seconds"] < MAX_SECONDS, r
    assert report["growth_mib"] < MAX_GROWTH_MIB, report
