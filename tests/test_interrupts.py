"""Interrupts and close() never wait for a running transform or gather.

Ctrl-C (SIGINT), a SIGTERM handler raising SystemExit, or any exception in
the consumer's thread reach the caller at once, and the interpreter exits
promptly after them; ``close()`` returns promptly and leaves a running
transform call behind, whose result is then discarded. The signal tests run
real child interpreters; every transform that would otherwise hold a test up
is "slow" only until released.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import loaderx_child_env
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

# A consumer of a loader whose transform is fast for step 0 and slow (sleeps
# sleep_s seconds) for the steps after it; it reports each stage on stdout.
# With where=body the consumer sleeps as long in its loop body.
#   argv: store batch_size where(next|body) sigterm(0|1) workers sleep_s
CHILD = textwrap.dedent(
    """
    import os, signal, sys, time
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    path, batch_size, where, sigterm, workers, sleep_s = sys.argv[1:7]
    if sigterm == "1":
        def on_term(signum, frame):
            raise SystemExit(3)
        signal.signal(signal.SIGTERM, on_term)

    def say(line):                          # one write: lines from two threads never mix
        os.write(1, (line + "\\n").encode())

    def slow(batch):
        if int(batch["x"].flat[0]) == 0:    # step 0 (sequential)
            return batch
        say("IN_TRANSFORM")
        time.sleep(float(sleep_s))
        return batch

    loader = DataLoader({"x": Dense.open(path)}, batch_size=int(batch_size), mode=0,
                        transform=slow, transform_workers=int(workers), prefetch_size=4)
    for i, batch in enumerate(loader):
        say(f"GOT {i}")
        if where == "body":
            time.sleep(float(sleep_s))
    """
)

SLOW_S = 30.0
BOUND_S = 2.0


def small_store(path: Path) -> Path:
    with Dense.create(path, np.int64, (), codec="raw") as w:
        w.append(np.arange(64, dtype=np.int64))
    return path


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> Path:
    """uint8 (3, 224, 224) x 1,000 records (record i filled with i % 251):
    38.5 MB batches of 256."""
    path = tmp_path_factory.mktemp("interrupts") / "big"
    with Dense.create(path, np.uint8, (3, 224, 224), codec="raw") as w:
        for i in range(0, 1000, 125):
            values = (np.arange(i, i + 125) % 251).astype(np.uint8)
            w.append(np.broadcast_to(values[:, None, None, None], (125, 3, 224, 224)))
    return path


def interrupt_child(store: Path, sig: int, *, batch_size: int = 8, where: str = "next",
                    workers: int = 2) -> tuple[subprocess.CompletedProcess, float, str]:
    """Starts CHILD, waits until the consumer is blocked in next() on a slow
    step (``where="next"``) or sleeping in its loop body while a transform
    runs (``"body"``), sends ``sig`` and returns (result, seconds from the
    signal to the child's exit, stdout)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(store), str(batch_size), where,
         "1" if sig == signal.SIGTERM else "0", str(workers), str(SLOW_S)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=loaderx_child_env())
    guard = threading.Timer(60, proc.kill)  # a child that never gets going fails the test
    guard.start()
    try:
        seen: list[str] = []
        while not ("GOT 0" in seen and "IN_TRANSFORM" in seen):
            line = proc.stdout.readline()
            assert line, f"child never got going: {seen}\n{proc.stderr.read()}"
            seen.append(line.strip())
        guard.cancel()
        time.sleep(0.3)                      # the consumer now waits in next() (or sleeps)
        assert proc.poll() is None
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=SLOW_S + 30)
        elapsed = time.monotonic() - t0
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    out = "\n".join(seen) + "\n" + out
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), elapsed, out


def assert_keyboard_interrupt(res: subprocess.CompletedProcess, elapsed: float, where: str) -> None:
    # An unhandled KeyboardInterrupt makes Python exit by SIGINT (3.8+).
    assert res.returncode == -signal.SIGINT, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):", res.stderr
    assert lines[-1] == "KeyboardInterrupt", res.stderr
    if where == "next":                      # raised while waiting in the loader
        assert "in __next__" in res.stderr, res.stderr
    assert "Exception in thread" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr
    assert elapsed < BOUND_S, f"exited {elapsed:.2f} s after SIGINT (transform sleeps {SLOW_S} s)"


