"""Readers get at records by memory map or positional reads; both agree."""

import pickle

import numpy as np
import pytest

from loaderx.zrecord import Dense, Ragged

IMAGES = np.arange(40 * 3 * 8 * 8, dtype=np.uint8).reshape(40, 3, 8, 8)
TOKENS = [np.arange(i % 9 + 1, dtype=np.int64) * 3 + i for i in range(40)]


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_modes_agree(tmp_path, codec):
    with Dense.create(tmp_path / "d", np.uint8, (3, 8, 8), codec=codec) as w:
        w.append(IMAGES)
    with Ragged.create(tmp_path / "r", np.int64, codec=codec) as w:
        w.append(TOKENS)
    idx = np.random.default_rng(5).integers(0, 40, 100)
    for mode in ("map", "read", "auto", None):
        with Dense.open(tmp_path / "d", data_access=mode) as d, Ragged.open(tmp_path / "r", data_access=mode) as r:
            if mode in ("map", "read"):
                assert d.data_access == mode and r.data_access == mode
            np.testing.assert_array_equal(d[idx], IMAGES[idx])
            for got, i in zip(r[idx], idx):
                np.testing.assert_array_equal(got, TOKENS[i])


def test_auto_maps_small_raw_records_and_reads_the_rest(tmp_path, monkeypatch):
    monkeypatch.delenv("LOADERX_DATA_ACCESS", raising=False)
    with Dense.create(tmp_path / "small", np.uint8, (3, 8, 8), codec="raw") as w:
        w.append(IMAGES)
    with Dense.create(tmp_path / "zstd", np.uint8, (3, 8, 8), codec="zstd") as w:
        w.append(IMAGES)
    with Dense.create(tmp_path / "big", np.uint8, (200_000,), codec="raw") as w:
        w.append(np.zeros((2, 200_000), np.uint8))
    assert Dense.open(tmp_path / "small").data_access == "map"
    assert Dense.open(tmp_path / "zstd").data_access == "read"
    assert Dense.open(tmp_path / "big").data_access == "read"
    monkeypatch.setenv("LOADERX_DATA_ACCESS", "read")
    assert Dense.open(tmp_path / "small").data_access == "read"
    monkeypatch.setenv("LOADERX_DATA_ACCESS", "map")
    assert Dense.open(tmp_path / "zstd").data_access == "map"


def test_bad_mode_and_pickling(tmp_path):
    with Dense.create(tmp_path / "d", np.uint8, (3, 8, 8), codec="raw") as w:
        w.append(IMAGES)
    with pytest.raises(ValueError, match="data_access"):
        Dense.open(tmp_path / "d", data_access="fast")
    r = Dense.open(tmp_path / "d", data_access="read")
    again = pickle.loads(pickle.dumps(r))
    assert again.data_access == "read" and again.item_shape == (3, 8, 8)
    np.testing.assert_array_equal(again[[3, 1]], IMAGES[[3, 1]])
    r.close()
    again.close()
    with pytest.raises(RuntimeError):
        r.data_access
