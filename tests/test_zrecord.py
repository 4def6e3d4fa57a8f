"""Contract tests for the record store layer: loaderx.zrecord Dense / Ragged.

Written against API.md / FORMAT.md and the loaderx 2.0.0 README; the
implementation under test is whatever ``import loaderx`` resolves to.
"""
from __future__ import annotations

import gc
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from loaderx.utils import train_dict
from loaderx.zrecord import DICT_TIERS, Dense, Ragged, SchemaError, ZrecordError

CODECS = ["raw", "zstd", "zstd_dict"]
KIB = 1024
MIB = 1024 * 1024

# Every dtype the stores must carry bit-exactly.
ROUND_TRIP_DTYPES = [
    "|b1", "<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4",
    "<u8", "<c8", "<c16", "<M8[ns]", "<m8[s]", "<U5", "|S3",
]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zdict(fixtures_dir) -> bytes:
    """A real zstd dictionary (trained by loaderx 2.0.0 for one fixture)."""
    data = (fixtures_dir / "dict_fast_images.zdict").read_bytes()
    assert len(data) > 0
    return data


def codec_kwargs(codec, zdict):
    return {"codec": codec, "dict_bytes": zdict if codec == "zstd_dict" else None}


def random_values(dtype, shape, rng) -> np.ndarray:
    """Deterministic values of ``dtype``; every bit pattern for plain types."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    if dt.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dt)
    if dt.kind == "U":
        alphabet = np.array(list("abcXYZ09 é漢\u00ff\U0001F600"))
        out = np.empty(count, dtype=dt)
        for i in range(count):
            n = int(rng.integers(0, dt.itemsize // 4 + 1))
            out[i] = "".join(rng.choice(alphabet, size=n))
        return out.reshape(shape)
    raw = rng.integers(0, 256, size=count * dt.itemsize, dtype=np.uint8)
    return raw.view(dt).reshape(shape).copy()


def assert_exact(actual, expected):
    """Same type of container, dtype, shape and bytes."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.dtype.str == expected.dtype.str
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_record(actual, expected):
    """One Dense record: an array of item_shape (a NumPy scalar is accepted
    for a scalar store)."""
    assert isinstance(actual, (np.ndarray, np.generic)), type(actual)
    arr = np.asarray(actual)
    assert arr.dtype == expected.dtype
    assert arr.shape == expected.shape
    assert arr.tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_records(actual, expected_list):
    assert isinstance(actual, list), type(actual)
    assert len(actual) == len(expected_list)
    for a, e in zip(actual, expected_list):
        assert_exact(a, e)


def make_dense(path, data, codec="zstd", zdict=None, batches=1):
    with Dense.create(path, data.dtype, data.shape[1:], codec=codec,
                      dict_bytes=zdict if codec == "zstd_dict" else None) as w:
        for part in np.array_split(np.arange(len(data)), batches):
            if len(part):
                assert w.append(data[part[0]:part[-1] + 1]) is None
    return path


def make_ragged(path, records, dtype, codec="zstd", zdict=None):
    with Ragged.create(path, dtype, codec=codec,
                       dict_bytes=zdict if codec == "zstd_dict" else None) as w:
        assert w.append(records) is None
    return path


F32 = np.arange(10 * 2 * 3, dtype=np.float32).reshape(10, 2, 3) * 0.5 - 7.0
RAGGED_RECS = [
    np.array(3.5, dtype=np.float64),                       # 0-d
    np.arange(5, dtype=np.float64),                        # 1-d
    np.arange(6, dtype=np.float64).reshape(2, 3) + 100,    # 2-d
    np.arange(24, dtype=np.float64).reshape(2, 3, 4) - 9,  # 3-d
    np.array([-1.25]),                                     # 1-d, length 1
    np.ones((1, 1), dtype=np.float64),                     # 2-d of one item
    np.arange(7, dtype=np.float64)[::-1].copy(),
    np.array(-0.0),                                        # 0-d again
]


@pytest.fixture
def dense_reader(tmp_path):
    r = Dense.open(make_dense(tmp_path / "d", F32, codec="zstd", batches=3))
    yield r
    r.close()


@pytest.fixture
def ragged_reader(tmp_path):
    r = Ragged.open(make_ragged(tmp_path / "r", RAGGED_RECS, np.float64, codec="zstd"))
    yield r
    r.close()


# --------------------------------------------------------------------------
# module surface
# --------------------------------------------------------------------------

def test_module_surface():
    import loaderx.utils
    import loaderx.zrecord

    assert isinstance(loaderx.__version__, str) and loaderx.__version__
    for name in ("Dense", "Ragged", "ZrecordError", "DICT_TIERS"):
        assert hasattr(loaderx.zrecord, name)
    assert callable(loaderx.utils.train_dict)


def test_dict_tiers_exact():
    assert DICT_TIERS == {
        "fast": {"size": 32 * KIB, "samples": 4 * MIB},
        "balanced": {"size": 128 * KIB, "samples": 16 * MIB},
        "max": {"size": 1 * MIB, "samples": 64 * MIB},
    }
    assert DICT_TIERS["fast"]["size"] == 32768
    assert DICT_TIERS["max"]["samples"] == 67108864


def test_zrecorderror_is_runtimeerror_with_int_code(tmp_path):
    assert issubclass(ZrecordError, RuntimeError)
    (tmp_path / "occupied").mkdir()
    (tmp_path / "occupied" / "x.txt").write_text("hello")
    with pytest.raises(ZrecordError) as ei:
        Dense.create(tmp_path / "occupied", np.float32, (2,))
    assert type(ei.value.code) is int
    assert ei.value.code == -12
    assert isinstance(ei.value, RuntimeError)
    assert str(ei.value)


# --------------------------------------------------------------------------
# construction and attributes
# --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [Dense, Ragged])
@pytest.mark.parametrize("args", [(), ("some/path",), ("p", np.float32, (2,))])
def test_direct_construction_is_refused(cls, args):
    with pytest.raises(TypeError) as ei:
        cls(*args)
    msg = str(ei.value)
    assert ".open(" in msg and ".create(" in msg


@pytest.mark.parametrize("codec", CODECS)
def test_dense_writer_and_reader_attributes(tmp_path, codec, zdict):
    p = tmp_path / "ds"
    w = Dense.create(str(p), np.float32, [2, 3], **codec_kwargs(codec, zdict))
    try:
        assert isinstance(w, Dense)
        assert isinstance(w.path, Path)
        assert w.path == p
        assert w.dtype == np.dtype("<f4") and isinstance(w.dtype, np.dtype)
        assert w.item_shape == (2, 3) and type(w.item_shape) is tuple
        assert w.codec == codec
        assert w.has_dict() is (codec == "zstd_dict")
        assert len(w) == 0
        w.append(F32[:4])
        assert len(w) == 4
        w.append(F32[4:])
        assert len(w) == 10
    finally:
        w.close()
    r = Dense.open(p)
    try:
        assert isinstance(r, Dense)
        assert isinstance(r.path, Path) and r.path == p
        assert r.dtype == np.dtype("<f4") and isinstance(r.dtype, np.dtype)
        assert r.item_shape == (2, 3) and type(r.item_shape) is tuple
        assert r.codec == codec
        assert r.has_dict() is (codec == "zstd_dict")
        assert len(r) == 10
    finally:
        r.close()


