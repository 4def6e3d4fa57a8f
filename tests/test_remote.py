"""Stores and store sets in object storage, against a real S3 server
(SeaweedFS on 127.0.0.1, started by the ``s3_server`` fixture)."""
from __future__ import annotations

import itertools
import multiprocessing
import pickle
import time

import numpy as np
import pytest

from _ranks import run_ranks
from loaderx import _native, tools
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged, ZrecordError
from loaderx.zsampler import Sampler


def options(server, **extra) -> dict:
    """storage_options pointing at the test server (object_store's key names)."""
    return {
        "aws_endpoint": server.endpoint,
        "aws_access_key_id": server.access_key,
        "aws_secret_access_key": server.secret_key,
        "aws_region": server.region,
        "aws_allow_http": "true",
        **extra,
    }


def images(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, size=(n, 3, 8, 8), dtype=np.uint8)


def token_records(n: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, size=int(rng.integers(1, 60)), dtype=np.int32) for _ in range(n)]


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_dense_round_trip(s3_server, s3_bucket, codec):
    from loaderx.utils import train_dict

    data = images(300)
    blob = train_dict(data, "fast") if codec == "zstd_dict" else None
    url = f"s3://{s3_bucket}/train/images"
    opts = options(s3_server)
    with Dense.create(url, data.dtype, data.shape[1:], codec=codec, dict_bytes=blob,
                      storage_options=opts) as w:
        w.append(data[:200])
        w.append(data[200:])
    keys = sorted(s3_server.list_objects(s3_bucket, "train/"))
    extra = {"raw": ["sums.zr"], "zstd": [], "zstd_dict": ["dict.zr"]}[codec]
    assert keys == sorted(f"train/images/{f}" for f in ["meta.zr", "data.zr", *extra])
    with Dense.open(url, storage_options=opts, verify_checksums=True) as ds:
        assert (len(ds), ds.codec, ds.item_shape, ds.path) == (300, codec, (3, 8, 8), url)
        assert ds.checksums == ("sidecar" if codec == "raw" else "frames")
        assert ds.data_access == "remote"
        idx = np.random.default_rng(3).integers(0, 300, size=256)
        np.testing.assert_array_equal(ds[idx], data[idx])
        np.testing.assert_array_equal(ds[299], data[299])
        np.testing.assert_array_equal(ds[:], data)
        if blob:
            assert ds.dict_bytes() == blob


def test_ragged_round_trip_and_packed(s3_server, s3_bucket):
    recs = token_records(120)
    url = f"s3://{s3_bucket}/tokens"
    opts = options(s3_server)
    with Ragged.create(url, np.int32, storage_options=opts) as w:
        w.append(recs)
    with Ragged.open(url, storage_options=opts) as rs:
        for got, want in zip(rs[[119, 0, 57, 57]], [recs[119], recs[0], recs[57], recs[57]],
                             strict=True):
            np.testing.assert_array_equal(got, want)
        values, cu, _ = rs.gather_packed([3, 4])
        np.testing.assert_array_equal(values, np.concatenate([recs[3], recs[4]]))
        assert cu.tolist() == [0, len(recs[3]), len(recs[3]) + len(recs[4])]


def test_the_standard_environment_configures_access(s3_server, s3_bucket, monkeypatch):
    for key, value in s3_server.env().items():
        monkeypatch.setenv(key, value)
    data = images(10)
    url = f"s3://{s3_bucket}/from-env"
    with Dense.create(url, data.dtype, data.shape[1:]) as w:
        w.append(data)
    with Dense.open(url) as ds:
        np.testing.assert_array_equal(ds[:], data)
    # storage_options win over the environment.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with Dense.open(url, storage_options={"aws_secret_access_key": s3_server.secret_key}) as ds:
        assert len(ds) == 10


