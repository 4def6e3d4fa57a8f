"""Machine-learning dtypes (bfloat16, float8, int4, ... from ml-dtypes):
stored by name, read back as the same dtype, bit for bit; and every dtype
whose stored form would not read back as itself is refused at create."""
from __future__ import annotations

import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

from conftest import loaderx_child_env
from loaderx import sets, tools
from loaderx.zrecord import ML_DTYPES, Dense, Ragged


def _values(dtype: np.dtype, n: int, seed: int = 0) -> np.ndarray:
    """``n`` values of ``dtype`` covering its bit patterns (NaNs included)."""
    bits = np.random.default_rng(seed).integers(0, 256, size=n * dtype.itemsize, dtype=np.uint8)
    if dtype.name in ("int2", "uint2", "int4", "uint4"):
        lo = 2 if dtype.name.endswith("2") else 4  # ml-dtypes keeps them in the low bits
        bits &= (1 << lo) - 1
    return bits.view(dtype)


@pytest.mark.parametrize("name", sorted(ML_DTYPES))
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_every_ml_dtype_round_trips_bit_for_bit(tmp_path, name, codec):
    dtype = np.dtype(getattr(ml_dtypes, name))
    data = _values(dtype, 6 * 5 * 7).reshape(6, 5, 7)
    with Dense.create(tmp_path / "d", dtype, (5, 7), codec=codec) as w:
        w.append(data)
    with Dense.open(tmp_path / "d") as ds:
        assert ds.dtype == dtype
        got = ds[[5, 0, 3]]
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(np.uint8), data[[5, 0, 3]].view(np.uint8))
    recs = [_values(dtype, n, seed=n) for n in (1, 9, 4)]
    with Ragged.create(tmp_path / "r", name, codec=codec) as w:  # by name works too
        w.append(recs)
    with Ragged.open(tmp_path / "r") as rs:
        for got, want in zip(rs[:], recs, strict=True):
            assert got.dtype == dtype
            np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    assert tools.info(tmp_path / "d")["dtype"] == name


def test_the_schema_records_the_name(tmp_path):
    with Dense.create(tmp_path / "b", ml_dtypes.bfloat16, (2,), codec="raw") as w:
        w.append(np.ones((3, 2), ml_dtypes.bfloat16))
    page = (tmp_path / "b" / "meta.zr").read_bytes()[:4096]
    assert b"bfloat16" in page and b"<V2" not in page
    # Plain NumPy dtypes keep loaderx 2.0.0's strings (byte order and widths too).
    for dtype in ("<f4", ">i8", "<U7", "|S3", ">M8[ms]", "|b1", "<c16"):
        path = tmp_path / dtype.replace("<", "le").replace(">", "be").replace("|", "na")
        data = np.zeros((2, 3), dtype)
        with Dense.create(path, dtype, (3,)) as w:
            w.append(data)
        assert dtype.encode() in (path / "meta.zr").read_bytes()[:4096]
        with Dense.open(path) as ds:
            assert ds.dtype == np.dtype(dtype) and ds[0].dtype.str == dtype


def test_sets_of_ml_dtypes(tmp_path):
    data = _values(np.dtype(ml_dtypes.float8_e4m3fn), 40).reshape(10, 4)
    with Dense.create(tmp_path / "s", data.dtype, (4,), shard_records=3) as w:
        w.append(data)
    with Dense.open(tmp_path / "s") as ds:
        assert len(ds.shards) == 4
        np.testing.assert_array_equal(ds[:].view(np.uint8), data.view(np.uint8))
    info = sets.write_shard(str(tmp_path / "t"), "p0", [data], dtype=data.dtype, item_shape=(4,))
    assert sets.commit(str(tmp_path / "t"), [info], dtype=data.dtype, item_shape=(4,))[
        "dtype"] == "float8_e4m3fn"


def test_dtypes_that_would_not_read_back_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="cannot be stored|not supported|cannot be persisted"):
        Dense.create(tmp_path / "x", np.dtypes.StringDType(), (2,))
    assert not (tmp_path / "x").exists()


def test_opening_without_ml_dtypes_names_the_package(tmp_path):
    with Dense.create(tmp_path / "b", ml_dtypes.bfloat16, (2,)) as w:
        w.append(np.ones((3, 2), ml_dtypes.bfloat16))
    child = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "from loaderx.zrecord import Dense\n"
        "try:\n"
        f"    Dense.open({str(tmp_path / 'b')!r})\n"
        "except ImportError as e:\n"
        "    print('ImportError:', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         timeout=60, env=loaderx_child_env())
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "ImportError: bfloat16 records need the ml-dtypes package: pip install ml-dtypes "
        "(or pip install 'loaderx[ml-dtypes]')")
