"""Concurrency stress: shared readers under many threads, DataLoaders started
and stopped in a loop while transforms fail at random, no leaked threads or
memory, and writer/reader exclusion across processes.

Every record's values are a function of its index (Dense row ``i`` is
``i * 1000 + arange(W)``, Ragged record ``i`` is ``i * 100 + arange`` shaped
``(1 + i % 5, 3)``), so any record that comes back is checked against the
index it must have been gathered for. Every wait is bounded: a deadlock fails
the test (with all thread stacks dumped) instead of hanging the suite.
"""
from __future__ import annotations

import faulthandler
import gc
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged, ZrecordError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self")

N = 1500
W = 16
BUSY = -13
DEADLINE_S = 60.0


def dense_rows(idx) -> np.ndarray:
    idx = np.asarray(idx, dtype=np.int64)[:, None]
    return idx * 1000 + np.arange(W, dtype=np.int64)


def ragged_rec(i: int) -> np.ndarray:
    rows = 1 + i % 5
    return (i * 100 + np.arange(rows * 3, dtype=np.int32)).reshape(rows, 3)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stress")
    out = {}
    for codec in ("raw", "zstd"):
        with Dense.create(root / f"dense_{codec}", np.int64, (W,), codec=codec) as w:
            for start in range(0, N, 500):
                w.append(dense_rows(range(start, start + 500)))
        with Ragged.create(root / f"ragged_{codec}", np.int32, codec=codec) as w:
            for start in range(0, N, 500):
                w.append([ragged_rec(i) for i in range(start, start + 500)])
        out[f"dense_{codec}"] = Dense.open(root / f"dense_{codec}")
        out[f"ragged_{codec}"] = Ragged.open(root / f"ragged_{codec}")
    yield out
    for s in out.values():
        s.close()


def status_field(name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(name + ":"):
            return int(line.split()[1])
    raise KeyError(name)


def native_threads() -> int:
    return status_field("Threads")


def rss_kib() -> int:
    return status_field("VmRSS")


def loader_threads() -> set:
    """Native loader threads (by tid) and Python transform workers (by ident).

    Tests compare against the set present when they start, so loaders that
    an earlier test abandoned (and the garbage collector has not reclaimed
    yet) do not count against this module.
    """
    found = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        # (The process-wide gather pool's threads, "loaderx-<n>", stay.)
        if comm.startswith("loaderx-loader"):
            found.add(("native", int(task.name), comm))
    for t in threading.enumerate():
        if t.name.startswith("loaderx-transform-"):
            found.add(("python", t.ident, t.name))
    return found


def no_new_loader_threads(before: set) -> bool:
    return not (loader_threads() - before)


def wait_until(cond, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def check_batch(batch: dict, batch_size: int) -> None:
    """All streams must hold the records of one and the same index batch."""
    idx = batch["dense_raw"][:, 0] // 1000
    assert len(idx) == batch_size
    assert ((idx >= 0) & (idx < N)).all()
    np.testing.assert_array_equal(batch["dense_raw"], dense_rows(idx))
    np.testing.assert_array_equal(batch["dense_zstd"], dense_rows(idx))
    for name in ("ragged_raw", "ragged_zstd"):
        recs = batch[name]
        assert len(recs) == batch_size
        for i, rec in zip(idx, recs):
            np.testing.assert_array_equal(rec, ragged_rec(int(i)))


class TransformFailed(ValueError):
    pass


def run_threads(targets, timeout: float = DEADLINE_S) -> None:
    errors: list[BaseException] = []

    def wrap(fn, *args):
        try:
            fn(*args)
        except BaseException as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=wrap, args=(fn, *args), daemon=True, name=f"stress-{k}")
               for k, (fn, *args) in enumerate(targets)]
    for t in threads:
        t.start()
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        faulthandler.dump_traceback(all_threads=True)
        pytest.fail(f"deadlock: threads {alive} still running after {timeout} s")
    if errors:
        raise errors[0]


def test_threads_gather_while_loaders_churn(stores):
    dense = [stores["dense_raw"], stores["dense_zstd"]]
    ragged = [stores["ragged_raw"], stores["ragged_zstd"]]
    # Warm up the pools (gather threads, decoder contexts) before the baseline.
    gc.collect()
    before = loader_threads()
    for s in dense + ragged:
        s[np.arange(0, N, 7)]
    with DataLoader(stores, transform_workers=2, batch_size=8, transform=lambda b: b) as dl:
        next(dl)
    assert wait_until(lambda: no_new_loader_threads(before))
    baseline = native_threads()

    def gatherer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            idx = np.array([rng.randrange(N) for _ in range(rng.randrange(1, 96))], dtype=np.int64)
            if rng.random() < 0.5:
                got = rng.choice(dense)[idx]
                np.testing.assert_array_equal(got, dense_rows(idx))
            else:
                got = rng.choice(ragged)[idx]
                for i, rec in zip(idx, got):
                    np.testing.assert_array_equal(rec, ragged_rec(int(i)))
            one = rng.randrange(N)
            np.testing.assert_array_equal(rng.choice(dense)[one], dense_rows([one])[0])

    def churner(seed: int) -> None:
        rng = random.Random(seed)
        for cycle in range(50):
            fail_at = rng.choice([None, None, 0, 1, 2, 3])
            calls = {"n": 0}
            lock = threading.Lock()

            def transform(batch):
                with lock:
                    k = calls["n"]
                    calls["n"] += 1
                if fail_at is not None and k >= fail_at:
                    raise TransformFailed(f"transform failure {seed}/{cycle}")
                check_batch(batch, 12)
                return batch

            dl = DataLoader(stores, transform_workers=rng.choice([1, 2, 3]), batch_size=12,
                            prefetch_size=rng.choice([1, 2, 4]), mode=rng.choice([0, 1, 2]),
                            seed=rng.randrange(2**32), transform=transform)
            try:
                for _ in range(rng.randrange(1, 6)):
                    try:
                        check_batch(next(dl), 12)
                    except TransformFailed:
                        failures.append(seed)
                        # The failure stops the loader; it is closed now.
                        with pytest.raises(StopIteration):
                            next(dl)
                        break
            finally:
                dl.close()
            dl.close()

    failures: list[int] = []
    targets = [(gatherer, 100 + k) for k in range(5)] + [(churner, 200 + k) for k in range(3)]
    run_threads(targets)
    assert len(failures) >= 5, "the transforms were meant to fail now and then"

    assert wait_until(lambda: no_new_loader_threads(before)), loader_threads() - before
    assert wait_until(lambda: native_threads() <= baseline), (native_threads(), baseline)


