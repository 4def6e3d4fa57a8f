#!/usr/bin/env python3
"""Object-storage benchmark: our DataLoader on local disk vs S3 at added latency,
side by side with MosaicML Streaming on the same S3 server.

Run it with the interpreter that imports OUR loaderx:

    .venv/bin/python benches/bench_remote.py --quick
    .venv/bin/python benches/bench_remote.py --make-mosaic-venv --json bench-out/remote/full.json

Workloads (synthetic, deterministic, the record index stamped into each record):

    vision   Dense uint8 (3, 224, 224), 2,500 records (--quick 600), zstd
    tokens   Dense int32[512], 100,000 records (--quick 20,000), zstd and raw

Each is written once to a local store and once to ``s3://`` on a SeaweedFS
server on 127.0.0.1 (tests/_servers.py ``S3Server``), with the same records.
Rows, every one in a fresh subprocess:

    local            DataLoader({'x': Dense.open(dir)}, batch_size=256, prefetch_size=4,
                     mode=2, transform=lambda b: b), warm page cache
                     (--transform none: no transform, the native path alone)
    S3 direct        the same on Dense.open('s3://...') straight to the server
    S3 +0/+5/+20 ms  the same through a delay proxy on 127.0.0.1 that adds that
                     round-trip time (benches/_latency.py; netem is used nowhere,
                     see the header line "added latency")
    mosaic ...       MosaicML Streaming (its own venv): MDSWriter to the same server,
                     StreamingDataset + torch DataLoader reading it, local and remote

See benches/README.md ("bench_remote.py") for the method and every column.
"""

from __future__ import annotations

import argparse
import atexit
import faulthandler
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Process-tree walking and interpreter probes are bench_loader's (stdlib and
# numpy only, so this file's workers can load it under any interpreter).
_bench_loader = _load("_bench_loader_for_remote", HERE / "bench_loader.py")
tree_pids = _bench_loader.tree_pids
probe = _bench_loader.probe
GENERATOR_VERSION = 1  # bump when the data changes, to invalidate cached sources
MiB = 2 ** 20
DEFAULT_MAX_IN_FLIGHT = 128  # the engine's default max_in_flight (remote::Tuning::default)
WORKLOADS = {
    "vision": dict(title="Dense vision: uint8 (3, 224, 224)", dtype="uint8", item=(3, 224, 224),
                   codecs=("zstd",), full=(2500, 50, 5), quick=(600, 8, 2)),
    "tokens": dict(title="Dense tokens: int32[512]", dtype="int32", item=(512,),
                   codecs=("zstd", "raw"), full=(100_000, 100, 10), quick=(20_000, 20, 3)),
}
BACKENDS = ("loaderx", "mosaic")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================== worker
# Runs under our interpreter (loaderx rows) or the mosaic venv (mosaic rows),
# always with -I: only stdlib + numpy + the backend's public API here.


def stamps(batch: np.ndarray, kind: str) -> np.ndarray:
    """The record index stamped into each record of a batch."""
    if kind == "vision":  # bytes 0..3 of channel 0, row 0 (little-endian uint32)
        return np.ascontiguousarray(batch[:, 0, 0, :4]).view("<u4").reshape(-1).astype(np.int64)
    return batch[:, 0].astype(np.int64)  # tokens: the first token


def check_batch(x: np.ndarray, spec: dict, src: np.ndarray | None) -> np.ndarray:
    """Raise AssertionError unless ``x`` is a batch of distinct, correct records;
    with ``src`` every record is compared byte for byte. Returns the indices."""
    want = (spec["batch"], *spec["item"])
    if tuple(x.shape) != want or x.dtype != np.dtype(spec["dtype"]):
        raise AssertionError(f"batch {x.shape} {x.dtype}, expected {want} {spec['dtype']}")
    idx = stamps(x, spec["kind"])
    if idx.min() < 0 or idx.max() >= spec["records"]:
        raise AssertionError("stamped record index out of range")
    if len(np.unique(idx)) != len(idx):
        raise AssertionError("a record repeats within one batch")
    if src is not None:
        for k, i in enumerate(idx):
            if not np.array_equal(x[k], src[int(i)]):
                raise AssertionError(f"record {int(i)} differs from the source")
    return idx


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu(root: int) -> float:
    """User + system CPU seconds of a process tree (all threads), from /proc."""
    total = 0
    for pid in tree_pids(root):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
        except (OSError, ValueError, IndexError):
            pass
    return total / _TICK


def cpu_now(spec: dict) -> dict:
    """CPU seconds so far of this worker's process tree and of the watched ones
    (the S3 server, the delay proxy)."""
    out = {"loader": tree_cpu(os.getpid())}
    for name, pid in (spec.get("watch") or {}).items():
        out[name] = tree_cpu(pid)
    try:  # the whole machine's busy time, to tell what everything else used meanwhile
        v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        out["machine"] = (v[0] + v[1] + v[2] + sum(v[5:8])) / _TICK  # user nice system irq softirq steal
    except (OSError, ValueError, IndexError):
        pass
    return out


def _timed_loop(it, spec: dict, to_np, src, stats=None) -> dict:
    """Verify, warm up, then time ``next(it)`` for spec['batches'] batches, cut
    short after spec['max_seconds'] (at least 3 batches), and extended until the
    loop has run spec['min_seconds'] (so fast rows run long enough for the CPU
    accounting, whose resolution is one clock tick, 10 ms)."""
    out = {}
    pc = time.perf_counter
    for _ in range(spec["verify"]):
        check_batch(to_np(next(it)), spec, src)
    for _ in range(spec["warmup"]):
        check_batch(to_np(next(it)), spec, None)
    waits = []
    batch = None
    s0 = stats() if stats else None
    c0 = cpu_now(spec)
    t_start = pc()
    deadline = t_start + spec["max_seconds"]
    floor = t_start + spec.get("min_seconds", 0.0)
    while (len(waits) < spec["batches"] and (len(waits) < 3 or pc() < deadline)) or pc() < floor:
        t0 = pc()
        batch = next(it)  # the previous batch stays alive meanwhile, as in a for loop
        waits.append(pc() - t0)
    out["elapsed_s"] = pc() - t_start
    c1 = cpu_now(spec)
    s1 = stats() if stats else None
    out["cpu_s"] = {k: c1[k] - c0[k] for k in c0}
    out["waits_s"] = waits
    if stats:
        out["requests"], out["bytes"] = s1[0] - s0[0], s1[1] - s0[1]
    check_batch(to_np(batch), spec, None)  # the last timed batch is right too
    return out


def loader_threads() -> int:
    """Native loader producer threads in this process (named loaderx-loader-N)."""
    n = 0
    for comm in Path("/proc/self/task").glob("*/comm"):
        try:
            n += comm.read_text().startswith("loaderx-loader")
        except OSError:
            pass
    return n


