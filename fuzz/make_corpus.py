#!/usr/bin/env python3
"""Seed corpus for the ``open_gather`` fuzz target.

Writes inputs in the encoding that ``fuzz/harness.rs`` decodes:

    u8 flags | u32 len + meta section | u32 len + data.zr | u32 len + dict.zr | index script

flags: bit 0 compact meta (u16 page-prefix length, prefix, then the table),
bit 1 dict.zr present, bit 2 data.zr absent.

Seeds come from the loaderx 2.0.0 fixture stores (verbatim, and with a few
mutations) and from small stores built here byte by byte (so that hostile
values the public API refuses to write, such as huge ragged ranks, can be
planted), each with mutated headers, schemas, tables, frames, ragged shape
prefixes and dictionaries. zstd frames of the built stores are written with
raw and RLE blocks, which needs no compression library.

Usage: python3 fuzz/make_corpus.py [OUT_DIR] [--fixtures DIR]
(defaults: fuzz/corpus-work/open_gather, the git-ignored working corpus, and
../shared/fixtures/loaderx-2.0.0). Output names are content hashes, so
rerunning adds nothing twice. The committed corpus (fuzz/corpus/open_gather)
is the libFuzzer merge of a working corpus after fuzzing, not these seeds.
"""
from __future__ import annotations

import argparse
import hashlib
import random
import struct
from pathlib import Path

PAGE = 4096
ENTRY = 16
HERE = Path(__file__).resolve().parent
RAW, ZSTD, ZSTD_DICT = 0, 1, 2

# ---------------------------------------------------------------------------
# input encoding (mirror of harness::encode)
# ---------------------------------------------------------------------------


def encode_input(meta: bytes, data: bytes | None, dict_bytes: bytes | None, script: bytes = b"") -> bytes:
    flags = 0
    if len(meta) >= PAGE:
        flags |= 1
        page = meta[:PAGE].rstrip(b"\0")
        section = struct.pack("<H", len(page)) + page + meta[PAGE:]
    else:
        section = meta
    if dict_bytes is not None:
        flags |= 2
    if data is None:
        flags |= 4
    out = bytearray([flags])
    for part in (section, data or b"", dict_bytes or b""):
        out += struct.pack("<I", len(part)) + part
    return bytes(out) + script


# ---------------------------------------------------------------------------
# MessagePack (just what schemas need)
# ---------------------------------------------------------------------------


def mp_str(s: str) -> bytes:
    b = s.encode()
    assert len(b) < 32
    return bytes([0xA0 | len(b)]) + b


def mp_uint(v: int) -> bytes:
    if v < 128:
        return bytes([v])
    if v < 1 << 16:
        return b"\xcd" + struct.pack(">H", v)
    if v < 1 << 32:
        return b"\xce" + struct.pack(">I", v)
    return b"\xcf" + struct.pack(">Q", v)


def mp_map(pairs: list[tuple[bytes, bytes]]) -> bytes:
    return bytes([0x80 | len(pairs)]) + b"".join(k + v for k, v in pairs)


def dense_schema(dtype: str, shape: list[int]) -> bytes:
    arr = bytes([0x90 | len(shape)]) + b"".join(mp_uint(d) for d in shape)
    return mp_map([(mp_str("dtype"), mp_str(dtype)), (mp_str("item_shape"), arr)])


def ragged_schema(dtype: str) -> bytes:
    return mp_map([(mp_str("dtype"), mp_str(dtype))])


# ---------------------------------------------------------------------------
# zstd frames without a compressor: raw and RLE blocks
# ---------------------------------------------------------------------------

BLOCK_MAX = 128 << 10


def zstd_frame(content: bytes, rle: bool = False, declare_size: int | None = None) -> bytes:
    size = len(content) if declare_size is None else declare_size
    out = bytearray(struct.pack("<I", 0xFD2FB528))
    out.append(0xA0)  # single segment, 4-byte frame content size
    out += struct.pack("<I", size)
    pos = 0
    while True:
        chunk = content[pos:pos + BLOCK_MAX]
        pos += len(chunk)
        last = pos >= len(content)
        if rle and chunk and chunk == bytes([chunk[0]]) * len(chunk):
            hdr = (len(chunk) << 3) | (1 << 1) | int(last)
            out += struct.pack("<I", hdr)[:3] + chunk[:1]
        else:
            hdr = (len(chunk) << 3) | int(last)
            out += struct.pack("<I", hdr)[:3] + chunk
        if last:
            return bytes(out)


