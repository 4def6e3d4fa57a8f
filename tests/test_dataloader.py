"""Tests of loaderx.dataloader.DataLoader: the API.md contract plus the
project's extras (step-ordered delivery, resume, sharding, prompt shutdown).

Every store here is built so that record ``i`` is a known function of ``i``:

* ``id``     Dense int64, item shape ``()``, raw codec: record i is ``i``;
* ``image``  Dense uint8, item shape (3, 4, 5), zstd: ``np.full(shape, i % 251)``;
* ``tokens`` Ragged int32, zstd: ``token(i)`` (1-D, 2-D or 0-d, see below).

So each delivered batch is checked in full against its ``id`` column, and
the ``id`` columns are compared with ``loaderx.zsampler.Sampler``.

Timeouts in this file are failure guards only: a correct loader finishes each
wait in milliseconds.
"""
from __future__ import annotations

import gc
import multiprocessing
import queue as queue_mod
import random
import struct
import threading
import time
import traceback
import weakref
from pathlib import Path

import numpy as np
import pytest

from loaderx.dataloader import DataLoader, distributed_shard
from loaderx.zrecord import Dense, Ragged, ZrecordError

N = 53                      # records per store: prime, so cyclic cycles leave a remainder
IMAGE_SHAPE = (3, 4, 5)
NAMES = ["id", "image", "tokens"]
GUARD = 10.0                # seconds; only ever reached when something hangs
DECODE_FAILED = -7
PAGE, ENTRY = 4096, 16      # meta.zr layout (FORMAT.md): table entries <QII at PAGE + 16 i

HAVE_PROC = Path("/proc/self/status").is_file()
needs_proc = pytest.mark.skipif(not HAVE_PROC, reason="needs /proc/self/status (Linux)")


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def token(i: int) -> np.ndarray:
    """Ragged record ``i``: ``arange(i % 7 + 1) + i``, some reshaped to 2-D or 0-d."""
    if i % 11 == 0:
        return np.array(i, dtype=np.int32)
    a = np.arange(i % 7 + 1, dtype=np.int32) + i
    if i % 4 == 1:
        return a.reshape(1, -1)
    return a


