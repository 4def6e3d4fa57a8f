"""Converting real datasets as they come: encoded images, text and class
labels (Ragged uint8 stores of the exact source bytes, the ``features.json``
sidecar), ``--codec auto``, and decoding images at conversion or in the
loader's transform workers.

Datasets are built in memory (``datasets.Dataset.from_dict``) and saved to
temporary folders; images are encoded with Pillow here. Nothing is downloaded.
"""
from __future__ import annotations

import io
import json
import pickle
import string
from pathlib import Path

import numpy as np
import pytest
from test_tools import cli, fails, ok

from loaderx import _sidecar, tools
from loaderx.dataloader import DataLoader
from loaderx.tools import _codec
from loaderx.zrecord import Dense, Ragged

PIL = pytest.importorskip("PIL.Image")

N = 48
NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
_rng = np.random.default_rng(11)
PIXELS = [_rng.integers(0, 256, size=(int(h), int(w), 3), dtype=np.uint8)
          for h, w in _rng.integers(3, 17, size=(N, 2))]
LABELS = (np.arange(N) * 7 % 10).astype(np.int64)
TEXTS = [f"row {i}: {'é' * (i % 3)}{string.ascii_lowercase[: 1 + i % 26]} ✓" for i in range(N)]


def encode(pixels: np.ndarray, fmt: str = "PNG", **kw) -> bytes:
    buf = io.BytesIO()
    PIL.fromarray(pixels).save(buf, format=fmt, **kw)
    return buf.getvalue()


PNGS = [encode(p) for p in PIXELS]


def pil_decode(data: bytes, mode: str = "RGB") -> np.ndarray:
    with PIL.open(io.BytesIO(data)) as img:
        arr = np.asarray(img.convert(mode))
    return arr if arr.ndim == 3 else arr[:, :, None]


def hf_dataset():
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "image": datasets.Image(),
        "text": datasets.Value("string"),
        "label": datasets.ClassLabel(names=NAMES),
    })
    return datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in PNGS], "text": TEXTS, "label": LABELS.tolist()},
        features=features,
    )


def assert_bytes_store(path: Path, expected: list[bytes]) -> None:
    with Ragged.open(path) as s:
        assert s.dtype == np.uint8 and len(s) == len(expected)
        got = s[:]
    for i, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.shape == (len(e),) and g.tobytes() == e, i


def check_converted(out: Path) -> None:
    """The three columns of hf_dataset() as converted: exact bytes and values."""
    assert_bytes_store(out / "image", PNGS)
    assert_bytes_store(out / "text", [t.encode("utf-8") for t in TEXTS])
    with Dense.open(out / "label") as s:
        assert s.dtype == np.int64 and s.item_shape == ()
        np.testing.assert_array_equal(s[:], LABELS)
        assert s.features["names"] == NAMES
    assert tools.class_names(out / "label") == NAMES
    assert tools.class_names(out / "text") is None


# ---------------------------------------------------------------------------
# encoded images, text and class labels
# ---------------------------------------------------------------------------


def test_hf_dataset_and_its_parquet_convert_to_exact_bytes_with_class_names(tmp_path):
    ds = hf_dataset()
    ds.save_to_disk(str(tmp_path / "hf"))
    ds.to_parquet(str(tmp_path / "t.parquet"))  # keeps the features in the schema metadata
    out = ok(cli("convert", tmp_path / "hf", tmp_path / "a")).stdout
    assert "image -> " in out and "Ragged uint8" in out and "encoded image" in out
    assert "label -> " in out and "10 class names" in out
    check_converted(tmp_path / "a")
    ok(cli("convert", tmp_path / "t.parquet", tmp_path / "b", "--quiet"))
    check_converted(tmp_path / "b")

    with Ragged.open(tmp_path / "b" / "image") as s:
        f = s.features
    assert f["column"] == "image" and f["content"] == "encoded image"
    assert f["source_type"] == "struct<bytes: binary, path: string>"
    assert f["feature"]["_type"] == "Image" and f["names"] is None
    text = json.loads((tmp_path / "b" / "text" / "features.json").read_text())
    assert text["format"] == "loaderx.features" and text["version"] == 1
    assert text["content"] == "text" and text["source_type"] == "string"
    label = tools.info(tmp_path / "b" / "label")["features"]
    assert label["feature"] == {"names": NAMES, "_type": "ClassLabel"} and label["content"] == "values"

    shown = ok(cli("info", tmp_path / "a" / "label", tmp_path / "a" / "image")).stdout
    assert "classes     10 names: 0=airplane, 1=automobile, 2=bird" in shown
    assert "source      label (int64)" in shown
    assert "an encoded image file's bytes (uint8); decode with loaderx.tools.decode_images" in shown
    got = json.loads(ok(cli("info", "--json", tmp_path / "a" / "label")).stdout)[0]
    assert got["features"]["names"] == NAMES


