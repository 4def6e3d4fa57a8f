#!/usr/bin/env python3
"""End-to-end loader benchmark: our DataLoader vs loaderx 2.0.0 vs torch DataLoader.

Run it with the interpreter that imports OUR loaderx:

    .venv/bin/python benches/bench_loader.py --quick
    .venv/bin/python benches/bench_loader.py                  # full size

Workload: 2,500 deterministic image-like uint8 (3, 224, 224) records (the
generator of bench_zrecord.py's dense-vision workload) with int64 labels
``label[i] = i``, batch 256, 200 timed batches after 10 warm-up batches.

Rows (every row runs in its own fresh subprocess, and the parent samples the
PSS/RSS of that process tree every ~50 ms):

    ours            loaderx.dataloader.DataLoader({'image', 'label'}, batch_size=256,
                    transform_workers=4, prefetch_size=4), default identity transform
    ours + py-transform   the same with ``transform=lambda b: b`` (the Python
                    transform-thread path)
    loaderx 2.0.0   the reference DataLoader, same arguments, on the SAME store
                    files, in its own virtualenv
    torch           torch.utils.data.DataLoader over a map-style Dataset on
                    np.load(mmap_mode='r') files: num_workers=2, shuffle=True,
                    persistent_workers=True, default collate

The loaderx rows run once per store codec (zstd, raw).  See benches/README.md
("bench_loader.py") for the methodology and the columns.
"""

from __future__ import annotations

import argparse
import faulthandler
import glob
import json
import os
import platform
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
BACKENDS = ("ours", "ours-pytransform", "reference", "torch")
PHASE = "@@PHASE "


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================== worker
# Runs under three different interpreters (ours, the reference venv, the torch
# venv), always with -I: only stdlib + numpy + the backend's public API here.


def _phase(name: str) -> None:
    print(PHASE + name, flush=True)


def stamp_of(images: np.ndarray) -> np.ndarray:
    """The record index stamped into bytes 0..3 of channel 0, row 0 of each image."""
    return np.ascontiguousarray(images[:, 0, 0, :4]).view("<u4").reshape(-1).astype(np.int64)


def _verify(batch: dict, spec: dict, src: np.ndarray, full: bool) -> None:
    """Raise AssertionError unless ``batch`` is a correct batch of the workload."""
    img, lab = batch["image"], batch["label"]
    b = spec["batch"]
    if img.shape != (b, *ITEM) or img.dtype != np.uint8:
        raise AssertionError(f"image batch {img.shape} {img.dtype}, expected {(b, *ITEM)} uint8")
    if lab.shape != (b,) or lab.dtype != np.int64:
        raise AssertionError(f"label batch {lab.shape} {lab.dtype}, expected ({b},) int64")
    if int(lab.min()) < 0 or int(lab.max()) >= spec["records"]:
        raise AssertionError("label outside 0..records-1")
    if len(np.unique(lab)) != b:
        raise AssertionError("a record repeats within one batch")
    if not np.array_equal(stamp_of(img), lab):
        raise AssertionError("images do not match their labels (stamp != label)")
    if full:
        for k in range(b):  # compare every image with its source record, read by pread
            if not np.array_equal(img[k], src.record(int(lab[k]))):
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