@pytest.mark.parametrize("codec", CODECS)
def test_ragged_writer_and_reader_attributes(tmp_path, codec, zdict):
    p = tmp_path / "rs"
    w = Ragged.create(str(p), np.int32, **codec_kwargs(codec, zdict))
    try:
        assert isinstance(w, Ragged)
        assert isinstance(w.path, Path) and w.path == p
        assert w.dtype == np.dtype("<i4") and isinstance(w.dtype, np.dtype)
        assert w.codec == codec
        assert w.has_dict() is (codec == "zstd_dict")
        assert len(w) == 0
        w.append([np.arange(3, dtype=np.int32), np.array(4, dtype=np.int32)])
        assert len(w) == 2
    finally:
        w.close()
    with Ragged.open(p) as r:
        assert isinstance(r, Ragged)
        assert isinstance(r.path, Path) and r.path == p
        assert r.dtype == np.dtype("<i4")
        assert r.codec == codec
        assert r.has_dict() is (codec == "zstd_dict")
        assert len(r) == 2


def test_default_codec_is_zstd(tmp_path):
    with Dense.create(tmp_path / "d", np.uint8, (4,)) as w:
        assert w.codec == "zstd"
        w.append(np.zeros((1, 4), np.uint8))
    with Ragged.create(tmp_path / "r", np.uint8) as w:
        assert w.codec == "zstd"
        w.append([np.zeros(4, np.uint8)])
    with Dense.open(tmp_path / "d") as r:
        assert r.codec == "zstd" and not r.has_dict()
    with Ragged.open(tmp_path / "r") as r:
        assert r.codec == "zstd" and not r.has_dict()


@pytest.mark.parametrize("dtype_spec", [np.float32, "float32", "<f4", np.dtype("float32")])
def test_dtype_spellings(tmp_path, dtype_spec):
    with Dense.create(tmp_path / "d", dtype_spec, (2,)) as w:
        assert w.dtype == np.dtype("<f4")
    with Ragged.create(tmp_path / "r", dtype_spec) as w:
        assert w.dtype == np.dtype("<f4")


def test_item_shape_accepts_numpy_ints_and_lists(tmp_path):
    with Dense.create(tmp_path / "a", np.int16, [np.int64(2), np.uint8(3)]) as w:
        assert w.item_shape == (2, 3) and type(w.item_shape) is tuple
        w.append(np.zeros((1, 2, 3), np.int16))
    with Dense.open(tmp_path / "a") as r:
        assert r.item_shape == (2, 3)
        assert all(int(d) == e for d, e in zip(r.item_shape, (2, 3)))


def test_with_returns_self_and_closes(tmp_path):
    p = tmp_path / "d"
    with Dense.create(p, np.int8, (2,)) as w:
        w.append(np.ones((3, 2), np.int8))
    with pytest.raises(RuntimeError):
        w.append(np.ones((1, 2), np.int8))
    with Dense.open(p) as r:
        assert isinstance(r, Dense) and len(r) == 3
    with pytest.raises(RuntimeError):
        r[0]


def test_with_does_not_swallow_exceptions(tmp_path):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with Ragged.create(tmp_path / "r", np.int8) as w:
            w.append([np.ones(2, np.int8)])
            raise Boom()
    with pytest.raises(RuntimeError):
        w.append([np.ones(2, np.int8)])


def test_close_twice_is_harmless(tmp_path):
    p = tmp_path / "d"
    w = Dense.create(p, np.int8, (2,))
    w.append(np.ones((1, 2), np.int8))
    w.close()
    w.close()
    r = Dense.open(p)
    r.close()
    r.close()
    q = tmp_path / "r"
    w = Ragged.create(q, np.int8)
    w.close()
    w.close()
    r = Ragged.open(q)
    assert len(r) == 0
    r.close()
    r.close()


@pytest.mark.parametrize("cls", [Dense, Ragged])
def test_an_unclosed_writer_warns_when_collected(tmp_path, cls):
    args = (np.int8, (2,)) if cls is Dense else (np.int8,)
    w = cls.create(tmp_path / "s", *args)
    with pytest.warns(ResourceWarning, match=r"unclosed .* writer of .*: the store stays uncommitted"):
        del w
        gc.collect()
    with pytest.raises(ZrecordError, match="never closed"):
        cls.open(tmp_path / "s")


def test_closed_writers_and_readers_do_not_warn(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = Dense.create(tmp_path / "d", np.int8, (2,))
        w.append(np.ones((1, 2), np.int8))
        w.close()
        del w
        r = Dense.open(tmp_path / "d")  # an open reader is dropped without close()
        del r
        with Ragged.create(tmp_path / "r", np.int8) as w:
            w.append([np.ones(3, np.int8)])
        del w
        gc.collect()


def test_writer_has_no_maintenance_api(tmp_path):
    for w in (Dense.create(tmp_path / "d", np.int8, (2,)), Ragged.create(tmp_path / "r", np.int8)):
        try:
            for name in ("sync", "delete", "compact", "stats"):
                assert not hasattr(w, name), name
        finally:
            w.close()


# --------------------------------------------------------------------------
# codec / dict validation at create
# --------------------------------------------------------------------------

@pytest.mark.parametrize("codec", ["lz4", "ZSTD", "", "zstdict", "gzip"])
def test_unknown_codec(tmp_path, codec):
    with pytest.raises(ValueError, match="unknown codec"):
        Dense.create(tmp_path / "d", np.float32, (2,), codec=codec)
    with pytest.raises(ValueError, match="unknown codec"):
        Ragged.create(tmp_path / "r", np.float32, codec=codec)
    # a refused create does not block a later valid one at the same path
    Dense.create(tmp_path / "d", np.float32, (2,), codec="raw").close()
    Ragged.create(tmp_path / "r", np.float32, codec="raw").close()


@pytest.mark.parametrize("dict_bytes", [None, b""])
def test_zstd_dict_requires_non_empty_dict(tmp_path, dict_bytes):
    with pytest.raises(ValueError):
        Dense.create(tmp_path / "d", np.float32, (2,), codec="zstd_dict", dict_bytes=dict_bytes)
    with pytest.raises(ValueError):
        Ragged.create(tmp_path / "r", np.float32, codec="zstd_dict", dict_bytes=dict_bytes)
    Dense.create(tmp_path / "d", np.float32, (2,)).close()
    Ragged.create(tmp_path / "r", np.float32).close()


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_dict_bytes_with_other_codec(tmp_path, codec, zdict):
    with pytest.raises(ValueError):
        Dense.create(tmp_path / "d", np.float32, (2,), codec=codec, dict_bytes=zdict)
    with pytest.raises(ValueError):
        Ragged.create(tmp_path / "r", np.float32, codec=codec, dict_bytes=zdict)
    Dense.create(tmp_path / "d", np.float32, (2,), codec=codec).close()


# --------------------------------------------------------------------------
# dtype / item_shape validation
# --------------------------------------------------------------------------

BAD_DTYPES = {
    "structured": np.dtype([("a", "<f4"), ("b", "<i2")]),
    "subarray": np.dtype(("<f4", (2,))),
    "object": np.dtype(object),
    "metadata": np.dtype(np.float32, metadata={"a": 1}),
}


@pytest.mark.parametrize("which", sorted(BAD_DTYPES))
def test_bad_dtypes_refused(tmp_path, which):
    dt = BAD_DTYPES[which]
    with pytest.raises(ValueError):
        Dense.create(tmp_path / "d", dt, (2,))
    with pytest.raises(ValueError):
        Ragged.create(tmp_path / "r", dt)
    Dense.create(tmp_path / "d", np.float32, (2,)).close()
    Ragged.create(tmp_path / "r", np.float32).close()


def test_zero_itemsize_dtype_refused_for_dense(tmp_path):
    with pytest.raises(ValueError):
        Dense.create(tmp_path / "d", np.dtype("U0"), (2,))


@pytest.mark.parametrize("dtype,item_shape", [
    (np.float32, (-1,)),
    (np.float32, (2, -3)),
    (np.float32, (True,)),
    (np.float32, (2, False)),
    (np.float32, (1.5,)),
    (np.float32, (2.0,)),
    (np.float32, ("3",)),
    (np.float32, (None,)),
    (np.float32, 3),            # not an iterable
    (np.float32, (0,)),         # width 0
    (np.float32, (3, 0)),       # width 0
    (np.uint8, (2**31 + 1,)),   # width just over 2^31
    (np.uint16, (2**30 + 1,)),
    (np.float32, (2**31,)),
    (np.float64, (2**20, 2**20)),
])
def test_bad_item_shape(tmp_path, dtype, item_shape):
    with pytest.raises(ValueError):
        Dense.create(tmp_path / "d", dtype, item_shape)
    Dense.create(tmp_path / "d", np.float32, (2,)).close()


def test_max_width_item_shape_is_accepted(tmp_path):
    # exactly 2^31 bytes per record is the largest legal width (no data written)
    with Dense.create(tmp_path / "u8", np.uint8, (2**31,), codec="raw") as w:
        assert w.item_shape == (2**31,)
    with Dense.create(tmp_path / "f4", np.float32, (2**14, 2**15), codec="raw") as w:
        assert w.item_shape == (2**14, 2**15)
    with Dense.open(tmp_path / "f4") as r:
        assert len(r) == 0 and r.item_shape == (2**14, 2**15)


# --------------------------------------------------------------------------
# Dense append
# --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]],
    ([1.0, 2.0, 3.0],),
    b"\x00" * 24,
    bytearray(24),
    memoryview(np.zeros((2, 3), np.float32)),
    None,
    1.5,
    np.float32(1.0),
])
def test_dense_append_rejects_non_ndarray(tmp_path, bad):
    with Dense.create(tmp_path / "d", np.float32, (3,)) as w:
        with pytest.raises(TypeError):
            w.append(bad)
        assert len(w) == 0