def test_every_arrow_byte_type_converts_untouched(tmp_path):
    pa = pytest.importorskip("pyarrow")
    raw = [bytes([i % 256]) * (1 + i % 5) + b"\x00\xff" for i in range(30)]
    words = [f"w{i}-ß" for i in range(30)]
    table = pa.table({
        "binary": pa.array(raw, pa.binary()),
        "large_binary": pa.array(raw, pa.large_binary()),
        "fixed": pa.array([r[:1] * 3 for r in raw], pa.binary(3)),
        "string": pa.array(words, pa.string()),
        "large_string": pa.array(words, pa.large_string()),
        "view": pa.array(words, pa.string_view()),
    })
    # Slices and small batches: the records must honour each array's offset.
    got = tools.convert(table.slice(3, 25), tmp_path / "t", chunk_records=4)
    assert set(got) == set(table.column_names)
    for name in ("binary", "large_binary"):
        assert_bytes_store(tmp_path / "t" / name, raw[3:28])
    assert_bytes_store(tmp_path / "t" / "fixed", [r[:1] * 3 for r in raw[3:28]])
    for name in ("string", "large_string", "view"):
        assert_bytes_store(tmp_path / "t" / name, [w.encode() for w in words[3:28]])
        assert tools.info(tmp_path / "t" / name)["features"]["content"] == "text"
    assert tools.info(tmp_path / "t" / "binary")["features"]["content"] == "bytes"


def test_nulls_and_empty_rows_are_refused_by_row(tmp_path):
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(tools.UnsupportedColumnError, match="'s' has a null value in row 2"):
        tools.convert(pa.table({"s": pa.array(["a", "b", None, "d"])}), tmp_path / "n")
    with pytest.raises(tools.UnsupportedColumnError, match=r"column 's' row 3 is empty \(0 bytes\)"):
        tools.convert(pa.table({"s": pa.array(["a", "b", "c", "", "e"])}), tmp_path / "e", chunk_records=2)
    assert not (tmp_path / "n").exists() and not (tmp_path / "e").exists()


def test_image_given_by_path_is_read_from_its_file(tmp_path):
    datasets = pytest.importorskip("datasets")
    (tmp_path / "a.png").write_bytes(PNGS[0])
    ds = datasets.Dataset.from_dict({"image": [str(tmp_path / "a.png"), {"bytes": PNGS[1], "path": None}]},
                                    features=datasets.Features({"image": datasets.Image()}))
    tools.convert(ds, tmp_path / "o")
    assert_bytes_store(tmp_path / "o" / "image", PNGS[:2])
    (tmp_path / "a.png").unlink()
    with pytest.raises(tools.ConvertError, match="row 0 holds no bytes, only the path"):
        tools.convert(ds, tmp_path / "p")