def test_a_set_in_object_storage_feeds_a_sharded_loader(s3_server, s3_bucket, tmp_path):
    data = images(250)
    labels = np.arange(250, dtype=np.int64)
    opts = options(s3_server)
    base = f"s3://{s3_bucket}/ds"
    with Dense.create(f"{base}/x", data.dtype, data.shape[1:], shard_records=64,
                      storage_options=opts) as w:
        for start in range(0, 250, 100):
            w.append(data[start:start + 100])
    with Dense.create(f"{base}/y", labels.dtype, (), shard_bytes=800, storage_options=opts) as w:
        w.append(labels)
    keys = s3_server.list_objects(s3_bucket, "ds/x/")
    assert "ds/x/manifest.json" in keys and "ds/x/shard-000003/meta.zr" in keys
    assert len([k for k in keys if k.endswith("meta.zr")]) == 4

    def run(shard_index=0, shard_count=1, start_step=0, steps=5):
        streams = {"x": Dense.open(f"{base}/x", storage_options=opts),
                   "y": Dense.open(f"{base}/y", storage_options=opts)}
        assert [s["records"] for s in streams["y"].shards] == [100, 100, 50]
        loader = DataLoader(streams, batch_size=32, mode=Sampler.Mode.CYCLIC, seed=5,
                            start_step=start_step, shard_index=shard_index,
                            shard_count=shard_count)
        out = []
        for i, b in enumerate(loader):
            np.testing.assert_array_equal(b["x"], data[b["y"]])
            out.append(b["y"].copy())
            if i + 1 == steps:
                break
        loader.close()
        return out

    whole = run()
    for a, b in zip(whole[2:], run(start_step=2, steps=3), strict=True):
        np.testing.assert_array_equal(a, b)
    halves = [run(r, 2) for r in range(2)]
    for step, y in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([halves[0][step], halves[1][step]]), y)
    # info and verify read the set where it lies.
    d = tools.info(f"{base}/x", storage_options=opts)
    assert (d["kind"], d["shards"], d["records"]) == ("Dense", 4, 250)
    assert tools.verify(f"{base}/x", storage_options=opts).ok


def _expected_requests(idx, record: int, coalesce: int, cap: int = 16 << 20) -> int:
    """The documented merge rule, for raw records of ``record`` bytes laid
    back to back: a gap is bridged when it is at most ``coalesce`` bytes and
    the request then reads no more unneeded bytes than needed ones."""
    requests, span = 0, None
    for i in sorted(idx):
        start, end = i * record, (i + 1) * record
        if span is not None:
            first, last, useful, wasted = span
            gap = max(0, start - last)
            if (gap <= coalesce and wasted + gap <= useful + record
                    and max(last, end) - first <= cap):
                span = (first, max(last, end), useful + record, wasted + gap)
                continue
        requests += 1
        span = (start, end, record, 0)
    return requests


def test_gathers_merge_neighbouring_ranges(s3_server, s3_bucket):
    """Requests per gather follow the merge rule: one for a run of adjacent
    records, one per cluster of near ones, never bytes for far-apart ones."""
    data = np.random.default_rng(0).integers(0, 255, size=(2048, 2048), dtype=np.uint8)
    url = f"s3://{s3_bucket}/records"
    opts = options(s3_server)
    with Dense.create(url, data.dtype, data.shape[1:], codec="raw", storage_options=opts) as w:
        w.append(data)
    rng = np.random.default_rng(1)
    random_idx = rng.choice(2048, size=256, replace=False)
    clustered = np.concatenate([np.arange(k, k + 8) for k in range(0, 2048, 64)])[::2]
    cases = [
        ({}, np.arange(100, 356), 1),  # one contiguous run
        ({}, random_idx, _expected_requests(random_idx, 2048, 1 << 20)),
        ({}, clustered, 32),  # every other record of 32 clusters: each one request
        ({"coalesce_bytes": 0}, clustered, 128),
        ({"max_request_bytes": 4096}, np.arange(0, 8), 4),
    ]
    for extra, idx, expected in cases:
        # The table (32 KiB) comes with the header page at open.
        with Dense.open(url, storage_options=options(s3_server, **extra)) as ds:
            before = _native.remote_stats()
            np.testing.assert_array_equal(ds[idx], data[idx])
            requests = _native.remote_stats()[0] - before[0]
            fetched = _native.remote_stats()[1] - before[1]
        assert requests == expected, (extra, requests, expected)
        assert fetched <= 2 * 2048 * len(set(idx.tolist())), "merging at most doubles the bytes"
    assert _expected_requests(random_idx, 2048, 1 << 20) > 150  # far apart: mostly alone


