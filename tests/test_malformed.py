"""Malformed and damaged stores must raise clean errors, never crash or lie.

Each test builds a good store with the public API, corrupts a copy in
tmp_path following FORMAT.md's byte layout, and checks the error.
"""
from __future__ import annotations

import json
import shutil
import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest

from loaderx.zrecord import Dense, Ragged, ZrecordError

INVALID_FORMAT = -8
DECODE_FAILED = -7
PAGE = 4096
ENTRY = 16

DENSE_DATA = (np.arange(5 * 3 * 4, dtype=np.float32).reshape(5, 3, 4) - 20.5)
RAGGED_DATA = [
    np.arange(12, dtype=np.float32).reshape(3, 4) * 1.5,
    np.array([7.0, -1.0, 2.5, 9.0], dtype=np.float32),
    np.array(3.25, dtype=np.float32),
    np.arange(6, dtype=np.float32).reshape(1, 2, 3),
]
KINDS = ["dense", "ragged"]
CODECS = ["raw", "zstd", "zstd_dict"]


# --------------------------------------------------------------------------
# byte-level helpers
# --------------------------------------------------------------------------

class Meta:
    """Read/modify/write ``meta.zr`` as laid out in FORMAT.md."""

    def __init__(self, store: Path):
        self.path = store / "meta.zr"
        self.b = bytearray(self.path.read_bytes())

    @property
    def length(self):
        return struct.unpack_from("<Q", self.b, 0)[0]

    @property
    def tail(self):
        return struct.unpack_from("<Q", self.b, 8)[0]

    @property
    def schema_length(self):
        return struct.unpack_from("<I", self.b, 16)[0]

    @property
    def codec(self):
        return self.b[31]

    @property
    def schema(self):
        return bytes(self.b[32:32 + self.schema_length])

    def set_header(self, length=None, tail=None, schema_length=None, codec=None):
        if length is not None:
            struct.pack_into("<Q", self.b, 0, length)
        if tail is not None:
            struct.pack_into("<Q", self.b, 8, tail)
        if schema_length is not None:
            struct.pack_into("<I", self.b, 16, schema_length)
        if codec is not None:
            self.b[31] = codec
        return self

    def set_schema(self, raw: bytes):
        self.b[32:PAGE] = bytes(PAGE - 32)
        self.b[32:32 + len(raw)] = raw
        struct.pack_into("<I", self.b, 16, len(raw))
        return self

    def entry(self, i):
        return struct.unpack_from("<QII", self.b, PAGE + ENTRY * i)

    def set_entry(self, i, offset=None, phys=None, logic=None):
        o, p, lg = self.entry(i)
        struct.pack_into("<QII", self.b, PAGE + ENTRY * i,
                         o if offset is None else offset,
                         p if phys is None else phys,
                         lg if logic is None else logic)
        return self

    def save(self):
        self.path.write_bytes(bytes(self.b))


def zstd_frame(payload: bytes, declared=None, with_size=True) -> bytes:
    """A valid zstd frame made of raw blocks (no compression library needed).

    ``declared`` overrides the Frame_Content_Size field; ``with_size=False``
    writes a frame with a window descriptor and no content size at all.
    """
    if with_size:
        n = len(payload) if declared is None else declared
        if n < 256:
            header = bytes([0x20, n])                       # single segment, 1-byte FCS
        elif n < 65536 + 256:
            header = bytes([0x60]) + struct.pack("<H", n - 256)
        elif n < 2**32:
            header = bytes([0xA0]) + struct.pack("<I", n)
        else:
            header = bytes([0xE0]) + struct.pack("<Q", n)
        block_max = 128 * 1024
    else:
        header = bytes([0x00, 0x00])                        # window 1 KiB, no FCS
        block_max = 1024
    out = b"\x28\xb5\x2f\xfd" + header
    chunks = [payload[i:i + block_max] for i in range(0, len(payload), block_max)] or [b""]
    for k, chunk in enumerate(chunks):
        last = 1 if k == len(chunks) - 1 else 0
        out += struct.pack("<I", last | (len(chunk) << 3))[:3] + chunk
    return out