def build_stores(root: Path, n: int = N, codec_id: str = "raw") -> dict[str, Path]:
    paths = {name: root / name for name in NAMES}
    with Dense.create(paths["id"], np.int64, (), codec=codec_id) as w:
        w.append(np.arange(n, dtype=np.int64)[: n // 2])
        w.append(np.arange(n, dtype=np.int64)[n // 2:])
    with Dense.create(paths["image"], np.uint8, IMAGE_SHAPE, codec="zstd") as w:
        w.append(np.stack([np.full(IMAGE_SHAPE, i % 251, np.uint8) for i in range(n)]))
    with Ragged.create(paths["tokens"], np.int32, codec="zstd") as w:
        w.append(token(i) for i in range(n))
    return paths


def open_stores(paths: dict[str, Path]) -> dict:
    return {
        "id": Dense.open(paths["id"]),
        "image": Dense.open(paths["image"]),
        "tokens": Ragged.open(paths["tokens"]),
    }


def check_batch(batch, rows: int | None = None) -> list[int]:
    """Checks every stream of ``batch`` against its id column; returns the ids."""
    assert isinstance(batch, dict), type(batch)
    assert list(batch) == NAMES
    ids = batch["id"]
    assert isinstance(ids, np.ndarray) and ids.dtype == np.int64 and ids.ndim == 1
    if rows is not None:
        assert ids.shape == (rows,)
    assert ((ids >= 0) & (ids < N)).all(), ids
    image = batch["image"]
    assert isinstance(image, np.ndarray)
    assert image.dtype == np.uint8 and image.shape == (len(ids), *IMAGE_SHAPE)
    want = np.broadcast_to((ids % 251).astype(np.uint8).reshape(-1, 1, 1, 1), image.shape)
    np.testing.assert_array_equal(image, want)
    tokens = batch["tokens"]
    assert isinstance(tokens, list) and len(tokens) == len(ids)
    for i, got in zip(ids.tolist(), tokens):
        want = token(i)
        assert isinstance(got, np.ndarray)
        assert got.dtype == want.dtype and got.shape == want.shape, (i, got.shape, want.shape)
        np.testing.assert_array_equal(got, want)
    return ids.tolist()


def take_ids(loader, steps: int, rows: int | None = None) -> list[list[int]]:
    return [check_batch(next(loader), rows) for _ in range(steps)]


def sequential_ids(step: int, batch_size: int, length: int = N) -> list[int]:
    return [(step * batch_size + j) % length for j in range(batch_size)]


# --------------------------------------------------------------------------
# threads and timing helpers
# --------------------------------------------------------------------------

def native_threads() -> int:
    """Loader producer threads alive in this process (named loaderx-loader-N,
    which the kernel keeps as its first 15 characters). Counting only these
    keeps the count free of other libraries' threads (Ray, the I/O runtime)."""
    count = 0
    for comm in Path("/proc/self/task").glob("*/comm"):
        try:
            count += comm.read_text().startswith("loaderx-loader")
        except OSError:  # the thread ended while we looked
            pass
    return count


@pytest.fixture(autouse=True)
def _no_loader_threads_left_over():
    """Loaders abandoned by an earlier test may still be finishing a gather
    (closing never waits for one): let them end before a test counts threads."""
    if Path("/proc/self/task").is_dir():
        wait_until(lambda: native_threads() == 0, 5.0)
    yield


def transform_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loaderx-transform-")]


def wait_until(predicate, timeout: float = GUARD, interval: float = 0.005) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def in_thread(fn, *args):
    """Runs ``fn`` on a daemon thread; returns (thread, box) where box gets
    ("ok", value) or ("err", exception)."""
    box: list = []

    def run():
        try:
            box.append(("ok", fn(*args)))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box.append(("err", e))

    t = threading.Thread(target=run, daemon=True, name="test-consumer")
    t.start()
    return t, box


def finish(t: threading.Thread, box: list, what: str, timeout: float = GUARD):
    t.join(timeout)
    assert not t.is_alive(), f"{what} did not finish within {timeout} s (hang)"
    return box[0]


def drain(loader, limit: int = 1000) -> list:
    """Consumes until StopIteration (at most ``limit`` batches)."""
    out = []
    for _ in range(limit):
        try:
            out.append(next(loader))
        except StopIteration:
            return out
    raise AssertionError(f"loader still delivering after {limit} batches")


# --------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def store_dirs(tmp_path_factory) -> dict[str, Path]:
    return build_stores(tmp_path_factory.mktemp("dl_stores"))


@pytest.fixture
def streams(store_dirs):
    opened = open_stores(store_dirs)
    # Any gather starts the process-wide native worker pool ("loaderx-*"
    # threads), so that thread-count baselines taken later do not include it.
    opened["id"][[0, 1]]
    yield opened
    for s in opened.values():
        s.close()


@pytest.fixture
def make(streams):
    """Factory of loaders over ``streams`` (batch_size 8 by default); all
    are closed at teardown."""
    made: list[DataLoader] = []

    def factory(source=None, **kw):
        kw.setdefault("batch_size", 8)
        loader = DataLoader(streams if source is None else source, **kw)
        made.append(loader)
        return loader

    yield factory
    for loader in made:
        loader.close()


@pytest.fixture(scope="module")
def Sampler():
    try:
        from loaderx.zsampler import Sampler as cls
        cls(10, 3, 2, 42).batch_at(0)
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"loaderx.zsampler.Sampler is not usable yet (another engineer is "
                    f"finishing it): {type(e).__name__}: {e}")
    return cls


def passthrough(batch):
    """A transform that is not ``identity``: forces the Python worker stage."""
    return batch


TRANSFORMS = {"identity": {}, "transform": {"transform": passthrough, "transform_workers": 3}}


@pytest.fixture(params=list(TRANSFORMS))
def variant(request) -> dict:
    return dict(TRANSFORMS[request.param])


# --------------------------------------------------------------------------
# argument validation
# --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [
    {}, None, "abc", 42, [], (), {"x": np.arange(N)}, {"x": [1, 2, 3]}, {"x": None},
], ids=["empty-dict", "none", "str", "int", "list", "tuple", "ndarray", "pylist", "none-value"])
def test_streams_must_be_nonempty_dict_of_stores(bad):
    with pytest.raises(ValueError):
        DataLoader(bad)


def test_a_list_of_stores_is_refused(streams):
    with pytest.raises(ValueError):
        DataLoader(list(streams.values()))


def test_writer_stream_is_refused(streams, tmp_path):
    w = Dense.create(tmp_path / "w", np.int64, ())
    try:
        w.append(np.arange(N, dtype=np.int64))
        with pytest.raises(ValueError, match="writer"):
            DataLoader({"id": streams["id"], "w": w})
    finally:
        w.close()


def test_closed_stream_is_refused(store_dirs):
    s = Dense.open(store_dirs["id"])
    s.close()
    with pytest.raises(ValueError, match="closed"):
        DataLoader({"id": s})
    r = Ragged.open(store_dirs["tokens"])
    r.close()
    with pytest.raises(ValueError, match="closed"):
        DataLoader({"tokens": r})


def test_unequal_lengths_are_refused(streams, tmp_path):
    with Dense.create(tmp_path / "short", np.int64, ()) as w:
        w.append(np.arange(N - 1, dtype=np.int64))
    with Dense.open(tmp_path / "short") as short:
        with pytest.raises(ValueError, match="same number of records"):
            DataLoader({"id": streams["id"], "short": short})
        with pytest.raises(ValueError, match="same number of records"):
            DataLoader({"short": short, "tokens": streams["tokens"]})


def test_empty_stores_are_refused(tmp_path):
    Dense.create(tmp_path / "e", np.int64, ()).close()
    with Dense.open(tmp_path / "e") as e:
        with pytest.raises(ValueError):
            DataLoader({"e": e})


@pytest.mark.parametrize("name", ["transform_workers", "prefetch_size"])
@pytest.mark.parametrize("value", [1.5, 2.0, "2", None, True, False, np.bool_(True), [2]],
                         ids=repr)
def test_workers_and_prefetch_must_be_ints(streams, name, value):
    with pytest.raises(TypeError):
        DataLoader(streams, **{name: value})


@pytest.mark.parametrize("name", ["transform_workers", "prefetch_size"])
@pytest.mark.parametrize("value", [0, -1, -(2**70), np.int64(0)], ids=repr)
def test_workers_and_prefetch_must_be_positive(streams, name, value):
    with pytest.raises(ValueError):
        DataLoader(streams, **{name: value})


def test_numpy_integers_are_accepted(make):
    loader = make(transform_workers=np.int64(2), prefetch_size=np.int32(3), batch_size=np.uint16(8),
                  mode=np.int8(0), seed=np.uint64(3), transform=passthrough)
    assert check_batch(next(loader)) == list(range(8))


@pytest.mark.parametrize("kw, exc", [
    ({"batch_size": 0}, ValueError),
    ({"batch_size": -8}, ValueError),
    ({"batch_size": 2**64}, ValueError),
    ({"batch_size": True}, TypeError),
    ({"batch_size": 8.0}, TypeError),
    ({"batch_size": "8"}, TypeError),
    ({"batch_size": None}, TypeError),
    ({"mode": 3}, ValueError),
    ({"mode": -1}, ValueError),
    ({"mode": 2**64}, ValueError),
    ({"mode": 1.0}, TypeError),
    ({"mode": True}, TypeError),
    ({"mode": "cyclic"}, TypeError),
    ({"mode": None}, TypeError),
    ({"seed": -1}, ValueError),
    ({"seed": 2**64}, ValueError),
    ({"seed": 1.5}, TypeError),
    ({"seed": True}, TypeError),
    ({"seed": "42"}, TypeError),
    ({"start_step": -1}, ValueError),
    ({"start_step": 2**64}, ValueError),
    ({"start_step": 1.0}, TypeError),
    ({"shard_count": 3}, ValueError),                   # 8 % 3 != 0
    ({"shard_count": 16}, ValueError),                  # more shards than records per batch
    ({"shard_count": 0}, ValueError),
    ({"shard_index": 2, "shard_count": 2}, ValueError),
    ({"shard_index": 4, "shard_count": 4}, ValueError),
    ({"shard_index": 1}, ValueError),                   # default shard_count is 1
    ({"shard_index": -1, "shard_count": 2}, ValueError),
    ({"shard_index": 1.0, "shard_count": 2}, TypeError),
    ({"shard_count": True}, TypeError),
    ({"transform": 42}, TypeError),
    ({"transform": "upper"}, TypeError),
], ids=lambda v: repr(v) if isinstance(v, dict) else v.__name__)
def test_sampling_and_shard_arguments_are_checked(streams, kw, exc):
    kw = {"batch_size": 8, **kw}
    with pytest.raises(exc):
        DataLoader(streams, **kw)


def test_edge_values_are_accepted(make, Sampler):
    loader = make(seed=2**64 - 1, mode=Sampler.Mode.IID, batch_size=8, shard_index=7,
                  shard_count=8, start_step=2**63)
    want = Sampler(N, 8, 1, 2**64 - 1).batch_at(2**63).tolist()
    assert check_batch(next(loader), 1) == want[7:8]
    loader = make(transform=None, mode=Sampler.Mode.SEQUENTIAL, batch_size=1)
    assert check_batch(next(loader)) == [0]


@needs_proc
def test_refused_arguments_start_no_threads(streams):
    base = native_threads()
    for kw in ({"mode": 5}, {"shard_count": 3}, {"transform_workers": 0}, {"seed": -1}):
        with pytest.raises(ValueError):
            DataLoader(streams, batch_size=8, transform=passthrough, **kw)
    assert not transform_threads()
    assert native_threads() == base


# --------------------------------------------------------------------------
# batch layout
# --------------------------------------------------------------------------

def test_batch_layout(make, streams, variant):
    loader = make(mode=0, **variant)
    first = next(loader)
    second = next(loader)
    assert check_batch(first, 8) == list(range(8))
    assert check_batch(second, 8) == list(range(8, 16))
    for b in (first, second):
        for name in ("id", "image"):
            a = b[name]
            assert a.flags.c_contiguous and a.flags.writeable, (name, a.flags)
        # every ragged record is a complete array of its own
        for t in b["tokens"]:
            assert t.flags.c_contiguous
    arrays = [first["id"], first["image"], second["id"], second["image"]]
    for x in range(len(arrays)):
        for y in range(x + 1, len(arrays)):
            assert not np.shares_memory(arrays[x], arrays[y])
    # writing into a batch changes neither the store nor other batches
    first["image"][:] = 255
    first["id"][:] = -1
    first["tokens"][2][...] = -7
    assert check_batch(second, 8) == list(range(8, 16))
    np.testing.assert_array_equal(streams["image"][0], np.zeros(IMAGE_SHAPE, np.uint8))
    assert streams["id"][0] == 0
    np.testing.assert_array_equal(streams["tokens"][2], token(2))
    assert check_batch(next(loader), 8) == list(range(16, 24))


def test_single_stream_and_names(streams, make):
    loader = make({"only": streams["tokens"]}, mode=0, batch_size=3)
    b = next(loader)
    assert list(b) == ["only"]
    assert [t.shape for t in b["only"]] == [token(i).shape for i in range(3)]
    loader = make({"b": streams["image"], "a": streams["id"]}, mode=0, batch_size=3)
    b = next(loader)
    assert list(b) == ["b", "a"]
    assert b["a"].tolist() == [0, 1, 2]
    # the same store twice is fine
    loader = make({"x": streams["id"], "y": streams["id"]}, mode=2, batch_size=4)
    b = next(loader)
    assert b["x"].tolist() == b["y"].tolist()
    assert not np.shares_memory(b["x"], b["y"])


def test_len_raises_type_error(make, variant):
    loader = make(**variant)
    with pytest.raises(TypeError):
        len(loader)
    assert iter(loader) is loader


# --------------------------------------------------------------------------
# sampling modes
# --------------------------------------------------------------------------

def test_sequential_windows_wrap_around(make, variant):
    loader = make(mode=0, **variant)
    steps = 3 * N // 8 + 2          # well past the end of the store, several times
    got = take_ids(loader, steps, 8)
    assert got == [sequential_ids(k, 8) for k in range(steps)]


def test_iteration_is_endless(make, variant):
    loader = make(batch_size=16, mode=2, **variant)
    count = 0
    for batch in loader:
        check_batch(batch, 16)
        count += 1
        if count == 20:             # 320 records from a 53-record store
            break
    assert loader.step == 20
    check_batch(next(loader), 16)


def test_cyclic_covers_each_cycle_without_repeats(make, variant):
    loader = make(mode=2, seed=5, **variant)
    per_cycle = N // 8               # 6 steps, 48 of the 53 records
    cycles = [sum(take_ids(loader, per_cycle, 8), []) for _ in range(4)]
    for c in cycles:
        assert len(set(c)) == len(c) == per_cycle * 8
    assert len({tuple(c) for c in cycles}) == 4, "each cycle should be a fresh permutation"
    assert cycles[0] != list(range(48))


def test_iid_indices_are_in_range(make, variant):
    loader = make(mode=1, seed=9, **variant)
    got = take_ids(loader, 20, 8)
    flat = sum(got, [])
    assert all(0 <= i < N for i in flat)
    assert got != [sequential_ids(k, 8) for k in range(20)]
    assert len(set(flat)) > N // 2


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_batch_larger_than_the_store(make, mode, variant):
    loader = make(mode=mode, batch_size=64, **variant)
    got = take_ids(loader, 4)
    if mode == 0:
        assert got == [sequential_ids(k, 64) for k in range(4)]
    elif mode == 1:
        assert all(len(b) == 64 for b in got)
    else:                            # short batches holding the whole space
        assert all(sorted(b) == list(range(N)) for b in got)


@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("batch_size, seed", [(8, 42), (5, 7), (64, 123)])
def test_ids_equal_the_sampler(make, Sampler, mode, batch_size, seed, variant):
    loader = make(mode=mode, batch_size=batch_size, seed=seed, **variant)
    sampler = Sampler(N, batch_size, mode, seed)
    for k in range(15):
        assert check_batch(next(loader)) == sampler.batch_at(k).tolist(), f"step {k}"


def test_default_arguments_match_api(streams, Sampler):
    # transform_workers=4, batch_size=256, prefetch_size=4, mode=2 (cyclic), seed=42
    with DataLoader(streams) as loader:
        sampler = Sampler(N, 256, 2, 42)
        assert loader.batch_size == 256
        for k in range(3):
            ids = check_batch(next(loader), N)   # 53 < 256: all of the space each step
            assert ids == sampler.batch_at(k).tolist()


# --------------------------------------------------------------------------
# determinism and ordering
# --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0, 1, 2])
def test_same_arguments_give_the_same_sequence(make, mode):
    kw = {"mode": mode, "seed": 11, "batch_size": 6, "prefetch_size": 3}
    reference = take_ids(make(**kw), 25, 6)
    assert take_ids(make(**kw), 25, 6) == reference
    for workers in (1, 4):
        for _ in range(2):
            got = take_ids(make(transform=passthrough, transform_workers=workers, **kw), 25, 6)
            assert got == reference, f"transform_workers={workers}"
    other = take_ids(make(**{**kw, "seed": 12}), 25, 6)
    if mode != 0:
        assert other != reference


@pytest.mark.parametrize("workers", [2, 4])
def test_random_transform_delays_keep_step_order(make, Sampler, workers):
    """Transforms sleep a per-batch pseudo-random time, so they complete out
    of order; delivery is still in step order."""
    finished: list[int] = []
    lock = threading.Lock()

    def sleepy(batch):
        ids = batch["id"]
        rng = random.Random(int(ids[0]) * 1000 + int(ids[-1]))
        time.sleep(rng.random() * 0.01)
        with lock:
            finished.append(int(ids[0]))
        return batch

    loader = make(mode=2, seed=3, transform=sleepy, transform_workers=workers, prefetch_size=3)
    sampler = Sampler(N, 8, 2, 3)
    for k in range(30):
        assert check_batch(next(loader), 8) == sampler.batch_at(k).tolist(), f"step {k}"


def test_forced_out_of_order_completion_is_reordered(make):
    """Step 0's transform waits until step 3's transform has finished: the
    loader must hold 1..3 back and deliver 0, 1, 2, 3, ... in order."""
    step_of = {(5 * k) % N: k for k in range(10)}        # sequential, batch 5: first id -> step
    finished: list[int] = []
    lock = threading.Lock()
    step3_done = threading.Event()

    def transform(batch):
        k = step_of.get(int(batch["id"][0]), -1)
        if k == 0:
            assert step3_done.wait(GUARD), "step 3 never ran while step 0 was held"
        with lock:
            finished.append(k)
        if k == 3:
            step3_done.set()
        return ("step", k, batch)

    loader = make(mode=0, batch_size=5, transform=transform, transform_workers=4, prefetch_size=4)
    got = []
    for k in range(10):
        tag, step, batch = next(loader)
        assert (tag, step) == ("step", k)
        got.append(check_batch(batch, 5))
    assert got == [sequential_ids(k, 5) for k in range(10)]
    assert finished.index(3) < finished.index(0), finished


# --------------------------------------------------------------------------
# resume
# --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0, 1, 2])
def test_start_step_resumes_exactly(make, mode, variant):
    kw = {"mode": mode, "seed": 21, **variant}
    full = take_ids(make(**kw), 20, 8)
    for start in (1, 7, 13):
        loader = make(start_step=start, **kw)
        assert loader.step == start
        assert loader.state_dict() == {"step": start}
        assert take_ids(loader, 20 - start, 8) == full[start:]
        assert loader.step == 20


def test_step_counts_delivered_batches(make, variant):
    loader = make(**variant)
    assert loader.step == 0 and loader.state_dict() == {"step": 0}
    for n in range(1, 6):
        next(loader)
        assert loader.step == n
        assert loader.state_dict() == {"step": n}
    loader = make(start_step=100, **variant)
    take_ids(loader, 3)
    assert loader.state_dict() == {"step": 103}


def test_load_state_dict_repositions(make, variant):
    full = take_ids(make(mode=2, seed=4), 20, 8)
    loader = make(mode=2, seed=4, **variant)
    assert take_ids(loader, 3) == full[:3]
    loader.load_state_dict({"step": 12})                 # forward
    assert loader.step == 12
    assert take_ids(loader, 4) == full[12:16]
    assert loader.state_dict() == {"step": 16}
    loader.load_state_dict({"step": 2})                  # backward
    assert take_ids(loader, 5) == full[2:7]
    state = loader.state_dict()
    resumed = make(mode=2, seed=4, **variant)
    resumed.load_state_dict(state)                       # round trip through a fresh loader
    assert take_ids(resumed, 5) == full[7:12]


def test_bad_state_dict_leaves_the_loader_running(make, variant):
    full = take_ids(make(mode=1, seed=2), 6, 8)
    loader = make(mode=1, seed=2, **variant)
    assert take_ids(loader, 2) == full[:2]
    with pytest.raises(ValueError):
        loader.load_state_dict({"step": -1})
    with pytest.raises(TypeError):
        loader.load_state_dict({"step": 1.5})
    with pytest.raises((KeyError, TypeError, ValueError)):
        loader.load_state_dict({})
    assert take_ids(loader, 4) == full[2:6]


def test_last_step_is_delivered_or_refused(make, Sampler):
    loader = make(mode=1, seed=1, start_step=2**64 - 1)
    t, box = in_thread(next, loader)
    t.join(1.5)                                          # a batch takes microseconds
    hung = t.is_alive()
    loader.close()                                       # wakes the consumer in every case
    finish(t, box, "consumer after close")
    assert not hung, "next() at start_step=2**64-1 blocked (no batch, no error)"
    kind, value = box[0]
    if kind == "ok":        # the batch of the last step ...
        assert check_batch(value, 8) == Sampler(N, 8, 1, 1).batch_at(2**64 - 1).tolist()
    else:                   # ... or a clear error, but never a silent hang or a silent end
        assert not isinstance(value, StopIteration), value


# --------------------------------------------------------------------------
# sharding
# --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("shard_count", [2, 3, 4])
def test_shards_partition_the_global_batch(make, mode, shard_count):
    steps = 8
    glob = take_ids(make(mode=mode, batch_size=12, seed=8), steps, 12)
    per = 12 // shard_count
    shards = [
        take_ids(make(mode=mode, batch_size=12, seed=8, shard_index=i, shard_count=shard_count,
                      **({"transform": passthrough, "transform_workers": 2} if i % 2 else {})),
                 steps, per)
        for i in range(shard_count)
    ]
    for k in range(steps):
        for i in range(shard_count):
            assert shards[i][k] == glob[k][i * per:(i + 1) * per], (k, i)
        assert sum((shards[i][k] for i in range(shard_count)), []) == glob[k]
        if mode != 1:                                   # no replacement: shards are disjoint
            sets = [set(shards[i][k]) for i in range(shard_count)]
            assert sum(map(len, sets)) == len(set().union(*sets)) == 12


def test_resume_on_a_different_shard_count(make):
    kw = {"mode": 2, "batch_size": 12, "seed": 31}
    glob = take_ids(make(**kw), 15, 12)
    plan = [(2, 0, 5), (4, 5, 5), (3, 10, 3), (1, 13, 2)]    # (shard_count, start, steps)
    for count, start, steps in plan:
        loaders = [make(shard_index=i, shard_count=count, start_step=start, **kw)
                   for i in range(count)]
        per_shard = [take_ids(loader, steps, 12 // count) for loader in loaders]
        for j in range(steps):
            assert sum((p[j] for p in per_shard), []) == glob[start + j], (count, start + j)
        assert all(loader.step == start + steps for loader in loaders)


def test_shards_when_the_batch_exceeds_the_store(make):
    # cyclic over 53 records with a global batch of 60: each step is all 53
    # records; the shards still split exactly that between them
    glob = take_ids(make(mode=2, batch_size=60), 3, N)
    parts = [take_ids(make(mode=2, batch_size=60, shard_index=i, shard_count=4), 3)
             for i in range(4)]
    for k in range(3):
        assert sum((p[k] for p in parts), []) == glob[k]


_LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                  "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE")


@pytest.fixture
def no_launcher(monkeypatch):
    for var in _LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_distributed_shard_without_a_framework(no_launcher):
    # neither torch.distributed nor a multi-process JAX is initialised here
    assert distributed_shard() == (0, 1)


def test_distributed_shard_reads_the_launchers_environment(no_launcher):
    """Called before init_process_group, every rank still gets its own slice."""
    no_launcher.setenv("RANK", "2")
    no_launcher.setenv("WORLD_SIZE", "4")
    assert distributed_shard() == (2, 4)
    no_launcher.delenv("RANK")
    no_launcher.delenv("WORLD_SIZE")
    no_launcher.setenv("SLURM_PROCID", "1")
    no_launcher.setenv("SLURM_NTASKS", "3")
    assert distributed_shard() == (1, 3)
    no_launcher.setenv("SLURM_PROCID", "3")
    with pytest.raises(ValueError, match="SLURM_PROCID=3 is not a rank of SLURM_NTASKS=3"):
        distributed_shard()
    no_launcher.setenv("SLURM_PROCID", "x")
    with pytest.raises(ValueError, match="must be integers"):
        distributed_shard()
    no_launcher.delenv("SLURM_PROCID")
    no_launcher.delenv("SLURM_NTASKS")
    no_launcher.setenv("OMPI_COMM_WORLD_RANK", "5")
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "6")
    assert distributed_shard() == (5, 6)
    no_launcher.delenv("OMPI_COMM_WORLD_RANK")
    no_launcher.setenv("PMI_RANK", "0")
    no_launcher.setenv("PMI_SIZE", "2")
    assert distributed_shard() == (0, 2)


def test_distributed_shard_warns_when_only_local_ranks_are_known(no_launcher):
    no_launcher.setenv("LOCAL_WORLD_SIZE", "1")
    assert distributed_shard() == (0, 1)  # one local process: nothing to say
    no_launcher.setenv("LOCAL_WORLD_SIZE", "8")
    with pytest.warns(RuntimeWarning, match="LOCAL_WORLD_SIZE=8 is set but no global rank is"):
        assert distributed_shard() == (0, 1)
    no_launcher.delenv("LOCAL_WORLD_SIZE")
    no_launcher.setenv("LOCAL_RANK", "3")
    with pytest.warns(RuntimeWarning, match="LOCAL_RANK=3 is set but no global rank is"):
        assert distributed_shard() == (0, 1)
    no_launcher.setenv("RANK", "3")
    no_launcher.setenv("WORLD_SIZE", "4")
    assert distributed_shard() == (3, 4)  # the global rank is known: no warning


def test_distributed_shard_warns_when_framework_and_launcher_disagree(no_launcher):
    import sys
    import types

    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_rank=lambda: 1, get_world_size=lambda: 2)
    no_launcher.setitem(sys.modules, "torch", types.SimpleNamespace(distributed=dist))
    assert distributed_shard() == (1, 2)  # agreement, or no environment: no warning
    no_launcher.setenv("RANK", "1")
    no_launcher.setenv("WORLD_SIZE", "8")
    with pytest.warns(RuntimeWarning, match="rank 1 of 2, but RANK/WORLD_SIZE say rank 1 of 8"):
        assert distributed_shard() == (1, 2)