def _open_pipeline(spec: dict):
    """Build the pipeline; return (iterator yielding {'image','label'} numpy batches, close, info)."""
    info = {"python": f"{platform.python_implementation()} {platform.python_version()}",
            "executable": sys.executable, "numpy": np.__version__}
    if spec["backend"] == "torch":
        import warnings

        import torch
        from torch.utils.data import DataLoader as TorchLoader, Dataset

        # The Dataset hands torch read-only memmap slices; default_collate copies
        # them into the shared batch tensor. Silence the per-worker non-writable warning.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        info["torch"] = torch.__version__

        class NpyDataset(Dataset):
            def __init__(self, images_path: str, labels_path: str):
                self.images_path, self.labels_path = images_path, labels_path
                self.images = self.labels = None
                self.n = len(np.load(labels_path, mmap_mode="r"))

            def __len__(self):
                return self.n

            def __getitem__(self, i):
                if self.images is None:  # opened lazily, i.e. in each worker process
                    self.images = np.load(self.images_path, mmap_mode="r")
                    self.labels = np.load(self.labels_path, mmap_mode="r")
                return {"image": self.images[i], "label": self.labels[i]}

        torch.manual_seed(spec["seed"])
        loader = TorchLoader(NpyDataset(spec["images"], spec["labels"]), batch_size=spec["batch"],
                             shuffle=True, num_workers=spec["torch_workers"],
                             persistent_workers=spec["torch_workers"] > 0, drop_last=True)
        info["model"] = f"multiprocessing start method {torch.multiprocessing.get_start_method()}"

        def it():
            for b in _endless(loader):
                yield b

        def to_np(b):
            return {"image": b["image"].numpy(), "label": b["label"].numpy()}

        def close():
            nonlocal loader
            del loader

        return it(), to_np, close, info

    import loaderx
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    info["loaderx_version"] = getattr(loaderx, "__version__", "?")
    info["loaderx_file"] = loaderx.__file__
    streams = {"image": Dense.open(spec["stores"]["image"]), "label": Dense.open(spec["stores"]["label"])}
    kwargs = dict(batch_size=spec["batch"], transform_workers=spec["transform_workers"],
                  prefetch_size=spec["prefetch"])
    if spec.get("py_transform"):
        kwargs["transform"] = lambda b: b
    loader = DataLoader(streams, **kwargs)

    def close():
        loader.close()
        for s in streams.values():
            s.close()

    return iter(loader), (lambda b: b), close, info


def worker(spec: dict) -> dict:
    _phase("setup")
    src = _Source(spec["images"])
    it, to_np, close, info = _open_pipeline(spec)
    try:
        _phase("verify")
        for k in range(spec["verify"]):  # full check: stamps, labels and every image byte
            _verify(to_np(next(it)), spec, src, full=True)
        _phase("warmup")
        for _ in range(spec["warmup"]):
            _verify(to_np(next(it)), spec, src, full=False)
        _phase("timed")
        waits = []
        batch = None
        pc = time.perf_counter
        t_start = pc()
        for _ in range(spec["batches"]):
            t0 = pc()
            batch = next(it)  # the previous batch stays alive meanwhile, as in a for loop
            waits.append(pc() - t0)
        elapsed = pc() - t_start
        _phase("after")
        _verify(to_np(batch), spec, src, full=False)  # the last timed batch is correct too
        del batch
    finally:
        close()
        src.close()
    _phase("closed")
    return {"info": info, "waits_s": waits, "elapsed_s": elapsed}


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
            try:
                stack.extend(int(x) for x in Path(f).read_text().split())
            except (OSError, ValueError):
                pass
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
                    tot = [a + b for a, b in zip(tot, r)]
                    n += 1
            if n:
                self.samples.append((time.perf_counter() - t0, self.phase, tot[0], tot[1], n,
                                     tot[2], tot[3], tot[4]))
            self.stop.wait(self.interval)


def run_worker(python: str, spec: dict, spec_path: Path, timeout: float, interval: float) -> dict:
    spec_path.write_text(json.dumps(spec))
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
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    timer = threading.Timer(timeout, kill)
    timer.start()
    result = None
    try:
        for ln in proc.stdout:
            ln = ln.rstrip("\n")
            if ln.startswith(PHASE):
                sampler.phase = ln[len(PHASE):]
            elif ln.startswith("{"):
                try:
                    result = json.loads(ln)
                except ValueError:
                    pass
        rc = proc.wait()
    finally:
        timer.cancel()
        sampler.stop.set()
        sampler.join()
        # Reap anything the worker left behind (its session only).
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
    if killed:
        return {"error": f"timed out after {timeout:.0f} s (phase {sampler.phase})"}
    if result is None:
        return {"error": f"worker exited {rc} without a result (phase {sampler.phase})"}
    if "error" in result:
        return result
    if rc != 0:
        result["exit_note"] = f"worker exited {rc} after printing its result"
    result["mem"] = sampler.samples
    return result