@pytest.mark.parametrize("where", ["next", "body"])
def test_sigint_during_a_slow_transform_exits_promptly(tmp_path, where):
    store = small_store(tmp_path / "s")
    res, elapsed, out = interrupt_child(store, signal.SIGINT, where=where)
    assert_keyboard_interrupt(res, elapsed, where)
    assert "GOT 1" not in out


def test_sigterm_handler_raising_systemexit_exits_promptly(tmp_path):
    store = small_store(tmp_path / "s")
    res, elapsed, out = interrupt_child(store, signal.SIGTERM)
    assert res.returncode == 3, (res.returncode, res.stderr)
    assert res.stderr == "", res.stderr      # SystemExit prints nothing, and nothing else does
    assert elapsed < BOUND_S, f"exited {elapsed:.2f} s after SIGTERM (transform sleeps {SLOW_S} s)"
    assert "GOT 1" not in out


def test_sigint_with_large_batches_exits_promptly(big_store):
    res, elapsed, out = interrupt_child(big_store, signal.SIGINT, batch_size=256, workers=4)
    assert_keyboard_interrupt(res, elapsed, "next")
    assert "GOT 1" not in out


# --------------------------------------------------------------------------
# in process: close() and consumer exceptions
# --------------------------------------------------------------------------

def transform_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("loaderx-transform-")]


def wait_until(predicate, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)
    return True


class Slow:
    """A transform taking up to ``seconds`` for every step but ``fast``, unless
    released earlier; after the wait it returns a marker (even steps) or
    raises (odd steps)."""

    def __init__(self, seconds: float = 8.0, fast: tuple[int, ...] = ()) -> None:
        self.seconds = seconds
        self.fast = fast
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.entered: list[int] = []
        self.finished: list[int] = []

    def __call__(self, batch):
        step = int(batch["x"][0]) // 8               # sequential, batch 8
        with self.lock:
            self.entered.append(step)
        if step in self.fast:
            return batch
        self.release.wait(self.seconds)
        with self.lock:
            self.finished.append(step)
        if step % 2:
            raise RuntimeError(f"late failure of step {step}")
        return {"late": step}


@pytest.fixture
def store(tmp_path):
    s = Dense.open(small_store(tmp_path / "s"))
    yield s
    s.close()


@pytest.fixture
def thread_errors(monkeypatch):
    """Exceptions that escape any thread (reported by threading.excepthook)."""
    seen: list = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    return seen


def test_close_during_a_slow_transform_returns_promptly_and_discards_its_result(
        store, capfd, thread_errors):
    slow = Slow(seconds=8.0)
    loader = DataLoader({"x": store}, batch_size=8, mode=0, transform=slow,
                        transform_workers=2, prefetch_size=4)
    try:
        assert wait_until(lambda: len(slow.entered) == 2, 10)   # both workers in an 8 s call
        t0 = time.monotonic()
        loader.close()
        elapsed = time.monotonic() - t0
        assert elapsed < 1.0, f"close() took {elapsed:.2f} s during an 8 s transform"
        assert len(transform_threads()) == 2              # abandoned, not waited for
        with pytest.raises(StopIteration):
            next(loader)
        slow.release.set()                                # the calls return (step 1 raises)
        t1 = time.monotonic()
        assert wait_until(lambda: not transform_threads(), 1.0), \
            "a transform thread outlived its call"
        assert time.monotonic() - t1 < 1.0
        assert sorted(slow.finished) == [0, 1]
        assert sorted(slow.entered) == [0, 1]             # no transform started after close()
        with pytest.raises(StopIteration):
            next(loader)                                  # nothing delivered
        assert loader._pipe.done == {}                    # nothing parked either
        assert loader.step == 0
    finally:
        slow.release.set()
        loader.close()
    assert thread_errors == []
    captured = capfd.readouterr()
    assert captured.err == "", captured.err               # the late error is not printed