def _shard_worker(paths, shard_index, shard_count, steps, out):
    """multiprocessing (spawn) child: one shard's ids for ``steps`` steps."""
    try:
        streams = open_stores({k: Path(v) for k, v in paths.items()})
        with DataLoader(streams, batch_size=12, mode=2, seed=77, shard_index=shard_index,
                        shard_count=shard_count, transform_workers=2) as loader:
            ids = take_ids(loader, steps, 12 // shard_count)
        out.put(("ok", shard_index, ids))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("error", shard_index, traceback.format_exc()))


def _torch_worker(paths, rank, world, init_method, steps, out):
    """torch.distributed (gloo) child: shard from distributed_shard(), all_gather to rank 0."""
    try:
        import torch.distributed as dist

        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
        try:
            shard_index, shard_count = distributed_shard()
            assert (shard_index, shard_count) == (rank, world), (shard_index, shard_count)
            streams = open_stores({k: Path(v) for k, v in paths.items()})
            with DataLoader(streams, batch_size=12, mode=2, seed=77, shard_index=shard_index,
                            shard_count=shard_count) as loader:
                ids = take_ids(loader, steps, 12 // shard_count)
            gathered = [None] * world
            dist.all_gather_object(gathered, ids)
            if rank == 0:
                out.put(("ok", rank, gathered))
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("error", rank, traceback.format_exc()))


