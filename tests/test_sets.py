"""Store sets on local disk, through the Python API: a folder of shards
opened as one store by the same ``Dense.open`` / ``Ragged.open``."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest

from conftest import loaderx_child_env
from loaderx import tools
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged, ZrecordError
from loaderx.zsampler import Sampler


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, 3, 4, 4), dtype=np.uint8)


def token_records(n: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, size=int(rng.integers(1, 40)), dtype=np.int32) for _ in range(n)]


def build_dense(path, data: np.ndarray, chunk: int = 7, **kwargs) -> None:
    with Dense.create(path, data.dtype, data.shape[1:], **kwargs) as w:
        for start in range(0, len(data), chunk):
            w.append(data[start:start + chunk])


@pytest.mark.parametrize("codec", ["raw", "zstd"])
def test_a_set_reads_like_one_store(tmp_path, codec):
    data = images(103)
    path = tmp_path / "set"
    build_dense(path, data, codec=codec, shard_records=25)
    manifest = json.loads((path / "manifest.json").read_text())
    assert [s["records"] for s in manifest["shards"]] == [25, 25, 25, 25, 3]
    assert (manifest["kind"], manifest["dtype"], manifest["item_shape"], manifest["codec"]) == (
        "dense", "|u1", [3, 4, 4], codec)
    with Dense.open(path) as ds:
        assert len(ds) == 103
        assert ds.item_shape == (3, 4, 4) and ds.codec == codec
        assert [s["path"] for s in ds.shards] == [f"shard-{k:06d}" for k in range(5)]
        idx = np.array([102, 0, 24, 25, 26, 99, 50, 50])
        np.testing.assert_array_equal(ds[idx], data[idx])
        np.testing.assert_array_equal(ds[24:27], data[24:27])
        np.testing.assert_array_equal(ds[102], data[102])
        np.testing.assert_array_equal(np.stack(list(ds)), data)
        with pytest.raises(IndexError, match="record index out of range for container of length 103: index 103"):
            ds[[1, 103]]
    # Each shard is an ordinary store.
    with Dense.open(path / "shard-000004") as shard:
        np.testing.assert_array_equal(shard[:], data[100:])


def test_shard_bytes_bounds_each_shard(tmp_path):
    data = images(40)  # 48-byte records
    path = tmp_path / "set"
    build_dense(path, data, chunk=40, codec="raw", shard_bytes=480)
    with Dense.open(path) as ds:
        assert [s["records"] for s in ds.shards] == [10, 10, 10, 10]
        assert all(s["data_bytes"] == 480 for s in ds.shards)
        np.testing.assert_array_equal(ds[:], data)


def test_ragged_sets_gather_and_pack_across_shards(tmp_path):
    recs = token_records(50)
    path = tmp_path / "tokens"
    with Ragged.create(path, np.int32, shard_records=16) as w:
        w.append(recs[:30])
        w.append(recs[30:])
    with Ragged.open(path) as rs:
        assert len(rs) == 50 and len(rs.shards) == 4
        for got, i in zip(rs[[49, 0, 16, 15]], [49, 0, 16, 15]):
            np.testing.assert_array_equal(got, recs[i])
        values, cu, shapes = rs.gather_packed([15, 16, 47])
        np.testing.assert_array_equal(values, np.concatenate([recs[15], recs[16], recs[47]]))
        assert cu.tolist() == [0, len(recs[15]), len(recs[15]) + len(recs[16]),
                               len(recs[15]) + len(recs[16]) + len(recs[47])]
        assert shapes[:, 0].tolist() == [len(recs[15]), len(recs[16]), len(recs[47])]


def test_a_loader_over_a_set_matches_the_same_data_in_one_store(tmp_path):
    data = images(97)
    labels = np.arange(97, dtype=np.int64)
    build_dense(tmp_path / "one", data)
    build_dense(tmp_path / "set", data, shard_records=10)
    build_dense(tmp_path / "labels", labels, shard_records=33)

    def batches(data_path, shard_index=0, shard_count=1, start_step=0, steps=6):
        streams = {"x": Dense.open(data_path), "y": Dense.open(tmp_path / "labels")}
        loader = DataLoader(streams, batch_size=16, mode=Sampler.Mode.IID, seed=7, start_step=start_step,
                            shard_index=shard_index, shard_count=shard_count)
        out = []
        for i, b in enumerate(loader):
            out.append((b["x"].copy(), b["y"].copy()))
            if i + 1 == steps:
                break
        loader.close()
        return out

    one, sharded = batches(tmp_path / "one"), batches(tmp_path / "set")
    for (xa, ya), (xb, yb) in zip(one, sharded, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(xb, data[yb])
    # Resume at step 3 gives steps 3.. again; two ranks split each batch.
    resumed = batches(tmp_path / "set", start_step=3, steps=3)
    for (xa, _), (xb, _) in zip(one[3:], resumed, strict=True):
        np.testing.assert_array_equal(xa, xb)
    halves = [batches(tmp_path / "set", shard_index=r, shard_count=2) for r in range(2)]
    for step, (x, y) in enumerate(one):
        np.testing.assert_array_equal(np.concatenate([halves[0][step][1], halves[1][step][1]]), y)


def test_set_readers_pickle(tmp_path):
    data = images(30)
    build_dense(tmp_path / "s", data, shard_records=8)
    with Dense.open(tmp_path / "s") as ds:
        clone = pickle.loads(pickle.dumps(ds))
        np.testing.assert_array_equal(clone[[29, 3]], data[[29, 3]])
        clone.close()


def test_writer_reports_progress_and_drops_an_empty_last_shard(tmp_path):
    data = images(20)
    w = Dense.create(tmp_path / "s", np.uint8, (3, 4, 4), shard_records=10)
    w.append(data)
    assert len(w) == 20
    assert [s["records"] for s in w.shards] == [10]  # the second is still open
    w.close()
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [
        "manifest.json", "shard-000000", "shard-000001"]


def test_an_unclosed_set_is_refused(tmp_path):
    w = Dense.create(tmp_path / "s", np.uint8, (3, 4, 4), shard_records=10)
    w.append(images(25))
    with pytest.warns(ResourceWarning):
        del w
    with pytest.raises(ZrecordError, match="holds stores but no manifest.json") as info:
        Dense.open(tmp_path / "s")
    assert info.value.code == -8


def test_inconsistent_manifests_are_refused(tmp_path):
    build_dense(tmp_path / "s", images(30), shard_records=10)
    path = tmp_path / "s" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["shards"][2]["records"] = 11
    manifest["records"] = 31
    path.write_text(json.dumps(manifest))
    with pytest.raises(ZrecordError, match="it holds 10 records, the manifest says 11"):
        Dense.open(tmp_path / "s")
    with pytest.raises(ValueError, match="is a dense store set"):
        Ragged.open(tmp_path / "s")


@pytest.mark.parametrize("kwargs, error, match", [
    ({"shard_records": 0}, ValueError, "shard_records must be positive"),
    ({"shard_bytes": -5}, ValueError, "shard_bytes must be positive"),
    ({"shard_records": 2.5}, TypeError, "shard_records must be a positive int"),
    ({"shard_records": True}, TypeError, "shard_records must be a positive int"),
    ({"storage_options": ["a"]}, TypeError, "storage_options must be a dict"),
])
def test_bad_set_arguments(tmp_path, kwargs, error, match):
    with pytest.raises(error, match=match):
        Dense.create(tmp_path / "s", np.uint8, (2,), **kwargs)
    assert not (tmp_path / "s").exists()


# -- tools -------------------------------------------------------------------


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loaderx", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=loaderx_child_env())


def test_info_verify_and_convert_understand_sets(tmp_path):
    data = images(50)
    np.save(tmp_path / "x.npy", data)
    out = _cli("convert", tmp_path / "x.npy", tmp_path / "set", "--shard-records", "20", "-q")
    assert out.returncode == 0, out.stderr
    with Dense.open(tmp_path / "set") as ds:
        assert [s["records"] for s in ds.shards] == [20, 20, 10]
        np.testing.assert_array_equal(ds[:], data)

    d = tools.info(tmp_path / "set")
    shard_files = [f for f in (tmp_path / "set").glob("shard-*/*.zr")]
    assert (d["kind"], d["shards"], d["records"]) == ("Dense", 3, 50)
    assert d["disk_bytes"] == sum(f.stat().st_size for f in shard_files)
    text = _cli("info", tmp_path / "set").stdout
    assert "layout      store set of 3 shards" in text, text

    assert tools.verify(tmp_path / "set").ok
    # A set converts back into one store (and a store into a set, above).
    assert tools.convert(tmp_path / "set", tmp_path / "one", codec="raw") == {"set": tmp_path / "one"}
    with Dense.open(tmp_path / "one") as one:
        assert one.shards == [] and one.codec == "raw"
        np.testing.assert_array_equal(one[:], data)

    # verify reports a damaged shard's record by its index in the set.
    data_file = tmp_path / "set" / "shard-000002" / "data.zr"
    raw = bytearray(data_file.read_bytes())
    raw[len(raw) // 2: len(raw) // 2 + 16] = b"\xff" * 16
    data_file.write_bytes(bytes(raw))
    result = tools.verify(tmp_path / "set")
    assert not result.ok and result.first_bad_index is not None and result.first_bad_index >= 40
    bad = _cli("verify", tmp_path / "set")
    assert bad.returncode == 1 and "FAILED" in bad.stdout


def test_an_unclosed_set_is_explained_by_info(tmp_path):
    w = Dense.create(tmp_path / "s", np.uint8, (2,), shard_records=2)
    w.append(np.zeros((5, 2), np.uint8))
    with pytest.warns(ResourceWarning):
        del w
    with pytest.raises(tools.NotAStoreError, match="store set whose writer never closed"):
        tools.info(tmp_path / "s")


# -- distributed builds ------------------------------------------------------


def test_shards_written_by_independent_tasks_commit_into_a_set(tmp_path):
    from loaderx import sets

    data = images(30)
    root = tmp_path / "built"
    # Tasks finish in any order; the commit's order is the set's row order.
    second = sets.write_shard(str(root), "part-1-b7", [data[12:20], data[20:]], dtype=np.uint8,
                              item_shape=(3, 4, 4))
    first = sets.write_shard(str(root), "part-0-a3", [data[:12]], dtype=np.uint8,
                             item_shape=(3, 4, 4))
    assert first == {"path": "part-0-a3", "records": 12, "data_bytes": first["data_bytes"]}
    # A failed attempt leaves an unlisted, uncommitted folder.
    def failing():
        yield data[:5]
        raise RuntimeError("task lost")
    with pytest.raises(RuntimeError, match="task lost"):
        sets.write_shard(str(root), "part-1-dead", failing(), dtype=np.uint8, item_shape=(3, 4, 4))
    manifest = sets.commit(str(root), [first, second], dtype=np.uint8, item_shape=(3, 4, 4))
    assert manifest["records"] == 30 and [s["path"] for s in manifest["shards"]] == [
        "part-0-a3", "part-1-b7"]
    with Dense.open(root) as ds:
        np.testing.assert_array_equal(ds[:], data)

    recs = token_records(9)
    r = sets.write_shard(str(tmp_path / "tok"), "p0", [recs[:4], recs[4:]], dtype=np.int32)
    sets.commit(str(tmp_path / "tok"), [r], dtype=np.int32)
    with Ragged.open(tmp_path / "tok") as rs:
        np.testing.assert_array_equal(rs[8], recs[8])


def test_a_commit_that_would_not_open_publishes_nothing(tmp_path):
    from loaderx import sets

    root = tmp_path / "s"
    ok = sets.write_shard(str(root), "p0", [images(4)], dtype=np.uint8, item_shape=(3, 4, 4))
    with pytest.raises(ZrecordError, match="it holds 4 records, the manifest says 5"):
        sets.commit(str(root), [{**ok, "records": 5}], dtype=np.uint8, item_shape=(3, 4, 4))
    with pytest.raises(ZrecordError, match="is missing"):
        sets.commit(str(root), [ok, {**ok, "path": "p9"}], dtype=np.uint8, item_shape=(3, 4, 4))
    assert not (root / "manifest.json").exists()
    with pytest.raises(ValueError, match="must be a relative path"):
        sets.write_shard(str(root), "../escape", [images(1)], dtype=np.uint8, item_shape=(3, 4, 4))
    with pytest.raises(ValueError, match="at least one shard"):
        sets.commit(str(root), [], dtype=np.uint8, item_shape=(3, 4, 4))
