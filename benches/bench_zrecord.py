#!/usr/bin/env python3
"""Store benchmark: our loaderx vs the reference loaderx 2.0.0 vs NumPy mmap.

Run it with the interpreter that imports OUR loaderx, e.g.

    .venv/bin/python benches/bench_zrecord.py --quick
    .venv/bin/python benches/bench_zrecord.py --make-reference-venv   # full size

For every workload (dense/ragged x vision/tokens) and codec (raw, zstd,
zstd_dict) it measures logical write and random batch gather throughput,
per-batch latency, allocated disk and compression ratio, for:

    ours        the loaderx importable here, measured in this process
    reference   loaderx 2.0.0 in its own virtualenv (same import name, so it
                runs as a subprocess: ``--reference-python``)
    npy         np.load(mmap_mode='r') fancy indexing (dense), or an npy-mmap
                of the flat concatenation + offsets with per-record slicing
                (ragged); raw only

All backends get the same source files and the same index plans, generated
here from ``--seed`` and saved under ``--workdir``.  The measuring code lives
in ``_zrecord_worker.py`` and is the same file for every backend.  See
``benches/README.md`` for the methodology and what each column means.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
WORKER = HERE / "_zrecord_worker.py"
GENERATOR_VERSION = 1  # bump when a generator changes, to invalidate cached sources
MiB = 2 ** 20

CODECS = ("raw", "zstd", "zstd_dict")
BACKENDS = ("ours", "reference", "npy")

# name -> (kind, data, records, batch, batches); quick mode -> second tuple.
WORKLOADS = {
    "dense-vision": dict(kind="dense", data="vision", full=(2_500, 256, 50), quick=(250, 64, 10),
                         title="Dense vision: uint8 (3, 224, 224) image-like records"),
    "dense-tokens": dict(kind="dense", data="tokens", full=(200_000, 256, 100), quick=(20_000, 256, 20),
                         title="Dense token blocks: int32[512] records"),
    "ragged-vision": dict(kind="ragged", data="vision", full=(2_500, 256, 50), quick=(250, 64, 10),
                          title="Ragged vision: uint8 (3, H, W), H/W lognormal in 64..512"),
    "ragged-tokens": dict(kind="ragged", data="tokens", full=(200_000, 256, 100), quick=(20_000, 256, 20),
                          title="Ragged tokens: int32 sequences of 16..512"),
}

TOKEN_VOCAB = 50257
TOKEN_BLOCK = 512


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================== data generation


def make_images(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    """``n`` deterministic image-like uint8 (3, h, w) records.

    A per-channel linear gradient plus six soft colour blobs (separable
    Gaussians), posterised to steps of 8 (flat regions, as in real photos'
    low-frequency content) with sparse +-1 sensor-like noise.  Plain zstd
    compresses this roughly 11-12x.
    """
    yy = np.linspace(0.0, 1.0, h, dtype=np.float32)
    xx = np.linspace(0.0, 1.0, w, dtype=np.float32)
    base = rng.uniform(30, 200, size=(n, 3, 1, 1)).astype(np.float32)
    gy = rng.uniform(-60, 60, size=(n, 3, 1, 1)).astype(np.float32)
    gx = rng.uniform(-60, 60, size=(n, 3, 1, 1)).astype(np.float32)
    img = base + gy * yy[None, None, :, None] + gx * xx[None, None, None, :]
    blobs = 6
    cy = rng.uniform(0, 1, size=(n, blobs)).astype(np.float32)
    cx = rng.uniform(0, 1, size=(n, blobs)).astype(np.float32)
    rad = rng.uniform(0.05, 0.3, size=(n, blobs)).astype(np.float32)
    col = rng.uniform(-120, 120, size=(n, blobs, 3)).astype(np.float32)
    for k in range(blobs):
        fy = np.exp(-np.square((yy[None, :] - cy[:, k, None]) / rad[:, k, None]))  # (n, h)
        fx = np.exp(-np.square((xx[None, :] - cx[:, k, None]) / rad[:, k, None]))  # (n, w)
        img += col[:, k, :, None, None] * (fy[:, None, :, None] * fx[:, None, None, :])
    img = np.floor(img * np.float32(1 / 8)) * np.float32(8)
    flip = rng.random(img.shape, dtype=np.float32) < np.float32(0.006)
    img += flip * rng.integers(-1, 2, size=img.shape, dtype=np.int8)
    return np.clip(img, 0, 255).astype(np.uint8)


class TokenModel:
    """Token-like int32 ids < 50257: Zipf(1) unigram ids over a shuffled vocabulary,
    with half of all 8-token segments drawn (Zipf-popular first) from a bank of
    recurring phrases. Per-record zstd gets ~1.8x; the phrase bank is the
    cross-record structure a dictionary can capture."""

    SEG = 8
    PHRASES = 8192

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.perm = rng.permutation(TOKEN_VOCAB).astype(np.int32)  # rank -> token id
        self.bank = self.perm[self._ranks(self.PHRASES * self.SEG)].reshape(self.PHRASES, self.SEG)

    def _ranks(self, n: int, top: int = TOKEN_VOCAB) -> np.ndarray:
        # P(rank = k) = log((k + 2) / (k + 1)) / log(top): Zipf with exponent ~1.
        u = self.rng.random(n)
        return np.minimum(np.floor(np.power(float(top), u)).astype(np.int64) - 1, top - 1)

    def stream(self, n_tokens: int) -> np.ndarray:
        nseg = -(-n_tokens // self.SEG)
        out = self.perm[self._ranks(nseg * self.SEG)].reshape(nseg, self.SEG)
        use = self.rng.random(nseg) < 0.5
        out[use] = self.bank[self._ranks(int(use.sum()), self.PHRASES)]
        return out.reshape(-1)[:n_tokens]


def generate_source(name: str, spec: dict, n: int, seed: int, out: Path) -> dict:
    """Write the workload's source files into ``out``; return summary stats."""
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    kind, data = spec["kind"], spec["data"]
    stats = {}
    if kind == "dense" and data == "vision":
        arr = np.lib.format.open_memmap(out / "source.npy", mode="w+", dtype=np.uint8, shape=(n, 3, 224, 224))
        for i in range(0, n, 64):
            m = min(64, n - i)
            arr[i:i + m] = make_images(rng, m, 224, 224)
        arr.flush()
        del arr
    elif kind == "dense" and data == "tokens":
        model = TokenModel(rng)
        arr = np.lib.format.open_memmap(out / "source.npy", mode="w+", dtype=np.int32, shape=(n, TOKEN_BLOCK))
        step = 8192
        for i in range(0, n, step):
            m = min(step, n - i)
            arr[i:i + m] = model.stream(m * TOKEN_BLOCK).reshape(m, TOKEN_BLOCK)
        arr.flush()
        del arr
    elif kind == "ragged" and data == "vision":
        hw = np.clip(np.rint(rng.lognormal(np.log(224.0), 0.35, size=(n, 2))), 64, 512).astype(np.int64)
        shapes = np.concatenate([np.full((n, 1), 3, dtype=np.int64), hw], axis=1)
        sizes = shapes.prod(axis=1)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.lib.format.open_memmap(out / "flat.npy", mode="w+", dtype=np.uint8, shape=(int(offsets[-1]),))
        for i in range(n):
            h, w = int(hw[i, 0]), int(hw[i, 1])
            flat[offsets[i]:offsets[i + 1]] = make_images(rng, 1, h, w).reshape(-1)
        flat.flush()
        del flat
        np.save(out / "offsets.npy", offsets)
        np.save(out / "shapes.npy", shapes)
        stats.update(median_h=float(np.median(hw[:, 0])), median_w=float(np.median(hw[:, 1])))
    elif kind == "ragged" and data == "tokens":
        lengths = np.clip(np.rint(rng.lognormal(np.log(130.0), 0.6, size=n)), 16, 512).astype(np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        model = TokenModel(rng)
        flat = np.lib.format.open_memmap(out / "flat.npy", mode="w+", dtype=np.int32, shape=(int(offsets[-1]),))
        step = 4 * 2 ** 20
        for i in range(0, int(offsets[-1]), step):
            m = min(step, int(offsets[-1]) - i)
            flat[i:i + m] = model.stream(m)
        flat.flush()
        del flat
        np.save(out / "offsets.npy", offsets)
        np.save(out / "shapes.npy", lengths[:, None])
        q = np.percentile(lengths, [10, 50, 90])
        stats.update(p10_len=float(q[0]), median_len=float(q[1]), mean_len=float(lengths.mean()),
                     p90_len=float(q[2]))
    else:  # pragma: no cover
        raise ValueError(name)
    # Content digest, so two runs (or machines) can tell whether they measured the same bytes.
    h = hashlib.sha256()
    for f in sorted(out.glob("*.npy")):
        with open(f, "rb") as fh:
            for blk in iter(lambda: fh.read(1 << 24), b""):
                h.update(blk)
    stats["sha256"] = h.hexdigest()
    return stats


def cached_manifest(path: Path, want: dict, regenerate: bool) -> dict | None:
    """The manifest of data generated earlier with exactly the parameters
    ``want``, or None when there is none (or ``regenerate`` asks for fresh data)."""
    if regenerate or not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return manifest if manifest.get("params") == want else None


def prepare_workload(name: str, spec: dict, args) -> dict:
    n, batch, batches = spec["quick" if args.quick else "full"]
    wdir = args.workdir / ("quick" if args.quick else "full") / name
    src_dir = wdir / "source"
    manifest_path = wdir / "manifest.json"
    want = {"generator": GENERATOR_VERSION, "seed": args.seed, "records": n, "batch": batch, "batches": batches}
    manifest = cached_manifest(manifest_path, want, args.regenerate)
    if manifest is None:
        log(f"[{name}] generating {n} records (seed {args.seed}) ...")
        t0 = time.perf_counter()
        manifest_path.unlink(missing_ok=True)
        stats = generate_source(name, spec, n, args.seed, src_dir)
        prng = np.random.default_rng([args.seed, zlib.crc32(name.encode()), 1])
        if batch <= n:
            plan = np.stack([prng.choice(n, size=batch, replace=False) for _ in range(batches)])
        else:
            plan = prng.integers(0, n, size=(batches, batch))
        np.save(wdir / "plan.npy", plan.astype(np.int64))
        manifest = {"params": want, "stats": stats, "generate_s": time.perf_counter() - t0}
        manifest_path.write_text(json.dumps(manifest, indent=1))
        log(f"[{name}] generated in {manifest['generate_s']:.1f} s")
    else:
        log(f"[{name}] reusing source in {src_dir}")
    if spec["kind"] == "dense":
        src = np.load(src_dir / "source.npy", mmap_mode="r")
        logical = int(src.nbytes)
        item = f"{src.dtype}{tuple(src.shape[1:])}"
        del src
    else:
        flat = np.load(src_dir / "flat.npy", mmap_mode="r")
        logical = int(flat.nbytes)
        item = f"{flat.dtype}, variable shape"
        del flat
    return {"name": name, "dir": wdir, "source_dir": src_dir, "plan": wdir / "plan.npy",
            "records": n, "batch": batch, "batches": batches, "logical_bytes": logical,
            "item": item, "stats": manifest["stats"], "kind": spec["kind"], "title": spec["title"]}


# =========================================================================== running backends


def load_worker_module():
    spec = importlib.util.spec_from_file_location("_zrecord_worker", WORKER)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_backend(backend: str, wl: dict, args, worker_mod) -> dict:
    spec = {
        "workload": wl["name"],
        "kind": wl["kind"],
        "source_dir": str(wl["source_dir"]),
        "plan": str(wl["plan"]),
        "backend": "npy" if backend == "npy" else "loaderx",
        "label": backend,
        "codecs": list(args.codecs),
        "chunk": args.chunk,
        "dict_tier": args.dict_tier,
        "store_root": str(wl["dir"] / "stores" / backend),
        "keep_stores": args.keep_stores,
    }
    if hasattr(os, "sync"):
        os.sync()  # flush earlier writeback (sources, previous stores) outside every timer
    log(f"[{wl['name']}] {backend} ...")
    if backend == "reference" or (backend == "ours" and args.ours_subprocess):
        spec_path = wl["dir"] / f"spec-{backend}.json"
        spec_path.write_text(json.dumps(spec))
        py = str(args.reference_python) if backend == "reference" else sys.executable
        # -I: the reference must import its own loaderx, never this repo's (PYTHONPATH, cwd).
        cmd = [py, "-I", str(WORKER), str(spec_path)] if backend == "reference" else [py, str(WORKER), str(spec_path)]
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=None, text=True, cwd=str(wl["dir"]))
        result = None
        for ln in reversed(proc.stdout.splitlines()):
            if ln.startswith("{"):
                try:
                    result = json.loads(ln)
                    break
                except ValueError:
                    continue
        if result is None:
            return {"info": {}, "results": [], "load": _loadavg(),
                    "error": f"worker exited {proc.returncode} without a result line"}
        if proc.returncode != 0:
            # The numbers were reported; the process died afterwards (e.g. at interpreter shutdown).
            result["exit_note"] = (f"worker process exited with status {proc.returncode}"
                                   f"{' (' + _signame(-proc.returncode) + ')' if proc.returncode < 0 else ''}"
                                   " after printing its results")
            log(f"[{wl['name']}] {backend}: {result['exit_note']}")
        result["load"] = _loadavg()
        return result
    result = worker_mod.run(spec)
    result["load"] = _loadavg()
    return result


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def _signame(num: int) -> str:
    import signal
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def ensure_reference(args) -> None:
    py = args.reference_python
    if py.exists():
        return
    if not args.make_reference_venv:
        sys.exit(f"reference python {py} not found. Create it with\n"
                 f"  python3 -m venv {py.parent.parent} && {py.parent}/pip install loaderx==2.0.0\n"
                 f"or pass --make-reference-venv, --reference-python PATH, or --backends without 'reference'.")
    venv = py.parent.parent
    log(f"creating reference virtualenv {venv} (loaderx==2.0.0) ...")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "--quiet", "loaderx==2.0.0"], check=True)
    if not py.exists():
        sys.exit(f"{py} still missing after creating {venv}")