def _run_processes(target, arg_lists, expected_results, timeout=60.0):
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args, out), daemon=True) for args in arg_lists]
    for p in procs:
        p.start()
    results = []
    try:
        deadline = time.monotonic() + timeout
        while len(results) < expected_results:
            left = deadline - time.monotonic()
            try:
                results.append(out.get(timeout=max(left, 0.01)))
            except queue_mod.Empty:
                codes = [p.exitcode for p in procs]
                pytest.fail(f"worker processes gave {len(results)}/{expected_results} results "
                            f"within {timeout} s (exit codes {codes})")
        for p in procs:
            p.join(GUARD)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(GUARD)
    errors = [r for r in results if r[0] == "error"]
    assert not errors, "\n".join(f"rank {r[1]}:\n{r[2]}" for r in errors)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return results


@pytest.mark.parametrize("world", [2, 3])
def test_multiprocess_shards_cover_the_global_batch(store_dirs, make, world):
    steps = 6
    glob = take_ids(make(batch_size=12, mode=2, seed=77), steps, 12)
    paths = {k: str(v) for k, v in store_dirs.items()}
    results = _run_processes(_shard_worker, [(paths, i, world, steps) for i in range(world)], world)
    by_shard = {r[1]: r[2] for r in results}
    assert sorted(by_shard) == list(range(world))
    for k in range(steps):
        parts = [by_shard[i][k] for i in range(world)]
        assert sum(parts, []) == glob[k], k
        assert len(set(sum(parts, []))) == 12