def test_dense_scalar_store_rejects_numpy_scalar(tmp_path):
    with Dense.create(tmp_path / "d", np.float32, ()) as w:
        with pytest.raises(TypeError):
            w.append(np.float32(1.0))
        assert len(w) == 0


@pytest.mark.parametrize("bad", [
    np.zeros((2, 3), np.float64),
    np.zeros((2, 3), np.int32),
    np.zeros((2, 3), ">f4"),
    np.zeros((2, 3), np.float16),
])
def test_dense_append_dtype_mismatch(tmp_path, bad):
    with Dense.create(tmp_path / "d", np.float32, (3,)) as w:
        with pytest.raises(ValueError):
            w.append(bad)
        assert len(w) == 0


@pytest.mark.parametrize("bad", [
    np.zeros((2, 4), np.float32),       # wrong item shape
    np.zeros((2, 3, 1), np.float32),    # extra axis
    np.zeros((3,), np.float32),         # missing batch axis
    np.zeros((1, 1, 3), np.float32),
    np.array(1.0, np.float32),          # 0-d into a non-scalar store
])
def test_dense_append_shape_mismatch(tmp_path, bad):
    with Dense.create(tmp_path / "d", np.float32, (3,)) as w:
        with pytest.raises(ValueError):
            w.append(bad)
        assert len(w) == 0


@pytest.mark.parametrize("item_shape", [(3,), (), (2, 2)])
def test_dense_append_empty_batch(tmp_path, item_shape):
    with Dense.create(tmp_path / "d", np.float32, item_shape) as w:
        with pytest.raises(ValueError):
            w.append(np.zeros((0, *item_shape), np.float32))
        assert len(w) == 0


def test_dense_failed_appends_write_nothing(tmp_path):
    p = tmp_path / "d"
    good1 = np.arange(6, dtype=np.int32).reshape(2, 3)
    good2 = np.arange(100, 109, dtype=np.int32).reshape(3, 3)
    with Dense.create(p, np.int32, (3,)) as w:
        w.append(good1)
        for bad in (np.zeros((2, 3), np.int64), np.zeros((2, 4), np.int32),
                    np.zeros((0, 3), np.int32), [[1, 2, 3]]):
            with pytest.raises((TypeError, ValueError)):
                w.append(bad)
            assert len(w) == 2
        w.append(good2)
        assert len(w) == 5
    with Dense.open(p) as r:
        assert_exact(r[:], np.concatenate([good1, good2]))


def test_dense_scalar_store_zero_d_and_one_d(tmp_path):
    p = tmp_path / "labels"
    with Dense.create(p, np.int64, ()) as w:
        assert w.item_shape == ()
        w.append(np.array(7, dtype=np.int64))          # one scalar record
        assert len(w) == 1
        w.append(np.arange(5, dtype=np.int64) * -3)   # five scalar records
        assert len(w) == 6
        with pytest.raises(ValueError):
            w.append(np.zeros((2, 1), np.int64))
    expected = np.array([7, 0, -3, -6, -9, -12], dtype=np.int64)
    with Dense.open(p) as r:
        assert r.item_shape == ()
        assert len(r) == 6
        assert_exact(r[:], expected)
        for i in range(6):
            assert_record(r[i], expected[i:i + 1].reshape(()))
        assert_exact(r[[5, 0]], expected[[5, 0]])


@pytest.mark.parametrize("codec", CODECS)
def test_dense_non_contiguous_inputs(tmp_path, codec, zdict):
    base = np.arange(4 * 3 * 8, dtype=np.float32).reshape(4, 3, 8)
    strided = base[:, :, ::2]                               # (4, 3, 4) strided
    fortran = np.asfortranarray(base[:, :, :4] + 1000)      # F order
    reversed_ = base[::-1, :, 4:]                           # negative stride
    ro = np.array(base[:, :, 1::2])
    ro.flags.writeable = False
    assert not strided.flags.c_contiguous
    assert not fortran.flags.c_contiguous
    assert not reversed_.flags.c_contiguous
    p = tmp_path / "d"
    with Dense.create(p, np.float32, (3, 4), **codec_kwargs(codec, zdict)) as w:
        for arr in (strided, fortran, reversed_, ro):
            w.append(arr)
        with pytest.raises(ValueError):
            w.append(base[:, :, ::3])                       # (4, 3, 3): wrong item shape
    expected = np.concatenate([strided, fortran, reversed_, ro])
    with Dense.open(p) as r:
        assert len(r) == 16
        assert_exact(r[:], expected)


def test_dense_append_accepts_transposed_view(tmp_path):
    src = np.arange(5 * 4 * 3, dtype=np.uint16).reshape(5, 4, 3)
    view = src.transpose(0, 2, 1)                           # (5, 3, 4), not C-contiguous
    assert not view.flags.c_contiguous
    with Dense.create(tmp_path / "d", np.uint16, (3, 4), codec="raw") as w:
        w.append(view)
    with Dense.open(tmp_path / "d") as r:
        assert_exact(r[:], np.ascontiguousarray(view))


