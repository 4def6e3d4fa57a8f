#!/usr/bin/env python3
"""End-to-end loader benchmark: our DataLoader vs loaderx 2.0.0, torch's DataLoader and peer loaders.

Run it with the interpreter that imports OUR loaderx (and torch, for the torch rows):

    .venv/bin/python benches/bench_loader.py --setup          # once: numba here and in .venv-ref,
                                                              # grain + numba in .venv-peers
    .venv/bin/python benches/bench_loader.py --quick          # smoke run, every table
    .venv/bin/python benches/bench_loader.py --tables transforms,peers --json bench-out/loader.json \\
        --update-docs                                         # the #10 / #17 tables into docs/benchmarks.md
    .venv/bin/python benches/bench_loader.py --from-json bench-out/loader.json --update-docs

Workload ("Dense vision"): 2,500 deterministic image-like uint8 (3, 224, 224)
records (the generator of bench_zrecord.py's dense-vision workload, with the
record index stamped into bytes 0..3 of each image) and int64 labels
``label[i] = i``; batch 256; timed: up to 200 batches after 10 warm-up
batches, stopping early once 20 are timed and 10 s have passed (the
CPU-heavy transforms deliver a few batches per second).

Every row runs in its own fresh subprocess, under its own interpreter (ours,
loaderx 2.0.0's venv, the peers' venv), and the parent samples the PSS of
that whole process tree (worker processes included) every ~50 ms.  Before
anything is timed, every row's first batches are checked for exact values
against the source records, transform outputs included.  Three tables
(``--tables``):

``classic`` (the original table of this script)
    ours / ours + ``lambda b: b`` / loaderx 2.0.0 with ``transform_workers=4``,
    and torch's DataLoader (2 fork workers) on ``np.load(mmap_mode='r')``.
``transforms`` (issue #10)
    {ours-thread, ours-process, loaderx 2.0.0, torch-fork} x {identity,
    pyloop, numpy, numba} (``benches/_transforms.py``), zstd and raw stores,
    ``transform_workers=2`` / ``num_workers=2``.
``peers`` (issue #17)
    every loader with no transform: ours (threads, processes) and loaderx
    2.0.0 on zstd and raw stores, torch DataLoader (fork, spawn) on npy,
    grain over ArrayRecord, MosaicML StreamingDataset over local MDS,
    WebDataset tar shards (sequential) and Hugging Face ``datasets``
    (``with_format('numpy')``); plus pyloop and numba for the loaderx rows,
    torch-fork and grain.

The loaders themselves are built in ``benches/_pipelines.py``; see
benches/README.md ("bench_loader.py") for the methodology and the columns.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import glob
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
GENERATOR_VERSION = 1  # bump when the data layout changes, to invalidate cached data
MiB = 2 ** 20
ITEM = (3, 224, 224)
CODECS = ("zstd", "raw")
BACKENDS = ("ours", "ours-pytransform", "reference", "torch")  # rows of the classic table
TABLES = ("classic", "transforms", "peers")
LOADERS = ("ours-thread", "ours-process", "reference", "torch-fork", "torch-spawn",
           "grain", "streaming", "wds", "hf")
TRANSFORMS = ("identity", "pyloop", "numpy", "numba")
# peer loader -> (data format built by _pipelines.py --build, table label, storage, access pattern)
PEER_DATA = {
    "grain": ("arrayrecord", "Grain", "ArrayRecord, uncompressed", "random"),
    "streaming": ("mds", "MosaicML `StreamingDataset`", "MDS, uncompressed", "random (shard-aware shuffle)"),
    "wds": ("wds", "WebDataset", "tar shards", "**sequential** (shuffle buffer)"),
    "hf": ("hf", "HF `datasets`, `with_format('numpy')`", "Arrow (`save_to_disk`)", "random"),
}
# peer loader -> (import probe, the distribution the header names)
PEER_IMPORTS = {
    "grain": ("import grain, array_record.python.array_record_module", "grain"),
    "streaming": ("import streaming, torch", "mosaicml-streaming"),
    "wds": ("import webdataset, torch", "webdataset"),
    "hf": ("import datasets, torch", "datasets"),
}
# Installed by --setup into our venv and the reference venv (.venv-peers gets
# it, and grain, from bench_peers.PEER_PACKAGES).
LOADER_PACKAGES = ["numba==0.68.1"]
DOC_MARKERS = {"transforms": "loader-transforms", "peers": "loader-peers"}
PHASE = "@@PHASE "


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================== worker
# Runs under several interpreters (ours, the reference venv, the peers venv),
# always with -I: only stdlib + numpy here; the loaders are in _pipelines.py.


def _phase(name: str) -> None:
    print(PHASE + name, flush=True)


def stamp_of(images: np.ndarray) -> np.ndarray:
    """The record index stamped into bytes 0..3 of channel 0, row 0 of each (uint8) image."""
    return np.ascontiguousarray(images[:, 0, 0, :4]).view("<u4").reshape(-1).astype(np.int64)


def _verify(batch: dict, spec: dict, src: np.ndarray, full: bool) -> None:
    """Raise AssertionError unless ``batch`` is a correct batch of the workload,
    transformed by ``spec['transform']`` (None / absent: untransformed).

    Always: shape and dtype, labels in range and distinct, each image's stamp
    equal to its label, and the transform's output against its NumPy
    reference on the delivered image.  ``full``: also every image (and
    transform output) against the source record of its label."""
    tf = spec.get("transform")
    tf = None if tf in (None, "none") else tf
    img, lab = batch["image"], batch["label"]
    b = spec["batch"]
    want_dt = np.float32 if tf == "numpy" else np.uint8
    if img.shape != (b, *ITEM) or img.dtype != want_dt:
        raise AssertionError(f"image batch {img.shape} {img.dtype}, "
                             f"expected {(b, *ITEM)} {np.dtype(want_dt)}")
    if lab.shape != (b,) or lab.dtype != np.int64:
        raise AssertionError(f"label batch {lab.shape} {lab.dtype}, expected ({b},) int64")
    if int(lab.min()) < 0 or int(lab.max()) >= spec["records"]:
        raise AssertionError("label outside 0..records-1")
    if len(np.unique(lab)) != b:
        raise AssertionError("a record repeats within one batch")
    tfm = None
    if tf is not None:
        import _transforms as tfm  # benches/ is on sys.path (spec["sys_path"])
    # numpy transform: the stamp's uint8 bytes recovered from the normalised floats
    head = img if tfm is None else tfm.stamp_image(tf, img)[:, None, None, :]
    stamps = stamp_of(head)
    if not np.array_equal(stamps, lab):
        raise AssertionError("images do not match their labels (stamp != label)")
    if tfm is not None:
        tfm.check_batch(tf, batch)
    if full:
        for k in range(b):  # compare every image with its source record, read by pread
            rec = src.record(int(lab[k]))
            if tfm is not None:
                tfm.check_record(tf, batch, k, rec)
            elif not np.array_equal(img[k], rec):
                raise AssertionError(f"image of record {int(lab[k])} differs from the source")


class _Source:
    """Reads single records of the source .npy with pread into one small reused
    buffer. Unlike an mmap, this leaves no file pages mapped in the worker, so
    verification does not inflate the pipeline's PSS/RSS."""

    def __init__(self, path: str):
        m = np.load(path, mmap_mode="r")  # header only; unmapped again right away
        shape, dtype, self.offset = m.shape, m.dtype, int(m.offset)
        del m
        if tuple(shape[1:]) != ITEM or dtype != np.uint8:
            raise AssertionError(f"unexpected source {shape} {dtype}")
        self.fd = os.open(path, os.O_RDONLY)
        self.size = int(np.prod(ITEM))
        self.buf = np.empty(ITEM, dtype=np.uint8)

    def record(self, i: int) -> np.ndarray:
        n = os.preadv(self.fd, [memoryview(self.buf).cast("B")], self.offset + i * self.size)
        if n != self.size:
            raise AssertionError(f"short read of source record {i}")
        return self.buf

    def close(self):
        os.close(self.fd)


def _endless(loader):
    while True:
        yield from loader