# ---------------------------------------------------------------------------
# stores as byte strings
# ---------------------------------------------------------------------------


class Store:
    def __init__(self, meta: bytes, data: bytes | None, dict_bytes: bytes | None):
        self.meta = bytearray(meta)
        self.data = bytearray(data) if data is not None else None
        self.dict = dict_bytes

    def copy(self) -> "Store":
        return Store(bytes(self.meta), None if self.data is None else bytes(self.data), self.dict)

    @property
    def length(self) -> int:
        return struct.unpack_from("<Q", self.meta, 0)[0]

    @property
    def tail(self) -> int:
        return struct.unpack_from("<Q", self.meta, 8)[0]

    def entry(self, i: int) -> tuple[int, int, int]:
        return struct.unpack_from("<QII", self.meta, PAGE + ENTRY * i)

    def set_entry(self, i: int, off=None, phys=None, logic=None) -> "Store":
        o, p, l = self.entry(i)
        struct.pack_into("<QII", self.meta, PAGE + ENTRY * i,
                         o if off is None else off, p if phys is None else phys,
                         l if logic is None else logic)
        return self

    def encode(self, script: bytes = b"") -> bytes:
        return encode_input(bytes(self.meta), None if self.data is None else bytes(self.data),
                            self.dict, script)


def build(schema: bytes, codec: int, records: list[bytes], dict_bytes: bytes | None = None,
          rle: bool = False, shuffle: random.Random | None = None) -> Store:
    frames = [zstd_frame(r, rle=rle) if codec else r for r in records]
    order = list(range(len(frames)))
    if shuffle is not None:
        shuffle.shuffle(order)  # physical order is free
    data = bytearray()
    locs = [None] * len(frames)
    for i in order:
        locs[i] = (len(data), len(frames[i]), len(records[i]))
        data += frames[i]
    header = struct.pack("<QQI", len(records), len(data), len(schema)) + bytes(11) + bytes([codec])
    page = (header + schema).ljust(PAGE, b"\0")
    table = b"".join(struct.pack("<QII", *loc) for loc in locs)
    return Store(page + table, bytes(data), dict_bytes)


def ragged_record(shape: list[int], payload: bytes) -> bytes:
    return struct.pack("<Q", len(shape)) + b"".join(struct.pack("<Q", d) for d in shape) + payload


def load_fixture(d: Path) -> Store:
    dict_path = d / "dict.zr"
    return Store((d / "meta.zr").read_bytes(), (d / "data.zr").read_bytes(),
                 dict_path.read_bytes() if dict_path.exists() else None)


# ---------------------------------------------------------------------------
# mutations
# ---------------------------------------------------------------------------


def header_mutations(s: Store):
    n, tail = s.length, s.tail
    for length in {n + 1, max(n - 1, 0), 0, 1 << 40, (1 << 64) - 1, (1 << 60) + 1}:
        m = s.copy()
        struct.pack_into("<Q", m.meta, 0, length)
        yield m
    for t in {tail + 1, max(tail - 1, 0), 0, 1 << 63, (1 << 63) - 1}:
        m = s.copy()
        struct.pack_into("<Q", m.meta, 8, t)
        yield m
    schema_len = struct.unpack_from("<I", s.meta, 16)[0]
    for sl in {0, 1, schema_len - 1, schema_len + 1, 4064, 4065, 0xFFFFFFFF}:
        m = s.copy()
        struct.pack_into("<I", m.meta, 16, sl & 0xFFFFFFFF)
        yield m
    for pos in (20, 25, 30):
        m = s.copy()
        m.meta[pos] = 1
        yield m
    for tag in (0, 1, 2, 3, 255):
        if tag != s.meta[31]:
            m = s.copy()
            m.meta[31] = tag
            yield m


def schema_mutations(s: Store):
    for schema in (
        dense_schema("<f4", [1 << 32, 1 << 32]),
        dense_schema("<f4", [0]),
        dense_schema("<f4", []),
        dense_schema("|u1", [1 << 31]),
        dense_schema("|u1", [(1 << 31) + 1]),
        dense_schema("<f8", [1 << 28]),
        dense_schema("|V8", [2]),
        dense_schema("<M8[ns]", [1]),
        dense_schema("<f4", [2] * 15),
        ragged_schema("<f4"),
        ragged_schema("|u1"),
        ragged_schema("|O"),
        ragged_schema("<U0"),
        ragged_schema(""),
        mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("extra"), mp_uint(1))]),
        mp_map([(mp_str("dtype"), mp_uint(3))]),
        mp_map([(mp_str("dtype"), mp_str("<f4")), (mp_str("item_shape"), mp_str("x"))]),
        b"\x92\x01\x02",
        b"\xc1",
        b"\x81\xa5dtyp",
        b"\xdf\xff\xff\xff\xff",
        b"\x82\xa5dtype\xa3<f4\xaaitem_shape\xdd\xff\xff\xff\xff",
    ):
        m = s.copy()
        m.meta[32:PAGE] = bytes(PAGE - 32)
        m.meta[32:32 + len(schema)] = schema
        struct.pack_into("<I", m.meta, 16, len(schema))
        yield m