def worker_reqrate(spec: dict) -> dict:
    """Small-request rate of the S3 path: gathers of every other record (no two
    ranges touch, coalesce_bytes=0, so one request per record) with many in flight."""
    from loaderx import _native
    from loaderx.zrecord import Dense
    store = Dense.open(spec["url"], storage_options=spec["storage_options"])
    n = len(store)
    k = min(spec["count"], n // 2)
    rates = []
    for rep in range(6):  # the first one warms the connection pool, untimed
        idx = list(range(rep % 2, 2 * k, 2))
        s0 = _native.remote_stats()
        t = time.perf_counter()
        store.__getitems__(idx)
        dt = time.perf_counter() - t
        if rep:
            rates.append((_native.remote_stats()[0] - s0[0]) / dt)
    store.close()
    # A ceiling: the best of five (the box is shared, so slower ones are other load).
    return {"req_s": float(max(rates)), "requests_per_gather": k, "rates": rates}


def worker_loaderx(spec: dict, src) -> dict:
    import loaderx
    from loaderx import _native
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense
    info = {"loaderx": f"{loaderx.__version__} {loaderx.__file__}"}
    opts = spec.get("storage_options") or None
    pc = time.perf_counter
    r0 = _native.remote_stats()
    t0 = pc()
    store = Dense.open(spec["url"], storage_options=opts)
    t_open = pc() - t0
    # "lambda": a trivial Python transform, as almost every training loop
    # passes one (it runs on transform threads); "none": the native path only.
    transform = None if spec.get("transform") == "none" else (lambda batch: batch)
    loader = DataLoader({"x": store}, batch_size=spec["batch"], prefetch_size=spec["prefetch"], mode=2,
                        seed=spec["seed"], transform=transform)
    it = iter(loader)
    first = next(it)["x"]
    ttfb = pc() - t0
    r1 = _native.remote_stats()
    producers = loader_threads()
    check_batch(first, spec, src)
    del first
    try:
        res = _timed_loop(it, spec, lambda b: b["x"], src, _native.remote_stats)
    finally:
        loader.close()
    # Isolated gathers: one batch at a time, nothing else in flight.
    rng = np.random.default_rng([spec["seed"], 7])
    lat, reqs, byts = [], [], []
    for _ in range(spec["gathers"]):
        idx = np.sort(rng.choice(spec["records"], size=spec["batch"], replace=False)).tolist()
        s0 = _native.remote_stats()
        t = pc()
        x = store.__getitems__(idx)
        lat.append(pc() - t)
        s1 = _native.remote_stats()
        reqs.append(s1[0] - s0[0])
        byts.append(s1[1] - s0[1])
        if not np.array_equal(stamps(x, spec["kind"]), np.asarray(idx)):
            raise AssertionError("isolated gather returned the wrong records")
    store.close()
    res.update(info=info, open_s=t_open, ttfb_s=ttfb, producers=producers, first_requests=r1[0] - r0[0], first_bytes=r1[1] - r0[1],
               gather_s=lat, gather_requests=reqs, gather_bytes=byts)
    return res


def worker_mosaic(spec: dict, src) -> dict:
    import streaming
    import torch
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader as TorchLoader
    clean_stale_shared_memory()
    info = {"streaming": streaming.__version__, "torch": torch.__version__}
    cache = tempfile.mkdtemp(prefix="mosaic-cache-", dir=spec["scratch"])
    pc = time.perf_counter
    t0 = pc()
    if spec.get("remote"):
        ds = StreamingDataset(remote=spec["remote"], local=cache, shuffle=True, shuffle_seed=spec["seed"],
                              batch_size=spec["batch"])
    else:
        ds = StreamingDataset(local=spec["local"], shuffle=True, shuffle_seed=spec["seed"],
                              batch_size=spec["batch"])
    nw = spec["mosaic_workers"]
    dl = TorchLoader(ds, batch_size=spec["batch"], num_workers=nw, drop_last=True,
                     persistent_workers=nw > 0, prefetch_factor=2 if nw > 0 else None)

    def endless():
        while True:
            yield from dl

    it = endless()
    first = next(it)["x"].numpy()
    ttfb = pc() - t0
    check_batch(first, spec, src)
    del first
    res = _timed_loop(it, spec, lambda b: b["x"].numpy(), src)
    res.update(info=info, ttfb_s=ttfb, cache_bytes=sum(f.stat().st_size for f in Path(cache).rglob("*")
                                                        if f.is_file()))
    return res


def worker_mosaic_write(spec: dict) -> dict:
    """Write the source with MDSWriter to (local dir, remote URL)."""
    import streaming
    from streaming import MDSWriter
    src = np.load(spec["source"], mmap_mode="r")
    col = f"ndarray:{spec['dtype']}:{','.join(str(d) for d in spec['item'])}"
    t0 = time.perf_counter()
    with MDSWriter(out=(spec["local"], spec["remote"]), columns={"x": col},
                   compression=spec["compression"], keep_local=True, progress_bar=False) as w:
        for i in range(0, len(src), 4096):
            chunk = np.ascontiguousarray(src[i:i + 4096])
            for rec in chunk:
                w.write({"x": rec})
    dt = time.perf_counter() - t0
    files = [f for f in Path(spec["local"]).rglob("*") if f.is_file()]
    return {"write_s": dt, "files": len(files), "bytes": sum(f.stat().st_size for f in files),
            "info": {"streaming": streaming.__version__}}


def worker_main(spec_path: str) -> int:
    faulthandler.enable()
    spec = json.loads(Path(spec_path).read_text())
    if spec.get("timeout", 0) > 10:  # show where a hung worker hangs
        faulthandler.dump_traceback_later(spec["timeout"] - 5, exit=False)
    try:
        if spec["backend"] == "mosaic-write":
            res = worker_mosaic_write(spec)
        elif spec["backend"] == "reqrate":
            res = worker_reqrate(spec)
        else:
            spec["item"] = tuple(spec["item"])
            src = np.load(spec["source"], mmap_mode="r")
            res = worker_loaderx(spec, src) if spec["backend"] == "loaderx" else worker_mosaic(spec, src)
    except BaseException as exc:
        import traceback
        traceback.print_exc()
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
        sys.stderr.flush()
        os._exit(1)
    print(json.dumps(res), flush=True)
    sys.stdout.flush()
    os._exit(0)  # skip teardown of native pools / torch workers: the numbers are out


# =========================================================================== cleanup (driver)

_CLEANUPS: list = []


def _on_exit(fn) -> None:
    _CLEANUPS.append(fn)


def _cleanup_all() -> None:
    while _CLEANUPS:
        fn = _CLEANUPS.pop()
        try:
            fn()
        except Exception as exc:  # keep cleaning the rest
            log(f"cleanup: {type(exc).__name__}: {exc}")


def _terminate(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


# =========================================================================== helpers (driver)


_MOSAIC_SHM = re.compile(r"^\d+_(barrier|cache_usage|locals|next_epoch|shard_access_times|shard_states|"
                         r"filelock|epoch_shape|epoch_sample_ids|.*)$")


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


def run_worker(python: str, spec: dict, spec_path: Path, timeout: float, env: dict) -> dict:
    spec_path.write_text(json.dumps(dict(spec, timeout=timeout)))
    shm_before = _shm_names()
    try:
        return _run_worker(python, spec_path, timeout, env)
    finally:
        # MosaicML Streaming keeps its coordination state in /dev/shm and a worker
        # that ends with os._exit (or is killed) leaves it behind: remove what this
        # worker created, so the next mosaic row starts clean.
        for name in _shm_names() - shm_before:
            if _MOSAIC_SHM.match(name):
                try:
                    os.unlink(f"/dev/shm/{name}")
                except OSError:
                    pass


def _run_worker(python: str, spec_path: Path, timeout: float, env: dict) -> dict:
    cmd = [python, "-I", str(Path(__file__).resolve()), "--worker", str(spec_path)]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=str(spec_path.parent), start_new_session=True, env=env)
    except OSError as exc:
        return {"error": f"cannot start {python}: {exc}"}

    def kill():
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass

    _on_exit(kill)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill()
        _, err = proc.communicate()
        tail = [x for x in (err or "").strip().splitlines() if x.strip()]
        if tail:
            log("    worker stderr (its stacks were dumped 5 s before the timeout):\n      "
                + "\n      ".join(tail[-40:]))
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        kill()  # reap whatever the worker left in its session (torch workers)
        if kill in _CLEANUPS:
            _CLEANUPS.remove(kill)
    result = None
    for ln in reversed(out.splitlines()):
        if ln.startswith("{"):
            try:
                result = json.loads(ln)
                break
            except ValueError:
                continue
    if result is None:
        tail = [x for x in err.strip().splitlines() if x.strip()][-3:]
        return {"error": f"worker exited {proc.returncode} without a result: {' / '.join(tail)[:400]}"}
    if "error" in result:
        tail = [x for x in err.strip().splitlines() if x.strip()]
        if tail:
            log("    worker stderr: " + " / ".join(tail[-6:])[:1500])
    return result


def ensure_mosaic_venv(args) -> str | None:
    """None when the mosaic venv is usable, else the reason it is not."""
    py = args.mosaic_python
    if not py.exists():
        if not args.make_mosaic_venv:
            return (f"{py} not found (pass --make-mosaic-venv to create it: python -m venv + "
                    f"pip install mosaicml-streaming, about 6 GB with torch's CUDA wheels)")
        venv = py.parent.parent
        log(f"[mosaic] creating {venv} (pip install mosaicml-streaming numpy; a few minutes) ...")
        try:
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "mosaicml-streaming", "numpy"],
                           check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"installing mosaicml-streaming failed: {exc}"
    ok, out = probe(str(py), "import streaming, torch, numpy; print(streaming.__version__, torch.__version__)",
                    timeout=300)
    return None if ok else f"{py} cannot import streaming/torch: {out}"