def summarize(res: dict, batch_bytes: int) -> dict:
    if "error" in res:
        return {"error": res["error"]}
    w = np.asarray(res["waits_s"])
    timed = [s for s in res["mem"] if s[1] == "timed"]
    allm = res["mem"]
    out = {
        "batches_s": len(w) / res["elapsed_s"],
        "mib_s": len(w) * batch_bytes / MiB / res["elapsed_s"],
        "p50_ms": float(np.percentile(w, 50)) * 1e3,
        "p95_ms": float(np.percentile(w, 95)) * 1e3,
        "max_ms": float(w.max()) * 1e3,
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


# =========================================================================== driver


def probe(python: str, code: str, timeout: float = 180) -> tuple[bool, str]:
    try:
        proc = subprocess.run([python, "-I", "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, timeout=timeout, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if proc.returncode != 0:
        tail = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        return False, (tail[-1] if tail else f"exit status {proc.returncode}")[:300]
    return True, proc.stdout.strip()


def _fmt(x: float) -> str:
    if x != x:
        return "n/a"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--worker":
        return worker_main(argv[1])
    faulthandler.enable()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 1,024 records, 40 timed batches after 5 warm-up")
    p.add_argument("--records", type=int, help="records in the source (default 2500; --quick 1024)")
    p.add_argument("--batches", type=int, help="timed batches (default 200; --quick 40)")
    p.add_argument("--warmup", type=int, help="untimed warm-up batches (default 10; --quick 5)")
    p.add_argument("--verify", type=int, default=2, help="fully verified batches before warm-up (default 2)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--transform-workers", type=int, default=4)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--torch-workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=20240611, help="seed of the image generator")
    p.add_argument("--backends", default=",".join(BACKENDS), help=f"subset of {','.join(BACKENDS)}")
    p.add_argument("--codecs", default=",".join(CODECS), help="subset of zstd,raw (loaderx rows)")
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out" / "loader")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python")
    p.add_argument("--torch-python", type=Path, default=Path("/tmp/torchvenv/bin/python"),
                   help="python of a virtualenv with torch + numpy (default /tmp/torchvenv/bin/python)")
    p.add_argument("--require-torch", action="store_true", help="exit 1 when torch cannot be imported")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every row N times (rotating the order) and report per-metric medians (default 1)")
    p.add_argument("--interval", type=float, default=0.05, help="memory sampling period in seconds")
    p.add_argument("--timeout", type=float, help="per-row timeout in seconds (default 900; --quick 300)")
    p.add_argument("--regenerate", action="store_true", help="rebuild the source and stores")
    p.add_argument("--json", type=Path, help="also write every raw number (waits, memory samples) here")
    args = p.parse_args(argv)
    q = args.quick
    args.records = args.records or (1024 if q else 2500)
    args.batches = args.batches or (40 if q else 200)
    args.warmup = args.warmup if args.warmup is not None else (5 if q else 10)
    args.timeout = args.timeout or (300 if q else 900)
    args.workdir = args.workdir.resolve()
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.codecs = [c for c in CODECS if c in {x.strip() for x in args.codecs.split(",")}]
    if any(b not in BACKENDS for b in args.backends) or not args.backends:
        p.error(f"--backends: choose from {','.join(BACKENDS)}")
    if not args.codecs:
        p.error("--codecs: choose from zstd,raw")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.batch > args.records:
        p.error("--batch must not exceed --records")

    bz = _bench_zrecord()
    machine = bz.machine_info()
    data = prepare_data(args, bz)
    batch_bytes = args.batch * int(np.prod(ITEM)) + args.batch * 8

    # Versions (and whether torch is usable at all) before anything is measured.
    impl = {}
    ok, out = probe(sys.executable, "import loaderx, numpy; print(loaderx.__version__, loaderx.__file__)")
    if not ok:
        log(f"ours: cannot import loaderx: {out}")
        return 2
    impl["ours"] = out
    if "reference" in args.backends:
        ok, out = probe(str(args.reference_python), "import loaderx; print(loaderx.__version__, loaderx.__file__)") \
            if args.reference_python.exists() else (False, f"{args.reference_python} not found")
        impl["reference"] = out if ok else f"unavailable: {out}"
    torch_reason = None
    if "torch" in args.backends:
        ok, out = probe(str(args.torch_python), "import torch, numpy; print(torch.__version__, numpy.__version__)") \
            if args.torch_python.exists() else (False, f"{args.torch_python} not found")
        if ok:
            tv, tnv = out.split()
            impl["torch"] = f"torch {tv}, numpy {tnv} ({args.torch_python})"
        else:
            torch_reason = out
            impl["torch"] = f"unavailable: {out}"

    plan = []  # (key, loader, model, storage, python, spec overrides, files to warm)
    tw = args.transform_workers
    for codec in args.codecs:
        st = data["stores"] / codec
        stores = {"image": str(st / "image"), "label": str(st / "label")}
        if "ours" in args.backends:
            plan.append((f"ours/{codec}", "**ours**", "threads (native gather)", f"zrecord-{codec}",
                         sys.executable, {"backend": "loaderx", "stores": stores}, [st]))
        if "ours-pytransform" in args.backends:
            plan.append((f"ours-pytransform/{codec}", "ours + `lambda b: b`",
                         f"threads (native gather + {tw} Python transform threads)", f"zrecord-{codec}",
                         sys.executable, {"backend": "loaderx", "stores": stores, "py_transform": True}, [st]))
        if "reference" in args.backends:
            plan.append((f"reference/{codec}", "loaderx 2.0.0", f"threads (1 gather + {tw} transform)",
                         f"zrecord-{codec}", str(args.reference_python), {"backend": "loaderx", "stores": stores},
                         [st]))
    if "torch" in args.backends:
        plan.append(("torch", "torch", f"processes (fork, {args.torch_workers} workers)", "npy-mmap-raw",
                     str(args.torch_python), {"backend": "torch"}, [data["images"], data["labels"]]))

    base_spec = {"images": str(data["images"]), "labels": str(data["labels"]), "records": args.records,
                 "batch": args.batch, "batches": args.batches, "warmup": args.warmup, "verify": args.verify,
                 "transform_workers": tw, "prefetch": args.prefetch, "torch_workers": args.torch_workers,
                 "seed": 42}
    results, summaries = {}, {}  # key -> one raw result per round / the per-metric median over rounds
    runs = {}
    for rnd in range(args.rounds):
        k = rnd % len(plan)  # rotate the order between rounds, so no row always runs first
        for key, *_rest, python, extra, warm in plan[k:] + plan[:k]:
            if key == "torch" and torch_reason is not None:
                results[key] = {"unavailable": torch_reason}
                if rnd == 0:
                    log(f"[loader] torch: unavailable ({torch_reason})")
                continue
            if key.startswith("reference") and impl.get("reference", "").startswith("unavailable"):
                results[key] = {"error": impl["reference"]}
                continue
            warm_files(warm)
            log(f"[loader] {key}{f' (round {rnd + 1}/{args.rounds})' if args.rounds > 1 else ''} ...")
            t0 = time.perf_counter()
            spec = dict(base_spec, **extra)
            res = run_worker(python, spec, data["dir"] / f"spec-{key.replace('/', '-')}.json",
                             args.timeout, args.interval)
            res["load"] = bz._loadavg()
            runs.setdefault(key, []).append(res)
            s1 = summarize(res, batch_bytes)
            if "error" in s1:
                log(f"[loader] {key}: ERROR {s1['error']}")
            else:
                log(f"[loader] {key}: {s1['batches_s']:.1f} batches/s, peak PSS {s1['peak_pss']:.0f} MiB "
                    f"({time.perf_counter() - t0:.1f} s)")
    for key, rr in runs.items():
        per = [summarize(r, batch_bytes) for r in rr]
        bad = next((x for x in per if "error" in x), None)
        if bad:
            summaries[key] = bad
        else:
            summaries[key] = {m: float(np.median([x[m] for x in per])) for m in per[0]}
            summaries[key]["procs"] = int(max(x["procs"] for x in per))
        results[key] = rr[-1] if len(rr) == 1 else {"rounds": rr, "load": rr[-1].get("load"),
                                                    "exit_note": "; ".join(r["exit_note"] for r in rr
                                                                           if r.get("exit_note"))}

    # ------------------------------------------------------------------ report
    L = [f"## loaderx end-to-end DataLoader benchmark{' (--quick)' if q else ''}", ""]
    cores = f"{machine['cpu_count']} logical CPUs, {machine['affinity']} usable (sched_getaffinity)"
    if "cgroup_cpus" in machine:
        cores += f", cgroup quota {machine['cgroup_cpus']} CPUs"
    mem = machine["memory"] + (f" (cgroup limit {machine['cgroup_memory']})" if "cgroup_memory" in machine else "")
    L += ["| machine | value |", "|---|---|", f"| CPU | {machine['cpu']} |", f"| cores | {cores} |",
          f"| memory | {mem} |", f"| kernel | {machine['kernel']} |",
          f"| python | {machine['python']}, numpy {machine['numpy']} |"]
    for k, v in impl.items():
        L.append(f"| {k} | {v} |")
    L += [f"| load average at start | {machine.get('loadavg', '?')} |", f"| data | {data['dir']} |", ""]
    st_notes = ", ".join(f"{c} {v['disk_bytes'] / MiB:.0f} MiB on disk" for c, v in data["manifest"]["stores"].items()
                         if c in args.codecs)
    L.append(f"{args.records:,} records uint8{ITEM} + int64 label ({data['logical_bytes'] / MiB:.0f} MiB of images; "
             f"stores written by ours: {st_notes}); batch {args.batch} "
             f"({batch_bytes / MiB:.1f} MiB); {args.verify} fully verified + {args.warmup} warm-up batches, then "
             f"{args.batches} timed{f'; every cell is the median of {args.rounds} rounds' if args.rounds > 1 else ''}. Waits are per `next()` as seen by the consumer; memory is summed over the "
             f"worker's process tree, sampled every {args.interval * 1e3:.0f} ms (steady = median while timing, "
             f"peak = max over the worker's whole life).")
    L.append("")
    L.append("| loader | model | storage | batches/s | MiB/s | p50 wait | p95 wait | steady PSS | peak PSS | "
             "steady PSS anon / file / shmem | steady RSS | peak RSS | procs |")
    L.append("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    failed = False
    for key, loader, model, storage, *_ in plan:
        res = results[key]
        if "unavailable" in res:
            L.append(f"| {loader} | {model} | {storage} | unavailable: {res['unavailable'][:160]} "
                     "| | | | | | | | | |")
            if args.require_torch:
                failed = True
            continue
        s = summaries.get(key) or {"error": res.get("error", "?")}
        if "error" in s:
            failed = True
            msg = s["error"].replace("|", "\\|").replace("\n", " ")[:200]
            L.append(f"| {loader} | {model} | {storage} | ERROR: {msg} | | | | | | | | | |")
            continue
        L.append(f"| {loader} | {model} | {storage} | {_fmt(s['batches_s'])} | {_fmt(s['mib_s'])} | "
                 f"{_fmt(s['p50_ms'])} ms | {_fmt(s['p95_ms'])} ms | {_fmt(s['steady_pss'])} MiB | "
                 f"{_fmt(s['peak_pss'])} MiB | {_fmt(s['steady_anon'])} / {_fmt(s['steady_file'])} / "
                 f"{_fmt(s['steady_shmem'])} MiB | {_fmt(s['steady_rss'])} MiB | {_fmt(s['peak_rss'])} MiB | "
                 f"{s['procs']} |")
    L.append("")
    ratios = []
    ok_s = {k: v for k, v in summaries.items() if "error" not in v}
    for codec in args.codecs:
        o, r = ok_s.get(f"ours/{codec}"), ok_s.get(f"reference/{codec}")
        if o and r:
            ratios.append(f"ours vs loaderx 2.0.0 ({codec}): {o['batches_s'] / r['batches_s']:.2f}x batches/s, "
                          f"{o['peak_pss'] / r['peak_pss']:.2f}x peak PSS")
    t = ok_s.get("torch")
    for codec in args.codecs:
        o = ok_s.get(f"ours/{codec}")
        if o and t:
            ratios.append(f"ours-{codec} vs torch: {o['batches_s'] / t['batches_s']:.2f}x batches/s, "
                          f"{o['peak_pss'] / t['peak_pss']:.2f}x peak PSS")
    for codec in args.codecs:
        o, pt = ok_s.get(f"ours/{codec}"), ok_s.get(f"ours-pytransform/{codec}")
        if o and pt:
            ratios.append(f"ours with vs without a Python transform ({codec}): "
                          f"{pt['batches_s'] / o['batches_s']:.2f}x batches/s")
    if ratios:
        L.append("**Ratios** (>1 = first one higher; for PSS lower is better): " + "; ".join(ratios) + ".")
        L.append("")
    notes = [f"{k}: {v['exit_note']}" for k, v in results.items() if v.get("exit_note")]
    if notes:
        L.append("Note — " + "; ".join(notes) + ".")
        L.append("")
    loads = ", ".join(f"{k} {v['load']}" for k, v in results.items() if v.get("load"))
    if loads:
        L.append(f"Load average (1/5/15 min) after each row: {loads}.")
        L.append("")
    L.append("Correctness: every row's pipeline was checked untimed (labels in range and unique within a batch, "
             "image stamp == label for every warm-up batch and the last timed batch, and every image byte equal "
             f"to the source for the first {args.verify} batches); a row that fails shows as ERROR.")
    print("\n".join(L), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "implementations": impl, "summaries": summaries,
                                         "results": results,
                                         "args": {k: str(v) if isinstance(v, Path) else v
                                                  for k, v in vars(args).items()}}, indent=1))
        log(f"raw numbers written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