def frame_header_size(frame_start: bytes) -> int:
    """Bytes from the magic number to the first block header."""
    fhd = frame_start[4]
    single = (fhd >> 5) & 1
    fcs = [1 if single else 0, 2, 4, 8][fhd >> 6]
    did = [0, 1, 2, 4][fhd & 3]
    return 4 + 1 + (0 if single else 1) + did + fcs


def ragged_bytes(shape, payload: bytes) -> bytes:
    return struct.pack("<Q", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + payload


def mp_str(s: str) -> bytes:
    raw = s.encode()
    assert len(raw) < 32
    return bytes([0xA0 | len(raw)]) + raw


def mp_int(v: int) -> bytes:
    if 0 <= v < 128:
        return bytes([v])
    if -32 <= v < 0:
        return struct.pack("b", v)
    return b"\xcf" + struct.pack(">Q", v)


def mp_arr(items) -> bytes:
    items = list(items)
    return bytes([0x90 | len(items)]) + b"".join(items)


def mp_map(pairs) -> bytes:
    pairs = list(pairs)
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def dense_schema(dtype="<f4", item_shape=(3, 4), extra=()):
    return mp_map([(mp_str("dtype"), mp_str(dtype)),
                   (mp_str("item_shape"), mp_arr(mp_int(d) for d in item_shape))] + list(extra))


def append_payload(store: Path, meta: Meta, i: int, record: bytes, codec: str, logic=None,
                   frame: bytes | None = None):
    """Write a new payload at the tail of data.zr and point entry ``i`` at it."""
    payload = frame if frame is not None else (record if codec == "raw" else zstd_frame(record))
    with open(store / "data.zr", "r+b") as f:
        f.seek(0, 2)
        start = f.tell()
        f.write(payload)
    meta.set_entry(i, offset=start, phys=len(payload),
                   logic=len(record) if logic is None else logic)
    meta.set_header(tail=start + len(payload))
    meta.save()


# --------------------------------------------------------------------------
# stores
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def zdict(fixtures_dir) -> bytes:
    return (fixtures_dir / "dict_fast_images.zdict").read_bytes()


@pytest.fixture(scope="module")
def good_stores(tmp_path_factory, zdict):
    root = tmp_path_factory.mktemp("good")
    stores = {}
    for codec in CODECS:
        kw = {"codec": codec, "dict_bytes": zdict if codec == "zstd_dict" else None}
        p = root / f"dense_{codec}"
        with Dense.create(p, np.float32, (3, 4), **kw) as w:
            w.append(DENSE_DATA[:2])
            w.append(DENSE_DATA[2:])
        stores[("dense", codec)] = p
        q = root / f"ragged_{codec}"
        with Ragged.create(q, np.float32, **kw) as w:
            w.append(RAGGED_DATA)
        stores[("ragged", codec)] = q
    return stores


@pytest.fixture
def copy_store(good_stores, tmp_path):
    counter = iter(range(10**6))

    def make(kind, codec):
        dst = tmp_path / f"{kind}_{codec}_{next(counter)}"
        shutil.copytree(good_stores[(kind, codec)], dst)
        for f in dst.iterdir():
            f.chmod(0o644)
        return dst

    return make


def opener(kind):
    return Dense.open if kind == "dense" else Ragged.open


def expected_records(kind):
    return DENSE_DATA if kind == "dense" else RAGGED_DATA


def check_record(kind, got, i):
    want = expected_records(kind)[i]
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype
    assert got.tobytes() == want.tobytes()


def assert_open_fails(kind, path, code=INVALID_FORMAT):
    with pytest.raises(ZrecordError) as ei:
        opener(kind)(path)
    if code is not None:
        assert ei.value.code == code, (ei.value.code, str(ei.value))
    assert str(ei.value)
    return ei.value


def assert_bad_record(kind, path, bad, codes):
    """The store opens; record ``bad`` raises ZrecordError (code in ``codes``),
    gathers that include it raise too, and every other record reads fine."""
    with opener(kind)(path) as ds:
        n = len(ds)
        for sel in (lambda: ds[bad], lambda: ds[[0, bad]] if bad else ds[[bad, n - 1]],
                    lambda: ds[:], lambda: ds.__getitems__([bad])):
            with pytest.raises(ZrecordError) as ei:
                sel()
            assert ei.value.code in codes, (ei.value.code, str(ei.value))
        for i in range(n):
            if i != bad:
                check_record(kind, ds[i], i)


def test_good_stores_are_good(good_stores):
    for (kind, codec), path in good_stores.items():
        with opener(kind)(path) as ds:
            assert len(ds) == len(expected_records(kind))
            for i in range(len(ds)):
                check_record(kind, ds[i], i)
        m = Meta(path)
        assert m.length == len(expected_records(kind))
        assert m.codec == CODECS.index(codec)
        assert m.b[20:31] == bytes(11)
        assert m.tail <= (path / "data.zr").stat().st_size


# --------------------------------------------------------------------------
# header
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("offset", [20, 24, 30])
def test_reserved_bytes_must_be_zero(copy_store, kind, codec, offset):
    p = copy_store(kind, codec)
    m = Meta(p)
    m.b[offset] = 0x01
    m.save()
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("value", [3, 7, 255])
def test_unknown_codec_byte(copy_store, kind, value):
    p = copy_store(kind, "zstd")
    Meta(p).set_header(codec=value).save()
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_zstd_dict_codec_without_dict_file(copy_store, kind, codec):
    p = copy_store(kind, codec)
    Meta(p).set_header(codec=2).save()
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
def test_zstd_dict_store_missing_dict(copy_store, kind):
    p = copy_store(kind, "zstd_dict")
    (p / "dict.zr").unlink()
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_dict_file_on_non_dict_store(copy_store, kind, codec, zdict):
    p = copy_store(kind, codec)
    (p / "dict.zr").write_bytes(zdict)
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("value", [0, 4065, 4096, 2**32 - 1])
def test_schema_length_out_of_range(copy_store, kind, codec, value):
    p = copy_store(kind, codec)
    Meta(p).set_header(schema_length=value).save()
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_meta_shorter_than_table(copy_store, kind, codec):
    p = copy_store(kind, codec)
    m = Meta(p)
    n = m.length
    with open(p / "meta.zr", "r+b") as f:
        f.truncate(PAGE + ENTRY * n - 1)
    assert_open_fails(kind, p)
    q = copy_store(kind, codec)
    Meta(q).set_header(length=n + 1).save()
    assert_open_fails(kind, q)
    r = copy_store(kind, codec)
    Meta(r).set_header(length=2**40).save()
    assert_open_fails(kind, r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("size", [0, 31, 100, PAGE - 1])
def test_meta_shorter_than_static_page(copy_store, kind, size):
    p = copy_store(kind, "zstd")
    with open(p / "meta.zr", "r+b") as f:
        f.truncate(size)
    assert_open_fails(kind, p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
def test_tail_offset_beyond_data(copy_store, kind, codec):
    p = copy_store(kind, codec)
    m = Meta(p)
    size = (p / "data.zr").stat().st_size
    m.set_header(tail=size + 1).save()
    assert_open_fails(kind, p)
    q = copy_store(kind, codec)
    Meta(q).set_header(tail=2**63).save()                  # > i64::MAX
    assert_open_fails(kind, q)
    r = copy_store(kind, codec)
    Meta(r).set_header(tail=2**64 - 1).save()
    assert_open_fails(kind, r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
def test_truncated_data_file(copy_store, kind, codec):
    p = copy_store(kind, codec)
    tail = Meta(p).tail
    with open(p / "data.zr", "r+b") as f:
        f.truncate(tail - 1)
    assert_open_fails(kind, p)
    q = copy_store(kind, codec)
    with open(q / "data.zr", "r+b") as f:
        f.truncate(0)
    assert_open_fails(kind, q)


@pytest.mark.parametrize("kind", KINDS)
def test_missing_data_file(copy_store, kind):
    p = copy_store(kind, "zstd")
    (p / "data.zr").unlink()
    with pytest.raises((ZrecordError, FileNotFoundError)) as ei:
        opener(kind)(p)
    if isinstance(ei.value, ZrecordError):
        assert ei.value.code == INVALID_FORMAT


@pytest.mark.parametrize("kind", KINDS)
def test_failed_open_releases_everything(copy_store, kind):
    p = copy_store(kind, "raw")
    good = Meta(p)
    Meta(p).set_header(codec=9).save()
    for _ in range(3):
        assert_open_fails(kind, p)
    good.save()                          # repaired: opens and reads normally
    with opener(kind)(p) as ds:
        for i in range(len(ds)):
            check_record(kind, ds[i], i)


# --------------------------------------------------------------------------
# schema
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind,schema", [
    ("dense", mp_map([(mp_str("dtype"), mp_str("<f4"))])),
    ("dense", dense_schema(extra=[(mp_str("x"), mp_int(1))])),
    ("dense", mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("shape"), mp_arr([mp_int(3)]))])),
    ("dense", mp_map([])),
    ("ragged", mp_map([])),
    ("ragged", mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("item_shape"), mp_arr([]))])),
    ("ragged", mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("meta"), mp_str("x"))])),
    ("ragged", mp_map([(mp_str("type"), mp_str("<f4"))])),
], ids=["dense-missing", "dense-extra", "dense-renamed", "dense-empty", "ragged-empty",
        "ragged-extra-shape", "ragged-extra", "ragged-renamed"])
