"""Stores written by later loaderx releases (2.0.1 through 2.8.19) read exactly.

The fixtures under ``tests/fixtures/later/<release>/`` were written by each
release from PyPI, driven as a black box by ``make_fixtures.py`` (see there);
``expected.npz`` holds the values appended, computed by the script, never
read back through a release. CI needs no release installed.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaderx import tools
from loaderx.zrecord import Dense, Ragged, ZrecordError

LATER = Path(__file__).resolve().parent / "fixtures" / "later"


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


RELEASES = sorted((p.name for p in LATER.iterdir() if (p / "manifest.json").is_file()),
                  key=_version_key)

# Which layout each release writes, as found by comparing their bytes
# (docs/format.md, "Layouts of later releases"). Dense stores only changed
# where a Ragged-only difference did not apply.
def expected_layout(release: str, kind: str) -> str:
    v = _version_key(release)
    if v < (2, 0, 1):
        return "2.0.0"
    if v < (2, 2):
        return "2.0.0" if kind == "dense" else "2.0.1"
    if v < (2, 3, 3):
        return "2.2"
    if v < (2, 8, 12):
        return "2.3.3"
    if v < (2, 8, 18):
        return "2.8.12"
    if v < (2, 8, 19) or kind == "dense":
        return "2.8.18"
    return "2.8.19"


def _cases():
    for release in RELEASES:
        manifest = json.loads((LATER / release / "manifest.json").read_text())
        for name, entry in sorted(manifest["stores"].items()):
            if "error" not in entry:
                yield pytest.param(release, name, entry, id=f"{release}-{name}")


CASES = list(_cases())


def test_every_release_has_fixtures():
    assert RELEASES[0] == "2.0.0" and RELEASES[-1] == "2.8.19"
    assert len(RELEASES) == 23
    assert len(CASES) > 23 * 15


def _expected(release: str):
    return np.load(LATER / release / "expected.npz")


def _check(store, name: str, entry: dict, expected) -> None:
    n = entry["length"]
    assert len(store) == n
    assert store.codec == entry["codec"]
    assert store.dtype == np.dtype(entry["dtype"])
    if entry["kind"] == "dense":
        want = expected[name]
        assert store.item_shape == tuple(entry["item_shape"])
        got = store[:]
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        for i in range(n):
            np.testing.assert_array_equal(store[i], want[i])
        if n:  # a gather out of order
            idx = np.arange(n)[::-1]
            np.testing.assert_array_equal(store[idx], want[idx])
    else:
        got = store[:]
        assert len(got) == n
        for i, (rec, shape) in enumerate(zip(got, entry["shapes"])):
            want = expected[f"{name}/{i}"]
            assert rec.shape == tuple(shape) and rec.dtype == want.dtype
            np.testing.assert_array_equal(rec, want)
            np.testing.assert_array_equal(store[i], want)


@pytest.mark.parametrize("release,name,entry", CASES)
def test_release_store_reads_exactly(release, name, entry):
    expected = _expected(release)
    cls = Dense if entry["kind"] == "dense" else Ragged
    with cls.open(LATER / release / name) as store:
        _check(store, name, entry, expected)
        want = expected_layout(release, entry["kind"])
        if entry["length"] == 0 and want in ("2.0.1", "2.8.19"):
            # Only records tell these from 2.0.0 / 2.8.18: empty stores are the same bytes.
            want = {"2.0.1": "2.0.0", "2.8.19": "2.8.18"}[want]
        assert store.layout == want
        assert not store.writable
    # The kind-probing opener (info, verify, convert) finds the same.
    with tools.open_store(LATER / release / name) as store:
        assert type(store) is cls


@pytest.mark.parametrize("release,name,entry", CASES)
def test_release_store_verifies(release, name, entry):
    result = tools.verify(LATER / release / name)
    assert result.ok, result


def _one_per_layout():
    seen: dict[tuple[str, str], object] = {}
    for p in CASES:
        release, name, entry = p.values
        key = (expected_layout(release, entry["kind"]), entry["codec"] + entry["kind"])
        if key not in seen and entry["length"]:
            seen[key] = p
    return list(seen.values())


@pytest.mark.parametrize("release,name,entry", _one_per_layout())
def test_convert_to_2_0_0_layout(release, name, entry, tmp_path):
    dst = tmp_path / "converted"
    codec = "raw" if entry["codec"] == "raw" else "zstd"
    tools.convert(LATER / release / name, dst, codec=codec)
    cls = Dense if entry["kind"] == "dense" else Ragged
    with cls.open(dst) as store:
        assert store.layout == "2.0.0"
        _check(store, name, dict(entry, codec=codec), _expected(release))
    # the 2.0.0 files (no data_N.zr); beside them, sums.zr and convert's features.json
    names = {p.name for p in dst.iterdir()}
    assert {"data.zr", "meta.zr"} <= names <= {"data.zr", "meta.zr", "dict.zr", "sums.zr", "features.json"}


def test_wrong_kind_is_a_schema_error():
    with pytest.raises(ValueError):
        Ragged.open(LATER / "2.8.19" / "dense_u8_raw_2")
    with pytest.raises(ValueError):
        Dense.open(LATER / "2.3.3" / "ragged_i32_rank2_raw")


def test_info_reports_the_layout(capsys):
    d = tools.info(LATER / "2.5.5" / "dense_f32_zstd")
    assert (d["layout"], d["layout_releases"]) == ("2.3.3", "loaderx 2.3.3–2.8.6")
    assert d["records"] == 3 and d["codec"] == "zstd"
    d = tools.info(LATER / "2.0.7" / "ragged_i32_rank2_raw")
    assert (d["layout"], d["layout_releases"]) == ("2.0.1", "loaderx 2.0.1–2.0.7")
    d = tools.info(LATER / "2.0.0" / "ragged_i32_rank2_raw")
    assert d["layout"] == "2.0.0"
    proc = subprocess.run(
        [sys.executable, "-m", "loaderx", "info", str(LATER / "2.8.19" / "ragged_i32_rank2_zstd")],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "loaderx 2.8.19 layout (written by loaderx 2.8.19" in proc.stdout
    assert "read-only" in proc.stdout


def test_cli_convert_round_trip(tmp_path):
    src = LATER / "2.8.18" / "ragged_i32_rank3_zstd"
    dst = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "loaderx", "convert", str(src), str(dst)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    with Ragged.open(dst) as a, Ragged.open(src) as b:
        assert a.layout == "2.0.0" and b.layout == "2.8.18"
        for x, y in zip(a[:], b[:]):
            np.testing.assert_array_equal(x, y)
            assert x.shape == y.shape


def _copy(release: str, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(LATER / release / name, dst)
    return dst


def test_unknown_sharded_header_is_refused(tmp_path):
    p = _copy("2.3.3", "dense_u8_raw_2", tmp_path)
    meta = bytearray((p / "meta.zr").read_bytes())
    meta[12] = 7  # a field no known release sets
    (p / "meta.zr").write_bytes(bytes(meta))
    with pytest.raises(ZrecordError, match="does not know"):
        Dense.open(p)


def test_unknown_schema_is_refused(tmp_path):
    p = _copy("2.8.19", "dense_u8_raw_2", tmp_path)
    meta = bytearray((p / "meta.zr").read_bytes())
    at = 2056
    schema = b'{"dtype": "uint8", "item_shape": [4], "v": 3}'
    meta[8:10] = len(schema).to_bytes(2, "little")
    meta[at:at + len(schema)] = schema
    (p / "meta.zr").write_bytes(bytes(meta))
    with pytest.raises(ZrecordError, match="no layout of a loaderx release"):
        Dense.open(p)


def test_unknown_native_header_is_refused(tmp_path):
    p = _copy("2.0.0", "dense_u8_raw_2", tmp_path)
    meta = bytearray((p / "meta.zr").read_bytes())
    meta[24] = 1  # reserved in every 2.0.x header
    (p / "meta.zr").write_bytes(bytes(meta))
    with pytest.raises(ZrecordError, match="not a header of any loaderx layout"):
        Dense.open(p)


def test_missing_and_extra_data_files_are_refused(tmp_path):
    p = _copy("2.3.3", "dense_f32_raw", tmp_path)
    (p / "data_3.zr").unlink()
    with pytest.raises(ZrecordError, match="data_3.zr is missing"):
        Dense.open(p)
    p = _copy("2.3.3", "dense_u8_raw_9_shards3", tmp_path / "b")
    (p / "data_3.zr").write_bytes(b"")
    with pytest.raises(ZrecordError, match="names 3 data files"):
        Dense.open(p)


def test_damaged_table_entry_is_refused(tmp_path):
    p = _copy("2.3.3", "dense_u8_raw_9_shards3", tmp_path)
    meta = bytearray((p / "meta.zr").read_bytes())
    meta[4096 + 16 * 8: 4096 + 16 * 8 + 8] = (12).to_bytes(8, "little")  # past data_2's end
    (p / "meta.zr").write_bytes(bytes(meta))
    with Dense.open(p) as s:
        np.testing.assert_array_equal(s[0], [1, 2, 3, 4])
        with pytest.raises(ZrecordError, match="data_2.zr"):
            s[8]


def test_mismatched_ragged_records_are_corrupt(tmp_path):
    # A 2.8.18 store (u64 dims) whose second record was rewritten the 2.8.19 way.
    p = _copy("2.8.18", "ragged_u16_rank1_raw_7_shards2", tmp_path)
    with Ragged.open(p) as s:
        assert s.layout == "2.8.18"
    meta = bytearray((p / "meta.zr").read_bytes())
    # record 1 is in data_1.zr at 0: [u64 2][2 u16]; rewrite as [u32 2][2 u16] + pad
    d1 = bytearray((p / "data_1.zr").read_bytes())
    d1[0:12] = (2).to_bytes(4, "little") + bytes(d1[8:12]) + bytes(4)
    (p / "data_1.zr").write_bytes(bytes(d1))
    meta[4096 + 16 + 8:4096 + 16 + 16] = (8).to_bytes(4, "little") * 2
    (p / "meta.zr").write_bytes(bytes(meta))
    with Ragged.open(p) as s:
        np.testing.assert_array_equal(s[0], [1])
        with pytest.raises(ZrecordError):
            s[1]


def test_create_over_a_later_release_store_is_refused(tmp_path):
    p = _copy("2.3.3", "dense_u8_raw_2", tmp_path)
    with pytest.raises(ZrecordError, match="already exists"):
        Dense.create(p, "|u1", (4,), codec="raw")