def test_missing_stores_and_buckets(s3_server, s3_bucket):
    opts = options(s3_server)
    with pytest.raises(FileNotFoundError, match=f"no store at s3://{s3_bucket}/nothing: no meta.zr"):
        Dense.open(f"s3://{s3_bucket}/nothing", storage_options=opts)
    t0 = time.monotonic()
    with pytest.raises((FileNotFoundError, ZrecordError), match="s3://no-such-bucket-loaderx/x"):
        Dense.open("s3://no-such-bucket-loaderx/x", storage_options=opts)
    assert time.monotonic() - t0 < 5, "a missing bucket is not retried"
    # Only data.zr, as a killed upload leaves it: not a store.
    s3_server.put_object(s3_bucket, "half/data.zr", b"\0" * 64)
    with pytest.raises(FileNotFoundError, match="no meta.zr there"):
        Dense.open(f"s3://{s3_bucket}/half", storage_options=opts)


def test_bad_credentials_fail_at_once_and_stay_secret(s3_server, s3_bucket):
    data = images(4)
    url = f"s3://{s3_bucket}/secret"
    with Dense.create(url, data.dtype, data.shape[1:], storage_options=options(s3_server)) as w:
        w.append(data)
    bad = options(s3_server, aws_secret_access_key="not-the-secret-xyz")
    t0 = time.monotonic()
    with pytest.raises(ZrecordError, match="access denied") as info:
        Dense.open(url, storage_options=bad)
    assert time.monotonic() - t0 < 5
    assert info.value.code == -2
    assert url in str(info.value)
    for secret in ("not-the-secret-xyz", s3_server.secret_key):
        assert secret not in str(info.value)
    with Dense.open(url, storage_options=options(s3_server)) as ds:
        assert s3_server.secret_key not in repr(ds)


def test_create_refuses_a_used_prefix(s3_server, s3_bucket):
    opts = options(s3_server)
    url = f"s3://{s3_bucket}/once"
    with Dense.create(url, np.uint8, (2,), storage_options=opts) as w:
        w.append(np.zeros((1, 2), np.uint8))
    with pytest.raises(ZrecordError, match="is not empty") as info:
        Dense.create(url, np.uint8, (2,), storage_options=opts)
    assert info.value.code == -12


def test_an_unfinished_upload_never_opens(s3_server, s3_bucket):
    """A set whose writer never closed has shards but no manifest; a plain
    store whose writer never closed has nothing in the bucket at all."""
    opts = options(s3_server)
    w = Dense.create(f"s3://{s3_bucket}/set", np.uint8, (2,), shard_records=10, storage_options=opts)
    w.append(np.zeros((25, 2), np.uint8))
    assert len(w.shards) == 2  # uploaded at roll-over
    with pytest.warns(ResourceWarning):
        del w
    assert "set/shard-000001/meta.zr" in s3_server.list_objects(s3_bucket, "set/")
    with pytest.raises(FileNotFoundError, match="no meta.zr there"):
        Dense.open(f"s3://{s3_bucket}/set", storage_options=opts)
    w = Dense.create(f"s3://{s3_bucket}/plain", np.uint8, (2,), storage_options=opts)
    w.append(np.zeros((25, 2), np.uint8))
    with pytest.warns(ResourceWarning):
        del w
    assert s3_server.list_objects(s3_bucket, "plain/") == []


def test_short_or_changed_objects_are_errors_not_data(s3_server, s3_bucket):
    data = images(50)
    opts = options(s3_server)
    url = f"s3://{s3_bucket}/s"
    with Dense.create(url, data.dtype, data.shape[1:], codec="raw", storage_options=opts) as w:
        w.append(data)
    original = s3_server.get_object(s3_bucket, "s/data.zr")
    ds = Dense.open(url, storage_options=opts)
    # Replaced under an open reader by an object of the same size.
    s3_server.put_object(s3_bucket, "s/data.zr", bytes(len(original)))
    with pytest.raises(ZrecordError, match="changed after the store was opened"):
        ds[[1, 2]]
    ds.close()
    # Shorter than the header says: refused at open.
    s3_server.put_object(s3_bucket, "s/data.zr", original[:1000])
    with pytest.raises(ZrecordError, match="shorter than its committed end") as info:
        Dense.open(url, storage_options=opts)
    assert info.value.code == -8


