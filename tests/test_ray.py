"""loaderx.ray: Ray Data writes one store set per column (ZrecordDatasink,
write_zrecord) and reads stores back as a Dataset (read_zrecord), on a local
two-CPU Ray cluster shared by the module."""
from __future__ import annotations

import itertools
import json
import logging
import re
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from _ranks import run_ranks
from conftest import in_ci

try:
    import ray
except ImportError:  # requirements-dev.txt installs it: CI must not lose these tests
    if in_ci():
        raise
    pytest.skip("ray is not installed: pip install 'loaderx[ray]'", allow_module_level=True)

import ray.cloudpickle

from loaderx.dataloader import DataLoader
from loaderx.ray import ZrecordDatasink, ZrecordDatasource, read_zrecord, write_zrecord
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

# Ray workers cannot import this test module: ship its functions by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

# Ray's own deprecation notices (DataContext internals) are not ours to fix.
pytestmark = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:ray\..*")

SHARD = re.compile(r"part-(\d{6})-[0-9a-f]{8}-\d{4}")


@pytest.fixture(scope="module", autouse=True)
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             log_to_driver=False, object_store_memory=256 << 20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield
    ray.shutdown()


def options(server, **extra) -> dict:
    """storage_options pointing at the test S3 server (as in test_remote.py)."""
    return {"aws_endpoint": server.endpoint, "aws_access_key_id": server.access_key,
            "aws_secret_access_key": server.secret_key, "aws_region": server.region,
            "aws_allow_http": "true", **extra}


# Every column is a function of the row id, so any row can be checked alone.
def img_of(i: int) -> np.ndarray:
    """Row i's fixed-shape column."""
    return (np.arange(6, dtype=np.int32).reshape(2, 3) + 10 * i).astype(np.int32)


def tok_of(i: int) -> np.ndarray:
    """Row i's ragged column: i % 5 + 1 copies of i."""
    return np.full(i % 5 + 1, i, dtype=np.int32)


def columns_of(batch: dict) -> dict:
    """map_batches UDF: id (int64 scalar), img (int32 2x3), tok (ragged int32)."""
    ids = batch["id"]
    tok = np.empty(len(ids), dtype=object)
    for k, i in enumerate(ids):
        tok[k] = tok_of(int(i))
    return {"id": ids, "img": np.stack([img_of(int(i)) for i in ids]), "tok": tok}


def dataset(n: int, blocks: int, batch_size: int = 16):
    """Rows 0..n-1 of columns_of, read as ``blocks`` blocks."""
    return ray.data.range(n, override_num_blocks=blocks).map_batches(columns_of,
                                                                     batch_size=batch_size)


def check_rows(ids, img, tok) -> None:
    """Row k of every column belongs to dataset row ids[k]."""
    assert len(ids) == len(img) == len(tok)
    for k, i in enumerate(ids):
        np.testing.assert_array_equal(img[k], img_of(int(i)))
        np.testing.assert_array_equal(tok[k], tok_of(int(i)))


def open_sets(root, **kw) -> dict:
    """The three column sets a write of ``dataset`` publishes under root."""
    return {"id": Dense.open(f"{root}/id", **kw), "img": Dense.open(f"{root}/img", **kw),
            "tok": Ragged.open(f"{root}/tok", **kw)}


def task_order(shards) -> list[int]:
    """The write-task index in each shard's name, in manifest order."""
    return [int(SHARD.fullmatch(s["path"]).group(1)) for s in shards]


def ordered(ds):
    """``ds``, run with preserve_order: blocks (and rows) in dataset order."""
    ds.context.execution_options.preserve_order = True
    return ds


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------

def test_local_round_trip(tmp_path):
    n = 300
    ds = dataset(n, 6)
    ds.context.target_max_block_size = 1024  # several blocks, so several shards, per task
    manifests = write_zrecord(ds, tmp_path / "out", shard_bytes=1024)
    assert sorted(manifests) == ["id", "img", "tok"]
    sets = open_sets(tmp_path / "out")
    assert (sets["id"].dtype, sets["id"].item_shape) == (np.int64, ())
    assert (sets["img"].dtype, sets["img"].item_shape) == (np.int32, (2, 3))
    assert sets["tok"].dtype == np.int32
    assert sets["id"][:].tolist() == list(range(n))  # the dataset's rows, in order
    check_rows(sets["id"][:], sets["img"][:], sets["tok"][:])
    # Several tasks and several shards per task, listed by task index; the
    # three columns were cut at the same rows.
    shards = sets["id"].shards
    assert len(set(task_order(shards))) > 1 and len(shards) > len(set(task_order(shards)))
    assert task_order(shards) == sorted(task_order(shards))
    for s in sets.values():
        assert [(x["path"], x["records"]) for x in s.shards] == [
            (x["path"], x["records"]) for x in shards]
        s.close()
    # Read back by Ray.
    back = ordered(read_zrecord(tmp_path / "out")).take_all()
    assert [r["id"] for r in back] == list(range(n))
    check_rows([r["id"] for r in back], [r["img"] for r in back], [r["tok"] for r in back])