def _classic_spec(spec: dict) -> dict:
    """Map a classic-table spec (``backend``: loaderx / torch) onto _pipelines' keys."""
    if spec.get("loader") or "backend" not in spec:
        return spec
    if spec["backend"] == "torch":
        return dict(spec, loader="torch", workers=spec["torch_workers"], start_method=None, transform=None)
    return dict(spec, loader="loaderx", transform="identity" if spec.get("py_transform") else None)


def _open_pipeline(spec: dict):
    """Build the pipeline; return (iterator yielding batches, to_numpy, close, info)."""
    import _pipelines

    return _pipelines.open_pipeline(_classic_spec(spec))


def worker(spec: dict) -> dict:
    # benches/ (for _pipelines, _transforms) and, for our rows, the package the
    # driver imported: -I leaves both off sys.path, and multiprocessing passes
    # sys.path on to spawned children.
    sys.path[:0] = [p for p in spec.get("sys_path", [str(HERE)]) if p not in sys.path]
    _phase("setup")
    spec = _classic_spec(spec)
    if spec.get("transform") not in (None, "none"):
        import _transforms
        _transforms.prepare(spec["transform"])  # numba: compiled before any worker forks
    src = _Source(spec["images"])
    import _pipelines
    try:
        it, to_np, close, info = _open_pipeline(spec)
    except _pipelines.Unavailable as exc:
        src.close()
        return {"unavailable": str(exc)}
    try:
        _phase("verify")
        for _k in range(spec["verify"]):  # full check: stamps, labels, every image byte, transform output
            _verify(to_np(next(it)), spec, src, full=True)
        _phase("warmup")
        for _ in range(spec["warmup"]):
            _verify(to_np(next(it)), spec, src, full=False)
        _phase("timed")
        pc = time.perf_counter
        # The loader's read-ahead is full after the warm-up, so the first
        # ``settle`` batches come at once: they are taken here but left out of
        # the numbers, which would otherwise credit a slow row with its buffer.
        settle_waits = []
        batch = None
        for _ in range(spec.get("settle", 0)):
            t0 = pc()
            batch = next(it)
            settle_waits.append(pc() - t0)
        waits = []
        max_s, min_n = spec.get("max_seconds"), spec.get("min_batches", 1)
        t_start = pc()
        for n in range(spec["batches"]):
            t0 = pc()
            batch = next(it)  # the previous batch stays alive meanwhile, as in a for loop
            t1 = pc()
            waits.append(t1 - t0)
            if max_s and n + 1 >= min_n and t1 - t_start >= max_s:
                break  # a slow row: enough batches, and the time is up
        elapsed = pc() - t_start
        _phase("after")
        _verify(to_np(batch), spec, src, full=False)  # the last timed batch is correct too
        del batch
    finally:
        close()
        src.close()
    _phase("closed")
    return {"info": info, "waits_s": waits, "elapsed_s": elapsed, "settle_waits_s": settle_waits}


def worker_main(spec_path: str) -> int:
    faulthandler.enable()
    spec = json.loads(Path(spec_path).read_text())
    try:
        res = worker(spec)
    except BaseException as exc:
        import traceback
        traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(json.dumps(res), flush=True)
    sys.stdout.flush()
    # Skip interpreter teardown (torch workers, native pools): the numbers are out.
    os._exit(0)


# =========================================================================== memory sampling (parent)


def tree_pids(root: int) -> list[int]:
    """``root`` and all its descendants, via /proc/<pid>/task/*/children."""
    out, stack, seen = [], [root], set()
    while stack:
        pid = stack.pop()
        if pid in seen:
            continue
        seen.add(pid)
        out.append(pid)
        for f in glob.glob(f"/proc/{pid}/task/*/children"):
            with contextlib.suppress(OSError, ValueError):
                stack.extend(int(x) for x in Path(f).read_text().split())
    return out


ROLLUP_FIELDS = ("Pss", "Rss", "Pss_Anon", "Pss_File", "Pss_Shmem")