def test_a_server_outage_fails_the_loader_then_resume_is_exact(s3_server, s3_bucket):
    data = images(400)
    url = f"s3://{s3_bucket}/outage"
    with Dense.create(url, data.dtype, data.shape[1:], shard_records=100,
                      storage_options=options(s3_server)) as w:
        w.append(data)
    # Few, quick retries keep the test short; the defaults are larger.
    opts = options(s3_server, max_retries=1, retry_timeout=2, connect_timeout="1s")

    def loader(start_step=0):
        return DataLoader({"x": Dense.open(url, storage_options=opts)}, batch_size=16,
                          mode=Sampler.Mode.IID, seed=3, start_step=start_step, prefetch_size=2)

    reference = []
    ref = loader()
    for i, b in enumerate(ref):
        reference.append(b["x"].copy())
        if i == 11:
            break
    ref.close()

    live = loader()
    it = iter(live)
    delivered = [next(it)["x"].copy() for _ in range(2)]
    s3_server.stop_process()
    try:
        t0 = time.monotonic()
        with pytest.raises(ZrecordError, match=f"s3://{s3_bucket}/outage"):
            for _ in range(10):  # batches already gathered may still arrive
                delivered.append(next(it)["x"].copy())
        assert time.monotonic() - t0 < 30, "bounded retries, no hang"
        step = len(delivered)
        live.close()
    finally:
        s3_server.start_process()
    resumed = loader(start_step=step)
    for i, b in enumerate(resumed):
        np.testing.assert_array_equal(b["x"], reference[step + i])
        if step + i == 11:
            break
    resumed.close()
    for i, x in enumerate(delivered):
        np.testing.assert_array_equal(x, reference[i])


def test_readers_pickle_with_their_options(s3_server, s3_bucket):
    data = images(20)
    opts = options(s3_server)
    url = f"s3://{s3_bucket}/p"
    with Dense.create(url, data.dtype, data.shape[1:], storage_options=opts) as w:
        w.append(data)
    with Dense.open(url, storage_options=opts) as ds:
        clone = pickle.loads(pickle.dumps(ds))
        np.testing.assert_array_equal(clone[[19, 0]], data[[19, 0]])
        clone.close()


def test_http_urls_read_stores(s3_server, s3_bucket):
    data = images(60)
    with Dense.create(f"s3://{s3_bucket}/web", data.dtype, data.shape[1:], shard_records=25,
                      storage_options=options(s3_server)) as w:
        w.append(data)
    url = f"{s3_server.http_base(s3_bucket)}/web"
    with Dense.open(url) as ds:
        assert len(ds) == 60 and len(ds.shards) == 3
        np.testing.assert_array_equal(ds[[59, 0, 30]], data[[59, 0, 30]])
    with pytest.raises(FileNotFoundError):
        Dense.open(f"{s3_server.http_base(s3_bucket)}/absent")


def _rank(url, opts, shard_index, shard_count, start_step, steps):
    """A rank's record ids per step, and the bytes its gathers fetched (the
    store is opened first, so its metadata is excluded)."""
    ds = Dense.open(url, storage_options=opts)
    opened = _native.remote_stats()[1]
    loader = DataLoader({"x": ds}, batch_size=12, mode=Sampler.Mode.CYCLIC, seed=11,
                        start_step=start_step, shard_index=shard_index,
                        shard_count=shard_count, prefetch_size=1, transform=None)
    ids = [b["x"][:, 0].astype(np.int64).tolist() for b in itertools.islice(loader, steps)]
    loader.close()
    return ids, _native.remote_stats()[1] - opened


def _ranks(url, opts, count, start_step, steps):
    return run_ranks(_rank, [(url, opts, r, count, start_step, steps) for r in range(count)])


def test_ranks_read_disjoint_slices_of_a_remote_set_and_resume_on_another_count(
        s3_server, s3_bucket):
    width = 512  # int64 records of 4 KiB, record i filled with i
    n = 240
    data = np.repeat(np.arange(n, dtype=np.int64)[:, None], width, axis=1)
    url = f"s3://{s3_bucket}/ranks"
    # coalesce_bytes 0: a rank fetches exactly its own records' bytes.
    opts = options(s3_server, coalesce_bytes=0)
    with Dense.create(url, data.dtype, (width,), codec="raw", shard_records=50,
                      storage_options=opts) as w:
        w.append(data)
    single = DataLoader({"x": Dense.open(url, storage_options=opts)}, batch_size=12,
                        mode=Sampler.Mode.CYCLIC, seed=11, transform=None)
    glob = [b["x"][:, 0].tolist() for b in itertools.islice(single, 6)]
    single.close()

    three = _ranks(url, opts, 3, 0, 3)
    for step in range(3):
        parts = [three[r][0][step] for r in range(3)]
        assert sum(parts, []) == glob[step]  # disjoint, complete, in order
    record = width * 8
    for ids, fetched in three.values():
        # Its 4 records a step, for the 3 steps taken plus at most 2 gathered ahead.
        assert fetched % record == 0 and 3 * 4 * record <= fetched <= 5 * 4 * record, fetched
    # Resumed at step 3 on two processes: the same global batches.
    two = _ranks(url, opts, 2, 3, 3)
    for step in range(3):
        assert two[0][0][step] + two[1][0][step] == glob[3 + step]