@pytest.mark.parametrize("world", [2, 3])
def test_torch_distributed_shards_cover_the_global_batch(store_dirs, make, tmp_path, world):
    try:
        import torch.distributed as dist
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"torch is not installed ({type(e).__name__}); the multiprocessing variant "
                    f"covers sharding across processes")
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this torch build")
    steps = 6
    glob = take_ids(make(batch_size=12, mode=2, seed=77), steps, 12)
    paths = {k: str(v) for k, v in store_dirs.items()}
    init = (tmp_path / "torch_init").as_uri()
    results = _run_processes(_torch_worker, [(paths, r, world, init, steps) for r in range(world)], 1,
                             timeout=120.0)
    gathered = results[0][2]
    for k in range(steps):
        parts = [gathered[r][k] for r in range(world)]
        assert sum(parts, []) == glob[k], k
        assert len(set(sum(parts, []))) == 12


# --------------------------------------------------------------------------
# transform
# --------------------------------------------------------------------------

def test_transform_runs_on_worker_threads(make):
    seen: set[str] = set()

    def record(batch):
        me = threading.current_thread()
        assert me is not threading.main_thread()
        seen.add(me.name)
        return batch

    loader = make(transform=record, transform_workers=3)
    take_ids(loader, 12, 8)
    assert seen and all(name.startswith("loaderx-transform-") for name in seen), seen
    assert threading.current_thread() is threading.main_thread()


