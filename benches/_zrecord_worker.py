"""Measurement worker for ``bench_zrecord.py``.

One invocation measures one backend on one workload, for every requested codec,
and reports raw numbers as a single JSON line on stdout (progress goes to
stderr).  It is imported in-process by the driver for our loaderx and for the
NumPy baseline, and run as ``python _zrecord_worker.py SPEC.json`` under the
reference virtualenv for loaderx 2.0.0.  Because the reference runs this file
with its own interpreter, the worker:

* imports nothing from this repository (stdlib + numpy + the public loaderx API);
* touches loaderx only through its public surface: ``Dense.create/append/close``,
  ``Dense.open``, ``store.__getitems__``, the ``Ragged`` equivalents and
  ``loaderx.utils.train_dict``;
* keeps the timing code identical for every backend.

Spec (JSON object):
    workload      name, used in progress lines only
    kind          "dense" | "ragged"
    source_dir    directory with the driver's source files (see below)
    plan          path of the int64 (n_batches, batch) index plan (.npy)
    backend       "loaderx" (whichever loaderx this interpreter imports) | "npy"
    label         progress label, e.g. "ours" / "reference"
    codecs        list of codec names (ignored for "npy": it is always raw)
    chunk         records per append call
    dict_tier     tier for train_dict (zstd_dict only)
    store_root    directory under which stores are created (one per codec)
    keep_stores   leave the stores on disk afterwards

Source files: dense -> ``source.npy`` (N, *item_shape);
ragged -> ``flat.npy`` (all payload, 1-D), ``offsets.npy`` (N+1 element
offsets into flat) and ``shapes.npy`` (N, ndim).
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np


def _log(label: str, msg: str) -> None:
    print(f"  [{label}] {msg}", file=sys.stderr, flush=True)


def allocated_bytes(path: Path) -> tuple[int, dict]:
    """Allocated size (st_blocks * 512) of every file under ``path``."""
    files = {}
    paths = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for p in paths:
        files[str(p.relative_to(path.parent if path.is_file() else path))] = os.stat(p).st_blocks * 512
    return sum(files.values()), files


# --------------------------------------------------------------------------- source


class Source:
    def __init__(self, kind: str, source_dir: Path):
        self.kind = kind
        d = Path(source_dir)
        if kind == "dense":
            # Fully loaded into memory so write timing never pays source page faults.
            self.array = np.load(d / "source.npy")
            self.n = self.array.shape[0]
            self.dtype = self.array.dtype
            self.item_shape = tuple(self.array.shape[1:])
            self.record_nbytes = int(np.prod(self.item_shape, dtype=np.int64)) * self.dtype.itemsize
            self.logical_bytes = int(self.array.nbytes)
        elif kind == "ragged":
            self.flat = np.load(d / "flat.npy")
            self.offsets = np.load(d / "offsets.npy").astype(np.int64)
            self.shapes = np.load(d / "shapes.npy").astype(np.int64)
            self.n = len(self.offsets) - 1
            self.dtype = self.flat.dtype
            off = self.offsets.tolist()
            shp = [tuple(s) for s in self.shapes.tolist()]
            self.records = [self.flat[off[i]:off[i + 1]].reshape(shp[i]) for i in range(self.n)]
            self.record_nbytes_arr = np.diff(self.offsets) * self.dtype.itemsize
            self.logical_bytes = int(self.flat.nbytes)
        else:
            raise ValueError(kind)

    def batch_nbytes(self, idx: np.ndarray) -> int:
        if self.kind == "dense":
            return len(idx) * self.record_nbytes
        return int(self.record_nbytes_arr[idx].sum())

    def chunks(self, chunk: int) -> list:
        if self.kind == "dense":
            return [self.array[i:i + chunk] for i in range(0, self.n, chunk)]
        return [self.records[i:i + chunk] for i in range(0, self.n, chunk)]

    def check(self, idx: np.ndarray, out) -> None:
        """Raise AssertionError unless ``out`` is exactly the records at ``idx``."""
        if self.kind == "dense":
            want = self.array[idx]
            if not isinstance(out, np.ndarray):
                raise AssertionError(f"dense gather returned {type(out).__name__}, not ndarray")
            if out.dtype != want.dtype or out.shape != want.shape:
                raise AssertionError(f"dense gather returned {out.dtype}{out.shape}, want {want.dtype}{want.shape}")
            if not np.array_equal(out, want):
                bad = np.flatnonzero((out != want).reshape(len(idx), -1).any(axis=1))
                raise AssertionError(f"dense gather values differ at plan positions {bad[:8].tolist()}")
            return
        if not isinstance(out, list):
            raise AssertionError(f"ragged gather returned {type(out).__name__}, not list")
        if len(out) != len(idx):
            raise AssertionError(f"ragged gather returned {len(out)} records, want {len(idx)}")
        for pos, (i, got) in enumerate(zip(idx.tolist(), out)):
            want = self.records[i]
            if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
                desc = f"{got.dtype}{got.shape}" if isinstance(got, np.ndarray) else type(got).__name__
                raise AssertionError(f"ragged record {i} (plan position {pos}) is {desc}, want {want.dtype}{want.shape}")
            if not np.array_equal(got, want):
                raise AssertionError(f"ragged record {i} (plan position {pos}) values differ")


# --------------------------------------------------------------------------- backends


class _Backend:
    """What every backend's writers share: an ``append`` method, then ``close``."""

    @staticmethod
    def appender(writer):
        return writer.append

    @staticmethod
    def finish(writer) -> None:
        writer.close()


