"""DataLoader(..., workers="process"): transforms in worker processes that
map the batches the loader gathers into shared memory (issue #10).

What must hold: the batches are those of thread workers, in step order, so
resume is exact; exceptions, a killed worker and an unpicklable transform
give clear errors naming the step; close() and Ctrl-C stop the workers
promptly; no process and no shared memory outlives the loader, even when
its process is SIGKILLed.

Transforms are module-level functions, so they pickle by reference for
spawn and forkserver workers.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from loaderx.dataloader import DataLoader, Mixture, TransformWorkerError
from loaderx.zrecord import Dense, Ragged

N = 40
SHAPE = (3, 4, 5)
GUARD = 20.0  # seconds; only reached when something hangs

# start_method="fork" is tested on purpose: JAX (imported by other tests)
# warns about any fork of a process that has its threads.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")
REPO = Path(__file__).resolve().parents[1]


def token(i: int) -> np.ndarray:
    return np.arange(i % 5 + 1, dtype=np.int32) + i


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("procs")
    with Dense.create(root / "id", np.int64, (), codec="raw") as w:
        w.append(np.arange(N, dtype=np.int64))
    with Dense.create(root / "image", np.uint8, SHAPE, codec="zstd") as w:
        w.append(np.stack([np.full(SHAPE, i, np.uint8) for i in range(N)]))
    with Ragged.create(root / "tokens", np.int32, codec="zstd") as w:
        w.append(token(i) for i in range(N))
    opened = {
        "id": Dense.open(root / "id"),
        "image": Dense.open(root / "image"),
        "tokens": Ragged.open(root / "tokens"),
    }
    yield opened
    for s in opened.values():
        s.close()


# -- transforms (module level: picklable by reference) -------------------------


def same(batch):
    return batch


def scale(batch):
    """New arrays, a renamed key, a list and a scalar: everything but views."""
    return {
        "id": batch["id"] * 10,
        "pixels": batch["image"].astype(np.float32) / 2,
        "lengths": [len(t) for t in batch["tokens"]],
        "first": float(batch["image"][0, 0, 0, 0]),
    }


def views(batch):
    """Views of the gathered memory, reshaped and sliced."""
    return {
        "flat": batch["image"].reshape(len(batch["id"]), -1),
        "red": batch["image"][:, 0],
        "id": batch["id"],
    }


def as_tuple(batch):
    return batch["id"].tolist(), batch["tokens"]


def fail_at_step_3(batch):
    if 3 * 8 in batch["id"].tolist():  # mode 0, batch 8: step 3 holds id 24
        raise KeyError("no such label: 24")
    return batch


def die_at_step_2(batch):
    if 2 * 8 in batch["id"].tolist():
        os.kill(os.getpid(), signal.SIGKILL)
    return batch


def exit_at_step_1(batch):
    if 8 in batch["id"].tolist():
        os._exit(3)
    return batch


def sleep_long(batch):
    time.sleep(60)
    return batch


def unpicklable_result(batch):
    return {"gen": (i for i in range(3))}


class TwoArgError(Exception):
    """Pickles, but cannot be rebuilt from its args (a custom __init__)."""

    def __init__(self, what, why):
        super().__init__(f"{what}: {why}")


def raise_unrebuildable(batch):
    raise TwoArgError("label", "missing")


def whose_pid(batch):
    return {"pid": np.array([os.getpid()]), "id": batch["id"]}


class Offset:
    """A picklable callable object with state."""

    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, batch):
        return {"id": batch["id"] + self.k}


# -- helpers --------------------------------------------------------------------


def loader(stores, transform, **kw):
    kw.setdefault("batch_size", 8)
    kw.setdefault("transform_workers", 2)
    kw.setdefault("mode", 2)
    return DataLoader(stores, transform=transform, **kw)


def equal(a, b) -> None:
    """Deep equality of transform results (dicts, lists, tuples, arrays, scalars)."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            equal(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.flags.writeable and b.flags.writeable  # as every array a loader hands out
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout: float = 5.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def memfds(pid: int | str = "self") -> int:
    """Shared-memory files this process holds open."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("/memfd:loaderx"):
                n += 1
        except OSError:
            pass
    return n


def mapped_memfds(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/maps") as f:
        return sum("/memfd:loaderx" in line for line in f)


def named_shm(pid: int | str = "self") -> set[str]:
    """Named shared memory (files in /dev/shm) process ``pid`` has mapped or
    open; loaderx uses anonymous files only, which no crash can leave behind."""
    names = set()
    with open(f"/proc/{pid}/maps") as f:
        names |= {line.split()[-1] for line in f if "/dev/shm/" in line}
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/"):
            names.add(target)
    return names


def worker_pids(dl) -> list[int]:
    return dl._pipe.procs.pids()


# -- the same batches as threads ----------------------------------------------------


CASES = [
    *((m, t) for m in ("forkserver", "spawn", "fork") for t in (same, scale)),
    *(("forkserver", t) for t in (views, as_tuple, Offset(7))),
]


@pytest.mark.parametrize(
    ("start_method", "transform"), CASES, ids=[f"{m}-{getattr(t, '__name__', 'Offset')}" for m, t in CASES]
)
def test_process_workers_deliver_the_thread_workers_batches(stores, start_method, transform):
    with (
        loader(stores, transform) as threads,
        loader(stores, transform, workers="process", start_method=start_method) as procs,
    ):
        for _ in range(12):
            equal(next(procs), next(threads))
        assert procs.step == 12


def test_batches_come_from_both_workers_in_step_order(stores):
    with loader(stores, whose_pid, workers="process", mode=0) as dl:
        pids = worker_pids(dl)
        seen = set()
        for step in range(10):
            batch = next(dl)
            assert batch["id"].tolist() == [(step * 8 + j) % N for j in range(8)]
            seen.add(int(batch["pid"][0]))
        assert seen == set(pids) and len(pids) == 2


def test_identity_results_are_the_gathered_memory_not_copies(stores):
    with loader(stores, views, workers="process") as dl:
        procs = dl._pipe.procs
        lo, hi = procs.arena.ptr, procs.arena.end
        for _ in range(6):
            batch = next(dl)
            for name in ("flat", "red", "id"):
                ptr = batch[name].__array_interface__["data"][0]
                assert lo <= ptr < hi, name
            np.testing.assert_array_equal(batch["red"], batch["flat"][:, :20].reshape(-1, 4, 5))
            np.testing.assert_array_equal(batch["red"][:, 0, 0], batch["id"].astype(np.uint8))


def test_results_held_by_the_consumer_stay_intact(stores):
    """Results kept past the loader's bound fall back to copies, never to
    memory the loader reuses; big results come through reused shared files."""
    with (
        loader(stores, views, workers="process", mode=0) as dl,
        loader(stores, scale, workers="process", mode=0) as big,
    ):
        kept = [next(dl) for _ in range(25)]
        kept_big = [next(big) for _ in range(25)]
    for step, (a, b) in enumerate(zip(kept, kept_big, strict=True)):
        ids = [(step * 8 + j) % N for j in range(8)]
        assert a["id"].tolist() == ids
        np.testing.assert_array_equal(a["red"][:, 0, 0], np.array(ids, np.uint8))
        assert b["id"].tolist() == [i * 10 for i in ids]
        np.testing.assert_array_equal(b["pixels"][:, 0, 0, 0], np.array(ids, np.float32) / 2)


def test_large_results_travel_through_shared_files_that_are_reused(stores, tmp_path):
    with Dense.create(tmp_path / "big", np.uint8, (256, 1024), codec="raw") as w:
        w.append(np.stack([np.full((256, 1024), i, np.uint8) for i in range(16)]))
    big = Dense.open(tmp_path / "big")
    gc.collect()
    fds0, maps0 = memfds(), mapped_memfds()
    try:
        with DataLoader(
            {"x": big}, batch_size=4, transform=halve, transform_workers=2, workers="process", mode=0
        ) as dl:
            for step in range(30):
                batch = next(dl)
                ids = [(step * 4 + j) % 16 for j in range(4)]
                np.testing.assert_array_equal(batch["x"][:, 0, 0], np.array(ids, np.float32) / 2)
                del batch
            # Each direction of each worker's socket keeps a few files; a
            # file per batch would have made ~30.
            assert mapped_memfds() <= 1 + 2 * 2 * 3
            # Descriptors are closed once passed (Python's mmap keeps a
            # duplicate of its own until the mapping is closed).
            assert memfds() - fds0 <= mapped_memfds() - maps0
    finally:
        big.close()
    del dl
    gc.collect()
    assert (memfds(), mapped_memfds()) == (fds0, maps0)


def halve(batch):
    return {"x": batch["x"].astype(np.float32) / 2}


def test_mixture_finite_pass_and_packed_streams(stores):
    a = {"id": stores["id"], "tokens": stores["tokens"]}
    mix = Mixture({"a": (a, 1), "b": (a, 1)}, source_stream="src")
    kw = dict(batch_size=8, mode=0, packed=["tokens"], transform_workers=2)
    with (
        DataLoader(mix, transform=same, **kw) as t,
        DataLoader(mix, transform=same, workers="process", **kw) as p,
    ):
        for _ in range(6):
            equal(next(p), next(t))
    kw = dict(batch_size=16, mode=2, epochs=2, transform_workers=2)
    with (
        DataLoader(stores, transform=same, **kw) as t,
        DataLoader(stores, transform=same, workers="process", **kw) as p,
    ):
        assert len(p) == len(t) == 6
        got, want = list(p), list(t)
    assert len(got) == 6
    for x, y in zip(got, want, strict=True):
        equal(x, y)
    assert got[2]["mask"].tolist() == [True] * 8 + [False] * 8


# -- resume -----------------------------------------------------------------------


def test_resume_from_step_is_exact(stores):
    with loader(stores, scale, workers="process") as dl:
        for _ in range(7):
            next(dl)
        step = dl.step
        rest = [next(dl) for _ in range(5)]
    assert step == 7
    with loader(stores, scale, workers="process", start_step=step) as resumed:
        for want in rest:
            equal(next(resumed), want)
    with loader(stores, scale) as threads:
        threads.load_state_dict({"step": step})
        for want in rest:
            equal(next(threads), want)


def test_load_state_dict_restarts_the_workers(stores):
    with loader(stores, same, workers="process", mode=0) as dl:
        first = worker_pids(dl)
        next(dl)
        dl.load_state_dict({"step": 4})
        assert wait_gone(first) == []
        assert next(dl)["id"].tolist() == [(32 + j) % N for j in range(8)]
        assert set(worker_pids(dl)).isdisjoint(first)


# -- errors -------------------------------------------------------------------------


def test_a_transform_exception_is_raised_at_its_step_with_the_worker_traceback(stores):
    dl = loader(stores, fail_at_step_3, workers="process", mode=0)
    for step in range(3):
        assert next(dl)["id"].tolist() == [step * 8 + j for j in range(8)]
    with pytest.raises(KeyError, match="no such label: 24") as info:
        next(dl)
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "in transform worker process" in notes and "transforming step 3" in notes
    assert "fail_at_step_3" in notes
    with pytest.raises(StopIteration):
        next(dl)
    dl.close()


def test_a_killed_worker_is_an_error_naming_the_step_not_a_hang(stores):
    dl = loader(stores, die_at_step_2, workers="process", mode=0)
    pids = worker_pids(dl)
    assert next(dl)["id"].tolist() == list(range(8))
    assert next(dl)["id"].tolist() == list(range(8, 16))
    t0 = time.monotonic()
    with pytest.raises(TransformWorkerError, match=r"was killed by SIGKILL .*while transforming step 2"):
        next(dl)
    assert time.monotonic() - t0 < GUARD
    dl.close()
    assert wait_gone(pids) == []


def test_a_worker_that_exits_is_an_error(stores):
    with loader(stores, exit_at_step_1, workers="process", mode=0, transform_workers=1) as dl:
        next(dl)
        with pytest.raises(TransformWorkerError, match="exited with status 3 while transforming step 1"):
            next(dl)


def test_an_exception_that_cannot_be_rebuilt_arrives_as_a_runtime_error_with_its_text(stores):
    with (
        loader(stores, raise_unrebuildable, workers="process", mode=0) as dl,
        pytest.raises(RuntimeError, match=r"^TwoArgError: label: missing") as info,
    ):
        next(dl)
    assert "transforming step 0" in "".join(getattr(info.value, "__notes__", []))


def test_a_result_that_cannot_be_pickled_is_an_error_of_its_step(stores):
    with (
        loader(stores, unpicklable_result, workers="process", mode=0) as dl,
        pytest.raises(TypeError, match="generator") as info,
    ):
        next(dl)
    assert "sending the result of step 0" in "".join(getattr(info.value, "__notes__", []))


def test_an_unpicklable_transform_is_refused_up_front_except_with_fork(stores):
    offset = 3
    with pytest.raises(
        TypeError, match=r"workers='process' with start_method='forkserver' .*cannot be pickled"
    ):
        loader(stores, lambda b: b, workers="process")
    with pytest.raises(TypeError, match="start_method='spawn'"):
        loader(stores, lambda b: b, workers="process", start_method="spawn")
    with loader(
        stores, lambda b: {"id": b["id"] + offset}, workers="process", start_method="fork", mode=0
    ) as dl:
        assert next(dl)["id"].tolist() == [3 + j for j in range(8)]


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"workers": "processes"}, "workers must be 'thread' or 'process', got 'processes'"),
        ({"workers": "thread", "start_method": "spawn"}, "start_method applies to workers='process' only"),
        ({"workers": "process", "start_method": "vfork"}, "start_method must be one of"),
    ],
)
def test_worker_arguments_are_checked(stores, kw, error):
    with pytest.raises(ValueError, match=error):
        loader(stores, same, **kw)


def test_without_a_transform_no_process_is_started(stores):
    with DataLoader(stores, batch_size=8, workers="process") as dl:
        assert dl._pipe.procs is None
        assert len(next(dl)["id"]) == 8


# -- stopping ------------------------------------------------------------------------


def test_close_is_prompt_and_leaves_no_process_or_shared_memory(stores):
    gc.collect()
    fds0, maps0 = memfds(), mapped_memfds()
    shm0 = named_shm()
    dl = loader(stores, sleep_long, workers="process")
    pids = worker_pids(dl)
    time.sleep(0.5)  # both workers are inside a 60 s transform
    assert [named_shm(p) for p in pids] == [set(), set()]
    assert mapped_memfds(pids[0]) >= 1  # the arena
    t0 = time.monotonic()
    dl.close()
    assert time.monotonic() - t0 < 1.0
    assert wait_gone(pids, 3.0) == []
    del dl
    gc.collect()
    assert memfds() == fds0
    assert mapped_memfds() == maps0
    assert named_shm() == shm0


def test_an_abandoned_loader_stops_its_workers(stores):
    dl = loader(stores, same, workers="process")
    next(dl)
    pids = worker_pids(dl)
    del dl
    gc.collect()
    assert wait_gone(pids) == []


_CHILD = textwrap.dedent(
    """
    import os, sys, time
    import numpy as np
    sys.path.insert(0, {tests!r})
    from test_process_workers import same, sleep_long
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    def main():
        store = Dense.open({path!r})
        dl = DataLoader({{"id": store}}, batch_size=4, transform={transform}, transform_workers=2,
                        workers="process", start_method={method!r})
        print(" ".join(map(str, dl._pipe.procs.pids())), flush=True)
        if {transform!r} == "same":
            for _ in range(3):
                next(dl)
        print("ready", flush=True)
        next(dl)

    if __name__ == "__main__":
        main()
    """
)


def _child(tmp_path, stores, transform: str, method: str):
    script = tmp_path / "child.py"
    store = stores["id"]
    script.write_text(
        _CHILD.format(
            tests=str(Path(__file__).parent), path=str(store.path), transform=transform, method=method
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert proc.stdout.readline().strip() == "ready"
    return proc, pids


@pytest.mark.parametrize("method", ["forkserver", "fork"])
def test_workers_end_when_the_loader_process_is_sigkilled(tmp_path, stores, method):
    proc, pids = _child(tmp_path, stores, "sleep_long", method)
    assert len(pids) == 2 and all(alive(p) for p in pids)
    assert [named_shm(p) for p in (proc.pid, *pids)] == [set(), set(), set()]
    proc.kill()
    proc.wait(GUARD)
    # The workers see the loader's process gone within a fraction of a
    # second, even in the middle of a 60 s transform.
    assert wait_gone(pids, 5.0) == []


def test_ctrl_c_while_waiting_stops_the_loader_and_its_workers(tmp_path, stores):
    proc, pids = _child(tmp_path, stores, "sleep_long", "forkserver")
    time.sleep(0.3)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=GUARD)
    assert time.monotonic() - t0 < 5.0
    assert proc.returncode != 0  # KeyboardInterrupt ended the script
    assert wait_gone(pids, 5.0) == []


# -- the memory bound -------------------------------------------------------------


def passthrough(batch):
    return batch


def slow_passthrough(batch):
    time.sleep(0.005)
    return batch


def _count_alive(tmp_path, regions_delta: int, transform, prefetch: int, n: int, hold: float, **kw):
    """Runs a loader whose Dense batches can only live in a pool of exactly
    ``documented bound + regions_delta`` regions; returns how many batches
    found no free region (0: the bound held)."""
    from loaderx import _native

    shape = (64, 64)
    path = tmp_path / f"bound-{prefetch}-{n}-{regions_delta}-{hold}"
    with Dense.create(path, np.uint8, shape, codec="raw") as w:
        w.append(np.stack([np.full(shape, i, np.uint8) for i in range(32)]))
    store = Dense.open(path)
    dl = DataLoader(
        {"x": store},
        batch_size=4,
        prefetch_size=prefetch,
        transform_workers=n,
        transform=transform,
        mode=0,
        **kw,
    )
    bound = dl._batches_alive()
    pool = _native.LentPool()
    for _ in range(bound + regions_delta):
        pool.lend(np.zeros(4 * 64 * 64, np.uint8))
    dl._lend(pool)
    try:
        batch = next(dl)
        for step in range(1, 30):
            # The consumer keeps its previous batch while it asks for the
            # next one, and a while after, as a for loop does at the instant
            # it is handed a batch: the most a loop holds, made to last.
            previous, batch = batch, next(dl)
            assert batch["x"][:, 0, 0].tolist() == [(step * 4 + j) % 32 for j in range(4)]
            time.sleep(hold)
            del previous
    finally:
        dl.close()
        store.close()
    lent, fallback, _ = pool.stats()
    assert lent + fallback >= 30
    return bound, fallback


@pytest.mark.parametrize(("prefetch", "workers"), [(4, 2), (1, 4), (2, 1), (6, 1)])
@pytest.mark.parametrize("transform", [None, passthrough, slow_passthrough], ids=["none", "fast", "slow"])
def test_batches_alive_never_exceed_the_documented_bound(tmp_path, prefetch, workers, transform):
    bound, fallback = _count_alive(tmp_path, 0, transform, prefetch, workers, hold=0.02)
    if transform is None:
        assert bound == max(prefetch, 2) + 1
    else:
        assert bound == max(prefetch + 1, workers + 3)
    assert fallback == 0


@pytest.mark.parametrize("transform", [None, passthrough], ids=["none", "transform"])
def test_the_documented_bound_is_reached(tmp_path, transform):
    """One region fewer than the bound is not enough for a slow consumer:
    the bound is exact, not a loose ceiling."""
    _, fallback = _count_alive(tmp_path, -1, transform, 4, 2, hold=0.03)
    assert fallback > 0


def test_process_workers_keep_the_same_bound(tmp_path):
    bound, fallback = _count_alive(tmp_path, 0, passthrough, 4, 2, hold=0.02, workers="process")
    assert (bound, fallback) == (5, 0)