@pytest.mark.parametrize("kind", ["tuple", "str", "none", "object", "same-dict"])
def test_transform_return_value_is_delivered_unchanged(make, kind):
    returned = {}
    sentinel = object()

    def transform(batch):
        ids = tuple(batch["id"].tolist())
        value = {"tuple": ("ids", ids), "str": "-".join(map(str, ids)), "none": None,
                 "object": sentinel, "same-dict": batch}[kind]
        returned[ids[0]] = value
        return value

    loader = make(mode=0, transform=transform, transform_workers=2)
    for k in range(6):
        got = next(loader)
        ids = tuple(sequential_ids(k, 8))
        assert got is returned[ids[0]]
        if kind == "tuple":
            assert got == ("ids", ids)
        elif kind == "str":
            assert got == "-".join(map(str, ids))
        elif kind == "same-dict":
            assert check_batch(got, 8) == list(ids)


class TransformError(Exception):
    def __init__(self, message, step):
        super().__init__(message)
        self.step = step


def failing_transform_at(bad_step: int, calls: list):
    """A transform (sequential, batch 8) raising TransformError at ``bad_step``."""
    def exploding_transform(batch):
        k = int(batch["id"][0]) // 8
        calls.append(k)
        if k == bad_step:
            raise TransformError(f"bad batch at step {k}", k)
        return batch
    return exploding_transform


@pytest.mark.parametrize("workers", [1, 4])
def test_transform_error_reaches_the_consumer_and_stops(make, workers):
    calls: list[int] = []
    loader = make(mode=0, transform=failing_transform_at(3, calls), transform_workers=workers)
    assert take_ids(loader, 3, 8) == [sequential_ids(k, 8) for k in range(3)]
    with pytest.raises(TransformError, match=r"^bad batch at step 3$") as ei:
        next(loader)
    assert ei.value.step == 3
    frames = [f.f_code.co_name for f, _ in traceback.walk_tb(ei.value.__traceback__)]
    assert "exploding_transform" in frames, frames
    for _ in range(3):
        with pytest.raises(StopIteration):
            next(loader)
    loader.close()
    loader.close()
    assert not transform_threads()


def test_transform_base_exceptions_are_delivered_too(make):
    class Stop(BaseException):
        pass

    def transform(batch):
        raise Stop("base")

    loader = make(transform=transform, transform_workers=2)
    with pytest.raises(Stop, match="base"):
        next(loader)
    with pytest.raises(StopIteration):
        next(loader)


def corrupt_record_after_open(store: Path, i: int) -> None:
    """Overwrites the zstd frame magic of record ``i`` in ``data.zr`` (in place)."""
    meta = (store / "meta.zr").read_bytes()
    offset, phys, logic = struct.unpack_from("<QII", meta, PAGE + ENTRY * i)
    with open(store / "data.zr", "r+b") as f:
        f.seek(offset)
        f.write(b"\x00\x00\x00\x00")