def test_schema_fields(copy_store, kind, schema):
    p = copy_store(kind, "raw")
    Meta(p).set_schema(schema).save()
    with pytest.raises(ValueError, match="schema fields"):
        opener(kind)(p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schema", [
    mp_str("<f4"), mp_arr([mp_str("<f4")]), mp_int(5), b"\xc0", b"\xc3",
], ids=["str", "array", "int", "nil", "true"])
def test_schema_not_a_map(copy_store, kind, schema):
    p = copy_store(kind, "zstd")
    Meta(p).set_schema(schema).save()
    with pytest.raises(ValueError):
        opener(kind)(p)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("schema", [
    b"\xc1",                                   # never-used msgpack byte
    b"\x82\xa5dtype",                          # truncated map
    "trailing",                                # a valid map followed by more bytes
], ids=["c1", "truncated", "trailing"])
def test_schema_not_msgpack(copy_store, kind, schema):
    p = copy_store(kind, "zstd")
    m = Meta(p)
    if schema == "trailing":
        schema = m.schema + b"\x00"
    m.set_schema(schema).save()
    with pytest.raises((ValueError, ZrecordError)) as ei:
        opener(kind)(p)
    if isinstance(ei.value, ZrecordError):
        assert ei.value.code == INVALID_FORMAT


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["|O", "zz", "<f4junk", ""])
def test_schema_bad_dtype(copy_store, kind, dtype):
    p = copy_store(kind, "raw")
    schema = dense_schema(dtype=dtype) if kind == "dense" else mp_map([(mp_str("dtype"), mp_str(dtype))])
    Meta(p).set_schema(schema).save()
    with pytest.raises((ValueError, TypeError, ZrecordError)):
        opener(kind)(p)