def test_dense_many_appends(tmp_path):
    rng = np.random.default_rng(5)
    data = rng.integers(0, 1000, size=(300, 5), dtype=np.int32)
    p = tmp_path / "d"
    with Dense.create(p, np.int32, (5,)) as w:
        for i in range(0, 240):
            w.append(data[i:i + 1])
        w.append(data[240:300])
        assert len(w) == 300
    with Dense.open(p) as r:
        assert len(r) == 300
        assert_exact(r[:], data)
        idx = rng.integers(0, 300, size=500)
        assert_exact(r[idx], data[idx])


# --------------------------------------------------------------------------
# Ragged append
# --------------------------------------------------------------------------

def test_ragged_append_generator_consumed_once(tmp_path):
    calls = {"iter": 0, "items": 0}
    recs = [np.arange(n, dtype=np.int16) for n in (1, 4, 2)]

    class OnceIterable:
        def __iter__(self):
            calls["iter"] += 1
            for r in recs:
                calls["items"] += 1
                yield r

    p = tmp_path / "r"
    with Ragged.create(p, np.int16) as w:
        w.append(OnceIterable())
        assert calls == {"iter": 1, "items": 3}
        gen = (np.full((2, k), k, dtype=np.int16) for k in (1, 2, 3))
        w.append(gen)
        assert next(gen, "exhausted") == "exhausted"
        w.append(iter([np.array(9, np.int16)]))
        w.append((np.array([5, 6], np.int16),))               # tuple
        assert len(w) == 8
    with Ragged.open(p) as r:
        assert_records(r[:], recs + [np.full((2, k), k, dtype=np.int16) for k in (1, 2, 3)]
                       + [np.array(9, np.int16), np.array([5, 6], np.int16)])


def test_ragged_append_ndarray_is_iterated_over_axis0(tmp_path):
    # an ndarray is an iterable of its rows; rows are ndarrays with their own shape
    p = tmp_path / "r"
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    with Ragged.create(p, np.int32) as w:
        w.append(m)
        assert len(w) == 2
    with Ragged.open(p) as r:
        assert_records(r[:], [m[0], m[1]])


@pytest.mark.parametrize("bad_item", [
    [1, 2, 3],
    b"\x01\x02\x03\x04",
    np.int32(5),
    7,
    None,
])
def test_ragged_append_non_ndarray_item(tmp_path, bad_item):
    with Ragged.create(tmp_path / "r", np.int32) as w:
        with pytest.raises(TypeError):
            w.append([np.arange(3, dtype=np.int32), bad_item])
        assert len(w) == 0


@pytest.mark.parametrize("bad", [5, None, 3.5])
def test_ragged_append_non_iterable(tmp_path, bad):
    with Ragged.create(tmp_path / "r", np.int32) as w:
        with pytest.raises(TypeError):
            w.append(bad)
        assert len(w) == 0


@pytest.mark.parametrize("bad_item", [
    np.arange(3, dtype=np.int64),
    np.arange(3, dtype=np.uint32),
    np.arange(3, dtype=">i4"),
    np.arange(3, dtype=np.float32),
])
def test_ragged_append_dtype_mismatch(tmp_path, bad_item):
    with Ragged.create(tmp_path / "r", np.int32) as w:
        with pytest.raises(ValueError):
            w.append([np.arange(3, dtype=np.int32), bad_item])
        assert len(w) == 0


@pytest.mark.parametrize("bad_item", [
    np.zeros(0, np.int32),
    np.zeros((2, 0), np.int32),
    np.zeros((0, 5, 5), np.int32),
])
def test_ragged_append_zero_byte_record(tmp_path, bad_item):
    with Ragged.create(tmp_path / "r", np.int32) as w:
        with pytest.raises(ValueError):
            w.append([np.arange(3, dtype=np.int32), bad_item])
        assert len(w) == 0


@pytest.mark.parametrize("empty", [[], (), "gen", "iter"])
def test_ragged_append_empty_iterable(tmp_path, empty):
    if empty == "gen":
        empty = (x for x in [])
    elif empty == "iter":
        empty = iter([])
    with Ragged.create(tmp_path / "r", np.int32) as w:
        with pytest.raises(ValueError):
            w.append(empty)
        assert len(w) == 0


def test_ragged_failed_append_writes_nothing(tmp_path):
    p = tmp_path / "r"
    good_a = [np.arange(4, dtype=np.uint16).reshape(2, 2), np.array(3, np.uint16)]
    good_b = [np.arange(5, dtype=np.uint16) + 50]

    def failing_gen():
        yield np.arange(3, dtype=np.uint16)
        yield np.arange(2, dtype=np.uint16)
        raise KeyError("source failed")

    with Ragged.create(p, np.uint16) as w:
        w.append(good_a)
        bad_batches = [
            ([np.arange(3, dtype=np.uint16), np.arange(3, dtype=np.int16)], ValueError),
            ([np.arange(3, dtype=np.uint16), np.zeros(0, np.uint16)], ValueError),
            ([np.arange(3, dtype=np.uint16), [1, 2]], TypeError),
            ([np.arange(3, dtype=np.uint16)] * 3 + [b"xx"], TypeError),
            ([], ValueError),
        ]
        for batch, exc in bad_batches:
            with pytest.raises(exc):
                w.append(batch)
            assert len(w) == 2
        with pytest.raises(KeyError):
            w.append(failing_gen())
        assert len(w) == 2
        w.append(good_b)
        assert len(w) == 3
    with Ragged.open(p) as r:
        assert len(r) == 3
        assert_records(r[:], good_a + good_b)


@pytest.mark.parametrize("codec", CODECS)
def test_ragged_non_contiguous_records(tmp_path, codec, zdict):
    base = np.arange(6 * 8, dtype=np.int64).reshape(6, 8)
    recs = [base[:, ::3], np.asfortranarray(base[:3, :5]), base[::-1, 2], base.T[1:4],
            base[2:3, 4:5]]
    assert not recs[0].flags.c_contiguous
    p = tmp_path / "r"
    with Ragged.create(p, np.int64, **codec_kwargs(codec, zdict)) as w:
        w.append(recs)
    with Ragged.open(p) as r:
        assert_records(r[:], [np.ascontiguousarray(x) for x in recs])


def test_ragged_many_appends(tmp_path):
    rng = np.random.default_rng(11)
    recs = [rng.integers(-50, 50, size=int(rng.integers(1, 20)), dtype=np.int8)
            for _ in range(250)]
    p = tmp_path / "r"
    with Ragged.create(p, np.int8, codec="zstd") as w:
        for i in range(200):
            w.append([recs[i]])
        w.append(recs[200:])
    with Ragged.open(p) as r:
        assert len(r) == 250
        assert_records(r[:], recs)
        idx = rng.integers(0, 250, size=300)
        assert_records(r[idx], [recs[i] for i in idx])


# --------------------------------------------------------------------------
# capability errors (writer vs reader) and use after close
# --------------------------------------------------------------------------

def test_reads_on_writer_mention_open(tmp_path):
    w = Dense.create(tmp_path / "d", np.int8, (2,))
    w.append(np.ones((3, 2), np.int8))
    rw = Ragged.create(tmp_path / "r", np.int8)
    rw.append([np.ones(2, np.int8)])
    try:
        for store in (w, rw):
            for read in (lambda s: s[0], lambda s: s[:], lambda s: s[[0]],
                         lambda s: s.__getitems__([0])):
                with pytest.raises(RuntimeError, match="open"):
                    read(store)
        assert len(w) == 3 and len(rw) == 1
    finally:
        w.close()
        rw.close()