def slow_middle(batch: dict) -> dict:
    """Blocks 2 and 3 finish last: without preserve_order they reach the
    write step after the blocks behind them."""
    time.sleep(0.5 if 40 <= batch["id"][0] < 80 else 0.0)
    return columns_of(batch)


def test_row_order_and_column_alignment(tmp_path):
    n = 160

    def ds():
        # num_cpus=0: every map task runs at once, apart from the write tasks
        # (no fusion), so blocks reach the write step in completion order.
        return ray.data.from_items([{"id": i} for i in range(n)], override_num_blocks=8
                                   ).map_batches(slow_middle, batch_size=20, num_cpus=0)

    write_zrecord(ds(), tmp_path / "ordered")
    sets = open_sets(tmp_path / "ordered")
    assert sets["id"][:].tolist() == list(range(n))
    check_rows(sets["id"][:], sets["img"][:], sets["tok"][:])
    # Plain write_datasink without preserve_order: rows come in completion
    # order (blocks 2 and 3 last, as a rule), but every column's row i is
    # the same dataset row.
    unordered = ds()
    unordered.context.execution_options.preserve_order = False
    unordered.write_datasink(ZrecordDatasink(tmp_path / "any"))
    sets = open_sets(tmp_path / "any")
    assert sorted(sets["id"][:].tolist()) == list(range(n))
    check_rows(sets["id"][:], sets["img"][:], sets["tok"][:])


def test_column_types_and_selection(tmp_path):
    items = [{"score": float(i) / 3, "flag": bool(i % 2), "vec": [i, i + 1, i + 2],
              "words": list(range(i % 4 + 1)), "name": f"row{i}"} for i in range(40)]
    ds = ray.data.from_items(items, override_num_blocks=4)
    with pytest.raises(ValueError, match="without '/'"):
        ZrecordDatasink(tmp_path / "bad", ["a/b"])  # checked on the driver, before any task
    with pytest.raises(Exception, match=r"column 'name' holds"):
        ds.write_datasink(ZrecordDatasink(tmp_path / "all"))
    assert not list((tmp_path / "all").rglob("manifest.json"))
    write_zrecord(ds, tmp_path / "sel", ["score", "flag", "vec", "words"],
                  ragged=["score"])
    assert sorted(p.name for p in (tmp_path / "sel").iterdir()) == [
        "flag", "score", "vec", "words"]
    flag, vec = Dense.open(tmp_path / "sel/flag"), Dense.open(tmp_path / "sel/vec")
    assert (flag.dtype, flag.item_shape, vec.dtype, vec.item_shape) == (
        np.bool_, (), np.int64, (3,))  # lists of one length: Dense
    np.testing.assert_array_equal(vec[:], [[i, i + 1, i + 2] for i in range(40)])
    assert flag[:].tolist() == [bool(i % 2) for i in range(40)]
    words = Ragged.open(tmp_path / "sel/words")  # lists of varying lengths: Ragged
    assert [w.tolist() for w in words[:]] == [list(range(i % 4 + 1)) for i in range(40)]
    score = Ragged.open(tmp_path / "sel/score")  # forced ragged: 0-d records
    assert [float(s) for s in score[:]] == [i / 3 for i in range(40)]

    # A variable-shaped 2-D tensor column whose last task's rows happen to
    # share one shape: that task's Dense shard is re-encoded as Ragged.
    shapes = [(2, 3), (3, 1), (2, 3), (1, 4)] * 3 + [(1, 1)] + [(5, 5)] * 4
    items = [{"x": np.full(shape, i, dtype=np.uint8)} for i, shape in enumerate(shapes)]
    sink = ZrecordDatasink(tmp_path / "img")
    ordered(ray.data.from_items(items, override_num_blocks=4)).write_datasink(sink)  # 5, 4, 4, 4
    recs = Ragged.open(tmp_path / "img/x")
    assert [r.shape for r in recs[:]] == shapes
    assert [int(r.flat[0]) for r in recs[:]] == list(range(17))
    assert sink.manifests["x"]["kind"] == "ragged"
    assert [s["path"].endswith("-ragged") for s in recs.shards] == [False] * 3 + [True]