def rollup(pid: int) -> tuple[int, ...] | None:
    """(Pss, Rss, Pss_Anon, Pss_File, Pss_Shmem) of one process in bytes, from
    /proc/<pid>/smaps_rollup (the split fields read 0 on kernels without them)."""
    vals = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for ln in fh:
                key, _, rest = ln.partition(":")
                if key in ROLLUP_FIELDS:
                    vals[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if "Pss" not in vals or "Rss" not in vals:
        return None
    return tuple(vals.get(k, 0) for k in ROLLUP_FIELDS)


class TreeSampler(threading.Thread):
    """Samples the summed PSS / RSS of a process tree every ``interval`` seconds,
    tagging each sample with the worker's current phase."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval = pid, interval
        self.phase = "start"
        # t, phase, pss, rss, nproc, pss_anon, pss_file, pss_shmem
        self.samples: list[tuple[float, str, int, int, int, int, int, int]] = []
        self.stop = threading.Event()

    def run(self):
        t0 = time.perf_counter()
        while not self.stop.is_set():
            tot = [0] * len(ROLLUP_FIELDS)
            n = 0
            for pid in tree_pids(self.pid):
                r = rollup(pid)
                if r:
                    tot = [a + b for a, b in zip(tot, r, strict=False)]
                    n += 1
            if n:
                self.samples.append((time.perf_counter() - t0, self.phase, tot[0], tot[1], n,
                                     tot[2], tot[3], tot[4]))
            self.stop.wait(self.interval)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except OSError:
        return True


def _drain_group(pgid: int, seconds: float) -> None:
    """Give what the worker left in its session (multiprocessing's resource
    tracker, loader workers on their way out) a moment to end by itself: the
    resource tracker unlinks leaked shared memory (grain's batches) only when
    it ends normally, and the SIGKILL that follows would leave it in /dev/shm."""
    end = time.monotonic() + seconds
    while _group_alive(pgid) and time.monotonic() < end:
        time.sleep(0.05)


# MosaicML Streaming keeps its coordination state in /dev/shm under names like
# "<prefix>_locals"; a worker that ends with os._exit (or is killed) leaves it
# behind (the same pattern as bench_remote.py).
_MOSAIC_SHM = re.compile(r"^\d+_(barrier|cache_usage|locals|next_epoch|shard_access_times|shard_states|"
                         r"filelock|epoch_shape|epoch_sample_ids|.*)$")


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def _remove_mosaic_shm(before: set[str]) -> None:
    """Remove the Streaming segments that appeared while one row ran, so the next starts clean."""
    for name in _shm_names() - before:
        if _MOSAIC_SHM.match(name):
            with contextlib.suppress(OSError):
                os.unlink(f"/dev/shm/{name}")


def run_worker(python: str, spec: dict, spec_path: Path, timeout: float, interval: float,
               drain: float = 0.0) -> dict:
    """Run ``<this file> --worker SPEC`` under ``python`` in a new session,
    sampling its process tree's memory; return its JSON result (plus ``mem``).

    ``drain``: seconds to let the worker's session end by itself after the
    worker exited, before the SIGKILL that reaps whatever is left."""
    spec_path.write_text(json.dumps(spec))
    shm_before = _shm_names()
    # -I: no PYTHONPATH / cwd / user site leaks between the three interpreters.
    cmd = [python, "-I", str(Path(__file__).resolve()), "--worker", str(spec_path)]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=None, text=True,
                                cwd=str(spec_path.parent), start_new_session=True)
    except OSError as exc:
        return {"error": f"cannot start {python}: {exc}"}
    sampler = TreeSampler(proc.pid, interval)
    sampler.start()
    killed = []

    def kill():
        killed.append(True)
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout, kill)
    timer.start()
    result = None
    try:
        for ln in proc.stdout:
            ln = ln.rstrip("\n")
            if ln.startswith(PHASE):
                sampler.phase = ln[len(PHASE):]
            elif ln.startswith("{"):
                with contextlib.suppress(ValueError):
                    result = json.loads(ln)
        rc = proc.wait()
    finally:
        timer.cancel()
        sampler.stop.set()
        sampler.join()
        if drain and not killed:
            _drain_group(proc.pid, drain)
        # Reap anything the worker left behind (its session only).
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        _remove_mosaic_shm(shm_before)
    if killed:
        return {"error": f"timed out after {timeout:.0f} s (phase {sampler.phase})"}
    if result is None:
        return {"error": f"worker exited {rc} without a result (phase {sampler.phase})"}
    if "error" in result or "unavailable" in result:
        return result
    if rc != 0:
        result["exit_note"] = f"worker exited {rc} after printing its result"
    result["mem"] = sampler.samples
    return result


def summarize(res: dict, batch_bytes: int) -> dict:
    """Table numbers of one worker run: rates, wait percentiles, memory (MiB);
    or ``{"error": ...}`` / ``{"unavailable": ...}`` / ``{"missing": ...}``."""
    for k in ("error", "unavailable", "missing"):
        if k in res:
            return {k: res[k]}
    w = np.asarray(res["waits_s"])
    timed = [s for s in res["mem"] if s[1] == "timed"]
    allm = res["mem"]
    out = {
        "batches_s": len(w) / res["elapsed_s"],
        "mib_s": len(w) * batch_bytes / MiB / res["elapsed_s"],
        "p50_ms": float(np.percentile(w, 50)) * 1e3,
        "p95_ms": float(np.percentile(w, 95)) * 1e3,
        "max_ms": float(w.max()) * 1e3,
        "timed": len(w),
        "samples": len(allm), "timed_samples": len(timed),
        "procs": max((s[4] for s in allm), default=0),
    }
    for key, col in (("pss", 2), ("rss", 3), ("anon", 5), ("file", 6), ("shmem", 7)):
        out[f"steady_{key}"] = float(np.median([s[col] for s in timed])) / MiB if timed else float("nan")
        out[f"peak_{key}"] = max((s[col] for s in allm), default=0) / MiB
    return out


# =========================================================================== data (parent, our interpreter)


def _bench_zrecord():
    import importlib.util
    spec = importlib.util.spec_from_file_location("_bench_zrecord_for_loader", HERE / "bench_zrecord.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def prepare_data(args, bz) -> dict:
    """Source .npy files and one zstd + one raw store per workload size, generated once."""
    wdir = args.workdir / ("quick" if args.quick else "full")
    src_dir, st_dir = wdir / "source", wdir / "stores"
    manifest_path = wdir / "manifest.json"
    import loaderx
    from loaderx.zrecord import Dense
    want = {"generator": GENERATOR_VERSION, "seed": args.seed, "records": args.records}
    manifest = bz.cached_manifest(manifest_path, want, args.regenerate)
    images, labels = src_dir / "images.npy", src_dir / "labels.npy"
    if manifest is None:
        import shutil
        shutil.rmtree(wdir, ignore_errors=True)
        src_dir.mkdir(parents=True)
        log(f"[data] generating {args.records} images (seed {args.seed}) in {src_dir} ...")
        t0 = time.perf_counter()
        # Same RNG stream and 64-image chunks as bench_zrecord's dense-vision source,
        # so the pixels match it (apart from the 4 stamp bytes per image).
        rng = np.random.default_rng([args.seed, zlib.crc32(b"dense-vision")])
        arr = np.lib.format.open_memmap(images, mode="w+", dtype=np.uint8, shape=(args.records, *ITEM))
        for i in range(0, args.records, 64):
            m = min(64, args.records - i)
            chunk = bz.make_images(rng, m, ITEM[1], ITEM[2])
            # Stamp the record index into the first 4 bytes (channel 0, row 0, x 0..3).
            chunk[:, 0, 0, :4] = np.arange(i, i + m, dtype="<u4").view(np.uint8).reshape(m, 4)
            arr[i:i + m] = chunk
        arr.flush()
        del arr
        np.save(labels, np.arange(args.records, dtype=np.int64))
        manifest = {"params": want, "generate_s": time.perf_counter() - t0, "stores": {}}
        manifest_path.write_text(json.dumps(manifest, indent=1))
    else:
        log(f"[data] reusing {src_dir}")
    src = np.load(images, mmap_mode="r")
    lab = np.load(labels, mmap_mode="r")
    for codec in args.codecs:
        sdir = st_dir / codec
        if codec in manifest["stores"] and all((sdir / f).exists() for f in ("image", "label")):
            continue
        import shutil
        shutil.rmtree(sdir, ignore_errors=True)
        sdir.mkdir(parents=True)
        log(f"[data] writing {codec} stores with loaderx {loaderx.__version__} ...")
        t0 = time.perf_counter()
        with Dense.create(sdir / "image", np.uint8, ITEM, codec=codec) as w:
            for i in range(0, args.records, 256):
                w.append(np.ascontiguousarray(src[i:i + 256]))
        with Dense.create(sdir / "label", np.int64, (), codec=codec) as w:
            w.append(np.ascontiguousarray(lab))
        size = sum(f.stat().st_blocks * 512 for f in sdir.rglob("*") if f.is_file())
        manifest["stores"][codec] = {"write_s": time.perf_counter() - t0, "disk_bytes": size,
                                     "written_by": f"loaderx {loaderx.__version__}"}
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return {"dir": wdir, "images": images, "labels": labels, "stores": st_dir, "manifest": manifest,
            "logical_bytes": int(src.nbytes)}


def warm_files(paths) -> None:
    """Read files once so every backend starts from a warm page cache."""
    for p in paths:
        p = Path(p)
        files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.read(1 << 24):
                    pass


def prepare_peer_data(args, data: dict, formats: list[str]) -> dict:
    """The peer data sets (``_pipelines.py --build``, run by the peers
    interpreter), built once per source under ``<data dir>/peers/<format>``;
    returns ``{format: {"path": ...} or {"error": ...}}``."""
    pdir = data["dir"] / "peers"
    manifest_path = pdir / "manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
    except (OSError, ValueError):
        manifest = {}
    want = data["manifest"]["params"]
    out = {}
    for fmt in formats:
        path = pdir / fmt
        entry = manifest.get(fmt)
        if not (entry and entry.get("params") == want and path.exists()):
            import shutil

            shutil.rmtree(path, ignore_errors=True)
            log(f"[data] writing the {fmt} peer data with {args.peers_python} ...")
            try:
                proc = subprocess.run(
                    [
                        str(args.peers_python),
                        "-I",
                        str(HERE / "_pipelines.py"),
                        "--build",
                        fmt,
                        str(data["images"]),
                        str(path),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                out[fmt] = {"error": f"cannot build {fmt}: {type(exc).__name__}: {exc}"}
                continue
            line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
            if proc.returncode != 0 or line is None:
                tail = [x for x in proc.stderr.strip().splitlines() if x.strip()]
                out[fmt] = {
                    "error": f"cannot build {fmt}: " + (tail[-1] if tail else f"exit {proc.returncode}")[:300]
                }
                shutil.rmtree(path, ignore_errors=True)
                continue
            entry = {"params": want, "build": json.loads(line)}
            manifest[fmt] = entry
            pdir.mkdir(parents=True, exist_ok=True)
            manifest_path.write_text(json.dumps(manifest, indent=1))
        target = (
            path / "store.array_record" if fmt == "arrayrecord" else path
        )  # ArrayRecord: one file in a folder
        out[fmt] = {"path": str(target), "dir": str(path), **entry["build"]}
    return out


# =========================================================================== driver


def probe(python: str, code: str, timeout: float = 180) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            [python, "-I", "-c", code], capture_output=True, text=True, timeout=timeout, cwd="/"
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        tail = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return False, (tail[-1] if tail else f"exit status {proc.returncode}")[:300]
    return True, proc.stdout.strip()


_PROBE_IMPORTS = """
import json, sys
from importlib import metadata
sys.path[:0] = {path!r}
out = {{}}
for name, (code, dist) in {checks!r}.items():
    try:
        exec(code, {{}})
    except BaseException as exc:
        out[name] = [False, f"{{type(exc).__name__}}: {{exc}}"[:300]]
        continue
    try:
        out[name] = [True, f"{{dist}} {{metadata.version(dist)}}"]
    except Exception:
        out[name] = [True, dist]
print(json.dumps(out))
"""


def probe_imports(
    python: str, checks: dict[str, tuple[str, str]], path: list[str] | None = None
) -> dict[str, tuple[bool, str]]:
    """Run each import snippet of ``checks`` (``{name: (code, distribution)}``)
    under ``python -I``; ``{name: (True, "distribution version") or (False, error)}``."""
    if not Path(python).exists():
        return {k: (False, f"no interpreter {python}") for k in checks}
    ok, out = probe(python, _PROBE_IMPORTS.format(path=path or [], checks=checks))
    if not ok:
        return {k: (False, out) for k in checks}
    return {k: tuple(v) for k, v in json.loads(out.splitlines()[-1]).items()}


_PROCESS_PROBE = """
import sys
sys.path[:0] = {path!r}
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense
import _transforms
s = {{"image": Dense.open({image!r}), "label": Dense.open({label!r})}}
try:
    dl = DataLoader(s, batch_size=8, transform_workers=2, transform=_transforms.identity, workers="process",
                    start_method=None)
except TypeError as exc:
    print(f"not available: TypeError: {{exc}}")
else:
    dl.close()
    print("ok")
"""


def _fmt(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _setup(args) -> int:
    """numba into our venv and the reference venv; .venv-peers (grain, numba and
    the peer formats) through bench_peers.py --setup."""
    for py in (Path(sys.executable), args.reference_python):
        log(f"[setup] pip install {' '.join(LOADER_PACKAGES)} into {py} ...")
        subprocess.run(
            [str(py), "-m", "pip", "install", "--progress-bar", "off", "-q", *LOADER_PACKAGES], check=True
        )
    log(f"[setup] bench_peers.py --setup --peers-python {args.peers_python} ...")
    subprocess.run(
        [sys.executable, str(HERE / "bench_peers.py"), "--setup", "--peers-python", str(args.peers_python)],
        check=True,
    )
    return 0


# --------------------------------------------------------------------------- rows


def _row(
    key, tables, loader, label, model, storage, access, transform, python, spec, warm, drain=0.0
) -> dict:
    return {
        "key": key,
        "tables": list(tables),  # a copy: add() extends it when another table shares the row
        "loader": loader,
        "label": label,
        "model": model,
        "storage": storage,
        "access": access,
        "transform": transform,
        "python": python,
        "spec": spec,
        "warm": [str(w) for w in warm],
        "drain": drain,
    }


def plan_rows(args, data: dict, ours_path: str) -> list[dict]:
    """Every row the selected tables need, each once (the tables share rows)."""
    rows: dict[str, dict] = {}
    here, ours_sys = [str(HERE)], [ours_path, str(HERE)]
    tw, w = args.transform_workers, args.workers
    npy_warm = [data["images"], data["labels"]]

    def add(row):
        if row["key"] in rows:
            rows[row["key"]]["tables"] += [t for t in row["tables"] if t not in rows[row["key"]]["tables"]]
        else:
            rows[row["key"]] = row

    if "classic" in args.tables:
        for codec in args.codecs:
            st = data["stores"] / codec
            stores = {"image": str(st / "image"), "label": str(st / "label")}
            if "ours" in args.backends:
                add(
                    _row(
                        f"ours/{codec}",
                        ["classic"],
                        "ours",
                        "**ours**",
                        "threads (native gather)",
                        f"zrecord-{codec}",
                        "random",
                        "none",
                        sys.executable,
                        {
                            "backend": "loaderx",
                            "settle": 0,
                            "max_seconds": None,
                            "stores": stores,
                            "sys_path": ours_sys,
                        },
                        [st],
                    )
                )
            if "ours-pytransform" in args.backends:
                add(
                    _row(
                        f"ours-pytransform/{codec}",
                        ["classic"],
                        "ours",
                        "ours + `lambda b: b`",
                        f"threads (native gather + {tw} Python transform threads)",
                        f"zrecord-{codec}",
                        "random",
                        "identity",
                        sys.executable,
                        {
                            "backend": "loaderx",
                            "settle": 0,
                            "max_seconds": None,
                            "stores": stores,
                            "py_transform": True,
                            "sys_path": ours_sys,
                        },
                        [st],
                    )
                )
            if "reference" in args.backends:
                add(
                    _row(
                        f"reference/{codec}",
                        ["classic"],
                        "reference",
                        "loaderx 2.0.0",
                        f"threads (1 gather + {tw} transform)",
                        f"zrecord-{codec}",
                        "random",
                        "none",
                        str(args.reference_python),
                        {
                            "backend": "loaderx",
                            "settle": 0,
                            "max_seconds": None,
                            "stores": stores,
                            "sys_path": here,
                        },
                        [st],
                    )
                )
        if "torch" in args.backends:
            add(
                _row(
                    "torch",
                    ["classic"],
                    "torch",
                    "torch",
                    f"processes (fork, {args.torch_workers} workers)",
                    "npy-mmap-raw",
                    "random",
                    "none",
                    str(args.torch_python),
                    {"backend": "torch", "settle": 0, "max_seconds": None, "sys_path": here},
                    npy_warm,
                )
            )

    def loaderx_rows(tables, transforms, loaders):
        for tf in transforms:
            for codec in args.codecs:
                st = data["stores"] / codec
                stores = {"image": str(st / "image"), "label": str(st / "label")}
                base = {"loader": "loaderx", "stores": stores, "transform": tf, "transform_workers": w}
                how = "no transform" if tf == "none" else f"{w} transform threads"
                if "ours-thread" in loaders:
                    add(
                        _row(
                            f"ours-thread/{codec}/{tf}",
                            tables,
                            "ours-thread",
                            "**ours**, threads",
                            f"threads (native gather, {how})",
                            f"{codec} store",
                            "random",
                            tf,
                            sys.executable,
                            dict(base, model="thread", sys_path=ours_sys),
                            [st],
                        )
                    )
                if "ours-process" in loaders:
                    add(
                        _row(
                            f"ours-process/{codec}/{tf}",
                            tables,
                            "ours-process",
                            "**ours**, processes",
                            f"{w} transform worker processes (start method {args.start_method or 'default'})",
                            f"{codec} store",
                            "random",
                            tf,
                            sys.executable,
                            dict(base, model="process", start_method=args.start_method, sys_path=ours_sys),
                            [st],
                        )
                    )
                if "reference" in loaders:
                    add(
                        _row(
                            f"reference/{codec}/{tf}",
                            tables,
                            "reference",
                            "loaderx 2.0.0",
                            f"threads (1 gather + {w} transform threads)",
                            f"{codec} store",
                            "random",
                            tf,
                            str(args.reference_python),
                            dict(base, sys_path=here),
                            [st],
                        )
                    )

    def torch_rows(tables, transforms, methods):
        for tf in transforms:
            for method in methods:
                if f"torch-{method}" in args.loaders:
                    add(
                        _row(
                            f"torch-{method}/npy/{tf}",
                            tables,
                            f"torch-{method}",
                            "torch DataLoader",
                            f"{w} {method} worker processes",
                            "npy (mmap)",
                            "random",
                            tf,
                            str(args.torch_python),
                            {
                                "loader": "torch",
                                "workers": w,
                                "start_method": method,
                                "transform": tf,
                                "sys_path": here,
                            },
                            npy_warm,
                        )
                    )

    def peer_rows(tables, transforms, loaders):
        for tf in transforms:
            for name in loaders:
                if name not in args.loaders:
                    continue
                fmt, label, storage, access = PEER_DATA[name]
                model = (
                    f"{w} worker processes (mp_prefetch)"
                    if name == "grain"
                    else f"torch DataLoader, {w} fork worker processes"
                )
                add(
                    _row(
                        f"{name}/{fmt}/{tf}",
                        tables,
                        name,
                        label,
                        model,
                        storage,
                        access,
                        tf,
                        str(args.peers_python),
                        {
                            "loader": name,
                            "workers": w,
                            "transform": tf,
                            "wds_shuffle": args.wds_shuffle,
                            "sys_path": here,
                            "peer_format": fmt,
                        },
                        [],
                        drain=3.0 if name == "grain" else 0.0,
                    )
                )

    loaders = [x for x in LOADERS if x in args.loaders]
    if "transforms" in args.tables:
        tfs = [t for t in TRANSFORMS if t in args.transforms]
        loaderx_rows(["transforms"], tfs, loaders)
        torch_rows(["transforms"], tfs, ["fork"])
    if "peers" in args.tables:
        if "none" in args.transforms:
            loaderx_rows(["peers"], ["none"], loaders)
            torch_rows(["peers"], ["none"], ["fork", "spawn"])
            peer_rows(["peers"], ["none"], list(PEER_DATA))
        heavy = [t for t in ("pyloop", "numba") if t in args.transforms]
        loaderx_rows(["peers"], heavy, loaders)
        torch_rows(["peers"], heavy, ["fork"])
        peer_rows(["peers"], heavy, ["grain"])
    return list(rows.values())


def check_rows(rows: list[dict], args, data: dict, ours_path: str, impl: dict) -> None:
    """Probe every interpreter once for what its rows import; a row that cannot
    run gets ``skip``: ``{"missing": why}`` (an interpreter or package is not
    there) or ``{"unavailable": why}`` (ours-process before its option exists).
    Builds the peer data the remaining peer rows need."""
    by_python: dict[str, dict[str, tuple[str, str]]] = {}
    for r in rows:
        checks = by_python.setdefault(r["python"], {})
        if r["loader"] in ("ours", "ours-thread", "ours-process", "reference"):
            checks["loaderx"] = ("import loaderx, numpy", "loaderx")
        elif r["loader"] in ("torch", "torch-fork", "torch-spawn"):
            checks["torch"] = ("import torch, numpy", "torch")
        else:
            checks[r["loader"]] = PEER_IMPORTS[r["loader"]]
        if r["transform"] == "numba":
            checks["numba"] = ("import numba", "numba")
    found = {
        py: probe_imports(py, checks, [ours_path] if py == sys.executable else None)
        for py, checks in by_python.items()
    }
    process_probe = None
    if any(r["loader"] == "ours-process" for r in rows):
        st = data["stores"] / args.codecs[0]
        ok, out = probe(
            sys.executable,
            _PROCESS_PROBE.format(
                path=[ours_path, str(HERE)], image=str(st / "image"), label=str(st / "label")
            ),
        )
        process_probe = out if ok else f"probe failed: {out}"
        impl["ours-process"] = "available" if process_probe == "ok" else process_probe
    needed_formats = set()
    for r in rows:
        got = found[r["python"]]
        what = (
            "loaderx"
            if r["loader"] in ("ours", "ours-thread", "ours-process", "reference")
            else "torch"
            if r["loader"] in ("torch", "torch-fork", "torch-spawn")
            else r["loader"]
        )
        for name in (what, "numba" if r["transform"] == "numba" else None):
            if name and not got[name][0]:
                who = {"loaderx": "loaderx", "torch": "torch"}.get(name, PEER_IMPORTS.get(name, (0, name))[1])
                r["skip"] = {"missing": f"{who} not importable in {r['python']}: {got[name][1]}"}
                break
        if "skip" not in r and r["loader"] == "ours-process" and process_probe and process_probe != "ok":
            r["skip"] = {"unavailable": process_probe}
        if "skip" not in r and r["loader"] in PEER_DATA:
            needed_formats.add(r["spec"]["peer_format"])
    built = prepare_peer_data(args, data, sorted(needed_formats)) if needed_formats else {}
    for r in rows:
        fmt = r["spec"].get("peer_format")
        if fmt and "skip" not in r:
            if "error" in built[fmt]:
                r["skip"] = {"missing": built[fmt]["error"]}
            else:
                r["spec"]["peer_data"] = built[fmt]["path"]
                r["warm"] = [built[fmt]["dir"]]
    data["peer_builds"] = {k: {kk: vv for kk, vv in v.items() if kk != "path"} for k, v in built.items()}
    for name in PEER_IMPORTS:
        if any(r["loader"] == name for r in rows):
            ok, got = found.get(str(args.peers_python), {}).get(name, (False, "not probed"))
            impl[name] = f"{got} ({args.peers_python})" if ok else f"missing: {got}"


# --------------------------------------------------------------------------- report


def _cell_error(s: dict) -> str | None:
    for k, prefix in (("error", "ERROR: "), ("missing", "missing: "), ("unavailable", "")):
        if k in s:
            return (prefix + s[k]).replace("|", "\\|").replace("\n", " ")[:220]
    return None


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a == a and b == b and b > 0 else "n/a"


def _ref_key(row: dict) -> str:
    """The loaderx 2.0.0 row a row is compared with: same transform, same codec
    for store rows, the raw store for everything that reads uncompressed data."""
    codec = (
        row["key"].split("/")[1] if row["loader"] in ("ours-thread", "ours-process", "reference") else "raw"
    )
    return f"reference/{codec}/{row['transform']}"


def _machine_lines(rep: dict) -> list[str]:
    m = rep["machine"]
    cores = f"{m['cpu_count']} logical CPUs, {m['affinity']} usable (sched_getaffinity)"
    if "cgroup_cpus" in m:
        cores += f", cgroup quota {m['cgroup_cpus']} CPUs"
    mem = m["memory"] + (f" (cgroup limit {m['cgroup_memory']})" if "cgroup_memory" in m else "")
    out = [
        "| machine | value |",
        "|---|---|",
        f"| CPU | {m['cpu']} |",
        f"| cores | {cores} |",
        f"| memory | {mem} |",
        f"| kernel | {m['kernel']} |",
        f"| python | {m['python']}, numpy {m['numpy']} |",
    ]
    out += [f"| {k} | {v} |" for k, v in rep["implementations"].items()]
    out += [
        f"| load average (1/5/15 min) | start {rep.get('loadavg_start', '?')}, "
        f"end {rep.get('loadavg_end', '?')} |",
        f"| data | {rep['data']['dir']} |",
    ]
    return out


def _workload_line(rep: dict, transform_workers: int | str, classic: bool = False) -> str:
    """The workload and method sentence under a table's title (``classic``:
    that table's rows time exactly ``--batches`` batches, with no settling)."""
    a, d = rep["args"], rep["data"]
    timed = (
        f"up to {a['batches']} timed batches, stopping early once {a['min_batches']} are timed and "
        f"{a['max_seconds']:g} s have passed"
        if a.get("max_seconds") and not classic
        else f"{a['batches']} timed batches"
    )
    settled = (
        f", {a['settle']} more taken but not counted (so no row is credited with its full read-ahead)"
        if a.get("settle") and not classic
        else ""
    )
    rounds = f"; every cell is the median of {a['rounds']} rounds" if a["rounds"] > 1 else ""
    return (
        f"{a['records']:,} records uint8{ITEM} + int64 label ({d['logical_bytes'] / MiB:.0f} MiB of images); "
        f"batch {a['batch']} ({d['batch_bytes'] / MiB:.1f} MiB); {transform_workers} workers, "
        f"prefetch_size {a['prefetch']} (loaderx); {a['verify']} fully verified + {a['warmup']} warm-up "
        f"batches{settled}, then {timed}{rounds}. batches/s = counted batches ÷ their wall time. Each row "
        "is a fresh process; waits are per `next()` as the consumer sees them; peak PSS is the maximum, over "
        "the row's whole life, of the PSS summed over its process tree (workers included), sampled every "
        f"{a['interval'] * 1e3:.0f} ms."
    )


def render_classic(rep: dict) -> list[str]:
    """The original table (``--tables classic``)."""
    a = rep["args"]
    rows = [r for r in rep["rows"] if "classic" in r["tables"]]
    if not rows:
        return []
    sums = rep["summaries"]
    L = [f"## loaderx end-to-end DataLoader benchmark{' (--quick)' if a['quick'] else ''}", ""]
    L += [*_machine_lines(rep), ""]
    st_notes = ", ".join(
        f"{c} {v['disk_bytes'] / MiB:.0f} MiB on disk"
        for c, v in rep["data"]["stores"].items()
        if c in a["codecs"]
    )
    L.append(
        _workload_line(
            rep,
            f"transform_workers={a['transform_workers']} (loaderx), {a['torch_workers']} torch",
            classic=True,
        )
        + f" Stores written by ours: {st_notes}."
    )
    L.append("")
    L.append(
        "| loader | model | storage | batches/s | MiB/s | p50 wait | p95 wait | steady PSS | peak PSS | "
        "steady PSS anon / file / shmem | steady RSS | peak RSS | procs |"
    )
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        s = sums.get(r["key"], {"error": "not run"})
        err = _cell_error(s)
        if err:
            L.append(f"| {r['label']} | {r['model']} | {r['storage']} | {err} | | | | | | | | | |")
            continue
        L.append(
            f"| {r['label']} | {r['model']} | {r['storage']} | {_fmt(s['batches_s'])} | {_fmt(s['mib_s'])} | "
            f"{_fmt(s['p50_ms'])} ms | {_fmt(s['p95_ms'])} ms | {_fmt(s['steady_pss'])} MiB | "
            f"{_fmt(s['peak_pss'])} MiB | {_fmt(s['steady_anon'])} / {_fmt(s['steady_file'])} / "
            f"{_fmt(s['steady_shmem'])} MiB | {_fmt(s['steady_rss'])} MiB | {_fmt(s['peak_rss'])} MiB | "
            f"{s['procs']} |"
        )
    L.append("")
    ok_s = {k: v for k, v in sums.items() if "batches_s" in v}
    ratios = []
    for codec in a["codecs"]:
        o, r = ok_s.get(f"ours/{codec}"), ok_s.get(f"reference/{codec}")
        if o and r:
            ratios.append(
                f"ours vs loaderx 2.0.0 ({codec}): {o['batches_s'] / r['batches_s']:.2f}x batches/s, "
                f"{o['peak_pss'] / r['peak_pss']:.2f}x peak PSS"
            )
    t = ok_s.get("torch")
    for codec in a["codecs"]:
        o = ok_s.get(f"ours/{codec}")
        if o and t:
            ratios.append(
                f"ours-{codec} vs torch: {o['batches_s'] / t['batches_s']:.2f}x batches/s, "
                f"{o['peak_pss'] / t['peak_pss']:.2f}x peak PSS"
            )
    for codec in a["codecs"]:
        o, pt = ok_s.get(f"ours/{codec}"), ok_s.get(f"ours-pytransform/{codec}")
        if o and pt:
            ratios.append(
                f"ours with vs without a Python transform ({codec}): "
                f"{pt['batches_s'] / o['batches_s']:.2f}x batches/s"
            )
    if ratios:
        L += ["**Ratios** (>1 = first one higher; for PSS lower is better): " + "; ".join(ratios) + ".", ""]
    L += _notes(rep, rows)
    L.append(
        "Correctness: every row's pipeline was checked untimed (labels in range and unique within a batch, "
        "image stamp == label for every warm-up batch and the last timed batch, and every image byte equal "
        f"to the source for the first {a['verify']} batches); a row that fails shows as ERROR."
    )
    return L


def _notes(rep: dict, rows: list[dict]) -> list[str]:
    L = []
    notes = [
        f"{r['key']}: {rep['results'][r['key']]['exit_note']}"
        for r in rows
        if rep["results"].get(r["key"], {}).get("exit_note")
    ]
    if notes:
        L += ["Note — " + "; ".join(notes) + ".", ""]
    loads = ", ".join(f"{r['key']} {rep['loads'][r['key']]}" for r in rows if rep["loads"].get(r["key"]))
    if loads:
        L += [f"Load average (1/5/15 min) after each row: {loads}.", ""]
    return L


def _metric_cells(s: dict, ref: dict | None) -> str:
    if ref is None or "batches_s" not in ref:
        vs = "| | "
    else:
        vs = f"| {_ratio(s['batches_s'], ref['batches_s'])} | {_ratio(s['peak_pss'], ref['peak_pss'])} "
    return (
        f"| {_fmt(s['batches_s'])} | {_fmt(s['p95_ms'])} ms | {_fmt(s['peak_pss'])} MiB | {s['procs']} "
        f"| {s['timed']} {vs}|"
    )


def _row_order(r: dict) -> tuple:
    """Table order: by transform, then store codec (loaderx rows first), then loader (LOADERS order)."""
    tfs = ("none", *TRANSFORMS)
    codec = r["key"].split("/")[1]
    return (
        tfs.index(r["transform"]) if r["transform"] in tfs else 99,
        CODECS.index(codec) if codec in CODECS else 99,
        LOADERS.index(r["loader"]) if r["loader"] in LOADERS else 99,
    )


def _table_rows(rep: dict, table: str, first_cols) -> list[str]:
    """The table's rows, then (after a blank line) one numbered note per distinct
    reason a row is missing or not available, which its cell refers to."""
    sums = rep["summaries"]
    L, notes = [], {}
    for r in sorted((r for r in rep["rows"] if table in r["tables"]), key=_row_order):
        s = sums.get(r["key"], {"error": "not run"})
        lead = "| " + " | ".join(first_cols(r)) + " "
        kind = next((k for k in ("missing", "unavailable") if k in s), None)
        if kind:  # the same reason repeats on many rows: say it once, under the table
            why = _cell_error(s)
            n = notes.setdefault(why, len(notes) + 1)
            word = "missing" if kind == "missing" else "not available"
            L.append(lead + f"| {word} ({n}) | | | | | | |")
        elif "error" in s:
            L.append(lead + f"| {_cell_error(s)} | | | | | | |")
        else:
            L.append(lead + _metric_cells(s, sums.get(_ref_key(r)) if r["loader"] != "reference" else None))
    if notes:
        L.append("")
        L += [f"({n}) {why}" + ("  " if n < len(notes) else "") for why, n in notes.items()]
    return L


_METRIC_HEAD = "| batches/s | p95 wait | peak PSS | procs | timed | vs 2.0.0 batches/s | vs 2.0.0 peak PSS |"
_METRIC_ALIGN = "---:|---:|---:|---:|---:|---:|---:|"


def targets_10(rep: dict) -> list[str]:
    """Issue #10's targets, each met / missed / n/a, from the transforms table's rows."""
    sums, codecs = rep["summaries"], rep["args"]["codecs"]
    ok = {k: v for k, v in sums.items() if "batches_s" in v}
    L = []
    for codec in codecs:
        p, r = ok.get(f"ours-process/{codec}/pyloop"), ok.get(f"reference/{codec}/pyloop")
        if p and r:
            x = p["batches_s"] / r["batches_s"]
            L.append(
                f"processes, Python loop, {codec}: {x:.2f}x loaderx 2.0.0 (target >= 1.6x): "
                f"{'met' if x >= 1.6 else 'missed'}"
            )
        else:
            why = (
                _cell_error(sums.get(f"ours-process/{codec}/pyloop", {"unavailable": "not run"}))
                if not p
                else "no loaderx 2.0.0 row"
            )
            L.append(f"processes, Python loop, {codec}: n/a ({why})")
    for tf in TRANSFORMS:
        t = ok.get(f"torch-fork/npy/{tf}")
        for codec in codecs:
            p = ok.get(f"ours-process/{codec}/{tf}")
            if p and t:
                met = p["batches_s"] > t["batches_s"] and p["peak_pss"] <= t["peak_pss"]
                L.append(
                    f"processes vs torch-fork, {tf}, {codec}: "
                    f"{p['batches_s'] / t['batches_s']:.2f}x batches/s "
                    f"at {p['peak_pss'] / t['peak_pss']:.2f}x peak PSS (target > 1x at <= 1x): "
                    f"{'met' if met else 'missed'}"
                )
    if not any(k.startswith("ours-process/") for k in ok):
        L.append("processes vs torch-fork: n/a (no ours-process row ran)")
    worse = []
    compared = 0
    for key, s in ok.items():
        if key.startswith("ours-thread/") and key.split("/")[2] in TRANSFORMS:
            ref = ok.get("reference/" + key.split("/", 1)[1])
            if ref:
                compared += 1
                if s["peak_pss"] > ref["peak_pss"]:
                    worse.append(f"{key} {s['peak_pss']:.0f} vs {ref['peak_pss']:.0f} MiB")
    if compared:
        L.append(
            f"threads, peak PSS <= loaderx 2.0.0's on every row ({compared} compared): "
            + ("met" if not worse else "missed on " + "; ".join(worse))
        )
    return L


def render_transforms(rep: dict) -> list[str]:
    """Issue #10's table: loaders x transforms x codecs."""
    if not any("transforms" in r["tables"] for r in rep["rows"]):
        return []
    a = rep["args"]
    L = [_workload_line(rep, a["workers"]), ""]
    L.append("| transform | loader | model | storage " + _METRIC_HEAD)
    L.append("|---|---|---|---|" + _METRIC_ALIGN)
    L += _table_rows(
        rep, "transforms", lambda r: [f"`{r['transform']}`", r["label"], r["model"], r["storage"]]
    )
    L.append("")
    L.append(
        "`vs 2.0.0`: this row ÷ the loaderx 2.0.0 row with the same transform and store codec "
        "(torch: the raw store); above 1 is faster / more memory. Transforms (`benches/_transforms.py`): "
        f"`identity` returns the batch; `pyloop` walks {_pyloop_rows()} rows x 224 pixels per channel "
        "of every image in interpreted Python (about 2 ms per image, GIL-bound); "
        "`numba` is the same loop under "
        "`numba.njit(nogil=True)`, compiled before timing; `numpy` normalises the image to float32 "
        "(4x the bytes). Every transform's output was checked exactly against a NumPy reference."
    )
    L.append("")
    L.append("**Targets (#10)**:")
    L += [f"- {x}" for x in targets_10(rep)]
    L.append("")
    L += _notes(rep, [r for r in rep["rows"] if "transforms" in r["tables"]])
    return L


def render_peers(rep: dict) -> list[str]:
    """Issue #17's table: every loader, no transform, plus the CPU-heavy transforms."""
    if not any("peers" in r["tables"] for r in rep["rows"]):
        return []
    a = rep["args"]
    L = [_workload_line(rep, a["workers"]), ""]
    L.append("| transform | loader | model | storage | access " + _METRIC_HEAD)
    L.append("|---|---|---|---|---|" + _METRIC_ALIGN)
    L += _table_rows(
        rep, "peers", lambda r: [f"`{r['transform']}`", r["label"], r["model"], r["storage"], r["access"]]
    )
    L.append("")
    builds = rep["data"].get("peer_builds", {})
    if builds:
        L.append(
            "Peer data, written once from the same source records by `benches/peers/_worker.py`'s writers "
            "(uncompressed): "
            + "; ".join(
                f"{k} {v['disk_bytes'] / MiB:.0f} MiB" if "disk_bytes" in v else f"{k}: {v.get('error')}"
                for k, v in builds.items()
            )
            + "."
        )
    L.append(
        "`none`: the loader's own default (loaderx: no transform argument; torch: default collate). "
        "`vs 2.0.0`: ÷ the loaderx 2.0.0 row with the same transform, same codec for store rows and the raw "
        "store for the rest (all of which read uncompressed data). WebDataset reads its tar shards in order "
        f"(split between the workers) through a {a['wds_shuffle']}-sample shuffle buffer: sequential access, "
        "not random batches. Every row's first batches were checked byte for byte against the source."
    )
    L.append("")
    L += _notes(rep, [r for r in rep["rows"] if "peers" in r["tables"]])
    return L


def _pyloop_rows() -> int:
    sys.path.insert(0, str(HERE))
    import _transforms

    return _transforms.PYLOOP_ROWS


def render_doc_section(rep: dict, table: str) -> str:
    """The text between a docs marker pair: how it was run, then the table."""
    m = rep["machine"]
    body = render_transforms(rep) if table == "transforms" else render_peers(rep)
    head = (
        f"Run {rep.get('finished', '?')}{' (--quick)' if rep['args']['quick'] else ''}: "
        f"`{rep.get('command', 'bench_loader.py')}`, on {m['cpu']} ({m['affinity']} usable cores, "
        f"{m['memory']}), Python {m['python']}; load average (1/5/15 min) {rep.get('loadavg_start', '?')} at "
        f"the start, {rep.get('loadavg_end', '?')} at the end. Interpreters: "
        + "; ".join(f"{k}: {v}" for k, v in rep["implementations"].items())
        + "."
    )
    return "\n".join([head, "", *body]).rstrip() + "\n"


def update_docs(rep: dict, doc: Path) -> list[str]:
    """Replace the text between ``<!-- loader-transforms:begin/end -->`` and
    ``<!-- loader-peers:begin/end -->`` in ``doc`` with the report's tables."""
    text = doc.read_text()
    done = []
    for table, marker in DOC_MARKERS.items():
        if not any(table in r["tables"] for r in rep["rows"]):
            continue
        begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
        if begin not in text or end not in text:
            raise SystemExit(f"{doc}: markers {begin} / {end} not found")
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = pre + begin + "\n" + render_doc_section(rep, table) + end + post
        done.append(marker)
    doc.write_text(text)
    return done


def render_all(rep: dict) -> str:
    q = " (--quick)" if rep["args"]["quick"] else ""
    parts = []
    if any("classic" in r["tables"] for r in rep["rows"]):
        parts.append("\n".join(render_classic(rep)))
    for table, title in (
        ("transforms", "Loaders under transforms (#10)"),
        ("peers", "Loader comparison (#17)"),
    ):
        body = render_transforms(rep) if table == "transforms" else render_peers(rep)
        if body:
            head = [f"## {title}{q}", ""]
            if not parts:
                head += [*_machine_lines(rep), ""]
            parts.append("\n".join(head + body))
    return "\n\n".join(parts).rstrip() + "\n"


# --------------------------------------------------------------------------- main


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1,024 records, up to 40 timed batches (3 s) after 5 warm-up",
    )
    p.add_argument("--tables", default=",".join(TABLES), help=f"subset of {','.join(TABLES)} (default: all)")
    p.add_argument(
        "--loaders",
        default=",".join(LOADERS),
        help=f"rows of the transforms / peers tables, subset of {','.join(LOADERS)}",
    )
    p.add_argument(
        "--transforms",
        default="none," + ",".join(TRANSFORMS),
        help="subset of none,identity,pyloop,numpy,numba (none: the peers table's plain rows)",
    )
    p.add_argument(
        "--backends", default=",".join(BACKENDS), help=f"classic-table rows, subset of {','.join(BACKENDS)}"
    )
    p.add_argument("--codecs", default=",".join(CODECS), help="subset of zstd,raw (loaderx rows)")
    p.add_argument("--records", type=int, help="records in the source (default 2500; --quick 1024)")
    p.add_argument("--batches", type=int, help="most timed batches per row (default 200; --quick 40)")
    p.add_argument(
        "--max-seconds",
        type=float,
        help="stop timing a row after this long once --min-batches are timed (default 10; --quick 3; "
        "0 = always --batches)",
    )
    p.add_argument(
        "--min-batches", type=int, help="timed batches before --max-seconds applies (default 20; --quick 8)"
    )
    p.add_argument(
        "--settle",
        type=int,
        default=8,
        help="transforms / peers tables: batches taken after the warm-up but not counted, so a loader's "
        "full read-ahead does not count as throughput (default 8)",
    )
    p.add_argument("--warmup", type=int, help="untimed warm-up batches (default 10; --quick 5)")
    p.add_argument("--verify", type=int, default=2, help="fully verified batches before warm-up (default 2)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="transforms / peers tables: transform_workers of loaderx, num_workers of the others",
    )
    p.add_argument(
        "--start-method",
        default=None,
        help="ours-process: start_method (default None: the loader's own choice)",
    )
    p.add_argument(
        "--transform-workers", type=int, default=4, help="classic table: loaderx transform_workers"
    )
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--torch-workers", type=int, default=2, help="classic table: torch num_workers")
    p.add_argument(
        "--wds-shuffle", type=int, default=256, help="WebDataset shuffle buffer, samples per worker"
    )
    p.add_argument("--seed", type=int, default=20240611, help="seed of the image generator")
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out" / "loader")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python")
    p.add_argument(
        "--torch-python",
        type=Path,
        default=None,
        help="python with torch + numpy for the torch rows (default: this interpreter)",
    )
    p.add_argument(
        "--peers-python",
        type=Path,
        default=REPO / ".venv-peers" / "bin" / "python",
        help="python of the peers venv (grain, streaming, webdataset, datasets, torch)",
    )
    p.add_argument("--require-torch", action="store_true", help="exit 1 when torch cannot be imported")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every row N times (rotating the order) and report per-metric medians (default 1)",
    )
    p.add_argument("--interval", type=float, default=0.05, help="memory sampling period in seconds")
    p.add_argument("--timeout", type=float, help="per-row timeout in seconds (default 900; --quick 300)")
    p.add_argument("--regenerate", action="store_true", help="rebuild the source, stores and peer data")
    p.add_argument("--json", type=Path, help="also write every raw number (waits, memory samples) here")
    p.add_argument("--markdown", type=Path, help="also write the tables (markdown) here")
    p.add_argument("--from-json", type=Path, help="measure nothing: render the tables of an earlier --json")
    p.add_argument(
        "--update-docs",
        action="store_true",
        help="fill the loader-transforms / loader-peers sections of docs/benchmarks.md",
    )
    p.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md", help="file for --update-docs")
    p.add_argument(
        "--setup",
        action="store_true",
        help="install numba here and in --reference-python, grain + numba (+ peers) in --peers-python",
    )
    args = p.parse_args(argv)
    q = args.quick
    args.records = args.records or (1024 if q else 2500)
    args.batches = args.batches or (40 if q else 200)
    args.max_seconds = args.max_seconds if args.max_seconds is not None else (3.0 if q else 10.0)
    args.min_batches = args.min_batches or (8 if q else 20)
    args.warmup = args.warmup if args.warmup is not None else (5 if q else 10)
    args.timeout = args.timeout or (300 if q else 900)
    args.workdir = args.workdir.resolve()
    args.torch_python = Path(os.path.abspath(args.torch_python or sys.executable))
    args.reference_python = Path(os.path.abspath(args.reference_python))
    args.peers_python = Path(os.path.abspath(args.peers_python))

    def subset(opt, allowed):
        got = [x.strip() for x in getattr(args, opt).split(",") if x.strip()]
        bad = [x for x in got if x not in allowed]
        if bad or not got:
            p.error(f"--{opt.replace('_', '-')}: choose from {','.join(allowed)}")
        return [x for x in allowed if x in got]

    args.tables = subset("tables", TABLES)
    args.loaders = subset("loaders", LOADERS)
    args.transforms = subset("transforms", ("none", *TRANSFORMS))
    args.backends = subset("backends", BACKENDS)
    args.codecs = subset("codecs", CODECS)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.batch > args.records:
        p.error("--batch must not exceed --records")
    if args.update_docs and q and not args.from_json:
        p.error("--update-docs publishes numbers: not with --quick")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--worker":
        return worker_main(argv[1])
    faulthandler.enable()
    args = parse_args(argv)
    if args.setup:
        return _setup(args)
    if args.from_json:
        rep = json.loads(args.from_json.read_text())
        return _publish(rep, args)

    bz = _bench_zrecord()
    machine = bz.machine_info()
    t_begin = time.perf_counter()
    data = prepare_data(args, bz)
    batch_bytes = args.batch * int(np.prod(ITEM)) + args.batch * 8
    data["batch_bytes"] = batch_bytes

    import loaderx

    ours_path = str(Path(loaderx.__file__).resolve().parent.parent)  # passed to -I workers (see worker())
    impl = {}
    ok, out = probe(
        sys.executable,
        f"import sys; sys.path.insert(0, {ours_path!r}); import loaderx, numpy; "
        "print(loaderx.__version__, loaderx.__file__)",
    )
    if not ok:
        log(f"ours: cannot import loaderx: {out}")
        return 2
    impl["ours"] = out
    rows = plan_rows(args, data, ours_path)
    if any(r["loader"] == "reference" for r in rows):
        ok, out = (
            probe(str(args.reference_python), "import loaderx; print(loaderx.__version__, loaderx.__file__)")
            if args.reference_python.exists()
            else (False, f"{args.reference_python} not found")
        )
        impl["reference"] = out if ok else f"unavailable: {out}"
    if any(r["loader"].startswith("torch") for r in rows):
        ok, out = (
            probe(str(args.torch_python), "import torch, numpy; print(torch.__version__, numpy.__version__)")
            if args.torch_python.exists()
            else (False, f"{args.torch_python} not found")
        )
        impl["torch"] = (
            f"torch {out.split()[0]}, numpy {out.split()[1]} ({args.torch_python})"
            if ok
            else f"unavailable: {out}"
        )
    check_rows(rows, args, data, ours_path, impl)
    for r in rows:
        if "skip" in r:
            log(f"[loader] {r['key']}: {next(iter(r['skip']))}: {next(iter(r['skip'].values()))}")

    base_spec = {
        "images": str(data["images"]),
        "labels": str(data["labels"]),
        "records": args.records,
        "batch": args.batch,
        "batches": args.batches,
        "warmup": args.warmup,
        "verify": args.verify,
        "transform_workers": args.transform_workers,
        "prefetch": args.prefetch,
        "torch_workers": args.torch_workers,
        "seed": 42,
        "max_seconds": args.max_seconds,
        "min_batches": args.min_batches,
        "settle": args.settle,
    }
    runs: dict[str, list] = {}
    loads: dict[str, str] = {}
    loadavg_start = bz._loadavg()
    todo = [r for r in rows if "skip" not in r]
    for rnd in range(args.rounds):
        k = rnd % max(1, len(todo))  # rotate the order between rounds, so no row always runs first
        for r in todo[k:] + todo[:k]:
            warm_files(r["warm"])
            key = r["key"]
            log(f"[loader] {key}{f' (round {rnd + 1}/{args.rounds})' if args.rounds > 1 else ''} ...")
            t0 = time.perf_counter()
            spec = dict(base_spec, **r["spec"])
            res = run_worker(
                r["python"],
                spec,
                data["dir"] / f"spec-{key.replace('/', '-')}.json",
                args.timeout,
                args.interval,
                drain=r["drain"],
            )
            res["load"] = loads[key] = bz._loadavg()
            runs.setdefault(key, []).append(res)
            s1 = summarize(res, batch_bytes)
            if "batches_s" in s1:
                log(
                    f"[loader] {key}: {s1['batches_s']:.1f} batches/s, p95 {s1['p95_ms']:.1f} ms, peak PSS "
                    f"{s1['peak_pss']:.0f} MiB, {s1['timed']} timed ({time.perf_counter() - t0:.1f} s)"
                )
            else:
                log(f"[loader] {key}: {_cell_error(s1)}")
    summaries, results = {}, {}
    for r in rows:
        key = r["key"]
        if "skip" in r:
            summaries[key] = results[key] = dict(r["skip"])
            continue
        rr = runs[key]
        per = [summarize(x, batch_bytes) for x in rr]
        bad = next((x for x in per if "batches_s" not in x), None)
        if bad:
            summaries[key] = bad
        else:
            summaries[key] = {m: float(np.median([x[m] for x in per])) for m in per[0]}
            summaries[key]["procs"] = int(max(x["procs"] for x in per))
            summaries[key]["timed"] = int(min(x["timed"] for x in per))
        results[key] = (
            rr[-1]
            if len(rr) == 1
            else {
                "rounds": rr,
                "load": rr[-1].get("load"),
                "exit_note": "; ".join(x["exit_note"] for x in rr if x.get("exit_note")),
            }
        )
    rep = {
        "machine": machine,
        "implementations": impl,
        "command": " ".join(["bench_loader.py", *argv]),
        "finished": time.strftime("%Y-%m-%d %H:%M %Z"),
        "loadavg_start": loadavg_start,
        "loadavg_end": bz._loadavg(),
        "total_s": time.perf_counter() - t_begin,
        "data": {
            "dir": str(data["dir"]),
            "logical_bytes": data["logical_bytes"],
            "batch_bytes": batch_bytes,
            "stores": data["manifest"]["stores"],
            "peer_builds": data.get("peer_builds", {}),
        },
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": [{k: v for k, v in r.items() if k != "spec"} for r in rows],
        "summaries": summaries,
        "loads": loads,
        "results": results,
    }
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rep, indent=1, default=str))
        log(f"raw numbers written to {args.json}")
    rc = _publish(rep, args)
    failed = any("error" in s for s in summaries.values())
    if args.require_torch and any(
        "missing" in summaries[r["key"]] for r in rows if r["loader"].startswith("torch")
    ):
        failed = True
    return 1 if failed or rc else 0


def _publish(rep: dict, args) -> int:
    """Print the tables; --markdown / --update-docs write them too."""
    text = render_all(rep)
    print(text, flush=True)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(text)
        log(f"tables written to {args.markdown}")
    if args.update_docs:
        done = update_docs(rep, args.doc)
        log(f"{args.doc}: updated {', '.join(done) or 'nothing (no transforms / peers rows)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