def test_loader_cycles_keep_memory_flat(stores):
    def cycle(k: int) -> None:
        transform = (lambda b: b) if k % 2 else None
        dl = DataLoader(stores, transform_workers=2, batch_size=32, prefetch_size=2,
                        mode=k % 3, seed=k, transform=transform)
        for _ in range(3):
            check_batch(next(dl), 32)
        dl.close()

    gc.collect()
    before = loader_threads()
    for k in range(40):  # warm-up: allocator arenas, decoder pools, pool threads
        cycle(k)
    assert wait_until(lambda: no_new_loader_threads(before))
    threads0, rss0 = native_threads(), rss_kib()
    for k in range(300):
        cycle(k)
    assert wait_until(lambda: no_new_loader_threads(before)), loader_threads() - before
    growth_mib = (rss_kib() - rss0) / 1024
    assert growth_mib < 50, f"RSS grew {growth_mib:.1f} MiB over 300 loader cycles"
    assert wait_until(lambda: native_threads() <= threads0), (native_threads(), threads0)


def test_failing_transform_raises_original_error_and_stops(stores):
    def transform(batch):
        raise TransformFailed("boom")

    gc.collect()
    before = loader_threads()
    dl = DataLoader(stores, transform_workers=3, batch_size=4, transform=transform)
    with pytest.raises(TransformFailed, match="boom"):
        next(dl)
    with pytest.raises(StopIteration):
        next(dl)
    dl.close()
    assert wait_until(lambda: no_new_loader_threads(before)), loader_threads() - before


WRITER = textwrap.dedent(
    r"""
    import sys, numpy as np
    from loaderx.zrecord import Dense
    path, n = sys.argv[1], int(sys.argv[2])
    w = Dense.create(path, np.int64, (8,), codec="zstd")
    print("created", flush=True)
    step = 0
    # Keep appending until told to close.
    import select
    while not select.select([sys.stdin], [], [], 0)[0]:
        i = np.arange(step * n, (step + 1) * n, dtype=np.int64)[:, None]
        w.append(i * 10 + np.arange(8, dtype=np.int64))
        step += 1
    sys.stdin.readline()
    w.close()
    print(f"closed {step * n}", flush=True)
    """
)

READER = textwrap.dedent(
    r"""
    import json, sys, time
    from loaderx.zrecord import Dense, ZrecordError
    path, tries = sys.argv[1], int(sys.argv[2])
    codes, opened = {}, 0
    for _ in range(tries):
        try:
            Dense.open(path).close()
            opened += 1
        except ZrecordError as e:
            codes[str(e.code)] = codes.get(str(e.code), 0) + 1
            assert "busy" in str(e) or "being written" in str(e), str(e)
        time.sleep(0.001)
    print(json.dumps({"codes": codes, "opened": opened}), flush=True)
    """
)


def test_reader_process_is_refused_while_a_writer_holds_the_store(tmp_path):
    path = tmp_path / "busy"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "64"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "created"
        # Another process tries to open while the writer appends.
        out = subprocess.run([sys.executable, "-c", READER, str(path), "200"],
                             capture_output=True, text=True, timeout=DEADLINE_S)
        assert out.returncode == 0, out.stderr
        result = json.loads(out.stdout)
        assert result == {"codes": {str(BUSY): 200}, "opened": 0}, result
        # So does this process.
        with pytest.raises(ZrecordError) as info:
            Dense.open(path)
        assert info.value.code == BUSY
        writer.stdin.write("close\n")
        writer.stdin.flush()
        line = writer.stdout.readline().split()
        assert line[0] == "closed", line
        total = int(line[1])
        assert writer.wait(timeout=DEADLINE_S) == 0
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    # After close the store opens, complete.
    with Dense.open(path) as ds:
        assert len(ds) == total
        got = ds[0:total]
    i = np.arange(total, dtype=np.int64)[:, None]
    np.testing.assert_array_equal(got, i * 10 + np.arange(8, dtype=np.int64))


def test_writer_is_refused_while_a_reader_process_holds_the_store(tmp_path):
    path = tmp_path / "held"
    with Dense.create(path, np.int64, (2,), codec="raw") as w:
        w.append(np.arange(8, dtype=np.int64).reshape(4, 2))
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from loaderx.zrecord import Dense; d = Dense.open(sys.argv[1]); "
         "print('open', flush=True); sys.stdin.readline(); d.close()", str(path)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(ZrecordError) as info:
            Dense.create(path, np.int64, (2,), codec="raw")
        assert info.value.code == BUSY
        # Readers share.
        with Dense.open(path) as ds:
            np.testing.assert_array_equal(ds[3], [6, 7])
    finally:
        holder.stdin.close()
        holder.wait(timeout=DEADLINE_S)