def _fmt(x: float | None) -> str:
    if x is None or x != x:
        return "n/a"
    if x == math.inf:
        return "∞"
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# =========================================================================== data


def prepare_source(name: str, wl: dict, args, bz) -> dict:
    n = wl["records"]
    wdir = args.workdir / ("quick" if args.quick else "full") / name
    src = wdir / "source.npy"
    manifest_path = wdir / "manifest.json"
    want = {"generator": GENERATOR_VERSION, "seed": args.seed, "records": n}
    manifest = bz.cached_manifest(manifest_path, want, args.regenerate)
    if manifest is None or not src.exists():
        shutil.rmtree(wdir, ignore_errors=True)
        wdir.mkdir(parents=True)
        log(f"[{name}] generating {n:,} records (seed {args.seed}) ...")
        t0 = time.perf_counter()
        if name == "vision":
            # Same RNG stream and 64-image chunks as bench_zrecord's dense-vision source and
            # bench_loader's images, and the same stamp (record index in bytes 0..3).
            rng = np.random.default_rng([args.seed, zlib.crc32(b"dense-vision")])
            arr = np.lib.format.open_memmap(src, mode="w+", dtype=np.uint8, shape=(n, *wl["item"]))
            for i in range(0, n, 64):
                m = min(64, n - i)
                chunk = bz.make_images(rng, m, 224, 224)
                chunk[:, 0, 0, :4] = np.arange(i, i + m, dtype="<u4").view(np.uint8).reshape(m, 4)
                arr[i:i + m] = chunk
        else:
            rng = np.random.default_rng([args.seed, zlib.crc32(b"dense-tokens")])
            model = bz.TokenModel(rng)
            arr = np.lib.format.open_memmap(src, mode="w+", dtype=np.int32, shape=(n, *wl["item"]))
            for i in range(0, n, 8192):
                m = min(8192, n - i)
                chunk = model.stream(m * 512).reshape(m, 512)
                chunk[:, 0] = np.arange(i, i + m, dtype=np.int32)  # the stamp: first token = index
                arr[i:i + m] = chunk
        arr.flush()
        del arr
        manifest = {"params": want, "generate_s": time.perf_counter() - t0}
        manifest_path.write_text(json.dumps(manifest, indent=1))
    return {"dir": wdir, "source": src}


def write_loaderx(url: str, src: np.ndarray, wl: dict, codec: str, opts: dict | None, shard: int | None) -> dict:
    from loaderx.zrecord import Dense
    t0 = time.perf_counter()
    with Dense.create(url, np.dtype(wl["dtype"]), wl["item"], codec=codec, shard_records=shard,
                      storage_options=opts) as w:
        for i in range(0, len(src), 256):
            w.append(np.ascontiguousarray(src[i:i + 256]))
    return {"write_s": time.perf_counter() - t0}