def test_gather_error_reaches_the_consumer(tmp_path, variant):
    paths = build_stores(tmp_path, n=N, codec_id="zstd")
    streams = open_stores(paths)
    try:
        corrupt_record_after_open(paths["id"], 9)
        with pytest.raises(ZrecordError):
            streams["id"][9]
        calls: list[int] = []
        if "transform" in variant:
            def transform(batch):
                calls.append(int(batch["id"][0]))
                return batch
            variant["transform"] = transform
        loader = DataLoader(streams, batch_size=4, mode=0, **variant)
        try:
            assert take_ids(loader, 2, 4) == [[0, 1, 2, 3], [4, 5, 6, 7]]
            with pytest.raises(ZrecordError) as ei:
                next(loader)                            # step 2 holds record 9
            assert ei.value.code == DECODE_FAILED, (ei.value.code, str(ei.value))
            assert isinstance(ei.value, RuntimeError)
            assert 8 not in calls                       # the failed step is never transformed
            with pytest.raises(StopIteration):
                next(loader)
        finally:
            loader.close()
            loader.close()
        # the good records are still readable through the streams
        assert streams["id"][8] == 8
        with DataLoader(streams, batch_size=4, mode=0, start_step=3, **variant) as after:
            assert check_batch(next(after), 4) == [12, 13, 14, 15]
    finally:
        for s in streams.values():
            s.close()


@pytest.mark.parametrize("where", ["gather-identity", "gather-transform", "transform-error"])
def test_step_after_a_failed_step_is_the_failed_step(tmp_path, where):
    """``loader.step`` counts delivered batches; a failed step is not one, so
    after the error at step k, ``step == k`` and ``start_step=loader.step``
    retries it -- the same whether or not a transform is given."""
    paths = build_stores(tmp_path, n=N, codec_id="zstd")
    streams = open_stores(paths)
    try:
        kw = {}
        if where == "gather-identity" or where == "gather-transform":
            corrupt_record_after_open(paths["id"], 9)   # step 2 of sequential batch 4
            if where == "gather-transform":
                kw = {"transform": passthrough, "transform_workers": 2}
            expected = ZrecordError
        else:
            def transform(batch):
                if int(batch["id"][0]) == 8:
                    raise TransformError("step 2", 2)
                return batch
            kw = {"transform": transform, "transform_workers": 2}
            expected = TransformError
        with DataLoader(streams, batch_size=4, mode=0, **kw) as loader:
            take_ids(loader, 2, 4)
            with pytest.raises(expected):
                next(loader)
            assert loader.step == 2
            assert loader.state_dict() == {"step": 2}
    finally:
        for s in streams.values():
            s.close()


# --------------------------------------------------------------------------
# close
# --------------------------------------------------------------------------

def test_close_is_idempotent_and_ends_iteration(make, variant):
    loader = make(**variant)
    take_ids(loader, 2)
    loader.close()
    loader.close()
    with pytest.raises(StopIteration):
        next(loader)
    assert list(loader) == []
    loader.close()
    assert "closed" in repr(loader)


def test_close_before_any_batch(make, variant):
    loader = make(**variant)
    loader.close()
    with pytest.raises(StopIteration):
        next(loader)


def test_close_wakes_a_consumer_blocked_in_next(make):
    entered = threading.Event()
    release = threading.Event()

    def stuck(batch):
        entered.set()
        release.wait(GUARD)
        return batch

    loader = make(transform=stuck, transform_workers=1, prefetch_size=1)
    t, box = in_thread(next, loader)
    assert entered.wait(GUARD)
    time.sleep(0.05)                                   # let the consumer block in next()
    assert t.is_alive()
    closer, closed = in_thread(loader.close)
    try:
        kind, value = finish(t, box, "blocked consumer after close()")
        assert kind == "err" and isinstance(value, StopIteration), box
    finally:
        release.set()
    finish(closer, closed, "close()")
    assert closed[0] == ("ok", None)
    assert not transform_threads()


def test_close_from_another_thread_while_iterating(make, variant):
    count = [0]

    def consume(loader):
        for batch in loader:
            check_batch(batch, 8)
            count[0] += 1
        return "ended"

    loader = make(**variant)
    t, box = in_thread(consume, loader)
    assert wait_until(lambda: count[0] >= 5 or not t.is_alive())
    loader.close()
    assert finish(t, box, "consumer loop after close()") == ("ok", "ended")


def _close_inside_transform_run(make, workers):
    """Step 2's transform calls ``loader.close()`` once the consumer has taken
    steps 0 and 1 and is waiting for step 2. Returns what the consumer got."""
    holder = []
    ready = threading.Event()
    closed_at = threading.Event()

    def transform(batch):
        if int(batch["id"][0]) == 16:                  # step 2 (sequential, batch 8)
            loader = holder[0] if ready.wait(GUARD) else None
            assert wait_until(lambda: loader.step == 2)
            time.sleep(0.05)                           # the consumer is now waiting in next()
            loader.close()
            closed_at.set()
        return batch

    loader = make(mode=0, transform=transform, transform_workers=workers)
    holder.append(loader)
    ready.set()
    t, box = in_thread(drain, loader)
    kind, got = finish(t, box, "consumer after close() inside the transform")
    assert kind == "ok", got
    assert closed_at.is_set()
    # whatever was delivered is a correct prefix of the sequence
    assert [check_batch(b, 8) for b in got] == [sequential_ids(k, 8) for k in range(len(got))]
    closer, done = in_thread(loader.close)
    finish(closer, done, "close() after a close() from inside the transform")
    assert wait_until(lambda: not transform_threads())
    return got


@pytest.mark.parametrize("workers", [1, 3])
def test_close_from_inside_the_transform(make, workers):
    got = _close_inside_transform_run(make, workers)
    assert len(got) in (2, 3)


def test_no_batch_is_delivered_after_close_from_inside_the_transform(make):
    got = _close_inside_transform_run(make, 1)
    assert len(got) == 2, "the batch whose transform called close() was delivered after close()"