def table_mutations(s: Store, raw: bool):
    n, tail = s.length, s.tail
    if n == 0:
        return
    targets = sorted({0, n - 1})
    for i in targets:
        o, p, l = s.entry(i)
        for kw in (
            dict(off=tail), dict(off=(1 << 64) - 1), dict(off=tail - p + 1 if tail >= p else 0),
            dict(phys=0), dict(phys=tail + 1), dict(phys=0xFFFFFFFF),
            dict(logic=0), dict(logic=1 << 31), dict(logic=(1 << 31) + 1), dict(logic=0xFFFFFFFF),
            dict(logic=l + 1), dict(logic=max(l - 1, 1)), dict(phys=p + 1), dict(phys=max(p - 1, 1)),
            dict(phys=p + 1, logic=p + 1), dict(off=o + 1),
        ):
            yield s.copy().set_entry(i, **kw)
    if n >= 2:
        a, b = s.entry(0), s.entry(1)
        yield s.copy().set_entry(0, *b).set_entry(1, *a)
        # Both entries name the same frame.
        yield s.copy().set_entry(1, *a)
    # Truncated table.
    m = s.copy()
    del m.meta[len(m.meta) - 8:]
    yield m


def frame_mutations(s: Store, rng: random.Random):
    if not s.data:
        return
    n = s.length
    for i in sorted({0, n - 1}) if n else []:
        o, p, l = s.entry(i)
        for pos in {o, o + 1, o + 4, o + 5, o + p // 2, o + p - 1}:
            if pos < len(s.data):
                for xor in (0x01, 0x80, 0xFF):
                    m = s.copy()
                    m.data[pos] ^= xor
                    yield m
        m = s.copy()
        m.data[o:o + p] = bytes(p)
        yield m
    m = s.copy()
    del m.data[-1:]
    yield m
    m = s.copy()
    m.data = None
    yield m
    for _ in range(4):
        m = s.copy()
        pos = rng.randrange(len(m.data))
        m.data[pos] = rng.randrange(256)
        yield m


def dict_mutations(s: Store, rng: random.Random):
    if s.dict is not None:
        for d in (None, b"", s.dict[:8], s.dict[:len(s.dict) // 2], bytes(rng.randrange(256) for _ in range(64)),
                  struct.pack("<I", 0xEC30A437) + bytes(60)):
            m = s.copy()
            m.dict = d
            yield m
    else:
        for d in (b"\x37\xa4\x30\xec" + bytes(12), b""):
            m = s.copy()
            m.dict = d
            yield m


def script(rng: random.Random, n: int) -> bytes:
    n = min(n, 0xFFFE)
    out = bytearray()
    for _ in range(rng.randrange(1, 5)):
        k = rng.randrange(17)
        out.append(k)
        for _ in range(k):
            v = rng.choice([rng.randrange(max(n, 1)), rng.randrange(max(n, 1)), n, 0xFFFF])
            out += struct.pack("<H", min(v, 0xFFFF))
    return bytes(out)


# ---------------------------------------------------------------------------
# the seed stores
# ---------------------------------------------------------------------------


def built_stores(rng: random.Random, dict_bytes: bytes | None):
    f4 = lambda vals: struct.pack(f"<{len(vals)}f", *vals)
    dense_recs = [f4([i * 3 + k for k in range(3)]) for i in range(6)]
    shapes = [[3], [1, 2], [], [2, 2, 1], [1], [4]]
    ragged_recs = []
    for i, sh in enumerate(shapes):
        count = 1
        for d in sh:
            count *= d
        ragged_recs.append(ragged_record(sh, f4([i + k / 2 for k in range(count)])))
    u1 = [ragged_record([40], bytes([i]) * 40) for i in range(4)]  # RLE-friendly
    for codec in (RAW, ZSTD, ZSTD_DICT):
        d = dict_bytes if codec == ZSTD_DICT else None
        if codec == ZSTD_DICT and d is None:
            continue
        yield "dense", codec, build(dense_schema("<f4", [3]), codec, dense_recs, d, shuffle=rng)
        yield "ragged", codec, build(ragged_schema("<f4"), codec, ragged_recs, d, shuffle=rng)
        yield "ragged", codec, build(ragged_schema("|u1"), codec, u1, d, rle=True)
    # Empty committed stores.
    yield "dense", RAW, build(dense_schema("<i8", []), RAW, [])
    yield "ragged", ZSTD, build(ragged_schema("<i4"), ZSTD, [])


def hostile_ragged(codec: int, d: bytes | None):
    """Ragged stores whose shape prefixes lie; built directly with the bad prefix."""
    bad = [
        struct.pack("<Q", 65) + bytes(65 * 8) + b"\1",
        struct.pack("<Q", 1 << 63) + bytes(16),
        struct.pack("<Q", (1 << 64) - 1) + bytes(16),
        struct.pack("<QQ", 1, (1 << 64) - 1) + bytes(4),
        struct.pack("<QQQ", 2, 1 << 32, 1 << 32) + bytes(4),
        struct.pack("<QQ", 1, 3) + bytes(4),
        struct.pack("<QQ", 1, 0),
        struct.pack("<QQ", 1, 0) + bytes(4),
        struct.pack("<Q", 0),
        b"\1\2\3\4",
        struct.pack("<Q", 64) + struct.pack("<Q", 1) * 64 + bytes(4),
        struct.pack("<Q", 2) + struct.pack("<Q", 1),
    ]
    good = ragged_record([2], struct.pack("<2f", 1.0, 2.0))
    for b in bad:
        yield build(ragged_schema("<f4"), codec, [good, b, good], d)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default=str(HERE / "corpus-work" / "open_gather"))
    ap.add_argument("--fixtures", default=str(HERE.parent.parent / "shared" / "fixtures" / "loaderx-2.0.0"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(20240611)
    seeds: list[bytes] = []

    fixtures = Path(args.fixtures)
    dict_bytes = None
    if (fixtures / "dict_fast_images.zdict").exists():
        dict_bytes = (fixtures / "dict_fast_images.zdict").read_bytes()
    fixture_stores = sorted(p for p in fixtures.iterdir() if (p / "meta.zr").exists()) if fixtures.is_dir() else []
    for d in fixture_stores:
        s = load_fixture(d)
        seeds.append(s.encode())
        seeds.append(s.encode(script(rng, s.length)))
        # A few cheap mutations of the real stores (real compressed frames).
        small = len(s.data or b"") < 50_000
        muts = list(table_mutations(s, s.meta[31] == RAW))[:6] + list(frame_mutations(s, rng))[:6]
        if s.dict is not None:
            muts += list(dict_mutations(s, rng))[:3]
        for m in muts if small else muts[:4]:
            seeds.append(m.encode())

    # A raw-content dictionary (no magic): valid for zstd, and small.
    raw_dict = bytes(range(256))
    for kind, codec, s in built_stores(rng, raw_dict):
        seeds.append(s.encode(script(rng, s.length)))
        for gen in (header_mutations(s), schema_mutations(s), table_mutations(s, codec == RAW),
                    frame_mutations(s, rng), dict_mutations(s, rng)):
            for m in gen:
                seeds.append(m.encode(script(rng, m.length) if rng.random() < 0.3 else b""))
        # Short and odd-sized meta.zr (non-compact encoding).
        for cut in (0, 31, 32, 100, PAGE - 1):
            seeds.append(encode_input(bytes(s.meta[:cut]), bytes(s.data or b""), s.dict))
    for codec in (RAW, ZSTD, ZSTD_DICT):
        d = raw_dict if codec == ZSTD_DICT else None
        for s in hostile_ragged(codec, d):
            seeds.append(s.encode(bytes([3, 0, 0, 1, 0, 2, 0])))
    # A zstd frame that claims more content than the table entry.
    s = build(ragged_schema("|u1"), ZSTD, [ragged_record([8], bytes(8))])
    s.data = bytearray(zstd_frame(ragged_record([8], bytes(8)), declare_size=1 << 31))
    s.set_entry(0, phys=len(s.data))
    struct.pack_into("<Q", s.meta, 8, len(s.data))
    seeds.append(s.encode())

    written = 0
    for seed in seeds:
        name = out / hashlib.sha1(seed).hexdigest()
        if not name.exists():
            name.write_bytes(seed)
            written += 1
    print(f"{len(seeds)} seeds, {written} new files in {out}")


if __name__ == "__main__":
    main()