# =========================================================================== reporting


def machine_info() -> dict:
    info = {}
    try:
        with open("/proc/cpuinfo") as fh:
            models = [ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")]
        info["cpu"] = models[0] if models else platform.processor()
    except OSError:
        info["cpu"] = platform.processor() or platform.machine()
    info["cpu_count"] = os.cpu_count()
    try:
        info["affinity"] = len(os.sched_getaffinity(0))
    except AttributeError:
        info["affinity"] = None
    try:
        with open("/proc/meminfo") as fh:
            mem = {ln.split(":")[0]: ln.split(":")[1].strip() for ln in fh}
        info["memory"] = f"{int(mem['MemTotal'].split()[0]) / 2**20:.1f} GiB"
    except (OSError, KeyError, ValueError):
        info["memory"] = "?"
    for cg in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            val = Path(cg).read_text().strip()
            if val != "max" and int(val) < 2 ** 60:
                info["cgroup_memory"] = f"{int(val) / 2**30:.1f} GiB"
            break
        except (OSError, ValueError):
            continue
    try:
        quota = Path("/sys/fs/cgroup/cpu.max").read_text().split()
        if quota[0] != "max":
            info["cgroup_cpus"] = round(int(quota[0]) / int(quota[1]), 2)
    except (OSError, ValueError, IndexError):
        pass
    info["python"] = f"{platform.python_implementation()} {platform.python_version()}"
    info["numpy"] = np.__version__
    info["kernel"] = f"{platform.system()} {platform.release()} {platform.machine()}"
    info["loadavg"] = _loadavg()
    return info


def summarize(res: dict) -> dict:
    """Derived numbers for one (backend, codec) result."""
    if "error" in res:
        return {"error": res["error"]}
    t = np.asarray(res["gather_s"], dtype=np.float64)
    total = float(t.sum())
    return {
        "write_mib_s": res["logical_bytes"] / MiB / res["write_s"],
        "gather_mib_s": sum(res["gather_bytes"]) / MiB / total,
        "krecords_s": sum(res["gather_records"]) / total / 1e3,
        "p50_ms": float(np.percentile(t, 50)) * 1e3,
        "p95_ms": float(np.percentile(t, 95)) * 1e3,
        "disk_mib": res["disk_bytes"] / MiB,
        "ratio": res["logical_bytes"] / res["disk_bytes"] if res["disk_bytes"] else float("nan"),
        "train_s": res.get("train_s"),
        "dict_len": res.get("dict_len"),
    }


def _fmt(x: float, unit: str = "") -> str:
    if x >= 100:
        s = f"{x:.0f}"
    elif x >= 10:
        s = f"{x:.1f}"
    else:
        s = f"{x:.2f}"
    return s + unit


def row_label(backend: str, codec: str, wl: dict, ref_version: str) -> str:
    if backend == "ours":
        return f"ours-{codec}"
    if backend == "reference":
        return f"loaderx-{ref_version}-{codec}"
    return "npy-mmap-raw" if wl["kind"] == "dense" else "npy-mmap-flat+offsets-raw (per-record slicing)"


def combine(rounds: list[dict], codec: str) -> dict:
    """Per-metric median over rounds of one backend's result for ``codec``."""
    per = []
    for run in rounds:
        res = next((r for r in run.get("results", []) if r.get("codec") == codec), None)
        if res is None:
            return {"error": str(run.get("error", "no result"))}
        s = summarize(res)
        if "error" in s:
            return s
        per.append(s)
    out = {}
    for key in per[0]:
        vals = [p[key] for p in per if p[key] is not None]
        out[key] = float(np.median(vals)) if vals else None
    out["rounds"] = len(per)
    return out


def workload_summaries(runs: dict, args) -> dict:
    keys = [(b, c) for c in args.codecs for b in ("ours", "reference") if b in runs]
    if "npy" in runs:
        keys.append(("npy", "raw"))
    return {k: combine(runs[k[0]], k[1]) for k in keys}


def render_workload(wl: dict, runs: dict, summaries: dict, args) -> str:
    lines = []
    mib = wl["logical_bytes"] / MiB
    per = mib / wl["records"]
    per_s = f"{per * 1024:.1f} KiB" if per < 1 else f"{per:.2f} MiB"
    lines.append(f"### {wl['name']} — {wl['title']}")
    lines.append("")
    extra = ""
    st = wl["stats"]
    if "median_h" in st:
        extra = f"; median H {st['median_h']:.0f}, median W {st['median_w']:.0f}"
    if "median_len" in st:
        extra = (f"; length p10 {st['p10_len']:.0f}, median {st['median_len']:.0f}, "
                 f"mean {st['mean_len']:.1f}, p90 {st['p90_len']:.0f}")
    timing = "timed once each after 1 warm-up"
    if args.rounds > 1:
        timing += f"; every cell is the median of {args.rounds} rounds"
    lines.append(f"{wl['records']:,} records ({wl['item']}), {mib:.1f} MiB logical, {per_s}/record{extra}; "
                 f"{wl['batches']} random batches of {wl['batch']} ({timing}).")
    lines.append("")
    lines.append("| backend | logical write | logical gather | krecords/s | p50 | p95 | disk | ratio |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|")
    ref_version = "2.0.0"
    for run in runs.get("reference", []):
        ref_version = run.get("info", {}).get("loaderx_version", ref_version)
    train_notes = []
    for (backend, codec), s in summaries.items():
        label = row_label(backend, codec, wl, ref_version)
        if "error" in s:
            msg = s["error"].replace("|", "\\|").replace("\n", " ")[:160]
            lines.append(f"| {label} | ERROR: {msg} | | | | | | |")
            continue
        lines.append(f"| {label} | {_fmt(s['write_mib_s'])} MiB/s | {_fmt(s['gather_mib_s'])} MiB/s | "
                     f"{_fmt(s['krecords_s'])} | {_fmt(s['p50_ms'])} ms | {_fmt(s['p95_ms'])} ms | "
                     f"{_fmt(s['disk_mib'])} MiB | {s['ratio']:.2f}x |")
        if s.get("train_s") is not None:
            train_notes.append(f"{label}: {s['train_s']:.2f} s, {int(s['dict_len']):,} B dictionary")
    lines.append("")
    if train_notes:
        lines.append(f"Dictionary training (train_dict tier={args.dict_tier!r}, not part of logical write): "
                     + "; ".join(train_notes) + ".")
        lines.append("")
    notes = [f"{b}: {r['exit_note']}" for b, rr in runs.items() for r in rr if r.get("exit_note")]
    if notes:
        lines.append("Note — " + "; ".join(notes) + ".")
        lines.append("")
    loads = ", ".join(f"{b} {rr[-1]['load']}" for b, rr in runs.items() if rr and rr[-1].get("load"))
    if loads:
        lines.append(f"Load average (1/5/15 min) when each backend finished: {loads}.")
        lines.append("")
    if "ours" in runs and "reference" in runs:
        parts = []
        for codec in args.codecs:
            a, b = summaries.get(("ours", codec)), summaries.get(("reference", codec))
            if not a or not b or "error" in a or "error" in b:
                parts.append(f"{codec}: n/a")
                continue
            parts.append(f"{codec}: gather {a['gather_mib_s'] / b['gather_mib_s']:.2f}x, "
                         f"write {a['write_mib_s'] / b['write_mib_s']:.2f}x, "
                         f"ratio {a['ratio'] / b['ratio']:.2f}x ({a['ratio']:.2f}x vs {b['ratio']:.2f}x)")
        lines.append(f"**ours vs loaderx-{ref_version}** (>1 = ours higher) — " + "; ".join(parts) + ".")
        lines.append("")
    return "\n".join(lines)


def render_header(machine: dict, impls: dict, args) -> str:
    lines = ["## loaderx store benchmark" + (" (--quick)" if args.quick else ""), ""]
    cores = f"{machine['cpu_count']} logical CPUs, {machine['affinity']} usable (sched_getaffinity)"
    if "cgroup_cpus" in machine:
        cores += f", cgroup quota {machine['cgroup_cpus']} CPUs"
    mem = machine["memory"] + (f" (cgroup limit {machine['cgroup_memory']})" if "cgroup_memory" in machine else "")
    lines += ["| machine | value |", "|---|---|",
              f"| CPU | {machine['cpu']} |",
              f"| cores | {cores} |",
              f"| memory | {mem} |",
              f"| kernel | {machine['kernel']} |",
              f"| python | {machine['python']}, numpy {machine['numpy']} |"]
    for backend, info in impls.items():
        if not info:
            continue
        if backend == "npy":
            desc = f"python {info.get('python')}, numpy {info.get('numpy')}"
        else:
            desc = (f"loaderx {info.get('loaderx_version')} from {info.get('loaderx_file')}; "
                    f"python {info.get('python')}, numpy {info.get('numpy')}")
        lines.append(f"| {backend} | {desc} |")
    lines.append(f"| load average at start | {machine.get('loadavg', '?')} |")
    lines.append(f"| work dir | {args.workdir} |")
    lines.append("")
    return "\n".join(lines)


# =========================================================================== main


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out",
                   help="where sources, plans and stores go (default: <repo>/bench-out)")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python",
                   help="python of a virtualenv with loaderx==2.0.0 (default: <repo>/.venv-ref/bin/python)")
    p.add_argument("--make-reference-venv", action="store_true",
                   help="create the reference virtualenv (python -m venv + pip install loaderx==2.0.0) if missing")
    p.add_argument("--quick", action="store_true", help="~10x smaller workloads, for a smoke run")
    p.add_argument("--only", default=",".join(WORKLOADS),
                   help=f"comma-separated workloads (default: all of {','.join(WORKLOADS)})")
    p.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated subset of ours,reference,npy")
    p.add_argument("--codecs", default=",".join(CODECS), help="comma-separated subset of raw,zstd,zstd_dict")
    p.add_argument("--dict-tier", default="balanced", help="train_dict tier for zstd_dict (default: balanced)")
    p.add_argument("--chunk", type=int, default=256, help="records per append call (default: 256)")
    p.add_argument("--seed", type=int, default=20240611, help="seed for sources and index plans")
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat every measurement N times (rotating backend order) and report medians "
                        "(default 1: a single pass, every plan timed once)")
    p.add_argument("--json", type=Path, help="also write every raw number to this JSON file")
    p.add_argument("--regenerate", action="store_true", help="regenerate sources even if cached in the work dir")
    p.add_argument("--keep-stores", action="store_true", help="leave the written stores in the work dir")
    p.add_argument("--ours-subprocess", action="store_true",
                   help="run ours in a fresh subprocess of this python too (default: in-process)")
    args = p.parse_args(argv)

    def split(val, allowed, what):
        items = [x.strip() for x in val.split(",") if x.strip()]
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            p.error(f"unknown {what} {bad}; choose from {','.join(allowed)}")
        return items

    args.only = split(args.only, list(WORKLOADS), "workload")
    args.backends = split(args.backends, BACKENDS, "backend")
    args.codecs = [c for c in CODECS if c in split(args.codecs, CODECS, "codec")]
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if args.chunk < 1:
        p.error("--chunk must be >= 1")
    args.workdir = args.workdir.resolve()
    args.reference_python = Path(os.path.abspath(args.reference_python))
    return args