def test_numpy_byte_and_text_arrays(tmp_path):
    s = np.array([b"ab", b"c\x00d", b"xyz"])  # NumPy drops only trailing NULs
    u = np.array(["é", "ab", "✓✓"])
    o = np.array([b"\x00\x01", "text", b"z"], dtype=object)
    tools.convert(s, tmp_path / "s")
    assert_bytes_store(tmp_path / "s", [b"ab", b"c\x00d", b"xyz"])
    tools.convert(u, tmp_path / "u", codec="zstd")
    assert_bytes_store(tmp_path / "u", [x.encode() for x in u.tolist()])
    tools.convert(o, tmp_path / "o")
    assert_bytes_store(tmp_path / "o", [b"\x00\x01", b"text", b"z"])
    assert tools.info(tmp_path / "u")["features"]["content"] == "text"
    assert tools.info(tmp_path / "o")["features"]["content"] == "bytes"
    np.save(tmp_path / "s.npy", s)
    np.savez(tmp_path / "a.npz", u=u, n=np.arange(3))
    ok(cli("convert", tmp_path / "s.npy", tmp_path / "fs", "--chunk-records", "2", "--quiet"))
    assert_bytes_store(tmp_path / "fs", [b"ab", b"c\x00d", b"xyz"])
    ok(cli("convert", tmp_path / "a.npz", tmp_path / "z", "--quiet"))
    assert_bytes_store(tmp_path / "z" / "u", [x.encode() for x in u.tolist()])
    assert tools.info(tmp_path / "z" / "u")["features"]["column"] == "u"
    np.testing.assert_array_equal(Dense.open(tmp_path / "z" / "n")[:], np.arange(3))
    # 2-D string arrays stay Dense, exactly as before
    tools.convert(np.array([[b"a", b"bb"], [b"c", b"d"]]), tmp_path / "d2")
    with Dense.open(tmp_path / "d2") as d:
        assert d.dtype == np.dtype("S2") and d[1].tolist() == [b"c", b"d"]
    with pytest.raises(tools.UnsupportedColumnError, match="row 1 is a int"):
        tools.convert(np.array([b"a", 3], dtype=object), tmp_path / "bad")
    with pytest.raises(tools.UnsupportedColumnError, match="row 1 is empty"):
        tools.convert(np.array(["a", ""]), tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


# ---------------------------------------------------------------------------
# decoding images
# ---------------------------------------------------------------------------


def test_decode_images_at_conversion(tmp_path):
    hf_dataset().save_to_disk(str(tmp_path / "hf"))
    ok(cli("convert", tmp_path / "hf", tmp_path / "d", "--decode-images", "--columns", "image,label",
           "--quiet"))
    with Ragged.open(tmp_path / "d" / "image") as s:
        got = s[:]
        f = s.features
    assert f["content"] == "decoded image" and f["image_mode"] == "RGB" and f["feature"]["_type"] == "Image"
    for g, p in zip(got, PIXELS, strict=True):
        assert g.dtype == np.uint8 and g.shape == p.shape
        np.testing.assert_array_equal(g, p)  # PNG is lossless
    tools.convert(tmp_path / "hf", tmp_path / "l", columns="image", decode_images=["image"], image_mode="L")
    with Ragged.open(tmp_path / "l" / "image") as s:
        for g, b in zip(s[:], PNGS, strict=True):
            np.testing.assert_array_equal(g, pil_decode(b, "L"))
            assert g.shape[2] == 1
    fails(cli("convert", tmp_path / "hf", tmp_path / "x", "--image-columns", "text"),
          "names column 'text', which holds text")
    ok(cli("convert", tmp_path / "hf", tmp_path / "c", "--image-columns", "image", "--image-mode", "L",
           "--columns", "image", "--quiet"))
    assert tools.info(tmp_path / "c" / "image")["features"]["image_mode"] == "L"
    fails(cli("convert", tmp_path / "hf", tmp_path / "x", "--decode-images", "--columns", "label"),
          "no Hugging Face Image() column")
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"img": pa.array([PNGS[0], b"not an image"])})
    with pytest.raises(tools.ConvertError, match="column 'img' row 1: not an image Pillow can decode"):
        tools.convert(table, tmp_path / "x", decode_images="img")
    with pytest.raises(tools.ConvertError, match="decode_images applies to columns"):
        tools.convert(np.array([PNGS[0]], dtype=object), tmp_path / "x", decode_images=True)
    assert not (tmp_path / "x").exists()


