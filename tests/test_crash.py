"""Crash safety: a writer killed with SIGKILL at any moment leaves a store that
is either refused on open (ZrecordError -8, "never closed") or, when its
close() had returned, complete and exact.

Writers run in processes forked from a small "zygote" process that imported
numpy and loaderx once (and never touched loaderx's thread pool before
forking), so each of the ~300 kills costs milliseconds, not an interpreter
start. The zygote owns its children and does the killing itself, so no pid is
ever signalled after it was reaped. Kill delays are drawn from a seeded RNG
over a range calibrated per (kind, codec) to run past the writer's close(), so
some kills land mid-append, some mid-close, some after the store is complete.
Record values are a function of the record index, so the parent checks a
store without having kept its records.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged, ZrecordError

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="fork/SIGKILL harness is Linux-only")

INVALID_FORMAT = -8
KILLS_PER_KIND = 26  # x2 kinds = 52 kills per codec
SEED = 0x5EED

# Per codec: (batches, records per batch), sized so one build takes tens of
# milliseconds (zstd_dict compresses at level 19).
SIZES = {"raw": (12, 512), "zstd": (12, 256), "zstd_dict": (8, 48)}
DENSE_WIDTH = 64


def dense_batch(start: int, count: int) -> np.ndarray:
    i = np.arange(start, start + count, dtype=np.int64)[:, None]
    return i * 1000 + np.arange(DENSE_WIDTH, dtype=np.int64)


def ragged_record(i: int) -> np.ndarray:
    rows = 1 + i % 7
    return (i * 100 + np.arange(rows * 5, dtype=np.int32)).reshape(rows, 5)


# The zygote: reads one JSON command per line on stdin, answers on stdout.
#   {"op": "run", ...job...} -> forks a writer; answers "ready" once the store
#                              exists (or "failed ..." if the child died first)
#   {"op": "kill"}           -> SIGKILLs the child (still unreaped), waits,
#                              answers "done <status>"
#   {"op": "wait"}           -> waits for the child to exit, answers "done ..."
ZYGOTE = textwrap.dedent(
    r"""
    import json, os, signal, sys, time
    import numpy as np
    from loaderx.zrecord import Dense, Ragged

    def dense_batch(start, count, width):
        i = np.arange(start, start + count, dtype=np.int64)[:, None]
        return i * 1000 + np.arange(width, dtype=np.int64)

    def ragged_record(i):
        rows = 1 + i % 7
        return (i * 100 + np.arange(rows * 5, dtype=np.int32)).reshape(rows, 5)

    def child(job, ready_fd):
        dict_bytes = bytes.fromhex(job["dict"]) if job["dict"] else None
        if job["kind"] == "dense":
            w = Dense.create(job["path"], np.int64, (job["width"],), codec=job["codec"], dict_bytes=dict_bytes)
        else:
            w = Ragged.create(job["path"], np.int32, codec=job["codec"], dict_bytes=dict_bytes)
        os.write(ready_fd, b"r")
        per = job["per_batch"]
        for b in range(job["batches"]):
            if job["kind"] == "dense":
                w.append(dense_batch(b * per, per, job["width"]))
            else:
                w.append([ragged_record(i) for i in range(b * per, (b + 1) * per)])
        w.close(durable=job["durable"])
        with open(job["marker"], "w") as f:
            f.write("closed")

    pid = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                code = 0
                try:
                    child(cmd, w)
                except BaseException as e:
                    sys.stderr.write(f"writer failed: {e!r}\n")
                    code = 1
                os._exit(code)
            os.close(w)
            got = os.read(r, 1)
            os.close(r)
            print("ready" if got else "failed", flush=True)
        elif cmd["op"] in ("kill", "wait"):
            if cmd["op"] == "kill":
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            pid = None
            print(f"done {status}", flush=True)
    """
)


class Zygote:
    def __init__(self):
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", ZYGOTE],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, bufsize=1,
        )

    def ask(self, **cmd) -> str:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"zygote died (exit {self.proc.poll()})"
        return line.strip()

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def zygote():
    z = Zygote()
    yield z
    z.close()


@pytest.fixture(scope="module")
def dict_hex():
    samples = [dense_batch(i * 8, 8).tobytes() for i in range(64)]
    samples += [ragged_record(i).tobytes() for i in range(512)]
    return train_dict(samples, tier="fast").hex()


def expected_total(codec: str) -> int:
    batches, per = SIZES[codec]
    return batches * per


def verify_complete(path: Path, kind: str, codec: str) -> None:
    n = expected_total(codec)
    if kind == "dense":
        with Dense.open(path) as ds:
            assert len(ds) == n
            assert ds.codec == codec
            got = ds[0:n]
            np.testing.assert_array_equal(got, dense_batch(0, n))
    else:
        with Ragged.open(path) as ds:
            assert len(ds) == n
            got = ds[0:n]
            for i, rec in enumerate(got):
                np.testing.assert_array_equal(rec, ragged_record(i))


def check_outcome(path: Path, marker: Path, kind: str, codec: str) -> str:
    """Returns "refused" or "complete"; fails on anything else."""
    cls = Dense if kind == "dense" else Ragged
    try:
        store = cls.open(path)
    except ZrecordError as e:
        assert not marker.exists(), f"{path}: close() had returned, yet open failed: {e}"
        assert e.code == INVALID_FORMAT, f"{path}: refused with code {e.code}: {e}"
        assert "never closed" in str(e), f"{path}: unclear refusal: {e}"
        return "refused"
    except FileNotFoundError:
        pytest.fail(f"{path}: the store vanished although create() had returned")
    store.close()
    # It opened, so close() must have committed everything.
    verify_complete(path, kind, codec)
    return "complete"


def job(tmp: Path, name: str, kind: str, codec: str, dict_hex: str, durable: bool = False) -> dict:
    batches, per = SIZES[codec]
    return dict(
        op="run", path=str(tmp / name), marker=str(tmp / f"{name}.closed"), kind=kind, codec=codec,
        dict=dict_hex if codec == "zstd_dict" else "", width=DENSE_WIDTH, batches=batches,
        per_batch=per, durable=durable,
    )


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_sigkill_leaves_refused_or_complete_store(zygote, dict_hex, tmp_path, codec):
    rng = random.Random(f"{SEED}-{codec}")
    outcomes = {"refused": 0, "complete": 0}
    for kind in ("dense", "ragged"):
        # Calibrate: one uninterrupted build, timed from "ready" to exit.
        cal = job(tmp_path, f"cal-{kind}", kind, codec, dict_hex)
        assert zygote.ask(**cal) == "ready"
        t0 = time.perf_counter()
        assert zygote.ask(op="wait") == "done 0"
        build_s = time.perf_counter() - t0
        assert Path(cal["marker"]).exists()
        verify_complete(Path(cal["path"]), kind, codec)
        shutil.rmtree(cal["path"])

        for k in range(KILLS_PER_KIND):
            spec = job(tmp_path, f"{kind}-{k}", kind, codec, dict_hex)
            # Mostly inside the build, a quarter past its end; a few at once.
            delay = 0.0 if k % 13 == 0 else rng.uniform(0.0, build_s * 1.35)
            assert zygote.ask(**spec) == "ready"
            if delay:
                time.sleep(delay)
            status = zygote.ask(op="kill")
            assert status.startswith("done"), status
            path, marker = Path(spec["path"]), Path(spec["marker"])
            outcomes[check_outcome(path, marker, kind, codec)] += 1
            shutil.rmtree(path)
            marker.unlink(missing_ok=True)
    print(f"{codec}: {outcomes} (build {build_s * 1e3:.1f} ms)")
    # Both outcomes must have been exercised, or the delays were badly calibrated.
    assert outcomes["refused"] >= 10, outcomes
    assert outcomes["complete"] >= 1, outcomes


@pytest.mark.parametrize("kind", ["dense", "ragged"])
@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
def test_durable_close_gives_a_readable_store(tmp_path, dict_hex, kind, codec):
    path = tmp_path / "durable"
    dict_bytes = bytes.fromhex(dict_hex) if codec == "zstd_dict" else None
    if kind == "dense":
        w = Dense.create(path, np.int64, (DENSE_WIDTH,), codec=codec, dict_bytes=dict_bytes)
        w.append(dense_batch(0, 40))
        w.append(dense_batch(40, 24))
    else:
        w = Ragged.create(path, np.int32, codec=codec, dict_bytes=dict_bytes)
        w.append([ragged_record(i) for i in range(40)])
        w.append([ragged_record(i) for i in range(40, 64)])
    assert w.close(durable=True) is None
    w.close(durable=True)  # twice is harmless
    cls = Dense if kind == "dense" else Ragged
    with cls.open(path) as ds:
        assert len(ds) == 64
        got = ds[0:64]
    if kind == "dense":
        np.testing.assert_array_equal(got, dense_batch(0, 64))
    else:
        for i, rec in enumerate(got):
            np.testing.assert_array_equal(rec, ragged_record(i))


def test_durable_close_in_a_killed_child_commits(zygote, dict_hex, tmp_path):
    """close(durable=True) in a writer process that is then killed: the store
    is complete (the kill comes after the marker, i.e. after close returned)."""
    spec = job(tmp_path, "durable-child", "ragged", "zstd", dict_hex, durable=True)
    assert zygote.ask(**spec) == "ready"
    deadline = time.monotonic() + 30
    while not Path(spec["marker"]).exists():
        assert time.monotonic() < deadline, "the writer did not finish"
        time.sleep(0.005)
    zygote.ask(op="kill")
    assert check_outcome(Path(spec["path"]), Path(spec["marker"]), "ragged", "zstd") == "complete"


def test_writer_dropped_without_close_is_refused(tmp_path):
    """In-process variant: a writer abandoned without close() leaves the
    uncommitted header, which open() refuses with a clear message."""
    path = tmp_path / "abandoned"
    code = textwrap.dedent(
        f"""
        import os, numpy as np
        from loaderx.zrecord import Dense
        w = Dense.create({str(path)!r}, np.int64, (4,), codec="zstd")
        w.append(np.arange(40, dtype=np.int64).reshape(10, 4))
        os._exit(0)  # no close(), no finalizers
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    with pytest.raises(ZrecordError) as info:
        Dense.open(path)
    assert info.value.code == INVALID_FORMAT
    assert "never closed" in str(info.value)