@pytest.mark.parametrize("kind", KINDS)
def test_schema_dtype_not_a_string(copy_store, kind):
    p = copy_store(kind, "raw")
    if kind == "dense":
        schema = mp_map([(mp_str("dtype"), mp_int(5)),
                         (mp_str("item_shape"), mp_arr([mp_int(3), mp_int(4)]))])
    else:
        schema = mp_map([(mp_str("dtype"), mp_int(5))])
    Meta(p).set_schema(schema).save()
    with pytest.raises((ValueError, ZrecordError)):
        opener(kind)(p)


@pytest.mark.parametrize("item_shape", [
    mp_arr([mp_int(3), mp_int(-4)]),
    mp_arr([mp_int(0)]),
    mp_arr([mp_int(3), mp_str("4")]),
    mp_str("ab"),
    mp_int(12),
    mp_arr([mp_int(2**31), mp_int(2**31)]),
    mp_arr([b"\xc3"]),                                      # a bool dimension
], ids=["negative", "zero-width", "str-dim", "str", "int", "too-wide", "bool"])
def test_schema_bad_item_shape(copy_store, item_shape):
    p = copy_store("dense", "raw")
    schema = mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("item_shape"), item_shape)])
    Meta(p).set_schema(schema).save()
    with pytest.raises((ValueError, ZrecordError)) as ei:
        Dense.open(p)
    if isinstance(ei.value, ZrecordError):
        assert ei.value.code in (INVALID_FORMAT, DECODE_FAILED)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("item_shape,dtype", [((3, 5), "<f4"), ((2, 4), "<f4"), ((12,), "<f2")])