def test_appends_on_reader_mention_create(tmp_path):
    make_dense(tmp_path / "d", F32)
    make_ragged(tmp_path / "r", RAGGED_RECS, np.float64)
    with Dense.open(tmp_path / "d") as r:
        with pytest.raises(RuntimeError, match="create"):
            r.append(F32[:1])
        assert len(r) == 10
    with Ragged.open(tmp_path / "r") as r:
        with pytest.raises(RuntimeError, match="create"):
            r.append([RAGGED_RECS[1]])
        assert len(r) == len(RAGGED_RECS)


def test_use_after_close(tmp_path):
    w = Dense.create(tmp_path / "d", np.float32, (2, 3))
    w.append(F32)
    w.close()
    with pytest.raises(RuntimeError):
        w.append(F32)
    rw = Ragged.create(tmp_path / "r", np.float64)
    rw.append(RAGGED_RECS)
    rw.close()
    with pytest.raises(RuntimeError):
        rw.append(RAGGED_RECS)
    for r in (Dense.open(tmp_path / "d"), Ragged.open(tmp_path / "r")):
        r.close()
        for use in (lambda s: s[0], lambda s: s[:], lambda s: s[[0, 1]],
                    lambda s: s.__getitems__([0]), lambda s: len(s),
                    lambda s: s.append(F32)):
            with pytest.raises(RuntimeError):
                use(r)
        with pytest.raises(RuntimeError):
            train_dict(r, tier="fast")


# --------------------------------------------------------------------------
# indexing
# --------------------------------------------------------------------------

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
              np.uint64, np.intp]


def _check_dense_set(result, expected):
    assert isinstance(result, np.ndarray)
    assert result.flags.c_contiguous
    assert result.flags.writeable
    assert_exact(result, expected)


def test_dense_int_index(dense_reader):
    r = dense_reader
    for i in range(10):
        assert_record(r[i], F32[i])
    for t in INT_DTYPES:
        assert_record(r[t(7)], F32[7])


@pytest.mark.parametrize("sl", [
    slice(None), slice(2, 5), slice(0, 10, 3), slice(1, 8, 2), slice(5, 2), slice(3, 3),
    slice(8, 100), slice(100, None), slice(None, 4), slice(6, None), slice(0, 0),
    slice(np.int64(1), np.uint8(4)), slice(None, None, 4),
    # negative steps with non-negative bounds follow NumPy
    slice(None, None, -1), slice(5, 1, -1), slice(None, None, -3), slice(8, None, -2),
    slice(100, None, -1), slice(None, 3, -1),
], ids=repr)
def test_dense_slice(dense_reader, sl):
    _check_dense_set(dense_reader[sl], F32[sl])


def test_dense_tuple_list_array_index(dense_reader):
    r = dense_reader
    _check_dense_set(r[0, 5, 2], F32[[0, 5, 2]])
    _check_dense_set(r[(9,)], F32[[9]])
    _check_dense_set(r[[9, 0, 9, 3]], F32[[9, 0, 9, 3]])
    _check_dense_set(r[[]], F32[:0])
    _check_dense_set(r[()], F32[:0])
    for t in INT_DTYPES:
        idx = np.array([4, 1, 1, 9], dtype=t)
        _check_dense_set(r[idx], F32[[4, 1, 1, 9]])
    _check_dense_set(r[np.array([], dtype=np.int64)], F32[:0])
    _check_dense_set(r.__getitems__([3, 1]), F32[[3, 1]])
    _check_dense_set(r.__getitems__(np.array([8, 8, 0])), F32[[8, 8, 0]])
    _check_dense_set(r.__getitems__([]), F32[:0])


def test_dense_bool_mask(dense_reader):
    r = dense_reader
    mask = np.array([True, False, True, True, False, False, False, True, False, True])
    _check_dense_set(r[mask], F32[mask])
    _check_dense_set(r[np.zeros(10, bool)], F32[:0])
    _check_dense_set(r[np.ones(10, bool)], F32)


@pytest.mark.parametrize("idx", [
    10, 11, 100, -1, -10, np.int64(10), np.int64(-1),
    [0, 10], [-1], (0, -1), (3, 10), np.array([0, 10]), np.array([-1, 0]),
    slice(-1, None), slice(None, -1), slice(-3, -1), slice(-100, 2), slice(0, -2),
    np.zeros(9, bool), np.zeros(11, bool), np.zeros((2, 5), bool), np.zeros((10, 1), bool),
], ids=repr)
def test_dense_index_errors(dense_reader, idx):
    with pytest.raises(IndexError):
        dense_reader[idx]


@pytest.mark.parametrize("idx", [
    True, False, np.bool_(True), np.bool_(False), 1.0, np.float64(2.0), 2.5, "a", "0", None,
    np.array([1.0, 2.0]), [1.5], Ellipsis, slice(0, 1.5), slice(0.0, 2),
], ids=repr)
def test_dense_index_type_errors(dense_reader, idx):
    with pytest.raises(TypeError):
        dense_reader[idx]


def test_slice_step_zero_is_valueerror(dense_reader):
    with pytest.raises(ValueError):
        dense_reader[0:5:0]


def test_dense_record_sets_are_fresh_copies(dense_reader):
    r = dense_reader
    a = r[:]
    b = r[:]
    assert not np.shares_memory(a, b)
    a[...] = -1
    assert_exact(r[:], F32)
    s = r[[1, 2]]
    s[0, 0, 0] = 12345
    assert_exact(r[[1, 2]], F32[[1, 2]])
    one = r[4]
    if isinstance(one, np.ndarray) and one.flags.writeable:
        one[...] = 0
    assert_record(r[4], F32[4])


def test_empty_stores(tmp_path):
    with Dense.create(tmp_path / "d", np.float32, (2, 3)):
        pass
    with Ragged.create(tmp_path / "r", np.float32):
        pass
    with Dense.open(tmp_path / "d") as r:
        assert len(r) == 0
        out = r[:]
        assert isinstance(out, np.ndarray) and out.shape == (0, 2, 3) and out.dtype == np.float32
        with pytest.raises(IndexError):
            r[0]
    with Ragged.open(tmp_path / "r") as r:
        assert len(r) == 0
        assert r[:] == [] and isinstance(r[:], list)
        assert r[[]] == []
        with pytest.raises(IndexError):
            r[0]


def test_ragged_int_index(ragged_reader):
    r = ragged_reader
    for i, rec in enumerate(RAGGED_RECS):
        assert_exact(r[i], rec)
    for t in INT_DTYPES:
        assert_exact(r[t(3)], RAGGED_RECS[3])


def test_ragged_record_sets(ragged_reader):
    r = ragged_reader
    n = len(RAGGED_RECS)
    assert len(r) == n
    assert_records(r[:], RAGGED_RECS)
    assert_records(r[1:6:2], RAGGED_RECS[1:6:2])
    assert_records(r[5:2], [])
    assert_records(r[3:100], RAGGED_RECS[3:])
    assert_records(r[0, 5, 2], [RAGGED_RECS[i] for i in (0, 5, 2)])
    assert_records(r[[7, 7, 0]], [RAGGED_RECS[i] for i in (7, 7, 0)])
    for t in INT_DTYPES:
        assert_records(r[np.array([3, 0], dtype=t)], [RAGGED_RECS[3], RAGGED_RECS[0]])
    mask = np.array([True, False, False, True, True, False, False, True])
    assert_records(r[mask], [x for x, m in zip(RAGGED_RECS, mask) if m])
    assert_records(r[[]], [])
    assert_records(r.__getitems__([2, 6]), [RAGGED_RECS[2], RAGGED_RECS[6]])
    assert_records(r.__getitems__(np.array([4])), [RAGGED_RECS[4]])