def _cache_bytes(root) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and f.name != "key")


def test_a_local_cache_serves_repeat_reads_and_follows_object_changes(s3_server, s3_bucket, tmp_path):
    data = images(400)  # 192 B records: 75 KiB of payload
    url = f"s3://{s3_bucket}/cached"
    cache = tmp_path / "cache"
    opts = options(s3_server, cache_dir=str(cache), cache_block_bytes=16384)
    with Dense.create(url, data.dtype, data.shape[1:], codec="raw", storage_options=opts) as w:
        w.append(data)
    idx = np.random.default_rng(2).choice(400, size=64, replace=False)

    def gather_requests():
        with Dense.open(url, storage_options=opts) as ds:
            before = _native.remote_stats()[0]
            np.testing.assert_array_equal(ds[idx], data[idx])
            return _native.remote_stats()[0] - before

    assert gather_requests() >= 1
    assert gather_requests() == 0  # every block is on local disk now
    # A new version of the object (another ETag) is never served from the old blocks.
    replacement = images(400, seed=9)
    s3_server.put_object(s3_bucket, "cached/data.zr", replacement.tobytes())
    with Dense.open(url, storage_options=opts) as ds:
        np.testing.assert_array_equal(ds[idx], replacement[idx])


def test_the_cache_stays_within_its_limit(s3_server, s3_bucket, tmp_path):
    data = np.random.default_rng(0).integers(0, 255, size=(256, 4096), dtype=np.uint8)  # 1 MiB
    url = f"s3://{s3_bucket}/bounded"
    cache = tmp_path / "cache"
    limit = 256 << 10
    opts = options(s3_server, cache_dir=str(cache), cache_limit=limit, cache_block_bytes=16384)
    with Dense.create(url, data.dtype, (4096,), codec="raw", storage_options=opts) as w:
        w.append(data)
    with Dense.open(url, storage_options=opts) as ds:
        for start in range(0, 256, 16):  # reads the whole 1 MiB, 64 KiB at a time
            np.testing.assert_array_equal(ds[start:start + 16], data[start:start + 16])
            # Eviction runs once a sixteenth of the limit was added since the last scan.
            assert _cache_bytes(cache) <= limit + limit // 16 + 16384


def _gather_in_child(ds, idx, out):
    out.put(ds[idx].tolist())


def test_a_forked_child_reads_with_its_own_client(s3_server, s3_bucket):
    """After fork the parent's I/O threads and pooled connections are gone;
    the child makes its own instead of waiting on them forever."""
    data = images(40)
    url = f"s3://{s3_bucket}/fork"
    opts = options(s3_server)
    with Dense.create(url, data.dtype, data.shape[1:], storage_options=opts) as w:
        w.append(data)
    with Dense.open(url, storage_options=opts) as ds:
        ds[[0, 1]]  # the parent's runtime and client exist now
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        child = ctx.Process(target=_gather_in_child, args=(ds, [39, 5], out))
        child.start()
        try:
            got = out.get(timeout=60)
        finally:
            child.join(30)
            if child.is_alive():
                child.kill()
        np.testing.assert_array_equal(np.array(got, dtype=np.uint8), data[[39, 5]])
        assert child.exitcode == 0