def test_schema_width_disagrees_with_records(copy_store, codec, item_shape, dtype):
    p = copy_store("dense", codec)
    Meta(p).set_schema(dense_schema(dtype=dtype, item_shape=item_shape)).save()
    with Dense.open(p) as ds:
        assert ds.item_shape == item_shape
        for sel in (0, 4, slice(None), [1, 2]):
            with pytest.raises(ZrecordError) as ei:
                ds[sel]
            assert ei.value.code == DECODE_FAILED


def test_schema_same_width_other_geometry_is_valid(copy_store):
    # width is all that ties a record to the schema: <f8 (3, 2) == <f4 (3, 4) bytes
    p = copy_store("dense", "zstd")
    Meta(p).set_schema(dense_schema(dtype="<f8", item_shape=(3, 2))).save()
    with Dense.open(p) as ds:
        got = ds[:]
        assert got.dtype == np.float64 and got.shape == (5, 3, 2)
        assert got.tobytes() == DENSE_DATA.tobytes()


# --------------------------------------------------------------------------
# record table entries
# --------------------------------------------------------------------------

def _entry_case(p, case):
    m = Meta(p)
    off, phys, logic = m.entry(1)
    size = (p / "data.zr").stat().st_size
    if case == "offset-beyond-data":
        m.set_entry(1, offset=size + 10)
    elif case == "offset-overflow":
        m.set_entry(1, offset=2**64 - 8)
    elif case == "end-past-tail":
        m.set_entry(1, offset=m.tail - phys + 1)
    elif case == "logic-zero":
        m.set_entry(1, logic=0)
    elif case == "logic-over-2^31":
        m.set_entry(1, logic=2**31 + 1)
    elif case == "logic-max":
        m.set_entry(1, logic=2**32 - 1)
    elif case == "phys-zero":
        m.set_entry(1, phys=0)
    elif case == "phys-huge":
        m.set_entry(1, phys=2**32 - 1)
    m.save()