class LoaderxBackend(_Backend):
    """The loaderx that this interpreter imports, through its public API only."""

    def __init__(self):
        import loaderx
        from loaderx.utils import train_dict
        from loaderx.zrecord import Dense, Ragged

        self.loaderx = loaderx
        self.Dense, self.Ragged, self.train_dict = Dense, Ragged, train_dict

    def info(self) -> dict:
        return {
            "loaderx_version": getattr(self.loaderx, "__version__", "?"),
            "loaderx_file": getattr(self.loaderx, "__file__", "?"),
        }

    def train(self, src: Source, tier: str) -> bytes:
        data = src.array if src.kind == "dense" else src.records
        return self.train_dict(data, tier=tier)

    def create(self, path: Path, src: Source, codec: str, dict_bytes):
        if src.kind == "dense":
            return self.Dense.create(str(path), src.dtype, src.item_shape, codec=codec, dict_bytes=dict_bytes)
        return self.Ragged.create(str(path), src.dtype, codec=codec, dict_bytes=dict_bytes)

    def open(self, path: Path, src: Source):
        return (self.Dense if src.kind == "dense" else self.Ragged).open(str(path))

    @staticmethod
    def gatherer(reader):
        return reader.__getitems__

    @staticmethod
    def release(reader) -> None:
        reader.close()


class _NpyDenseWriter:
    def __init__(self, path: Path, src: Source):
        path.mkdir(parents=True)
        self.mm = np.lib.format.open_memmap(path / "data.npy", mode="w+", dtype=src.dtype,
                                            shape=(src.n, *src.item_shape))
        self.pos = 0

    def append(self, batch: np.ndarray) -> None:
        self.mm[self.pos:self.pos + len(batch)] = batch
        self.pos += len(batch)

    def close(self) -> None:
        self.mm.flush()
        del self.mm


class _NpyRaggedWriter:
    """Flat concatenation + int64 offsets + int64 shapes, all as .npy files.

    The payload file is preallocated (its element count is known up front);
    the offsets/shapes index is part of the data, so the append that completes
    the payload also saves it, inside the timed region, like a store's
    location table.
    """

    def __init__(self, path: Path, src: Source):
        path.mkdir(parents=True)
        self.path = path
        self.flat = np.lib.format.open_memmap(path / "flat.npy", mode="w+", dtype=src.dtype,
                                              shape=(int(src.offsets[-1]),))
        self.ndim = src.shapes.shape[1]
        self.pos = 0
        self.offsets = [0]
        self.shapes = []

    def append(self, records: list) -> None:
        buf = np.concatenate([r.reshape(-1) for r in records])
        self.flat[self.pos:self.pos + buf.size] = buf
        self.pos += buf.size
        for r in records:
            self.offsets.append(self.offsets[-1] + r.size)
            self.shapes.append(r.shape)
        if self.pos == self.flat.shape[0]:
            np.save(self.path / "offsets.npy", np.asarray(self.offsets, dtype=np.int64))
            np.save(self.path / "shapes.npy",
                    np.asarray(self.shapes, dtype=np.int64).reshape(-1, self.ndim))

    def close(self) -> None:
        self.flat.flush()
        del self.flat