def probe_implementations(args, worker_mod) -> dict:
    """Versions and import paths of every backend, before anything is measured."""
    impls = {}
    for backend in args.backends:
        if backend == "reference" or (backend == "ours" and args.ours_subprocess):
            py = str(args.reference_python) if backend == "reference" else sys.executable
            cmd = [py, "-I", str(WORKER), "--probe"] if backend == "reference" else [py, str(WORKER), "--probe"]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(args.workdir))
            try:
                info = json.loads(proc.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                info = {"error": f"probe exited {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        else:
            info = worker_mod.probe("npy" if backend == "npy" else "loaderx")
        impls[backend] = info
    return impls


def main(argv=None) -> int:
    faulthandler.enable()
    args = parse_args(argv)
    t_start = time.perf_counter()
    if "reference" in args.backends:
        ensure_reference(args)
    machine = machine_info()
    args.workdir.mkdir(parents=True, exist_ok=True)
    worker_mod = load_worker_module()

    impls = probe_implementations(args, worker_mod)
    broken = {b: i["error"] for b, i in impls.items() if i.get("error")}
    if broken:
        for b, e in broken.items():
            log(f"{b}: cannot import loaderx: {e}")
        return 2
    header = render_header(machine, impls, args)
    ours_file = impls.get("ours", {}).get("loaderx_file")
    ref_file = impls.get("reference", {}).get("loaderx_file")
    if ours_file and ref_file and Path(ours_file).resolve() == Path(ref_file).resolve():
        header += "\n**warning: 'ours' and 'reference' imported the same loaderx package.**\n"
        log("warning: 'ours' and 'reference' import the same loaderx package")
    print(header, flush=True)

    report = {"machine": machine, "implementations": impls,
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "workloads": {}}
    for name in args.only:
        wl = prepare_workload(name, WORKLOADS[name], args)
        runs = {b: [] for b in args.backends}
        for rnd in range(args.rounds):
            # Rotate the backend order between rounds so no backend always runs first.
            k = rnd % len(args.backends)
            if args.rounds > 1:
                log(f"[{name}] round {rnd + 1}/{args.rounds}")
            for backend in args.backends[k:] + args.backends[:k]:
                run = run_backend(backend, wl, args, worker_mod)
                runs[backend].append(run)
                if run.get("error"):
                    log(f"[{name}] {backend}: ERROR {run['error']}")
        summaries = workload_summaries(runs, args)
        print(render_workload(wl, runs, summaries, args), flush=True)
        log(f"[{name}] done")
        report["workloads"][name] = {
            "title": wl["title"], "kind": wl["kind"],
            "records": wl["records"], "batch": wl["batch"], "batches": wl["batches"],
            "logical_bytes": wl["logical_bytes"], "item": wl["item"], "source_stats": wl["stats"],
            "runs": runs,  # backend -> one raw worker result per round (per-batch times included)
            "summary": {f"{b}/{c}": v for (b, c), v in summaries.items()},
        }
    report["total_s"] = time.perf_counter() - t_start
    print(f"_Total run time {report['total_s']:.0f} s._", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
        log(f"raw numbers written to {args.json}")
    failed = any(r.get("error") or any("error" in x for x in r.get("results", []))
                 for w in report["workloads"].values() for rr in w["runs"].values() for r in rr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