@needs_proc
@pytest.mark.parametrize("workers", [1, 4])
def test_close_leaves_no_threads(streams, workers, variant):
    variant = {**variant, "transform_workers": workers}
    base = native_threads()
    loader = DataLoader(streams, batch_size=8, **variant)
    take_ids(loader, 5, 8)
    assert native_threads() > base
    loader.close()
    assert not transform_threads()
    assert wait_until(lambda: native_threads() <= base, 2.0), (native_threads(), base)


@needs_proc
def test_with_statement_closes(streams, variant):
    base = native_threads()
    with DataLoader(streams, batch_size=8, **variant) as loader:
        assert isinstance(loader, DataLoader)
        take_ids(loader, 3, 8)
    with pytest.raises(StopIteration):
        next(loader)
    assert not transform_threads()
    assert wait_until(lambda: native_threads() <= base, 2.0), (native_threads(), base)
    # an exception inside the block closes as well, and propagates
    with pytest.raises(KeyError):
        with DataLoader(streams, batch_size=8, **variant) as loader:
            next(loader)
            raise KeyError("boom")
    with pytest.raises(StopIteration):
        next(loader)
    assert wait_until(lambda: native_threads() <= base, 2.0), (native_threads(), base)


def test_streams_stay_open_after_close(streams, make, variant):
    loader = make(mode=0, **variant)
    take_ids(loader, 2)
    loader.close()
    for s in streams.values():
        assert not s.closed
        assert len(s) == N
    assert streams["id"][5] == 5
    np.testing.assert_array_equal(streams["tokens"][9], token(9))
    again = make(mode=0, start_step=2, **variant)
    assert take_ids(again, 2, 8) == [sequential_ids(2, 8), sequential_ids(3, 8)]


def test_load_state_dict_after_close_restarts(make, variant):
    loader = make(mode=0, **variant)
    take_ids(loader, 2)
    loader.close()
    loader.load_state_dict({"step": 4})
    assert take_ids(loader, 1, 8) == [sequential_ids(4, 8)]


# --------------------------------------------------------------------------
# bounded work
# --------------------------------------------------------------------------

def test_a_blocked_transform_stops_the_pipeline(make):
    calls = []
    release = threading.Event()

    def blocked(batch):
        calls.append(int(batch["id"][0]))
        release.wait(GUARD)
        return batch

    loader = make(mode=0, transform=blocked, transform_workers=1, prefetch_size=2)
    assert wait_until(lambda: len(calls) >= 1)
    time.sleep(0.5)
    assert calls == [0]
    release.set()
    assert take_ids(loader, 4, 8) == [sequential_ids(k, 8) for k in range(4)]


@pytest.mark.parametrize("workers", [1, 3])
def test_workers_do_not_run_ahead_of_the_consumer(make, workers):
    calls = []
    lock = threading.Lock()

    def record(batch):
        with lock:
            calls.append(int(batch["id"][0]))
        return batch

    loader = make(mode=0, transform=record, transform_workers=workers, prefetch_size=2)
    assert wait_until(lambda: len(calls) >= workers)
    time.sleep(0.3)
    assert len(calls) == workers, calls              # at most transform_workers batches held
    next(loader)
    assert wait_until(lambda: len(calls) >= workers + 1)
    time.sleep(0.2)
    assert len(calls) == workers + 1, calls


@pytest.mark.parametrize("transform", [None, "passthrough"])
def test_batch_buffers_circulate_instead_of_being_reallocated(tmp_path, transform):
    """Large batches reuse the buffers of earlier ones: after the first few,
    a loader allocates none, even when the consumer holds several batches
    and lets go of them at once (a swing the engine's default two-buffer
    cache cannot absorb; the loader reserves room for its own)."""
    from loaderx import _native

    shape = (512, 1024)  # 512 KiB records, so a batch of 4 is 2 MiB
    with Dense.create(tmp_path / "big", "uint8", shape, codec="raw") as w:
        for i in range(24):
            w.append(np.full((1, *shape), i, dtype=np.uint8))
    store = Dense.open(tmp_path / "big")
    kwargs = {} if transform is None else {"transform": passthrough}
    _, fresh0 = _native.batch_buffer_stats()
    loader = DataLoader({"x": store}, batch_size=4, prefetch_size=3, transform_workers=2,
                        mode=0, **kwargs)
    try:
        for cycle in range(20):
            held = [next(loader) for _ in range(3)]
            for k, b in enumerate(held):
                first = (12 * cycle + 4 * k) % 24
                assert b["x"][:, 0, 0].tolist() == [(first + j) % 24 for j in range(4)]
            del held, b
    finally:
        loader.close()
        store.close()
    _, fresh1 = _native.batch_buffer_stats()
    # At most every buffer alive at once: 3 prefetched (+2 in transform
    # threads) + 3 held + 1 replacing one; never one per batch.
    bound = 3 + 3 + 1 + (2 if transform else 0)
    assert fresh1 - fresh0 <= bound, (fresh0, fresh1)


# --------------------------------------------------------------------------
# garbage collection
# --------------------------------------------------------------------------

@needs_proc
def test_dropping_an_identity_loader_stops_its_threads(streams):
    base = native_threads()
    loader = DataLoader(streams, batch_size=8)
    take_ids(loader, 3, 8)
    assert native_threads() > base
    ref = weakref.ref(loader)
    del loader
    gc.collect()
    assert ref() is None
    assert wait_until(lambda: native_threads() <= base, 2.0), (native_threads(), base)
    # the streams are unaffected
    assert streams["id"][3] == 3


@needs_proc
def test_dropping_a_transform_loader_stops_its_threads(streams):
    base = native_threads()
    before = set(transform_threads())
    loader = DataLoader(streams, batch_size=8, transform=passthrough, transform_workers=2)
    take_ids(loader, 3, 8)
    ref = weakref.ref(loader)
    del loader
    gc.collect()
    try:
        assert ref() is None, "the loader was not collected"
        assert wait_until(lambda: native_threads() <= base, 2.0), (native_threads(), base)
    finally:
        # clean up what leaked, so later tests see a quiet process
        for t in set(transform_threads()) - before:
            owner = getattr(getattr(t, "_target", None), "__self__", None)
            if isinstance(owner, DataLoader):
                owner.close()