ENTRY_CASES = ["offset-beyond-data", "offset-overflow", "end-past-tail", "logic-zero",
               "logic-over-2^31", "logic-max", "phys-zero", "phys-huge"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("case", ENTRY_CASES)
def test_invalid_table_entry(copy_store, kind, codec, case):
    p = copy_store(kind, codec)
    _entry_case(p, case)
    assert_bad_record(kind, p, 1, (INVALID_FORMAT, DECODE_FAILED))


@pytest.mark.parametrize("kind", KINDS)
def test_entry_past_tail_but_inside_data_file(copy_store, kind):
    # data.zr may be longer than tail_offset; bytes past the tail are not committed
    p = copy_store(kind, "raw")
    m = Meta(p)
    off, phys, logic = m.entry(1)
    with open(p / "data.zr", "ab") as f:
        f.write(b"\x00" * 4096)
    payload = (p / "data.zr").read_bytes()[off:off + phys]
    with open(p / "data.zr", "r+b") as f:
        f.seek(m.tail + 100)
        f.write(payload)
    m.set_entry(1, offset=m.tail + 100).save()
    assert_bad_record(kind, p, 1, (INVALID_FORMAT, DECODE_FAILED))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("delta", [-4, -1, 1, 4])
def test_raw_phys_differs_from_logic(copy_store, kind, delta):
    p = copy_store(kind, "raw")
    m = Meta(p)
    off, phys, logic = m.entry(1)
    m.set_entry(1, phys=phys + delta if delta < 0 else phys, logic=logic + delta if delta > 0 else logic)
    m.save()
    assert_bad_record(kind, p, 1, (INVALID_FORMAT, DECODE_FAILED))


# --------------------------------------------------------------------------
# decode failures (-7)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_corrupted_frame_magic(copy_store, kind, codec):
    p = copy_store(kind, codec)
    off, phys, logic = Meta(p).entry(1)
    with open(p / "data.zr", "r+b") as f:
        f.seek(off)
        f.write(b"\x00\x00")
    assert_bad_record(kind, p, 1, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_corrupted_block_type(copy_store, kind, codec):
    p = copy_store(kind, codec)
    off, phys, logic = Meta(p).entry(2)
    data = bytearray((p / "data.zr").read_bytes())
    at = off + frame_header_size(bytes(data[off:off + 18]))
    data[at] |= 0x06                                        # block type 3 is reserved
    (p / "data.zr").write_bytes(bytes(data))
    assert_bad_record(kind, p, 2, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["zstd", "zstd_dict"])
def test_truncated_frame(copy_store, kind, codec):
    p = copy_store(kind, codec)
    m = Meta(p)
    off, phys, logic = m.entry(0)
    m.set_entry(0, phys=phys - 1).save()
    assert_bad_record(kind, p, 0, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("delta", [-8, -1, 1, 8])
def test_frame_decodes_to_wrong_size(copy_store, kind, delta):
    # the frame itself is valid; the table claims another decoded length
    p = copy_store(kind, "zstd")
    m = Meta(p)
    off, phys, logic = m.entry(1)
    m.set_entry(1, logic=logic + delta).save()
    assert_bad_record(kind, p, 1, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_size", [True, False], ids=["fcs", "no-fcs"])
@pytest.mark.parametrize("delta", [-4, 4])
def test_crafted_frame_of_wrong_size(copy_store, kind, with_size, delta):
    p = copy_store(kind, "zstd")
    m = Meta(p)
    good = expected_records(kind)[1]
    record = good.tobytes() if kind == "dense" else ragged_bytes(good.shape, good.tobytes())
    content = record + b"\x11" * delta if delta > 0 else record[:delta]
    append_payload(p, m, 1, record, "zstd", logic=len(record),
                   frame=zstd_frame(content, with_size=with_size))
    assert_bad_record(kind, p, 1, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_size", [True, False], ids=["fcs", "no-fcs"])
def test_crafted_valid_frames_are_read(copy_store, kind, with_size):
    """Control for the crafted-frame tests: a well-formed raw-block frame reads."""
    p = copy_store(kind, "zstd")
    m = Meta(p)
    good = expected_records(kind)[1]
    record = good.tobytes() if kind == "dense" else ragged_bytes(good.shape, good.tobytes())
    append_payload(p, m, 1, record, "zstd", frame=zstd_frame(record, with_size=with_size))
    with opener(kind)(p) as ds:
        for i in range(len(ds)):
            check_record(kind, ds[i], i)


def test_crafted_frame_declaring_wrong_content_size(copy_store):
    p = copy_store("ragged", "zstd")
    m = Meta(p)
    rec = ragged_bytes((4,), RAGGED_DATA[1].tobytes())
    append_payload(p, m, 1, rec, "zstd", frame=zstd_frame(rec, declared=len(rec) + 8),
                   logic=len(rec) + 8)
    assert_bad_record("ragged", p, 1, (DECODE_FAILED,))


@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("width", [44, 52, 4, 96])
def test_dense_record_width_differs_from_schema(copy_store, codec, width):
    # a self-consistent entry whose size is not the schema's record width
    p = copy_store("dense", codec)
    m = Meta(p)
    record = (np.arange(width // 4, dtype=np.float32) + 0.5).tobytes()
    append_payload(p, m, 3, record, codec)
    assert_bad_record("dense", p, 3, (DECODE_FAILED,))


@pytest.mark.parametrize("kind", KINDS)
def test_zstd_dict_store_with_foreign_dictionary(copy_store, kind):
    # Frames written against the real dictionary, read with garbage in dict.zr:
    # opening or reading must fail cleanly -- or, should a frame happen not to
    # depend on the dictionary, give back the exact record. Never wrong data.
    p = copy_store(kind, "zstd_dict")
    (p / "dict.zr").write_bytes(b"not a dictionary" * 64)
    try:
        ds = opener(kind)(p)
    except ZrecordError as exc:
        assert exc.code in (INVALID_FORMAT, DECODE_FAILED)
        return
    with ds:
        for i in range(len(ds)):
            try:
                got = ds[i]
            except ZrecordError as exc:
                assert exc.code in (INVALID_FORMAT, DECODE_FAILED)
            else:
                check_record(kind, got, i)


# --------------------------------------------------------------------------
# ragged shape prefixes that disagree with their payload
# --------------------------------------------------------------------------

def _f4(*vals):
    return np.array(vals, dtype=np.float32).tobytes()


RAGGED_BAD = {
    "ndim-huge": struct.pack("<Q", 2**63) + _f4(1, 2, 3, 4),
    "ndim-1000": struct.pack("<Q", 1000) + _f4(1, 2, 3, 4),
    "ndim-past-end": struct.pack("<Q", 3) + struct.pack("<Q", 1) + _f4(1),
    "dims-too-many-items": ragged_bytes((5,), _f4(1, 2, 3)),
    "dims-too-few-items": ragged_bytes((2,), _f4(1, 2, 3)),
    "dims-product-overflow": ragged_bytes((2**32, 2**32), _f4(1, 2, 3)),
    "dims-product-overflow-2": ragged_bytes((2**62, 4), _f4(1, 2, 3)),
    "dims-huge": ragged_bytes((2**63,), _f4(1, 2)),
    "zero-dim": ragged_bytes((1, 0), b""),
    "zero-payload-scalar": ragged_bytes((), b""),
    "scalar-with-two-items": ragged_bytes((), _f4(1, 2)),
    "payload-not-itemsize-multiple": ragged_bytes((1,), _f4(1)[:3]),
    "shorter-than-ndim": _f4(1),
    "seven-bytes": b"\x01" * 7,
}


@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("case", sorted(RAGGED_BAD))
def test_ragged_shape_prefix_disagrees(copy_store, codec, case):
    p = copy_store("ragged", codec)
    m = Meta(p)
    append_payload(p, m, 1, RAGGED_BAD[case], codec)
    assert_bad_record("ragged", p, 1, (DECODE_FAILED, INVALID_FORMAT))


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_ragged_crafted_good_prefix_is_read(copy_store, codec):
    """Control: a hand-written prefix + payload in the documented layout reads."""
    p = copy_store("ragged", codec)
    m = Meta(p)
    append_payload(p, m, 1, ragged_bytes((2, 1, 2), _f4(1, 2, 3, 4)), codec)
    with Ragged.open(p) as ds:
        got = ds[1]
        assert got.shape == (2, 1, 2) and got.dtype == np.float32
        assert got.ravel().tolist() == [1.0, 2.0, 3.0, 4.0]
        check_record("ragged", ds[0], 0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", CODECS)
def test_physical_order_is_free(copy_store, kind, codec):
    """Frames may sit anywhere in data.zr; only the table maps record i."""
    p = copy_store(kind, codec)
    m = Meta(p)
    data = (p / "data.zr").read_bytes()
    n = m.length
    frames = [data[o:o + ph] for o, ph, _ in (m.entry(i) for i in range(n))]
    out = bytearray(b"\xee" * 7)                           # unreferenced filler
    for i in reversed(range(n)):
        m.set_entry(i, offset=len(out))
        out += frames[i] + b"\xee" * 3
    (p / "data.zr").write_bytes(bytes(out))
    m.set_header(tail=len(out)).save()
    with opener(kind)(p) as ds:
        for i in range(n):
            check_record(kind, ds[i], i)
        got = ds[list(reversed(range(n)))]
        for j, i in enumerate(reversed(range(n))):
            check_record(kind, got[j], i)


# --------------------------------------------------------------------------
# a 2^31-byte claim must not allocate 2 GiB
# --------------------------------------------------------------------------

HUGE_CLAIM_CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from loaderx.zrecord import Ragged, ZrecordError
    path = sys.argv[1]
    ds = Ragged.open(path)
    ds[0]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    results = []
    for sel in ([1], [0, 1, 2], [1, 1, 1, 1]):
        try:
            ds[sel]
            results.append("no error")
        except ZrecordError as exc:
            results.append(exc.code)
        except Exception as exc:
            results.append(type(exc).__name__ + ": " + str(exc))
    secs = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ds.close()
    print(json.dumps({"results": results, "secs": secs, "grow_kib": after - before}))
""")


@pytest.mark.parametrize("variant", ["entry-only", "frame-declares-too"])
def test_huge_logic_length_claim_does_not_allocate(copy_store, run_ours, variant):
    p = copy_store("ragged", "zstd")
    m = Meta(p)
    if variant == "entry-only":
        m.set_entry(1, logic=2**31).save()
    else:
        rec = ragged_bytes((4,), RAGGED_DATA[1].tobytes())
        append_payload(p, m, 1, rec, "zstd", frame=zstd_frame(rec, declared=2**31), logic=2**31)
    proc = run_ours(HUGE_CLAIM_CHILD, p, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["results"] == [DECODE_FAILED] * 3, out
    assert out["secs"] < 10, out
    assert out["grow_kib"] < 200 * 1024, out                # ru_maxrss is KiB on Linux


# --------------------------------------------------------------------------
# a writer that dies before close() must not leave a readable store
# --------------------------------------------------------------------------

KILLED_WRITER_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from loaderx.zrecord import Dense, Ragged
    path, kind, codec, appends = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if kind == "dense":
        w = Dense.create(path, np.int32, (4,), codec=codec)
        for i in range(appends):
            w.append(np.arange(8, dtype=np.int32).reshape(2, 4) + i)
    else:
        w = Ragged.create(path, np.int32, codec=codec)
        for i in range(appends):
            w.append([np.arange(i + 1, dtype=np.int32), np.array(i, np.int32)])
    sys.stdout.write("appended\\n")
    sys.stdout.flush()
    os._exit(0)
""")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("appends", [0, 3])
def test_killed_writer_leaves_unopenable_store(tmp_path, run_ours, kind, codec, appends):
    p = tmp_path / "killed"
    proc = run_ours(KILLED_WRITER_CHILD, p, kind, codec, appends, timeout=60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "appended"
    assert (p / "meta.zr").is_file()
    for cls in (Dense, Ragged):
        with pytest.raises(ZrecordError) as ei:
            cls.open(p)
        assert ei.value.code == INVALID_FORMAT
        assert str(ei.value)
    # the lock died with the process: the directory is not busy, just not a store
    with pytest.raises(ZrecordError) as ei:
        Dense.create(p, np.int32, (4,))
    assert ei.value.code == -12