def test_ragged_results_are_independent_of_later_reads(ragged_reader):
    r = ragged_reader
    first = r[:]
    for a in first:
        if a.flags.writeable:
            a[...] = 42
    assert_records(r[:], RAGGED_RECS)
    one = r[3]
    if one.flags.writeable:
        one[...] = 0
    assert_exact(r[3], RAGGED_RECS[3])


@pytest.mark.parametrize("idx", [
    8, 100, -1, [0, 8], [-2], (1, -1), np.array([8]), slice(-1, None), slice(None, -2),
    np.zeros(7, bool), np.zeros(9, bool), np.zeros((8, 1), bool),
], ids=repr)
def test_ragged_index_errors(ragged_reader, idx):
    with pytest.raises(IndexError):
        ragged_reader[idx]


@pytest.mark.parametrize("idx", [
    True, np.bool_(False), 0.0, "x", None, np.array([0.0]), [0.5], slice(0, 2.5),
], ids=repr)
def test_ragged_index_type_errors(ragged_reader, idx):
    with pytest.raises(TypeError):
        ragged_reader[idx]


# --------------------------------------------------------------------------
# store lifecycle: existence, creation, locking
# --------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [Dense, Ragged])
def test_open_missing_store(tmp_path, cls):
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(FileNotFoundError):
        cls.open(missing)
    assert not (tmp_path / "nope").exists()
    with pytest.raises(FileNotFoundError):
        cls.open(str(tmp_path / "plain"))
    assert not (tmp_path / "plain").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError):
        cls.open(empty)
    assert list(empty.iterdir()) == []


@pytest.mark.parametrize("filler", ["file", "dir", "hidden", "store"])
def test_create_into_non_empty_dir(tmp_path, filler):
    p = tmp_path / "occupied"
    if filler == "store":
        make_dense(p, F32)
    else:
        p.mkdir()
        if filler == "file":
            (p / "notes.txt").write_bytes(b"keep me")
        elif filler == "dir":
            (p / "sub").mkdir()
        else:
            (p / ".hidden").write_bytes(b"")
    before = sorted((q.name, q.read_bytes() if q.is_file() else None) for q in p.iterdir())
    for create in (lambda: Dense.create(p, np.float32, (2, 3)),
                   lambda: Ragged.create(p, np.float32),
                   lambda: Dense.create(p, np.float32, (2, 3), codec="raw")):
        with pytest.raises(ZrecordError) as ei:
            create()
        assert ei.value.code == -12
    after = sorted((q.name, q.read_bytes() if q.is_file() else None) for q in p.iterdir())
    assert after == before
    if filler == "store":
        with Dense.open(p) as r:
            assert_exact(r[:], F32)


def test_create_into_existing_empty_dir(tmp_path):
    p = tmp_path / "empty"
    p.mkdir()
    make_dense(p, F32)
    with Dense.open(p) as r:
        assert_exact(r[:], F32)
    q = tmp_path / "empty2"
    q.mkdir()
    make_ragged(q, RAGGED_RECS, np.float64)
    with Ragged.open(q) as r:
        assert_records(r[:], RAGGED_RECS)


def test_create_makes_missing_parents(tmp_path):
    p = tmp_path / "a" / "b" / "c" / "store"
    make_dense(p, F32)
    q = tmp_path / "x" / "y" / "rag"
    make_ragged(str(q), RAGGED_RECS, np.float64)
    with Dense.open(p) as r:
        assert_exact(r[:], F32)
    with Ragged.open(q) as r:
        assert_records(r[:], RAGGED_RECS)


def test_store_files(tmp_path, zdict):
    for codec in CODECS:
        p = make_dense(tmp_path / f"d_{codec}", F32, codec=codec, zdict=zdict)
        q = make_ragged(tmp_path / f"r_{codec}", RAGGED_RECS, np.float64, codec=codec, zdict=zdict)
        expected = {"meta.zr", "data.zr"} | ({"dict.zr"} if codec == "zstd_dict" else set())
        # Raw stores carry their checksums beside the data; zstd frames hold their own.
        expected |= {"sums.zr"} if codec == "raw" else set()
        assert {f.name for f in p.iterdir()} == expected
        assert {f.name for f in q.iterdir()} == expected
        if codec == "zstd_dict":
            assert (p / "dict.zr").read_bytes() == zdict
            assert (q / "dict.zr").read_bytes() == zdict


def _busy(fn):
    with pytest.raises(ZrecordError) as ei:
        fn()
    assert ei.value.code == -13, (ei.value.code, str(ei.value))


def test_writer_lock_is_exclusive(tmp_path):
    p = tmp_path / "d"
    w = Dense.create(p, np.float32, (2, 3))
    try:
        w.append(F32[:2])
        _busy(lambda: Dense.open(p))
        _busy(lambda: Ragged.open(p))
        _busy(lambda: Dense.create(p, np.float32, (2, 3)))
        w.append(F32[2:])                       # the writer is unaffected
    finally:
        w.close()
    with Dense.open(p) as r:
        assert_exact(r[:], F32)


def test_readers_share_and_block_writers(tmp_path):
    p = make_ragged(tmp_path / "r", RAGGED_RECS, np.float64)
    readers = [Ragged.open(p) for _ in range(3)]
    try:
        _busy(lambda: Ragged.create(p, np.float64))
        _busy(lambda: Dense.create(p, np.float64, (2,)))
        for r in readers:
            assert_records(r[:], RAGGED_RECS)
    finally:
        for r in readers:
            r.close()
    # with the readers gone, creating there is refused because the store exists
    with pytest.raises(ZrecordError) as ei:
        Ragged.create(p, np.float64)
    assert ei.value.code == -12


def test_busy_writer_released_by_close(tmp_path):
    p = tmp_path / "r"
    w = Ragged.create(p, np.uint8)
    w.append([np.arange(3, dtype=np.uint8)])
    _busy(lambda: Ragged.open(p))
    w.close()
    r1, r2 = Ragged.open(p), Ragged.open(p)
    assert_records(r1[:], [np.arange(3, dtype=np.uint8)])
    assert_records(r2[0, 0], [np.arange(3, dtype=np.uint8)] * 2)
    r1.close()
    r2.close()


def test_wrong_class_for_store(tmp_path):
    make_dense(tmp_path / "d", F32)
    make_ragged(tmp_path / "r", RAGGED_RECS, np.float64)
    with pytest.raises(ValueError, match="schema fields"):
        Ragged.open(tmp_path / "d")
    with pytest.raises(ValueError, match="schema fields"):
        Dense.open(tmp_path / "r")
    with Dense.open(tmp_path / "d") as r, Ragged.open(tmp_path / "r") as q:
        assert len(r) == 10 and len(q) == len(RAGGED_RECS)


def test_wrong_kind_is_a_schema_error(tmp_path):
    """SchemaError is a ValueError (2.0.0's type) without a code, and pickles."""
    import pickle

    make_dense(tmp_path / "d", F32)
    with pytest.raises(SchemaError, match="^invalid ragged schema fields") as info:
        Ragged.open(tmp_path / "d")
    assert isinstance(info.value, ValueError) and not isinstance(info.value, ZrecordError)
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is SchemaError and str(again) == str(info.value)
    from loaderx.zrecord import _open_any

    with _open_any(tmp_path / "d") as store:  # probing the kind is not an error
        assert isinstance(store, Dense)


