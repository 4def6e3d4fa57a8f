"""Packed Ragged gathers: (values, cu_seqlens, shapes), standalone and from the loader."""

import numpy as np
import pytest

from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged

RECORDS = [np.arange(i % 5 + 1, dtype=np.int32) * 10 + i for i in range(23)]


@pytest.fixture(params=["raw", "zstd"])
def tokens(request, tmp_path):
    with Ragged.create(tmp_path / "t", np.int32, codec=request.param) as w:
        w.append(RECORDS)
    with Ragged.open(tmp_path / "t") as r:
        yield r


def unpack(values, cu, shapes):
    return [values[cu[i] : cu[i + 1]].reshape(shapes[i]) for i in range(len(shapes))]


def test_packed_layout(tokens):
    idx = [3, 0, 22, 7, 7]
    values, cu, shapes = tokens.gather_packed(idx)
    assert values.dtype == np.int32 and values.ndim == 1 and values.flags.c_contiguous
    assert cu.dtype == np.int32 and cu.tolist() == [0] + np.cumsum([len(RECORDS[i]) for i in idx]).tolist()
    assert shapes.dtype == np.int64 and shapes.shape == (5, 1)
    assert shapes[:, 0].tolist() == [len(RECORDS[i]) for i in idx]
    np.testing.assert_array_equal(values, np.concatenate([RECORDS[i] for i in idx]))
    for got, i in zip(unpack(values, cu, shapes), idx):
        np.testing.assert_array_equal(got, RECORDS[i])


def test_packed_keys(tokens):
    values, cu, shapes = tokens.gather_packed(4)
    np.testing.assert_array_equal(values, RECORDS[4])
    assert cu.tolist() == [0, 5] and shapes.tolist() == [[5]]
    values, cu, shapes = tokens.gather_packed(slice(2, 2))
    assert values.shape == (0,) and cu.tolist() == [0] and shapes.shape[0] == 0
    mask = np.zeros(len(RECORDS), bool)
    mask[[1, 5]] = True
    values, cu, _ = tokens.gather_packed(mask)
    np.testing.assert_array_equal(values, np.concatenate([RECORDS[1], RECORDS[5]]))
    with pytest.raises(IndexError):
        tokens.gather_packed([23])
    with pytest.raises(IndexError):
        tokens.gather_packed(-1)
    with pytest.raises(TypeError):
        tokens.gather_packed(1.5)


def test_packed_multi_dimensional_and_mixed_ranks(tmp_path):
    recs = [np.arange(6, dtype=np.float64).reshape(2, 3), np.arange(4, dtype=np.float64).reshape(4, 1)]
    with Ragged.create(tmp_path / "m", np.float64) as w:
        w.append(recs + [np.array(1.5)])
    with Ragged.open(tmp_path / "m") as r:
        values, cu, shapes = r.gather_packed([0, 1])
        assert shapes.tolist() == [[2, 3], [4, 1]] and cu.tolist() == [0, 6, 10]
        for got, want in zip(unpack(values, cu, shapes), recs):
            np.testing.assert_array_equal(got, want)
        with pytest.raises(ValueError, match="different ranks"):
            r.gather_packed([0, 2])


def test_loader_packed_stream(tmp_path, tokens):
    with Dense.create(tmp_path / "id", np.int64, ()) as w:
        w.append(np.arange(len(RECORDS), dtype=np.int64))
    ids = Dense.open(tmp_path / "id")
    try:
        plain = DataLoader({"id": ids, "t": tokens}, batch_size=6, mode=1, seed=3)
        packed = DataLoader({"id": ids, "t": tokens}, batch_size=6, mode=1, seed=3, packed=["t"])
        for _ in range(5):
            a, b = next(plain), next(packed)
            np.testing.assert_array_equal(a["id"], b["id"])
            values, cu, shapes = b["t"]
            for got, want, i in zip(unpack(values, cu, shapes), a["t"], a["id"]):
                np.testing.assert_array_equal(got, want)
                np.testing.assert_array_equal(got, RECORDS[i])
        plain.close()
        packed.close()
        with pytest.raises(ValueError, match="not Ragged"):
            DataLoader({"id": ids, "t": tokens}, packed=["id"])
        with pytest.raises(ValueError, match="not Ragged"):
            DataLoader({"id": ids, "t": tokens}, packed="nope")
    finally:
        ids.close()