def test_empty_tasks_and_an_empty_dataset(tmp_path):
    # Blocks 1 and 2 of 4 lose every row: their tasks write no shard.
    ds = dataset(80, 4).map_batches(
        lambda b: {k: v[(b["id"] < 20) | (b["id"] >= 60)] for k, v in b.items()})
    write_zrecord(ds, tmp_path / "holes")
    sets = open_sets(tmp_path / "holes")
    assert sets["id"][:].tolist() == list(range(20)) + list(range(60, 80))
    assert task_order(sets["id"].shards) == [0, 3]  # tasks 1 and 2 had no rows
    assert all(s["records"] > 0 for s in sets["id"].shards)
    check_rows(sets["id"][:], sets["img"][:], sets["tok"][:])
    with pytest.raises(ValueError, match="the dataset has no rows"):
        write_zrecord(dataset(30, 2).limit(0), tmp_path / "none")
    assert not list(tmp_path.glob("none/**/manifest.json"))


def fail_on_37(batch: dict) -> dict:
    """map_batches UDF failing on the block holding row 37."""
    if 37 in batch["id"]:
        raise RuntimeError("bad block")
    return columns_of(batch)


def test_a_failed_write_publishes_nothing(tmp_path):
    # Ray Data retries system failures only: this error fails the write.
    ds = ray.data.range(120, override_num_blocks=6).map_batches(fail_on_37, batch_size=10)
    with pytest.raises(Exception, match="bad block"):
        write_zrecord(ds, tmp_path / "out", shard_bytes=1)
    assert not list((tmp_path / "out").rglob("manifest.json"))


class FlakySink(ZrecordDatasink):
    """Task 1's first attempt writes one shard, then dies."""

    def __init__(self, path, marker):
        super().__init__(path, shard_bytes=1)
        self.marker = Path(marker)

    def write(self, blocks, ctx):
        if ctx.task_idx == 1 and not self.marker.exists():
            self.marker.touch()

            def first_then_fail(it):
                yield next(it)
                raise RuntimeError("attempt lost")

            blocks = first_then_fail(iter(blocks))
        return super().write(blocks, ctx)


def test_a_retried_task_is_listed_once(tmp_path):
    out = tmp_path / "out"
    ds = ordered(dataset(120, 4, batch_size=10))
    ds.write_datasink(FlakySink(out, tmp_path / "failed-once"),
                      ray_remote_args={"max_retries": 2, "retry_exceptions": True})
    assert (tmp_path / "failed-once").exists()
    sets = open_sets(out)
    assert sets["id"][:].tolist() == list(range(120))  # no row twice, none lost
    check_rows(sets["id"][:], sets["img"][:], sets["tok"][:])
    listed = {s["path"] for s in sets["id"].shards}
    on_disk = {p.name for p in (out / "id").iterdir() if p.is_dir()}
    lost = on_disk - listed
    assert lost and all(SHARD.fullmatch(p).group(1) == "000001" for p in lost)
    # The listed shards of task 1 all come from its one successful attempt.
    attempts = {p.split("-")[2] for p in listed if p.startswith("part-000001-")}
    assert len(attempts) == 1


# --------------------------------------------------------------------------
# object storage, a sharded DataLoader and the reference reader
# --------------------------------------------------------------------------

def _rank(root, opts, shard_index, shard_count, start_step, steps):
    """A rank's (id, img, tok) slices for ``steps`` steps."""
    loader = DataLoader(open_sets(root, storage_options=opts), batch_size=24,
                        mode=Sampler.Mode.SEQUENTIAL, start_step=start_step,
                        shard_index=shard_index, shard_count=shard_count,
                        prefetch_size=1, transform=None)
    got = [(b["id"].tolist(), b["img"], b["tok"]) for b in itertools.islice(loader, steps)]
    loader.close()
    return got


def _ranks(root, opts, count, start_step, steps) -> dict:
    return run_ranks(_rank, [(root, opts, r, count, start_step, steps) for r in range(count)])


def test_s3_set_feeds_a_sharded_resumed_loader(s3_server, s3_bucket):
    n = 200
    root = f"s3://{s3_bucket}/train"
    opts = options(s3_server)
    ds = dataset(n, 5).repartition(7)  # several write tasks
    write_zrecord(ds, root, storage_options=opts, shard_bytes=2048)
    keys = s3_server.list_objects(s3_bucket, "train/")
    assert sorted(k for k in keys if k.endswith("manifest.json")) == [
        f"train/{c}/manifest.json" for c in ("id", "img", "tok")]
    sets = open_sets(root, storage_options=opts)
    assert len(set(task_order(sets["id"].shards))) >= 3
    assert sets["id"][:].tolist() == list(range(n))
    # Two processes, resumed at step 3: each global batch is the dataset's
    # rows in order (sequential sampling), split between the ranks.
    start, steps = 3, 4
    ranks = _ranks(root, opts, 2, start, steps)
    sampler = Sampler(n, 24, Sampler.Mode.SEQUENTIAL, 0)
    for k in range(steps):
        want = sampler.batch_at(start + k).tolist()
        parts = [ranks[r][k] for r in (0, 1)]
        assert parts[0][0] + parts[1][0] == want
        for ids, img, tok in parts:
            check_rows(ids, img, tok)
    # And back through Ray, read from object storage.
    back = ordered(read_zrecord(root, ["id", "tok"], storage_options=opts)).take_all()
    assert [r["id"] for r in back] == list(range(n))
    assert all(np.array_equal(r["tok"], tok_of(r["id"])) for r in back)