def test_native_enum_arguments_are_parsed_on_conversion(tmp_path):
    """Kind, codec and data_access names are parsed by the binding's
    argument conversion: a wrong type is a TypeError naming the argument,
    an unknown name the ValueError it always was."""
    from loaderx import _native

    make_dense(tmp_path / "d", F32)
    with pytest.raises(ValueError, match="^unknown store kind \"sparse\""):
        _native.ReaderHandle.open(str(tmp_path / "d"), "sparse")
    with pytest.raises(TypeError, match="kind"):
        _native.ReaderHandle.open(str(tmp_path / "d"), 1)
    with pytest.raises(ValueError, match="^unknown data_access \"fast\""):
        _native.ReaderHandle.open(str(tmp_path / "d"), "dense", "fast")
    with pytest.raises(ValueError, match="^unknown codec \"lz4\""):
        _native.WriterHandle.create(str(tmp_path / "n"), "dense", "<f4", [2], "lz4")
    handle = _native.ReaderHandle.open(str(tmp_path / "d"), "dense", "read")
    assert handle.data_access == "read"
    handle.close()


# --------------------------------------------------------------------------
# round trips: every codec x several dtypes
# --------------------------------------------------------------------------

@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
def test_dense_round_trip(tmp_path, dtype, codec, zdict):
    rng = np.random.default_rng(zlib.crc32(f"dense {dtype} {codec}".encode()))
    data = random_values(dtype, (7, 3, 4), rng)
    p = tmp_path / "d"
    with Dense.create(p, np.dtype(dtype), (3, 4), **codec_kwargs(codec, zdict)) as w:
        w.append(data[:4])
        w.append(data[4:])
    with Dense.open(p) as r:
        assert r.dtype.str == np.dtype(dtype).str
        assert r.item_shape == (3, 4)
        assert r.codec == codec
        assert r.has_dict() is (codec == "zstd_dict")
        assert len(r) == 7
        _check_dense_set(r[:], data)
        for i in range(7):
            assert_record(r[i], data[i])
        idx = [6, 0, 3, 3, 1]
        _check_dense_set(r[idx], data[idx])


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("dtype", ROUND_TRIP_DTYPES)
def test_ragged_round_trip(tmp_path, dtype, codec, zdict):
    rng = np.random.default_rng(zlib.crc32(f"ragged {dtype} {codec}".encode()))
    shapes = [(), (1,), (5,), (2, 3), (3, 1, 2), (), (9,), (1, 1, 1, 1)]
    recs = [random_values(dtype, s, rng) for s in shapes]
    p = tmp_path / "r"
    with Ragged.create(p, np.dtype(dtype), **codec_kwargs(codec, zdict)) as w:
        w.append(recs[:3])
        w.append(iter(recs[3:]))
    with Ragged.open(p) as r:
        assert r.dtype.str == np.dtype(dtype).str
        assert r.codec == codec
        assert r.has_dict() is (codec == "zstd_dict")
        assert len(r) == len(recs)
        assert_records(r[:], recs)
        for i, rec in enumerate(recs):
            assert_exact(r[i], rec)
        idx = [7, 0, 4, 4]
        assert_records(r[idx], [recs[i] for i in idx])


@pytest.mark.parametrize("codec", CODECS)
def test_dense_scalar_store_round_trip(tmp_path, codec, zdict):
    labels = np.arange(-50, 250, dtype=np.int64) * 3
    p = tmp_path / "labels"
    with Dense.create(p, np.int64, (), **codec_kwargs(codec, zdict)) as w:
        w.append(labels[:100])
        w.append(labels[100:])
    with Dense.open(p) as r:
        assert r.item_shape == () and len(r) == 300
        _check_dense_set(r[:], labels)
        _check_dense_set(r[[299, 0, 150]], labels[[299, 0, 150]])
        assert_record(r[123], labels[123:124].reshape(()))


@pytest.mark.parametrize("codec", CODECS)
def test_large_records(tmp_path, codec, zdict):
    rng = np.random.default_rng(3)
    n = 2 if codec == "zstd_dict" else 4       # level 19 is slow; keep it small
    yy, xx = np.mgrid[0:224, 0:224]
    imgs = np.empty((n, 3, 224, 224), dtype=np.uint8)
    for i in range(n):
        for c in range(3):
            imgs[i, c] = ((xx * (c + 1) + yy * (i + 2)) % 256).astype(np.uint8)
        imgs[i] ^= rng.integers(0, 4, size=(3, 224, 224), dtype=np.uint8)
    p = tmp_path / "img"
    with Dense.create(p, np.uint8, (3, 224, 224), **codec_kwargs(codec, zdict)) as w:
        w.append(imgs)
    with Dense.open(p) as r:
        _check_dense_set(r[:], imgs)
        assert_record(r[n - 1], imgs[n - 1])
    q = tmp_path / "rimg"
    recs = [imgs[0], imgs[-1][:, :100, :50], imgs[0][0]]
    with Ragged.create(q, np.uint8, **codec_kwargs(codec, zdict)) as w:
        w.append(recs)
    with Ragged.open(q) as r:
        assert_records(r[:], [np.ascontiguousarray(x) for x in recs])


# --------------------------------------------------------------------------
# train_dict
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def dict_data():
    rng = np.random.default_rng(0)
    base = rng.integers(0, 255, size=(64,), dtype=np.uint8)
    rows = [np.roll(np.tile(base, 16), i) ^ rng.integers(0, 4, size=1024).astype(np.uint8)
            for i in range(400)]
    return np.stack(rows)


def _check_dict(d, tier="fast"):
    assert isinstance(d, bytes)
    assert 0 < len(d) <= DICT_TIERS[tier]["size"]


@pytest.mark.parametrize("tier", ["fast", "balanced", "max"])
def test_train_dict_ndarray(dict_data, tier):
    _check_dict(train_dict(dict_data, tier=tier), tier)


def test_train_dict_default_tier_is_balanced(dict_data):
    d = train_dict(dict_data)
    _check_dict(d, "balanced")
    assert d == train_dict(dict_data, tier="balanced")
    assert d == train_dict(dict_data, tier=None)


def test_train_dict_iterables(dict_data):
    _check_dict(train_dict(list(dict_data), tier="fast"))
    _check_dict(train_dict((row for row in dict_data), tier="fast"))
    _check_dict(train_dict([row.tobytes() for row in dict_data], tier="fast"))
    _check_dict(train_dict((row.tobytes() for row in dict_data), tier="fast"))
    # ragged-shaped record arrays are fine too
    _check_dict(train_dict([row.reshape(32, 32) for row in dict_data], tier="fast"))


def test_train_dict_from_readers(tmp_path, dict_data):
    d = make_dense(tmp_path / "d", dict_data.reshape(400, 16, 64), codec="raw")
    r = make_ragged(tmp_path / "r", list(dict_data[:, :900]), np.uint8, codec="zstd")
    with Dense.open(d) as s:
        _check_dict(train_dict(s, tier="fast"))
        assert len(s) == 400                      # the reader stays usable
        assert_exact(s[:], dict_data.reshape(400, 16, 64))
    with Ragged.open(r) as s:
        _check_dict(train_dict(s, tier="fast"))
        assert len(s) == 400