class NpyBackend(_Backend):
    """``np.load(mmap_mode='r')`` baseline (raw only)."""

    def info(self) -> dict:
        return {}

    def create(self, path: Path, src: Source, codec: str, dict_bytes):
        assert codec == "raw"
        return _NpyDenseWriter(path, src) if src.kind == "dense" else _NpyRaggedWriter(path, src)

    def open(self, path: Path, src: Source):
        if src.kind == "dense":
            return ("dense", np.load(path / "data.npy", mmap_mode="r"))
        flat = np.load(path / "flat.npy", mmap_mode="r")
        offsets = np.load(path / "offsets.npy")
        shapes = [tuple(s) for s in np.load(path / "shapes.npy").tolist()]
        return ("ragged", flat, offsets, shapes)

    @staticmethod
    def gatherer(reader):
        if reader[0] == "dense":
            mm = reader[1]
            return lambda idx: mm[idx]  # NumPy fancy indexing on the memmap -> new array
        _, flat, offsets, shapes = reader

        def gather(idx):
            starts = offsets[idx].tolist()
            ends = offsets[idx + 1].tolist()
            total = sum(e - s for s, e in zip(starts, ends))
            buf = np.empty(total, dtype=flat.dtype)  # one backing buffer per batch
            out = []
            pos = 0
            for i, s, e in zip(idx.tolist(), starts, ends):
                n = e - s
                view = buf[pos:pos + n]
                view[...] = flat[s:e]
                out.append(view.reshape(shapes[i]))
                pos += n
            return out
        return gather

    @staticmethod
    def release(reader) -> None:
        pass


# --------------------------------------------------------------------------- measurement


REPEAT_WRITES_UNDER_S = 1.5


def _write_once(backend, path: Path, src: Source, codec: str, dict_bytes, chunks) -> tuple[float, float]:
    """Writes the store at ``path``: (seconds in append calls, seconds in close)."""
    writer = backend.create(path, src, codec, dict_bytes)
    append = backend.appender(writer)
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for c in chunks:
            append(c)
        write_s = time.perf_counter() - t0
    finally:
        gc.enable()
    del append
    t0 = time.perf_counter()
    backend.finish(writer)
    return write_s, time.perf_counter() - t0