class Bandwidth:
    """GET throughput of the S3 server for large range reads (4 threads, 8 MiB
    ranges), measured with signed plain-Python requests: a lower bound for what
    a native client gets, used for the bandwidth column of the bounds."""

    @staticmethod
    def measure(servers_mod, server, bucket: str, key: str, size: int, port: int,
                total: int = 256 * MiB, threads: int = 4, chunk: int = 8 * MiB) -> float:
        import http.client
        import urllib.parse
        ranges = [(o, min(o + chunk, size) - 1) for o in range(0, size, chunk)]
        want = max(1, min(len(ranges) * 4, total // chunk))
        jobs = [ranges[i % len(ranges)] for i in range(want)]
        lock = threading.Lock()
        got = [0]
        errors = []

        def run():
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            path = urllib.parse.quote(f"/{bucket}/{key}")
            try:
                while True:
                    with lock:
                        if not jobs:
                            return
                        a, b = jobs.pop()
                    hdrs = {"host": f"127.0.0.1:{port}", "range": f"bytes={a}-{b}"}
                    hdrs.update(servers_mod.sigv4_headers("GET", path, "", hdrs, b"", server.access_key,
                                                          server.secret_key, server.region))
                    conn.request("GET", path, headers=hdrs)
                    resp = conn.getresponse()
                    n = len(resp.read())
                    if resp.status != 206:
                        raise RuntimeError(f"HTTP {resp.status}")
                    with lock:
                        got[0] += n
            except Exception as exc:  # reported below
                errors.append(exc)
            finally:
                conn.close()

        t0 = time.perf_counter()
        ts = [threading.Thread(target=run) for _ in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errors:
            raise errors[0]
        return got[0] / (time.perf_counter() - t0)


# =========================================================================== driver


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--worker":
        return worker_main(argv[1])
    faulthandler.enable()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="smoke run: 600 images / 20,000 token records, 8 / 20 timed batches, 5 s per row at most")
    p.add_argument("--only", default="vision,tokens", help="workloads, subset of vision,tokens")
    p.add_argument("--codecs", default="zstd,raw", help="codecs (vision is zstd only; tokens zstd and raw)")
    p.add_argument("--backends", default=",".join(BACKENDS), help="subset of loaderx,mosaic")
    p.add_argument("--latencies",
                   help="added round-trip times in ms, each through the delay proxy (default 0,5,20; --quick 0,20); "
                        "the direct (no proxy) S3 row is always run")
    p.add_argument("--each-way", action="store_true",
                   help="delay each direction by the full latency (round trip +2x), not half of it")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--prefetch", type=int, default=4)
    p.add_argument("--transform", choices=("lambda", "none"), default="lambda",
                   help="loaderx rows: a trivial Python transform (lambda b: b, the usual case; "
                        "default) or none (the native path only)")
    p.add_argument("--batches", type=int, help="timed batches per row (default vision 50 / tokens 100)")
    p.add_argument("--warmup", type=int, help="untimed warm-up batches (default vision 5 / tokens 10)")
    p.add_argument("--verify", type=int, default=1, help="batches compared byte for byte with the source "
                   "(besides the first), before warm-up (default 1)")
    p.add_argument("--gathers", type=int, help="isolated single-batch gathers per loaderx row (default 5; --quick 3)")
    p.add_argument("--max-seconds", type=float, help="cap on one row's timed loop (default 20; --quick 5)")
    p.add_argument("--min-seconds", type=float, help="shortest timed loop: fast rows run more batches than "
                   "--batches until then (default 2; --quick 0.5)")
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="extra storage option for every loaderx S3 read row (e.g. max_in_flight=64); repeatable")
    p.add_argument("--shard-records", type=int, help="write the loaderx stores as store sets with this many "
                   "records per shard (default: one store)")
    p.add_argument("--mosaic-python", type=Path, default=REPO / ".venv-bench-mosaic" / "bin" / "python")
    p.add_argument("--make-mosaic-venv", action="store_true",
                   help="create the mosaic venv (python -m venv + pip install mosaicml-streaming) if missing")
    p.add_argument("--mosaic-workers", type=int, default=1,
                   help="torch DataLoader workers for mosaic rows (default 1; 2 hung or read corrupt shards "
                        "now and then here, see benches/README.md)")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every row N times (rotating the order) and report per-metric medians")
    p.add_argument("--timeout", type=float, help="per-row timeout in seconds (default 300; --quick 120)")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out" / "remote")
    p.add_argument("--regenerate", action="store_true", help="rebuild the cached sources")
    p.add_argument("--json", type=Path, help="also write every raw number here")
    args = p.parse_args(argv)
    q = args.quick
    args.workdir = args.workdir.resolve()
    args.timeout = args.timeout or (120 if q else 300)
    args.max_seconds = args.max_seconds or (5.0 if q else 20.0)
    args.min_seconds = args.min_seconds if args.min_seconds is not None else (0.5 if q else 2.0)
    args.gathers = args.gathers if args.gathers is not None else (3 if q else 5)
    names = [x.strip() for x in args.only.split(",") if x.strip()]
    codecs = {x.strip() for x in args.codecs.split(",") if x.strip()}
    backends = [x.strip() for x in args.backends.split(",") if x.strip()]
    if not names or any(n not in WORKLOADS for n in names):
        p.error("--only: choose from vision,tokens")
    if not backends or any(b not in BACKENDS for b in backends):
        p.error("--backends: choose from loaderx,mosaic")
    try:
        latencies = [float(x) for x in (args.latencies or ("0,20" if q else "0,5,20")).split(",") if x.strip()]
    except ValueError:
        p.error("--latencies: numbers of milliseconds")
    extra_opts = {}
    for kv in args.storage_option:
        k, sep, v = kv.partition("=")
        if not sep:
            p.error(f"--storage-option {kv!r}: expected KEY=VALUE")
        extra_opts[k.strip()] = v.strip()
    max_in_flight = int(extra_opts.get("max_in_flight", DEFAULT_MAX_IN_FLIGHT))

    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGHUP, _terminate)
    atexit.register(_cleanup_all)
    try:
        return run(args, names, codecs, backends, latencies, extra_opts, max_in_flight)
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        return 130
    finally:
        _cleanup_all()