def test_convert_and_upload_publish_to_object_storage(s3_server, s3_bucket, tmp_path):
    data = images(90)
    np.save(tmp_path / "x.npy", data)
    opts = options(s3_server)
    url = f"s3://{s3_bucket}/converted"
    out = tools.convert(tmp_path / "x.npy", url, shard_records=40, storage_options=opts)
    assert out == {"x": url}
    with Dense.open(url, storage_options=opts) as ds:
        assert [s["records"] for s in ds.shards] == [40, 40, 10]
        np.testing.assert_array_equal(ds[:], data)
    # A local store set uploaded as it is.
    with Dense.create(tmp_path / "set", data.dtype, data.shape[1:], shard_records=50) as w:
        w.append(data)
    tools.upload(tmp_path / "set", f"s3://{s3_bucket}/uploaded", opts)
    keys = s3_server.list_objects(s3_bucket, "uploaded/")
    assert "uploaded/manifest.json" in keys
    assert sorted(k for k in keys if k.endswith("meta.zr")) == [
        "uploaded/shard-000000/meta.zr", "uploaded/shard-000001/meta.zr"]
    with Dense.open(f"s3://{s3_bucket}/uploaded", storage_options=opts) as ds:
        np.testing.assert_array_equal(ds[[89, 0]], data[[89, 0]])
    with pytest.raises(ZrecordError, match="is not empty"):
        tools.upload(tmp_path / "set", f"s3://{s3_bucket}/uploaded", opts)


def test_convert_to_object_storage_warns_that_sidecars_stay_behind(s3_server, s3_bucket, tmp_path):
    """The features.json sidecars (class names) are not uploaded: convert
    says so, the records arrive exact, and a remote store has no features."""
    pa = pytest.importorskip("pyarrow")
    meta = {b"huggingface": b'{"info": {"features": {"label": {"names": ["no", "yes"], "_type": "ClassLabel"}}}}'}
    table = pa.table({"label": pa.array([0, 1, 1, 0]), "text": pa.array(["a", "bb", "c", "dd"])}).replace_schema_metadata(meta)
    opts = options(s3_server)
    url = f"s3://{s3_bucket}/labelled"
    with pytest.warns(UserWarning, match=r"features.json .* of label is not uploaded to object storage"):
        out = tools.convert(table, url, storage_options=opts)
    assert out == {"label": f"{url}/label", "text": f"{url}/text"}
    assert not any(k.endswith("features.json") for k in s3_server.list_objects(s3_bucket, "labelled/"))
    with Dense.open(out["label"], storage_options=opts) as ds:
        assert ds[:].tolist() == [0, 1, 1, 0] and ds.features is None
    with Ragged.open(out["text"], storage_options=opts) as rs:
        assert [r.tobytes() for r in rs[:]] == [b"a", b"bb", b"c", b"dd"]
    assert tools.class_names(out["label"]) is None
    # the same table converted locally keeps them
    tools.convert(table, tmp_path / "local")
    assert tools.class_names(tmp_path / "local" / "label") == ["no", "yes"]


def test_local_only_arguments_are_refused_for_urls(s3_server):
    with pytest.raises(ValueError, match="data_access='map' applies to local stores"):
        Dense.open("s3://bucket/x", data_access="map", storage_options=options(s3_server))
    with pytest.raises(ValueError, match='storage option "aws_no_such_key" is not one of the S3 settings'):
        Dense.open("s3://bucket/x", storage_options=options(s3_server, aws_no_such_key="1"))
    with pytest.raises(ValueError, match='unsupported URL scheme "ftp"'):
        Dense.open("ftp://host/x")


def test_object_storage_writers_take_the_level(s3_server, s3_bucket):
    """A plain store and a set written to object storage at a level: the
    frames are that level's, and every record reads back."""
    yy, xx = np.indices((16, 16))
    data = np.stack([((yy * (i % 5 + 1) + xx * (i % 3 + 1)) // 3 % 64).astype(np.uint8) for i in range(60)])
    opts = options(s3_server)
    sizes = {}
    for level in (-5, 19):
        for layout, kw in (("plain", {}), ("set", {"shard_records": 25})):
            url = f"s3://{s3_bucket}/level{level}/{layout}"
            with Dense.create(url, np.uint8, (16, 16), level=level, storage_options=opts, **kw) as w:
                w.append(data)
            with Dense.open(url, storage_options=opts) as ds:
                np.testing.assert_array_equal(ds[:], data)
            keys = [k for k in s3_server.list_objects(s3_bucket, f"level{level}/{layout}/")
                    if k.endswith("data.zr")]
            sizes[level, layout] = sum(len(s3_server.get_object(s3_bucket, k)) for k in keys)
    assert sizes[-5, "plain"] > sizes[19, "plain"]
    assert sizes[-5, "set"] > sizes[19, "set"]
    with pytest.raises(ValueError, match="raw stores are not compressed"):
        Dense.create(f"s3://{s3_bucket}/rawlevel", np.uint8, (2,), codec="raw", level=1,
                     storage_options=opts)
    assert s3_server.list_objects(s3_bucket, "rawlevel/") == []