def measure_codec(backend, src: Source, plan: np.ndarray, codec: str, spec: dict) -> dict:
    label = spec["label"]
    path = Path(spec["store_root"]) / codec
    if path.exists():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    res = {"codec": codec, "logical_bytes": src.logical_bytes, "records_stored": src.n}

    dict_bytes = None
    if codec == "zstd_dict":
        t0 = time.perf_counter()
        dict_bytes = backend.train(src, spec["dict_tier"])
        res["train_s"] = time.perf_counter() - t0
        res["dict_len"] = len(dict_bytes)
        _log(label, f"{codec}: train_dict(tier={spec['dict_tier']!r}) {res['train_s']:.2f} s -> {len(dict_bytes)} B")

    # ---- write: the writer is created before timing; append calls and close are timed
    # apart.  On this shared VM the first write of a process often runs at a fraction of
    # the speed of the next ones, whatever the backend (most likely fresh page-cache pages
    # the host has to back again), so a write that took under REPEAT_WRITES_UNDER_S is done
    # three times, each on a fresh store after os.sync(), and the median write is reported.
    chunks = src.chunks(int(spec["chunk"]))
    samples = []
    while True:
        if samples:
            shutil.rmtree(path)
            os.sync()
        samples.append(_write_once(backend, path, src, codec, dict_bytes, chunks))
        first_s = sum(samples[0])
        if first_s >= REPEAT_WRITES_UNDER_S or len(samples) == 3:
            break
    res["write_samples_s"] = [w + c for w, c in samples]
    res["write_s"], res["close_s"] = sorted(samples, key=sum)[(len(samples) - 1) // 2]
    del chunks
    res["disk_bytes"], res["disk_files"] = allocated_bytes(path)
    _log(label, f"{codec}: wrote {src.logical_bytes / 2**20:.1f} MiB in {res['write_s']:.2f} s, "
               f"disk {res['disk_bytes'] / 2**20:.1f} MiB")

    # ---- read: open (untimed), validate every planned batch (untimed), warm up, time each batch once.
    reader = backend.open(path, src)
    try:
        gather = backend.gatherer(reader)
        t0 = time.perf_counter()
        for b in range(plan.shape[0]):
            out = gather(plan[b])
            try:
                src.check(plan[b], out)
            except AssertionError as exc:
                raise AssertionError(f"validation failed on batch {b}: {exc}") from None
            del out
        res["validate_s"] = time.perf_counter() - t0
        res["validated_batches"] = int(plan.shape[0])

        out = gather(plan[0])  # warm-up batch
        del out
        times = []
        nbytes = []
        perf = time.perf_counter
        gc.collect()
        gc.disable()
        try:
            for b in range(plan.shape[0]):
                idx = plan[b]
                t0 = perf()
                out = gather(idx)
                t1 = perf()
                del out  # freed outside the timed region
                times.append(t1 - t0)
                nbytes.append(src.batch_nbytes(idx))
        finally:
            gc.enable()
        res["gather_s"] = times
        res["gather_bytes"] = nbytes
        res["gather_records"] = [int(plan.shape[1])] * plan.shape[0]
        del gather
    finally:
        backend.release(reader)
        del reader
    tot = sum(res["gather_s"])
    _log(label, f"{codec}: gathered {plan.shape[0]} x {plan.shape[1]} in {tot:.3f} s "
               f"({sum(res['gather_bytes']) / 2**20 / tot:.0f} MiB/s)")
    if not spec.get("keep_stores"):
        shutil.rmtree(path, ignore_errors=True)
    return res


def _base_info() -> dict:
    return {
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "executable": sys.executable,
        "numpy": np.__version__,
        "pid": os.getpid(),
    }


def probe(backend_name: str = "loaderx") -> dict:
    """Versions and import location, without measuring anything."""
    info = _base_info()
    try:
        backend = LoaderxBackend() if backend_name == "loaderx" else NpyBackend()
        info.update(backend.info())
    except Exception as exc:
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def run(spec: dict) -> dict:
    label = spec["label"]
    t_start = time.perf_counter()
    info = _base_info()
    try:
        backend = LoaderxBackend() if spec["backend"] == "loaderx" else NpyBackend()
        info.update(backend.info())
    except Exception as exc:  # import failure: report, do not crash the driver
        return {"info": info, "results": [], "error": f"{type(exc).__name__}: {exc}"}

    src = Source(spec["kind"], Path(spec["source_dir"]))
    plan = np.load(spec["plan"]).astype(np.int64)
    codecs = ["raw"] if spec["backend"] == "npy" else list(spec["codecs"])
    results = []
    for codec in codecs:
        try:
            results.append(measure_codec(backend, src, plan, codec, spec))
        except Exception as exc:
            _log(label, f"{codec}: ERROR {type(exc).__name__}: {exc}")
            results.append({"codec": codec, "error": f"{type(exc).__name__}: {exc}"})
            if not spec.get("keep_stores"):
                shutil.rmtree(Path(spec["store_root"]) / codec, ignore_errors=True)
        gc.collect()
    info["worker_s"] = time.perf_counter() - t_start
    return {"info": info, "results": results}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} SPEC.json | --probe", file=sys.stderr)
        return 2
    faulthandler.enable()  # a native crash prints the Python stack to stderr
    if argv[1] == "--probe":
        out = probe()
    else:
        out = run(json.loads(Path(argv[1]).read_text()))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