def test_train_dict_refuses_writers(tmp_path, dict_data):
    with Dense.create(tmp_path / "d", np.uint8, (1024,)) as w:
        w.append(dict_data)
        with pytest.raises(ValueError):
            train_dict(w, tier="fast")
    with Ragged.create(tmp_path / "r", np.uint8) as w:
        w.append(list(dict_data))
        with pytest.raises(ValueError):
            train_dict(w, tier="fast")


@pytest.mark.parametrize("empty", ["array", "array2d", "list", "gen"])
def test_train_dict_empty(empty):
    src = {"array": np.zeros(0, np.uint8), "array2d": np.zeros((0, 16), np.uint8),
           "list": [], "gen": (x for x in [])}[empty]
    with pytest.raises(ValueError):
        train_dict(src, tier="fast")


@pytest.mark.parametrize("tier", ["huge", "FAST", "", "Balanced"])
def test_train_dict_unknown_tier(dict_data, tier):
    with pytest.raises(ValueError):
        train_dict(dict_data, tier=tier)


def test_train_dict_failure_is_zrecorderror(tmp_path):
    with pytest.raises(ZrecordError) as ei:
        train_dict(np.arange(48, dtype=np.uint8).reshape(3, 16), tier="fast")
    assert ei.value.code == -9


def test_train_dict_path(tmp_path, dict_data):
    out = tmp_path / "dicts" / "fast.zdict"
    out.parent.mkdir()
    d = train_dict(dict_data, tier="fast", path=out)
    assert out.read_bytes() == d
    out2 = tmp_path / "fast2.zdict"
    d2 = train_dict(dict_data, tier="fast", path=str(out2))
    assert out2.read_bytes() == d2
    _check_dict(d)


@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_train_dict_then_zstd_dict_store(tmp_path, dict_data, kind):
    d = train_dict(dict_data, tier="fast")
    p = tmp_path / "s"
    if kind == "dense":
        make_dense(p, dict_data, codec="zstd_dict", zdict=d, batches=3)
        opener = Dense.open
    else:
        recs = [row[: 100 + i] for i, row in enumerate(dict_data)]
        make_ragged(p, recs, np.uint8, codec="zstd_dict", zdict=d)
        opener = Ragged.open
    assert (p / "dict.zr").read_bytes() == d
    with opener(p) as r:
        assert r.has_dict() is True
        assert r.codec == "zstd_dict"
        if kind == "dense":
            _check_dense_set(r[:], dict_data)
        else:
            assert_records(r[:], recs)
    # the readme's recode pattern: store -> dictionary -> new store
    with opener(p) as s:
        q = tmp_path / "recoded"
        if kind == "dense":
            with Dense.create(q, s.dtype, s.item_shape, codec="zstd_dict",
                              dict_bytes=train_dict(s, tier="fast")) as dst:
                dst.append(s[:])
            with Dense.open(q) as r:
                _check_dense_set(r[:], dict_data)
        else:
            with Ragged.create(q, s.dtype, codec="zstd_dict",
                               dict_bytes=train_dict(s, tier="fast")) as dst:
                dst.append(s[:])
            with Ragged.open(q) as r:
                assert_records(r[:], recs)


# --------------------------------------------------------------------------
# compression level
# --------------------------------------------------------------------------

def _level_images(n: int = 24) -> np.ndarray:
    yy, xx = np.indices((16, 16))
    return np.stack([((yy * (i % 5 + 1) + xx * (i % 3 + 1)) // 3 % 64).astype(np.uint8)
                     for i in range(n)])


@pytest.mark.parametrize("codec,level", [("zstd", -5), ("zstd", -1), ("zstd", 0), ("zstd", 1),
                                         ("zstd", 9), ("zstd", 19), ("zstd", 22),
                                         ("zstd", -131072), ("zstd_dict", 1),
                                         ("zstd_dict", 19), ("zstd_dict", -2)])
def test_any_level_round_trips(tmp_path, zdict, codec, level):
    data = _level_images()
    d = zdict if codec == "zstd_dict" else None
    with Dense.create(tmp_path / "d", np.uint8, (16, 16), codec, d, level=np.int64(level)) as w:
        w.append(data[:10])
        w.append(data[10:])
    with Dense.open(tmp_path / "d") as r:
        assert r.codec == codec
        np.testing.assert_array_equal(r[:], data)
    recs = [np.arange(1 + i * 7 % 50, dtype=np.int16) for i in range(30)]
    with Ragged.create(tmp_path / "r", np.int16, codec, d, level=level) as w:
        w.append(recs)
    with Ragged.open(tmp_path / "r") as r:
        for got, want in zip(r[:], recs):
            np.testing.assert_array_equal(got, want)


def test_level_shapes_the_frames_and_none_is_the_2_0_0_default(tmp_path, zdict):
    data = np.concatenate([_level_images()] * 4)

    def size(name, codec="zstd", **kw):
        d = zdict if codec == "zstd_dict" else None
        with Dense.create(tmp_path / name, np.uint8, (16, 16), codec, d, **kw) as w:
            w.append(data)
        return (tmp_path / name / "data.zr").stat().st_size

    assert size("none") == size("three", level=3)
    assert size("dict_none", "zstd_dict") == size("dict_19", "zstd_dict", level=19)
    assert size("fast", level=-5) > size("one", level=1) >= size("nineteen", level=19)


def test_level_applies_to_store_sets(tmp_path):
    data = np.concatenate([_level_images()] * 4)
    for level in (-5, 19):
        with Dense.create(tmp_path / f"s{level}", np.uint8, (16, 16), level=level,
                          shard_records=30) as w:
            w.append(data)
        with Dense.open(tmp_path / f"s{level}") as r:
            assert len(r.shards) == 4
            np.testing.assert_array_equal(r[:], data)
    fast = (tmp_path / "s-5" / "shard-000000" / "data.zr").stat().st_size
    strong = (tmp_path / "s19" / "shard-000000" / "data.zr").stat().st_size
    assert fast > strong


@pytest.mark.parametrize("level,exc,message", [
    (23, ValueError, "level must be in zstd's range -131072..22, got 23"),
    (-131073, ValueError, "level must be in zstd's range -131072..22, got -131073"),
    (2**70, ValueError, f"level must be in zstd's range -131072..22, got {2**70}"),
    (3.0, TypeError, "'float' object cannot be interpreted as an integer: level must be an int or None"),
    ("3", TypeError, "'str' object cannot be interpreted as an integer: level must be an int or None"),
    (True, TypeError, "level must be an integer, not bool"),
])
@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_bad_levels_are_refused_before_anything_is_made(tmp_path, level, exc, message, kind):
    path = tmp_path / "s"
    with pytest.raises(exc) as ei:
        if kind == "dense":
            Dense.create(path, np.uint8, (4,), "zstd", level=level)
        else:
            Ragged.create(path, np.uint8, "zstd", level=level, shard_records=3)
    assert str(ei.value) == message
    assert not path.exists()


@pytest.mark.parametrize("level", [3, 0, -1, 99])
def test_level_with_raw_is_a_value_error(tmp_path, level):
    with pytest.raises(ValueError) as ei:
        Dense.create(tmp_path / "s", np.uint8, (4,), codec="raw", level=level)
    assert str(ei.value) == (
        "level applies only to codec='zstd' and codec='zstd_dict': raw stores are not "
        f"compressed (got level={level})")
    assert not (tmp_path / "s").exists()
    # None is the raw default: accepted.
    Dense.create(tmp_path / "ok", np.uint8, (4,), codec="raw", level=None).close()