def test_close_in_a_child_prints_nothing_after_the_abandoned_transform_ends(tmp_path):
    """The same, in a fresh interpreter that stays until the abandoned 8 s
    call has returned (and raised), then exits normally."""
    store = small_store(tmp_path / "s")
    code = textwrap.dedent(
        """
        import sys, threading, time
        from loaderx.dataloader import DataLoader
        from loaderx.zrecord import Dense
        release = threading.Event()
        done = threading.Event()
        entered = threading.Event()
        def slow(batch):
            entered.set()
            release.wait(8)
            done.set()
            raise RuntimeError("late failure")
        loader = DataLoader({"x": Dense.open(sys.argv[1])}, batch_size=8, transform=slow,
                            transform_workers=1, prefetch_size=2)
        assert entered.wait(10)
        t0 = time.monotonic()
        loader.close()
        print(f"close {time.monotonic() - t0:.3f}", flush=True)
        release.set()
        assert done.wait(5)
        t1 = time.monotonic()
        while any(t.name.startswith("loaderx-transform-") for t in threading.enumerate()):
            assert time.monotonic() - t1 < 1, "the transform thread outlived its call"
            time.sleep(0.005)
        try:
            next(loader)
        except StopIteration:
            print("stopped", flush=True)
        """
    )
    res = subprocess.run([sys.executable, "-c", code, str(store)], capture_output=True,
                         text=True, timeout=60, env=loaderx_child_env())
    assert res.returncode == 0, res.stderr
    assert res.stderr == "", res.stderr
    lines = res.stdout.split()
    assert lines[0] == "close" and float(lines[1]) < 1.0, res.stdout
    assert lines[2] == "stopped", res.stdout


def test_consumer_exception_then_close_is_prompt(store, thread_errors):
    slow = Slow(seconds=8.0, fast=(0,))
    loader = DataLoader({"x": store}, batch_size=8, mode=0, transform=slow,
                        transform_workers=2, prefetch_size=4)
    try:
        t0 = None
        with pytest.raises(ValueError, match="consumer failed"):
            for batch in loader:
                assert int(batch["x"][0]) == 0
                assert wait_until(lambda: len(slow.entered) == 3, 10)   # steps 1, 2 are slow
                t0 = time.monotonic()
                raise ValueError("consumer failed")
        raised = time.monotonic() - t0
        assert raised < 0.5, f"the exception took {raised:.2f} s to reach the caller"
        t1 = time.monotonic()
        loader.close()
        elapsed = time.monotonic() - t1
        assert elapsed < 1.0, f"close() took {elapsed:.2f} s during an 8 s transform"
        assert len(transform_threads()) == 2              # abandoned, not waited for
        assert loader.step == 1
        with pytest.raises(StopIteration):
            next(loader)
    finally:
        slow.release.set()
        loader.close()
    assert wait_until(lambda: not transform_threads(), 2.0)
    assert thread_errors == []


def test_consumer_exception_leaves_a_with_block_at_once(store, thread_errors):
    slow = Slow(seconds=8.0, fast=(0,))
    try:
        t0 = None
        with pytest.raises(KeyError):
            with DataLoader({"x": store}, batch_size=8, mode=0, transform=slow,
                            transform_workers=2, prefetch_size=4) as loader:
                for batch in loader:
                    assert wait_until(lambda: len(slow.entered) == 3, 10)
                    t0 = time.monotonic()
                    raise KeyError("consumer failed")
        elapsed = time.monotonic() - t0
        assert elapsed < 0.5, f"leaving the with block took {elapsed:.2f} s"
        with pytest.raises(StopIteration):
            next(loader)
        assert loader.state_dict() == {"step": 1}
    finally:
        slow.release.set()
    assert wait_until(lambda: not transform_threads(), 2.0)
    assert thread_errors == []


def test_load_state_dict_after_an_abandoned_transform_resumes_exactly(store, thread_errors):
    """close() abandons the slow call; load_state_dict then restarts at the
    step the consumer had reached, and the late result never shows up."""
    slow = Slow(seconds=8.0, fast=(0, 2, 3, 4, 5))
    loader = DataLoader({"x": store}, batch_size=8, mode=0, transform=slow,
                        transform_workers=2, prefetch_size=4)
    try:
        assert int(next(loader)["x"][0]) == 0
        assert wait_until(lambda: 1 in slow.entered, 10)
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 1.0
        slow.fast = tuple(range(8))                        # step 1 is fast from now on
        slow.release.set()
        loader.load_state_dict(loader.state_dict())
        got = [int(next(loader)["x"][0]) // 8 for _ in range(3)]
        assert got == [1, 2, 3]
    finally:
        slow.release.set()
        loader.close()
    assert wait_until(lambda: not transform_threads(), 2.0)
    assert thread_errors == []