def test_loader_decodes_images_in_its_transform_workers(tmp_path):
    hf_dataset().save_to_disk(str(tmp_path / "hf"))
    stores = tools.convert(tmp_path / "hf", tmp_path / "s", columns="image,label")
    transform = tools.decode_images("image")
    # Picklable (a class, not a closure): process-based workers can take it.
    again = pickle.loads(pickle.dumps(transform))
    assert (again.names, again.mode) == (("image",), "RGB")
    streams = {"image": Ragged.open(stores["image"]), "label": Dense.open(stores["label"])}
    try:
        for workers in ("thread", "process"):
            with DataLoader(streams, batch_size=8, mode=0, transform=transform, transform_workers=2,
                            workers=workers) as dl:
                for step in range(2 * N // 8):  # two epochs, in order
                    batch = next(dl)
                    idx = [(step * 8 + k) % N for k in range(8)]
                    np.testing.assert_array_equal(batch["label"], LABELS[idx])
                    assert len(batch["image"]) == 8
                    for g, i in zip(batch["image"], idx, strict=True):
                        assert g.dtype == np.uint8 and g.flags.writeable
                        np.testing.assert_array_equal(g, pil_decode(PNGS[i]))
                        np.testing.assert_array_equal(g, PIXELS[i])
        # then= runs after decoding; a missing stream is named
        stack = tools.decode_images("image", then=lambda b: {**b, "n": len(b["image"])})
        with DataLoader(streams, batch_size=4, mode=0, transform=stack, transform_workers=1) as dl:
            assert next(dl)["n"] == 4
        with DataLoader(streams, batch_size=4, transform=tools.decode_images("pixels")) as dl, \
                pytest.raises(KeyError, match="no stream 'pixels'"):
            next(dl)
        with DataLoader(streams, batch_size=4, transform=tools.decode_images("label")) as dl, \
                pytest.raises(TypeError, match="must be a Ragged uint8 stream"):
            next(dl)
    finally:
        for s in streams.values():
            s.close()
    jpeg = encode(PIXELS[0], "JPEG", quality=90)
    np.testing.assert_array_equal(tools.decode_image(np.frombuffer(jpeg, np.uint8)), pil_decode(jpeg))
    with pytest.raises(ValueError, match="not an image Pillow can decode"):
        tools.decode_image(b"nope")


# ---------------------------------------------------------------------------
# --codec auto
# ---------------------------------------------------------------------------


def _raw_copy_bytes(path: Path, tmp: Path) -> int:
    tools.convert(path, tmp, codec="raw")
    return tools.info(tmp)["disk_bytes"]


def _auto_case(tmp_path: Path, name: str, data) -> dict:
    """Converts ``data`` with codec auto; checks it against a raw copy and
    returns its info."""
    got = tools.convert(data, tmp_path / name)
    path = got[name] if isinstance(got.get(name), Path) else tmp_path / name
    d = tools.info(path)
    raw = _raw_copy_bytes(path, tmp_path / f"{name}-raw")
    assert d["disk_bytes"] <= raw, (name, d["codec"], d["disk_bytes"], raw)
    choice = d["features"]["codec"]
    assert choice["requested"] == "auto" and choice["chosen"] == d["codec"]
    assert choice["estimates"]["raw"] == 1.0 and choice["ratio"] == choice["estimates"][d["codec"]]
    return d


WORDS = "the of and to in is was for on that with as by at from his her it an were are which this".split()


def test_codec_auto_choices(tmp_path):
    rng = np.random.default_rng(3)
    # tiny records: an int64 label is smaller than a zstd frame's own bytes
    labels = _auto_case(tmp_path, "labels", rng.integers(0, 10, size=20_000).astype(np.int64))
    assert labels["codec"] == "raw"
    assert labels["features"]["codec"]["estimates"]["zstd"] < 1.0
    assert "records average 8 B" in labels["features"]["codec"]["reason"]
    # incompressible: random bytes
    noise = _auto_case(tmp_path, "noise", rng.integers(0, 256, size=(3000, 512), dtype=np.uint8))
    assert noise["codec"] == "raw"
    # many short, similar texts: a dictionary measurably helps
    text = [" ".join(rng.choice(WORDS, size=int(k))) for k in rng.integers(20, 60, size=20_000)]
    texts = _auto_case(tmp_path, "texts", np.array(text))
    assert texts["codec"] == "zstd_dict" and texts["dict_bytes"] > 0
    est = texts["features"]["codec"]["estimates"]
    assert est["zstd_dict"] >= 1.1 * est["zstd"] and est["zstd"] >= 1.1
    # structured records, each repetitive within itself but unlike the others:
    # zstd alone compresses them, a dictionary has nothing to add
    blocks = np.repeat(rng.integers(0, 1 << 30, size=(400, 16), dtype=np.int32), 64, axis=1)
    rows = _auto_case(tmp_path, "rows", blocks)
    assert rows["codec"] == "zstd" and rows["features"]["codec"]["estimates"]["zstd"] > 10
    # a column smaller than the dictionary itself never tries one
    small = _auto_case(tmp_path, "small", np.array(text[:300]))
    assert small["codec"] == "zstd"
    assert "no dictionary tried" in small["features"]["codec"]["reason"]
    assert small["features"]["codec"]["estimates"]["zstd_dict"] is None


def test_codec_auto_on_every_source_and_in_info(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    n = 4000
    table = pa.table({
        "label": pa.array(rng.integers(0, 5, size=n)),
        "text": pa.array([" ".join(rng.choice(WORDS, size=30)) for _ in range(n)]),
    })
    pq.write_table(table, tmp_path / "t.parquet", row_group_size=700)
    ok(cli("convert", tmp_path / "t.parquet", tmp_path / "p", "--chunk-records", "500", "--quiet"))
    assert tools.info(tmp_path / "p" / "label")["codec"] == "raw"
    assert tools.info(tmp_path / "p" / "text")["codec"] in ("zstd", "zstd_dict")
    shown = ok(cli("info", tmp_path / "p" / "label")).stdout
    assert "codec       raw, chosen by convert --codec auto: compression would make the store bigger" in shown
    assert "measured    on 1,000 sampled records" in shown and "raw 1.00x, zstd 0.8" in shown
    # an explicit codec is kept, and recorded as given
    tools.convert(tmp_path / "t.parquet", tmp_path / "z", codec="zstd", columns="label")
    z = tools.info(tmp_path / "z" / "label")
    assert z["codec"] == "zstd" and z["features"]["codec"]["requested"] == "zstd"
    assert z["features"]["codec"]["ratio"] is None
    # a store re-encoded with auto keeps its sidecar's meaning (and measures anew)
    tools.convert(tmp_path / "z" / "label", tmp_path / "again")
    a = tools.info(tmp_path / "again")
    assert a["codec"] == "raw" and a["features"]["column"] == "label"
    assert a["features"]["codec"]["requested"] == "auto"
    # npz members and store sets choose per store
    np.savez(tmp_path / "a.npz", lab=rng.integers(0, 3, size=n), txt=np.array(table["text"].to_pylist()))
    got = tools.convert(tmp_path / "a.npz", tmp_path / "npz", shard_records=1500)
    assert tools.info(got["lab"])["codec"] == "raw" and tools.info(got["lab"])["shards"] == 3
    assert tools.info(got["txt"])["codec"] in ("zstd", "zstd_dict")
    assert (got["txt"] / "features.json").is_file() and (got["txt"] / "manifest.json").is_file()


def test_spread_sample_is_even_and_bounded():
    s = _codec.SpreadSample(max_records=10, max_bytes=1 << 20)
    for a in range(0, 1000, 37):  # blocks of uneven size
        s.push(np.arange(a, min(1000, a + 37)))
    kept = [int(x) for x in s.records]
    assert s.seen == 1000 and len(kept) <= 10 and kept[0] == 0
    assert np.all(np.diff(kept) == s.stride) and kept[-1] + s.stride >= 1000 - s.stride
    b = _codec.SpreadSample(max_records=1000, max_bytes=800)  # bytes bound: 100 int64 records
    b.push(np.zeros((1000, 1), np.int64))
    assert len(b.records) <= 100 and b.stride == 16


def test_auto_rewrites_raw_a_store_that_came_out_bigger(tmp_path, monkeypatch):
    # A sample can mislead (here: a forced choice); the written store is
    # checked against raw's size anyway, and rewritten raw if it lost.
    noise = np.random.default_rng(1).integers(0, 256, size=(500, 64), dtype=np.uint8)
    real = _codec.choose

    def fooled(*args, **kw):
        c, _ = real(*args, **kw)
        return _codec.Choice({**c, "chosen": "zstd", "reason": "forced by the test"}, None)

    monkeypatch.setattr(_codec, "choose", fooled)
    tools.convert(noise, tmp_path / "n", shard_records=200)
    d = tools.info(tmp_path / "n")
    assert d["codec"] == "raw" and d["shards"] == 3
    np.testing.assert_array_equal(Dense.open(tmp_path / "n")[:], noise)
    reason = d["features"]["codec"]["reason"]
    assert reason.startswith("forced by the test; but the zstd store") and "rewritten raw" in reason
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n"]  # no scratch left behind


def test_sidecar_damage_is_reported_not_fatal(tmp_path):
    tools.convert(np.arange(10), tmp_path / "s")
    (tmp_path / "s" / "features.json").write_text("{not json")
    with Dense.open(tmp_path / "s") as s, pytest.raises(_sidecar.SidecarError, match="not JSON"):
        s.features
    assert "not JSON" in tools.info(tmp_path / "s")["features"]["error"]
    assert "features    unreadable" in ok(cli("info", tmp_path / "s")).stdout
    (tmp_path / "s" / "features.json").write_text(json.dumps({"format": "loaderx.features", "version": 2}))
    with pytest.raises(_sidecar.SidecarError, match="version 2"):
        tools.class_names(tmp_path / "s")