REF_READ_SHARDS = textwrap.dedent("""
    import json, sys
    import loaderx
    from loaderx.zrecord import Dense, Ragged
    assert loaderx.__version__ == "2.0.0", loaderx.__version__
    out = []
    for kind, path in json.load(open(sys.argv[1])):
        with (Dense if kind == "dense" else Ragged).open(path) as ds:
            recs = ds[:]
            out.append([r.tolist() for r in recs] if kind == "ragged" else recs.tolist())
    print(json.dumps(out))
    import os as _os
    sys.stdout.flush()
    sys.stderr.flush()
    _os._exit(0)
""")


def test_each_shard_opens_with_loaderx_2_0_0(tmp_path, run_reference):
    write_zrecord(dataset(90, 3), tmp_path / "out", shard_bytes=512)
    spec, want = [], []
    for name, s in open_sets(tmp_path / "out").items():
        kind = "dense" if isinstance(s, Dense) else "ragged"
        assert len(s.shards) > 2
        for shard in s.shards:
            path = tmp_path / "out" / name / shard["path"]
            spec.append((kind, str(path)))
            recs = type(s).open(path)[:]
            want.append([r.tolist() for r in recs] if kind == "ragged" else recs.tolist())
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    (tmp_path / "ref.py").write_text(REF_READ_SHARDS)
    proc = run_reference(tmp_path / "ref.py", tmp_path / "spec.json", timeout=60)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == want


# --------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------

def test_read_stores_as_tensor_columns(tmp_path):
    x = np.arange(50 * 4, dtype=np.float32).reshape(50, 2, 2)
    with Dense.create(tmp_path / "x", x.dtype, (2, 2)) as w:  # a plain store
        w.append(x)
    words = [np.arange(i % 3 + 1, dtype=np.int16) + i for i in range(50)]
    with Ragged.create(tmp_path / "w", np.int16, shard_records=20) as w:  # a set: 20, 20, 10
        w.append(words)
    # A plain store alone: one shard, one read task unless Ray asks for more.
    assert len(ZrecordDatasource(tmp_path / "x").get_read_tasks(1)) == 1
    assert len(ZrecordDatasource(tmp_path / "x").get_read_tasks(4)) == 4
    one = ordered(read_zrecord(tmp_path / "x", override_num_blocks=1))
    assert one.columns() == ["x"]
    np.testing.assert_array_equal(np.stack([r["x"] for r in one.take_all()]), x)
    # Two columns with different shard boundaries: read tasks never span one.
    source = ZrecordDatasource({"x": tmp_path / "x", "w": tmp_path / "w"})
    assert [t.metadata.num_rows for t in source.get_read_tasks(1)] == [20, 20, 10]
    ds = ordered(read_zrecord({"x": tmp_path / "x", "w": tmp_path / "w"}, block_rows=7))
    types = dict(zip(ds.schema().names, map(str, ds.schema().types), strict=True))
    assert "shape=(2, 2), dtype=float" in types["x"]
    assert "VariableShaped" in types["w"] and "dtype=int16" in types["w"]
    rows = ds.take_all()
    np.testing.assert_array_equal(np.stack([r["x"] for r in rows]), x)
    for r, want in zip(rows, words, strict=True):
        np.testing.assert_array_equal(r["w"], want)
    batch = next(iter(ds.iter_batches(batch_size=5, batch_format="numpy")))
    assert batch["x"].shape == (5, 2, 2) and batch["x"].dtype == np.float32


def test_import_needs_no_ray_until_asked(run_ours):
    code = ("import sys, loaderx, loaderx.zrecord, loaderx.dataloader, loaderx.sets\n"
            "assert 'ray' not in sys.modules\n"
            "sys.modules['ray'] = None\n"
            "try:\n"
            "    import loaderx.ray\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    proc = run_ours(code)
    assert proc.returncode == 0, proc.stderr
    assert "pip install 'loaderx[ray]'" in proc.stdout