def run(args, names, codecs, backends, latencies, extra_opts, max_in_flight) -> int:
    q = args.quick
    bz = _load("_bench_zrecord_for_remote", HERE / "bench_zrecord.py")
    servers = _load("_servers_for_remote", REPO / "tests" / "_servers.py")
    lat_mod = _load("_latency_for_remote", HERE / "_latency.py")
    machine = bz.machine_info()
    t_run = time.perf_counter()

    impl = {}
    ok, out = probe(sys.executable, "import loaderx, numpy; print(loaderx.__version__, loaderx.__file__)",
                    timeout=300)
    if not ok:
        log(f"ours: cannot import loaderx: {out}")
        return 2
    impl["loaderx"] = out
    mosaic_reason = None
    if "mosaic" in backends:
        mosaic_reason = ensure_mosaic_venv(args)
        if mosaic_reason is None:
            ok, out = probe(str(args.mosaic_python),
                            "import streaming, torch, numpy, boto3; print(streaming.__version__, torch.__version__, "
                            "numpy.__version__, boto3.__version__)", timeout=300)
            sv, tv, nv, bv = out.split()
            impl["mosaic"] = (f"mosaicml-streaming {sv}, torch {tv}, numpy {nv}, boto3 {bv} ({args.mosaic_python}); "
                              f"{args.mosaic_workers} DataLoader workers")
        else:
            impl["mosaic"] = f"unavailable: {mosaic_reason}"
            log(f"[mosaic] unavailable: {mosaic_reason}")

    log("[setup] probing network namespaces / netem ...")
    netns = lat_mod.probe_netns()
    method = ("asyncio delay proxy on 127.0.0.1 (benches/_latency.py): each direction's chunks held "
              f"{'the full latency' if args.each_way else 'half the latency'}, +1 added round trip per new "
              "connection, bandwidth unlimited")
    net_line = (f"netns {'ok' if netns['netns'] else 'no'}, veth {'ok' if netns['veth'] else 'no'}, netem "
                f"{'ok' if netns['netem'] else 'no'} ({netns['detail']}); used: {method}")
    log(f"[setup] {net_line}")

    # ---------------------------------------------------------------- data
    wls = []
    for name in names:
        base = WORKLOADS[name]
        n, batches, warmup = base["quick" if q else "full"]
        wl = dict(base, name=name, records=n, batches=args.batches or batches,
                  warmup=args.warmup if args.warmup is not None else warmup)
        wl["codecs"] = [c for c in base["codecs"] if c in codecs]
        if not wl["codecs"]:
            continue
        if args.batch > n:
            raise SystemExit(f"--batch {args.batch} exceeds the {n} records of {name}")
        wl.update(prepare_source(name, wl, args, bz))
        wls.append(wl)
    if not wls:
        log("nothing to run (check --only / --codecs)")
        return 2

    scratch = Path(tempfile.mkdtemp(prefix="run-", dir=args.workdir))
    _on_exit(lambda: shutil.rmtree(scratch, ignore_errors=True))

    log("[setup] starting the S3 server (SeaweedFS weed mini on 127.0.0.1) ...")
    server = servers.S3Server()
    _on_exit(server.stop)
    bucket = "loaderx-bench"
    server.create_bucket(bucket)
    s3_opts = {"aws_endpoint": server.endpoint, "aws_access_key_id": server.access_key,
               "aws_secret_access_key": server.secret_key, "aws_region": server.region, "aws_allow_http": "true"}
    weed_version = "?"
    try:
        weed_version = subprocess.run([server.weed, "version"], stdout=subprocess.PIPE, text=True,
                                      timeout=30).stdout.strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        pass
    impl["S3 server"] = f"{weed_version} ({server.weed}), `weed mini` on 127.0.0.1"

    # Environments of the workers: nothing from the caller's AWS / loaderx cache settings.
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("AWS_", "LOADERX_CACHE", "S3_ENDPOINT"))}

    def mosaic_env(endpoint: str) -> dict:
        return dict(base_env, S3_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID=server.access_key,
                    AWS_SECRET_ACCESS_KEY=server.secret_key, AWS_DEFAULT_REGION=server.region,
                    AWS_REQUEST_CHECKSUM_CALCULATION="when_required",
                    AWS_RESPONSE_CHECKSUM_VALIDATION="when_required")

    writes = {}  # (workload, codec) -> {...}
    for wl in wls:
        src = np.load(wl["source"], mmap_mode="r")
        wl["logical_bytes"] = int(src.nbytes)
        wl["record_bytes"] = int(src[0].nbytes)
        for codec in wl["codecs"]:
            key = (wl["name"], codec)
            w = writes[key] = {}
            local = wl["dir"] / "stores" / codec
            shutil.rmtree(local, ignore_errors=True)
            local.parent.mkdir(parents=True, exist_ok=True)
            log(f"[{wl['name']}/{codec}] writing the local store ...")
            w["local"] = write_loaderx(str(local), src, wl, codec, None, args.shard_records)
            w["local"]["bytes"] = dir_bytes(local)
            w["local_path"] = str(local)
            url = f"s3://{bucket}/{wl['name']}-{codec}/loaderx"
            log(f"[{wl['name']}/{codec}] writing {url} ...")
            try:
                w["s3"] = write_loaderx(url, src, wl, codec, s3_opts, args.shard_records)
                w["url"] = url
            except Exception as exc:
                w["s3"] = {"error": f"{type(exc).__name__}: {exc}"}
                log(f"[{wl['name']}/{codec}] S3 write failed: {w['s3']['error']}")
            # Payload bytes a batch needs, on average: the data files' bytes per record.
            data_files = [f for f in local.rglob("data*") if f.is_file()]
            data_bytes = sum(f.stat().st_size for f in data_files) if data_files else w["local"]["bytes"]
            w["stored_per_record"] = data_bytes / wl["records"]
            if "mosaic" in backends:
                if mosaic_reason is not None:
                    w["mosaic"] = {"unavailable": mosaic_reason}
                    continue
                mlocal = scratch / f"mds-{wl['name']}-{codec}"
                murl = f"s3://{bucket}/{wl['name']}-{codec}/mosaic"
                log(f"[{wl['name']}/{codec}] MDSWriter -> {murl} ...")
                spec = {"backend": "mosaic-write", "source": str(wl["source"]), "dtype": wl["dtype"],
                        "item": list(wl["item"]), "compression": "zstd" if codec == "zstd" else None,
                        "local": str(mlocal), "remote": murl}
                res = run_worker(str(args.mosaic_python), spec, scratch / f"spec-mw-{wl['name']}-{codec}.json",
                                 args.timeout, mosaic_env(server.endpoint))
                if "error" in res:
                    log(f"[{wl['name']}/{codec}] MDSWriter failed: {res['error']}")
                else:
                    res["local"], res["remote"] = str(mlocal), murl
                w["mosaic"] = res
        del src

    # ---------------------------------------------------------------- proxies + bandwidth
    proxies = {}
    for lat in latencies:
        pr = lat_mod.ProxyProcess(f"127.0.0.1:{server.s3_port}", lat, args.each_way)
        _on_exit(pr.stop)
        proxies[lat] = pr
    bw = {}
    big = max(((wl, c) for wl in wls for c in wl["codecs"] if writes[(wl["name"], c)].get("url")),
              key=lambda t: writes[(t[0]["name"], t[1])]["local"]["bytes"], default=None)
    if big is not None:
        w = writes[(big[0]["name"], big[1])]
        keys = [k for k in server.list_objects(bucket, f"{big[0]['name']}-{big[1]}/loaderx/") if "data" in k]
        if keys and not args.shard_records:
            key = keys[0]
            size = int(server.request("HEAD", f"/{bucket}/{key}")[1].get("content-length", "0"))
            targets = [("direct", server.s3_port)] + ([("proxy +0 ms", proxies[0.0].port)] if 0.0 in proxies else [])
            for label, port in targets:
                try:
                    bw[label] = Bandwidth.measure(servers, server, bucket, key, size, port,
                                                  total=(64 if q else 256) * MiB)
                    log(f"[setup] S3 GET bandwidth {label}: {bw[label] / MiB:.0f} MiB/s")
                except Exception as exc:
                    log(f"[setup] bandwidth probe {label} failed: {exc}")

    # Small-request rate of each path (direct / through the proxy at +0 ms), with
    # loaderx itself: one request per record, 128 in flight.
    reqrate = {}
    pick = next(((wl, c) for name, c in (("tokens", "raw"), ("tokens", "zstd"), ("vision", "zstd"))
                 for wl in wls if wl["name"] == name and c in wl["codecs"]
                 and writes[(name, c)].get("url")), None)
    if pick is not None and "loaderx" in backends:
        url = writes[(pick[0]["name"], pick[1])]["url"]
        targets = [("direct", server.endpoint)] + ([("proxy +0 ms", proxies[0.0].endpoint)] if 0.0 in proxies else [])
        for label, endpoint in targets:
            spec = {"backend": "reqrate", "url": url, "count": 1024,
                    "storage_options": dict(s3_opts, aws_endpoint=endpoint, max_in_flight="128", coalesce_bytes="0")}
            res = run_worker(sys.executable, spec, scratch / "spec-reqrate.json", args.timeout, base_env)
            if "error" in res:
                log(f"[setup] request-rate probe {label} failed: {res['error']}")
            else:
                reqrate[label] = res["req_s"]
                log(f"[setup] S3 small-request rate {label}: {res['req_s']:.0f} requests/s "
                    f"({res['requests_per_gather']} per gather, 128 in flight)")

    # ---------------------------------------------------------------- rows
    proc = getattr(server, "_proc", None)  # weed's pid, to count the server's CPU time per batch
    weed_pid = proc.pid if proc is not None else -1
    ncpu = machine.get("affinity") or machine.get("cpu_count") or 1
    plan = []  # one entry per row
    for wl in wls:
        for codec in wl["codecs"]:
            w = writes[(wl["name"], codec)]
            case = f"{wl['name']}/{codec}"
            common = {"kind": wl["name"], "dtype": wl["dtype"], "item": list(wl["item"]),
                      "records": wl["records"], "batch": args.batch, "batches": wl["batches"],
                      "warmup": wl["warmup"], "verify": args.verify, "max_seconds": args.max_seconds,
                      "min_seconds": args.min_seconds,
                      "prefetch": args.prefetch, "transform": args.transform, "seed": 42, "source": str(wl["source"]),
                      "gathers": args.gathers, "scratch": str(scratch), "watch": {"server": weed_pid}}
            if "loaderx" in backends:
                plan.append(dict(case=case, key=f"{case}/loaderx/local", backend="loaderx", storage="local disk",
                                 rtt=None, spec=dict(common, backend="loaderx", url=w["local_path"]),
                                 python=sys.executable, env=base_env, warm=w["local_path"]))
                if "error" in w.get("s3", {}):
                    plan.append(dict(case=case, key=f"{case}/loaderx/s3", backend="loaderx", storage="S3 direct",
                                     rtt=0.0, error=f"S3 write failed: {w['s3']['error']}"))
                else:
                    targets = [("S3 direct", 0.0, server.endpoint)] + [
                        (f"S3 via proxy +{lat:g} ms", lat, proxies[lat].endpoint) for lat in latencies]
                    for label, lat, endpoint in targets:
                        opts = dict(s3_opts, aws_endpoint=endpoint, **extra_opts)
                        spec = dict(common, backend="loaderx", url=w["url"], storage_options=opts)
                        if label != "S3 direct":
                            spec["watch"] = dict(common["watch"], proxy=proxies[lat].proc.pid)
                        plan.append(dict(case=case, key=f"{case}/loaderx/{label}", backend="loaderx", storage=label,
                                         rtt=lat, proxied=label != "S3 direct", spec=spec,
                                         python=sys.executable, env=base_env))
            if "mosaic" in backends:
                m = w.get("mosaic", {})
                mtargets = [("local disk (MDS)", None, None), ("S3 direct", 0.0, server.endpoint)] + [
                    (f"S3 via proxy +{lat:g} ms", lat, proxies[lat].endpoint) for lat in latencies if lat > 0]
                for label, lat, endpoint in mtargets:
                    row = dict(case=case, key=f"{case}/mosaic/{label}", backend="mosaic", storage=label, rtt=lat)
                    if "unavailable" in m:
                        row["unavailable"] = m["unavailable"]
                    elif "error" in m:
                        row["error"] = f"MDSWriter to S3 failed: {m['error']}"
                    else:
                        spec = dict(common, backend="mosaic", mosaic_workers=args.mosaic_workers)
                        if endpoint is None:
                            spec["local"] = m["local"]
                        else:
                            spec["remote"] = m["remote"]
                        if lat:
                            spec["watch"] = dict(common["watch"], proxy=proxies[lat].proc.pid)
                        row.update(spec=spec, python=str(args.mosaic_python),
                                   env=mosaic_env(endpoint or server.endpoint), warm=m["local"] if endpoint is None else None)
                    plan.append(row)

    warm = _bench_loader.warm_files
    runs = {}
    for rnd in range(args.rounds):
        k = rnd % len(plan)
        for row in plan[k:] + plan[:k]:
            if "spec" not in row:
                continue
            if row.get("warm"):
                warm([row["warm"]])
            tag = f" (round {rnd + 1}/{args.rounds})" if args.rounds > 1 else ""
            log(f"[row] {row['key']}{tag} ...")
            t0 = time.perf_counter()
            res = run_worker(row["python"], row["spec"], scratch / "spec.json", args.timeout, row["env"])
            res["load"] = bz._loadavg()
            runs.setdefault(row["key"], []).append(res)
            if "error" in res:
                log(f"    ERROR {res['error']}")
            else:
                nb = len(res["waits_s"])
                log(f"    {nb / res['elapsed_s']:.1f} batches/s over {nb} batches, first batch "
                    f"{res['ttfb_s'] * 1e3:.0f} ms ({time.perf_counter() - t0:.1f} s)")

    # ---------------------------------------------------------------- summaries
    def summarize(res: dict, wl: dict, w: dict) -> dict:
        if "error" in res:
            return {"error": res["error"]}
        wts = np.asarray(res["waits_s"])
        n = len(wts)
        out = {"n": n, "batches_s": n / res["elapsed_s"],
               "mib_s": n * args.batch * wl["record_bytes"] / MiB / res["elapsed_s"],
               "p50_ms": float(np.percentile(wts, 50)) * 1e3, "p95_ms": float(np.percentile(wts, 95)) * 1e3,
               "ttfb_ms": res["ttfb_s"] * 1e3}
        if "requests" in res:
            out["req_batch"] = res["requests"] / n
            out["mib_batch"] = res["bytes"] / n / MiB
            need = args.batch * w["stored_per_record"]
            out["overread"] = res["bytes"] / n / need if need else float("nan")
        if "producers" in res:
            out["producers"] = res["producers"]
        cpu = dict(res.get("cpu_s") or {})
        machine_busy = cpu.pop("machine", None)
        for who, sec in cpu.items():
            out[f"cpu_ms_{who}"] = sec / n * 1e3
        if machine_busy is not None:
            # cores' worth of CPU that other processes (not the row's) used during the loop
            out["other_cores"] = max(0.0, machine_busy - sum(cpu.values())) / res["elapsed_s"]
        if res.get("gather_s"):
            out["gather_p50_ms"] = float(np.median(res["gather_s"])) * 1e3
            out["gather_req"] = float(np.median(res["gather_requests"]))
            out["gather_mib"] = float(np.median(res["gather_bytes"])) / MiB
        return out

    summaries = {}
    for row in plan:
        wl = next(x for x in wls if row["case"].startswith(x["name"] + "/"))
        w = writes[(wl["name"], row["case"].split("/")[1])]
        rr = runs.get(row["key"], [])
        per = [summarize(r, wl, w) for r in rr]
        bad = next((x for x in per if "error" in x), None)
        if not per:
            continue
        if bad:
            summaries[row["key"]] = bad
        else:
            summaries[row["key"]] = {m: float(np.median([x[m] for x in per])) for m in per[0]}

    def cpu_ms(s: dict) -> float:
        return sum(v for k, v in s.items() if k.startswith("cpu_ms_"))

    def bounds(row: dict, s: dict) -> tuple[str, str]:
        """The ceilings on a row's batches/s, and which one is lowest."""
        parts = {}
        if cpu_ms(s) > 0:
            parts["CPU"] = max(0.05, ncpu - s.get("other_cores", 0.0)) / (cpu_ms(s) / 1e3)
        if row["backend"] == "loaderx" and row["rtt"] is not None:
            r = s.get("req_batch")
            producers = s.get("producers") or 0
            if row["rtt"] and r and producers:
                rounds = max(1, math.ceil(r / max_in_flight))
                parts["RTT"] = producers / (rounds * row["rtt"] / 1e3)
            link = "proxy +0 ms" if row.get("proxied") else "direct"
            if reqrate.get(link) and r:
                parts["REQ"] = reqrate[link] / r
            if bw.get(link) and s.get("mib_batch"):
                parts["BW"] = bw[link] / MiB / s["mib_batch"]
        if not parts:
            return "n/a", ""
        txt = " · ".join(f"{k} {_fmt(v)}" for k, v in parts.items())
        low = min(parts, key=parts.get)
        return txt, f"{low} ({s['batches_s'] / parts[low] * 100:.0f}%)"

    # ---------------------------------------------------------------- report
    L = [f"## loaderx object-storage benchmark{' (--quick)' if q else ''}", ""]
    cores = f"{machine['cpu_count']} logical CPUs, {machine['affinity']} usable (sched_getaffinity)"
    if "cgroup_cpus" in machine:
        cores += f", cgroup quota {machine['cgroup_cpus']} CPUs"
    mem = machine["memory"] + (f" (cgroup limit {machine['cgroup_memory']})" if "cgroup_memory" in machine else "")
    L += ["| machine | value |", "|---|---|", f"| CPU | {machine['cpu']} |", f"| cores | {cores} |",
          f"| memory | {mem} |", f"| kernel | {machine['kernel']} |",
          f"| python | {machine['python']}, numpy {machine['numpy']} |"]
    for k, v in impl.items():
        L.append(f"| {k} | {v} |")
    L.append(f"| added latency | {net_line} |")
    if bw:
        L.append("| S3 GET bandwidth | " + ", ".join(f"{k} {v / MiB:.0f} MiB/s" for k, v in bw.items())
                 + " (4 Python threads, 8 MiB ranges; the BW bound below) |")
    if reqrate:
        L.append("| S3 small-request rate | " + ", ".join(f"{k} {v:,.0f} requests/s" for k, v in reqrate.items())
                 + " (loaderx gathers of every other record, coalesce_bytes=0, 128 in flight; the REQ bound) |")
    cmd = " ".join([sys.executable, *sys.argv]).replace(str(REPO) + "/", "")
    L.append(f"| command | `{cmd}` |")
    L += [f"| load average at start | {machine.get('loadavg', '?')} |", ""]
    prod = {}
    for row in plan:
        sm = summaries.get(row["key"], {})
        if row["backend"] == "loaderx" and sm.get("producers"):
            prod.setdefault("local" if row["rtt"] is None else "S3", set()).add(int(sm["producers"]))
    prod_txt = ", ".join(f"{'/'.join(map(str, sorted(v)))} on {k}" for k, v in prod.items()) or "?"
    tf = "lambda b: b" if args.transform == "lambda" else "None"
    L.append(f"DataLoader(batch_size={args.batch}, prefetch_size={args.prefetch}, mode=2, transform={tf}), one "
             f"stream `x`; native producer threads, each gathering one whole batch: {prod_txt} (counted in each "
             f"worker); S3 reads with max_in_flight={max_in_flight} per gather"
             + (f" and {', '.join(f'{k}={v}' for k, v in extra_opts.items())}" if extra_opts else
                " and the default coalesce_bytes (1 MiB) / max_request_bytes (16 MiB)")
             + f". Each row: a fresh process; first batch + {args.verify} more compared byte for byte with the "
             f"source, warm-up, then N timed `next()` calls (cut short at {args.max_seconds:g} s, at least 3; "
             f"continued to {args.min_seconds:g} s when faster)"
             + (f"; every cell is the median of {args.rounds} rounds" if args.rounds > 1 else "") + ".")
    L.append("")
    failed = False
    for wl in wls:
        for codec in wl["codecs"]:
            case = f"{wl['name']}/{codec}"
            w = writes[(wl["name"], codec)]
            rows = [r for r in plan if r["case"] == case]
            batch_mib = args.batch * wl["record_bytes"] / MiB
            L.append(f"### {wl['title']}, {codec}: {wl['records']:,} records ({wl['logical_bytes'] / MiB:.0f} MiB), "
                     f"batch {args.batch} ({batch_mib:.2f} MiB), {wl['batches']} timed batches after {wl['warmup']} "
                     "warm-up")
            L.append("")
            wline = [f"loaderx local {wl['logical_bytes'] / MiB / w['local']['write_s']:.0f} MiB/s "
                     f"({w['local']['bytes'] / MiB:.1f} MiB stored)"]
            if "write_s" in w.get("s3", {}):
                wline.append(f"loaderx S3 {wl['logical_bytes'] / MiB / w['s3']['write_s']:.0f} MiB/s")
            else:
                wline.append(f"loaderx S3 ERROR: {w.get('s3', {}).get('error', '?')}")
            m = w.get("mosaic")
            if m is not None:
                if "write_s" in m:
                    wline.append(f"mosaic MDSWriter local+S3 {wl['logical_bytes'] / MiB / m['write_s']:.0f} MiB/s "
                                 f"({m['bytes'] / MiB:.1f} MiB in {m['files']} files)")
                elif "unavailable" in m:
                    wline.append("mosaic unavailable")
                else:
                    wline.append(f"mosaic MDSWriter ERROR: {m.get('error', '?')[:200]}")
            L.append("Logical write throughput: " + "; ".join(wline) + ".")
            L.append("")
            L.append("| loader | storage | batches/s | MiB/s | vs local | p50 wait | p95 wait | first batch | "
                     "req/batch | MiB fetched/batch | over-read | isolated gather p50 (req) | "
                     "CPU ms/batch: loader + S3 server + proxy | other load | bounds, batches/s | "
                     "limited by (% reached) |")
            L.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
            local_s = {b: summaries.get(f"{case}/{b}/local") or summaries.get(f"{case}/{b}/local disk (MDS)")
                       for b in BACKENDS}
            blank = " |" * 13
            for row in rows:
                who = "**loaderx**" if row["backend"] == "loaderx" else "mosaic streaming"
                if "unavailable" in row:
                    L.append(f"| {who} | {row['storage']} | unavailable: {row['unavailable'][:200]} |" + blank)
                    continue
                if "error" in row:
                    failed = True
                    L.append(f"| {who} | {row['storage']} | ERROR: {row['error'][:200]} |" + blank)
                    continue
                s = summaries.get(row["key"], {"error": "not run"})
                if "error" in s:
                    failed = True
                    msg = s["error"].replace("|", "\\|").replace("\n", " ")[:240]
                    L.append(f"| {who} | {row['storage']} | ERROR: {msg} |" + blank)
                    continue
                loc = local_s.get(row["backend"])
                vs = (f"{s['batches_s'] / loc['batches_s']:.2f}x"
                      if loc and "batches_s" in loc and row["rtt"] is not None else "")
                cpu = " + ".join(_fmt(s[f"cpu_ms_{k}"]) for k in ("loader", "server", "proxy")
                                 if f"cpu_ms_{k}" in s and (k != "server" or row["rtt"] is not None))
                btxt, low = bounds(row, s)
                remote = row["rtt"] is not None
                if row["backend"] == "loaderx":
                    req = f"{_fmt(s.get('req_batch'))} | {_fmt(s.get('mib_batch'))} | {_fmt(s.get('overread'))}x" \
                        if remote else " | | "
                    gather = (f"{_fmt(s.get('gather_p50_ms'))} ms ({_fmt(s.get('gather_req'))})" if remote
                              else f"{_fmt(s.get('gather_p50_ms'))} ms")
                else:
                    req = "n/a | n/a |" if remote else " | |"
                    gather = "n/a"
                L.append(f"| {who} | {row['storage']} | {_fmt(s['batches_s'])} | {_fmt(s['mib_s'])} | {vs} | "
                         f"{_fmt(s['p50_ms'])} ms | {_fmt(s['p95_ms'])} ms | {_fmt(s['ttfb_ms'])} ms | {req} | "
                         f"{gather} | {cpu} | {_fmt(s.get('other_cores'))} cores | {btxt} | {low} |")
            L.append("")
            # the target: +20 ms keeps >= 80 % of local throughput
            loc = local_s.get("loaderx")
            verdicts = []
            for row in rows:
                if row["backend"] == "loaderx" and row["rtt"] and "spec" in row:
                    s = summaries.get(row["key"], {})
                    if loc and "batches_s" in loc and "batches_s" in s:
                        ratio = s["batches_s"] / loc["batches_s"]
                        btxt, low = bounds(row, s)
                        z = summaries.get(f"{case}/loaderx/S3 via proxy +0 ms", {})
                        vs0 = (f", {s['batches_s'] / z['batches_s']:.2f}x of the +0 ms proxy row (the cost of the "
                               "latency alone)" if "batches_s" in z else "")
                        verdicts.append(f"+{row['rtt']:g} ms {ratio:.2f}x of local "
                                        f"({'meets' if ratio >= 0.8 else 'misses'} 0.80; lowest bound: {low}){vs0}")
            if verdicts:
                L.append("loaderx vs local (target: ≥ 0.80x at +20 ms): " + "; ".join(verdicts) + ".")
                L.append("")
    loads = ", ".join(f"{k} {v[-1]['load']}" for k, v in runs.items() if v and v[-1].get("load"))
    L.append("Columns: `batches/s` = timed batches ÷ loop wall time; `MiB/s` counts decoded (logical) bytes; "
             "`vs local` = batches/s ÷ the same loader's local-disk row; `p50/p95 wait` per `next()`; "
             "`first batch` = open + loader start + first batch; `req/batch`, `MiB fetched/batch` = deltas of "
             "`loaderx._native.remote_stats()` over the timed loop ÷ timed batches; `over-read` = fetched ÷ the "
             "stored bytes of the batch's records; `isolated gather` = one `store.__getitems__` of 256 sorted random "
             "indices with nothing else in flight (median, with its request count); `CPU ms/batch` = CPU time "
             "(user + system, all threads and child processes) over the timed loop ÷ timed batches, of the worker, "
             "the S3 server (remote rows) and the delay proxy (proxied rows); `other load` = CPU the rest of the "
             "machine used meanwhile (from /proc/stat), in cores. Bounds: "
             f"CPU = ({ncpu} usable cores − other load) ÷ that total; RTT = producers ÷ (⌈req/batch ÷ max_in_flight {max_in_flight}⌉ × "
             "added RTT); REQ = S3 small-request rate ÷ req/batch; BW = S3 GET bandwidth ÷ MiB fetched per batch "
             "(REQ and BW use the proxy's rates for proxied rows); `limited by` names the lowest bound and how "
             "much of it the row reached. Mosaic rows read whole shards into a "
             "fresh local cache (first epoch) and then serve from it; they have no request counters.")
    L.append("")
    if loads:
        L.append(f"Load average (1/5/15 min) after each row: {loads}.")
        L.append("")
    L.append(f"Total run time {time.perf_counter() - t_run:.0f} s.")
    print("\n".join(L), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "machine": machine, "implementations": impl, "netns": netns, "latency_method": method,
            "bandwidth": bw, "writes": {f"{a}/{b}": v for (a, b), v in writes.items()},
            "summaries": summaries, "runs": runs,
            "plan": [{k: v for k, v in r.items() if k not in ("env",)} for r in plan],
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}, indent=1,
            default=str))
        log(f"raw numbers written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
