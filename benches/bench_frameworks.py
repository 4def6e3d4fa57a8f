#!/usr/bin/env python3
"""PyTorch integration benchmark: ``loaderx.torch`` against ``torch.utils.data.DataLoader``
feeding a training-step stub.

Run it with the interpreter that imports OUR loaderx and torch:

    .venv/bin/python benches/bench_frameworks.py --quick      # smoke run
    .venv/bin/python benches/bench_frameworks.py              # full size
    .venv/bin/python benches/bench_frameworks.py --device cuda  # + host-to-device columns

Workload: the Dense vision data of bench_loader.py (its cached source and
stores are reused): 2,500 uint8 (3, 224, 224) images with the record index
stamped into each, int64 labels ``label[i] = i``, batches of 256 (36.8 MiB).

Rows, each one in a fresh subprocess (-I) whose process tree is sampled for
PSS by bench_loader's sampler:

    ours TorchLoader          loaderx.torch.TorchLoader({'image', 'label'}, transform=None),
                              default arguments (pinned and copied ahead on CUDA),
                              once per store codec (zstd, raw)
    torch DataLoader, npy     torch.utils.data.DataLoader over a map-style Dataset on
                              np.load(mmap_mode='r'): batch_size=256, shuffle=True,
                              num_workers=2, pin_memory=True, persistent_workers=True
    torch DataLoader, store   the same DataLoader over loaderx.torch.StoreDataset (raw
                              store) with batch_sampler=BatchSampler(RandomSampler, 256)
                              and collate_fn=loaderx.torch.collate
    IterableStreams           loaderx.torch.IterableStreams (raw store) under
                              torch.utils.data.DataLoader(num_workers=2, batch_size=None)

Every row is run once per training-step stub (``--steps``): ``none`` (the
loader alone), ``mean`` (``image.float().mean()`` on the delivered batch, a
fixed amount of real work on the device) and ``sleep:MS`` (the device busy for
MS ms without the host: a GPU kernel on CUDA, time.sleep on CPU). Before
timing, every row's batches are checked as in bench_loader (labels in range
and distinct, each image's stamp equal to its label, the first batches byte
for byte against the source). The same run also measures the physical limits
the rows run into (a single-thread memcpy of one batch, an isolated native
gather per codec, and on CUDA a pinned host-to-device copy).

See benches/README.md ("bench_frameworks.py") for the columns.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MiB = 2 ** 20


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# Data preparation, value checks, the subprocess runner, PSS sampling and the
# summary are bench_loader's. Its run_worker() starts "<its __file__> --worker
# SPEC" and worker_main() calls its module-level worker(): pointing both at
# this file makes that machinery drive this benchmark's rows unchanged.
_bl = _load("_bench_loader_for_frameworks", HERE / "bench_loader.py")
_bl.__file__ = str(Path(__file__).resolve())
ITEM = _bl.ITEM
log = _bl.log

# key -> (label in the table, loader is torch's map-style DataLoader?)
ROWS = {
    "ours-zstd": ("**ours** `TorchLoader`, zstd store", False),
    "ours-raw": ("**ours** `TorchLoader`, raw store", False),
    "torch-npy": ("torch `DataLoader`, npy mmap", True),
    "torch-store": ("torch `DataLoader`, our store map-style (`StoreDataset`)", True),
    "torch-iterable": ("ours `IterableStreams` under torch `DataLoader`", False),
}


# =========================================================================== worker
# Runs under our interpreter with -I: stdlib, numpy, torch and loaderx only.


def _stores(spec: dict, codec: str) -> dict:
    from loaderx.zrecord import Dense
    base = Path(spec["stores"]) / codec
    return {"image": Dense.open(base / "image"), "label": Dense.open(base / "label")}


class _PlanBatches:
    """Batch sampler replaying loaderx's CYCLIC plan (mode 2, same seed), so
    that with --torch-sampler plan torch draws exactly the batches ours does,
    endlessly and without epoch restarts."""

    def __init__(self, records: int, batch: int, seed: int):
        from loaderx.zsampler import Sampler
        self.sampler = Sampler(records, batch, mode=2, seed=seed)

    def __iter__(self):
        step = 0
        while True:
            yield self.sampler.batch_at(step).tolist()
            step += 1


def _torch_batches(spec: dict, dataset):
    """torch.utils.data.DataLoader over a map-style dataset, configured as the
    issue asks; a plan replay instead of shuffling with --torch-sampler plan."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler
    common = {"num_workers": spec["workers"], "pin_memory": True, "persistent_workers": spec["workers"] > 0}
    if spec["row"] == "torch-store":
        from loaderx.torch import collate
        common["collate_fn"] = collate
    torch.manual_seed(spec["seed"])
    if spec["torch_sampler"] == "plan":
        return DataLoader(dataset, batch_sampler=_PlanBatches(spec["records"], spec["batch"], spec["seed"]),
                          **common)
    if spec["row"] == "torch-store":
        sampler = BatchSampler(RandomSampler(dataset), spec["batch"], drop_last=True)
        return DataLoader(dataset, batch_sampler=sampler, **common)
    # drop_last: only full batches, as loaderx's CYCLIC delivers.
    return DataLoader(dataset, batch_size=spec["batch"], shuffle=True, drop_last=True, **common)


def _npy_dataset(spec: dict):
    import torch

    class NpyDataset(torch.utils.data.Dataset):
        """Records from np.load(mmap_mode='r'), opened lazily, i.e. in each worker."""

        def __init__(self):
            self.images = self.labels = None

        def __len__(self):
            return spec["records"]

        def __getitem__(self, i):
            if self.images is None:
                self.images = np.load(spec["images"], mmap_mode="r")
                self.labels = np.load(spec["labels"], mmap_mode="r")
            return {"image": self.images[i], "label": self.labels[i]}

    # default_collate copies the read-only memmap slices; their per-worker warning is noise.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    return NpyDataset()


def open_row(spec: dict, device):
    """Build the row's pipeline: (endless iterator of batches as the user gets
    them, on the device for CUDA; close)."""
    import torch
    from loaderx import torch as lt
    cuda = device.type == "cuda"
    if spec["row"].startswith("ours-"):
        streams = _stores(spec, spec["row"][len("ours-"):])
        loader = lt.TorchLoader(streams, device=device if cuda else None, transform=None,
                                batch_size=spec["batch"], seed=spec["seed"])
        return loader, loader.close
    if spec["row"] == "torch-npy":
        loader = _torch_batches(spec, _npy_dataset(spec))
    elif spec["row"] == "torch-store":
        loader = _torch_batches(spec, lt.StoreDataset(_stores(spec, "raw")))
    else:
        ds = lt.IterableStreams(_stores(spec, "raw"), batch_size=spec["batch"], seed=spec["seed"])
        loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=spec["workers"], pin_memory=True,
                                             persistent_workers=spec["workers"] > 0)

    def batches():
        for b in _bl._endless(loader):
            # What torch users write: the copy is queued on the current stream.
            yield {k: v.to(device, non_blocking=True) for k, v in b.items()} if cuda else b

    return batches(), lambda: None


def _cuda_sleep_cycles(ms: float) -> int:
    """torch.cuda._sleep cycles that keep the GPU busy for about ``ms``."""
    import torch
    torch.cuda._sleep(1_000_000)  # warm the kernel
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(10_000_000)
    torch.cuda.synchronize()
    return int(10_000_000 * ms / 1e3 / (time.perf_counter() - t0))


def make_step(name: str, device):
    """The training-step stub. Each one ends by reading a result back (as
    ``loss.item()`` does), so the next step cannot start before this one ends."""
    import torch
    if name == "none":
        return lambda batch: None
    if name == "mean":
        return lambda batch: (batch["image"].float().mean() + batch["label"].float().mean()).item()
    ms = float(name.split(":", 1)[1])
    if device.type == "cuda":
        cycles = _cuda_sleep_cycles(ms)

        def gpu_step(batch):
            torch.cuda._sleep(cycles)
            torch.cuda.current_stream().synchronize()
        return gpu_step
    return lambda batch: time.sleep(ms / 1e3)


def _median_time(fn, repeats: int = 7) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def probes(batch: dict, step, device) -> dict:
    """Alone, with the loader's queue full and idle: one step on a batch
    already on the device and, on CUDA, the pinned host-to-device copy of one
    batch (the ceiling of any loader's copy)."""
    import torch
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def one_step():
        step(batch)
        sync()

    out = {"step_s": _median_time(one_step)}
    if cuda:
        host = {k: v.cpu().pin_memory() for k, v in batch.items()}

        def copy():
            for v in host.values():
                v.to(device, non_blocking=True)
            sync()

        out["copy_s"] = _median_time(copy)
    return out


def _checked(batch: dict, spec: dict, src, full: bool) -> None:
    _bl._verify({k: v.cpu().numpy() for k, v in batch.items()}, spec, src, full)


def worker(spec: dict) -> dict:
    import torch

    # The loader's threads/processes share the box with the step; torch's
    # intra-op pool for the stub is capped so it cannot grab every core.
    torch.set_num_threads(spec["step_threads"])
    # torch's own warning that pin_memory=True does nothing without an accelerator.
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator")
    _bl._phase("setup")
    device = torch.device(spec["device"])
    step = make_step(spec["step"], device)
    src = _bl._Source(spec["images"])
    it, close = open_row(spec, device)
    cpu = _load("_bench_remote_for_frameworks", HERE / "bench_remote.py").tree_cpu
    out = {"info": {"torch": torch.__version__}}
    try:
        _bl._phase("verify")
        for _ in range(spec["verify"]):
            _checked(next(it), spec, src, full=True)
        _bl._phase("warmup")
        for _ in range(spec["warmup"]):
            batch = next(it)
            _checked(batch, spec, src, full=False)
            step(batch)
        out.update(probes(batch, step, device))
        del batch
        _bl._phase("timed")
        waits, pc = [], time.perf_counter
        c0, t_start = cpu(os.getpid()), pc()
        for _ in range(spec["batches"]):
            t0 = pc()
            batch = next(it)  # the previous batch stays alive meanwhile, as in a for loop
            waits.append(pc() - t0)
            step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        out["elapsed_s"], out["cpu_s"] = pc() - t_start, cpu(os.getpid()) - c0
        out["waits_s"] = waits
        _bl._phase("after")
        _checked(batch, spec, src, full=False)  # the last timed batch is right too
        del batch
    finally:
        close()
        src.close()
    _bl._phase("closed")
    return out


# =========================================================================== limits (parent)


def _isolated(fn) -> tuple[float, float]:
    """(median wall seconds, CPU seconds of this process per call) of ``fn``."""
    c0 = time.process_time()
    wall = _median_time(fn)
    return wall, (time.process_time() - c0) / 8  # _median_time calls fn 8 times


def physical_limits(data: dict, codecs: list[str], batch: int, seed: int) -> dict:
    """Ceilings measured in this run, in the driver, with nothing else running:
    a single-thread memcpy of one image batch (every row copies each batch at
    least once: the raw gather, torch's collate into shared memory) and one
    isolated native gather of a planned batch per codec (the zstd one is bound
    by decompression speed; both run on loaderx's pool of all cores)."""
    from loaderx.zrecord import Dense
    from loaderx.zsampler import Sampler
    nbytes = batch * int(np.prod(ITEM))
    a, b = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    out = {"batch_image_bytes": nbytes, "memcpy_s": _isolated(lambda: np.copyto(b, a))[0]}
    sampler = Sampler(len(np.load(data["labels"], mmap_mode="r")), batch, mode=2, seed=seed)
    for codec in codecs:
        store = Dense.open(data["stores"] / codec / "image")
        steps = iter(range(1, 10 ** 6))  # a new planned batch per call, as a loader draws them
        out[f"gather_{codec}_s"], out[f"gather_{codec}_cpu_s"] = _isolated(
            lambda store=store, steps=steps: store[sampler.batch_at(next(steps))])
        store.close()
    return out


# =========================================================================== driver


def cell(res: dict, batch_bytes: int) -> dict:
    """The numbers one worker run contributes to the table (bench_loader's
    summary plus CPU per batch, the step alone and, on CUDA, the copy alone)."""
    out = _bl.summarize(res, batch_bytes)
    if "error" in out:
        return out
    n = len(res["waits_s"])
    out.update(cpu_ms=res["cpu_s"] / n * 1e3, per_batch_s=res["elapsed_s"] / n, step_s=res["step_s"])
    if "copy_s" in res:
        out["copy_s"] = res["copy_s"]
    return out


def _median_cells(cells: list[dict]) -> dict:
    bad = next((c for c in cells if "error" in c), None)
    return bad or {k: float(np.median([c[k] for c in cells])) for k in cells[0]}


def run_rows(plan: list[tuple[str, str]], base: dict, data: dict, bz, args) -> tuple[dict, dict]:
    """Run every (row, step) in its own worker, ``--rounds`` times with the
    order rotated between rounds (so no row always runs first on a busy box).
    Returns the raw results and the per-metric median cells, by "row/step"."""
    batch_bytes = args.batch * (int(np.prod(ITEM)) + 8)
    raw: dict[str, list] = {}
    for rnd in range(args.rounds):
        k = rnd % len(plan)
        for key, step in plan[k:] + plan[:k]:
            warm = [data["stores"]] if key != "torch-npy" else [data["images"], data["labels"]]
            _bl.warm_files(warm)  # every row starts from a warm page cache
            t0 = time.perf_counter()
            spec_path = data["dir"] / f"spec-frameworks-{key}-{step.replace(':', '')}.json"
            res = _bl.run_worker(sys.executable, dict(base, row=key, step=step), spec_path, args.timeout,
                                 args.interval)
            res["load"] = bz._loadavg()
            raw.setdefault(f"{key}/{step}", []).append(res)
            c = cell(res, batch_bytes)
            msg = f"ERROR {c['error']}" if "error" in c else (
                f"{c['batches_s']:.1f} batches/s, peak PSS {c['peak_pss']:.0f} MiB")
            log(f"[frameworks] round {rnd + 1}/{args.rounds} {key} step={step}: {msg} "
                f"({time.perf_counter() - t0:.1f} s)")
    cells = {name: _median_cells([cell(r, batch_bytes) for r in runs]) for name, runs in raw.items()}
    return raw, cells


def _cuda_cells(c: dict, step: str, batch_bytes: int) -> str:
    """Host-to-device GB/s delivered (and of one pinned copy alone), and the
    share of the copy hidden behind the step: (copy alone + step alone - time
    per batch with both) / copy alone, clamped to 0..1. Without a step there
    is nothing to hide the copy behind."""
    copy_s = c.get("copy_s")
    if copy_s is None:
        return "n/a (CPU) | n/a (CPU)"
    cells = f"{batch_bytes / c['per_batch_s'] / 1e9:.1f} ({batch_bytes / copy_s / 1e9:.0f})"
    if step == "none":
        return cells + " | –"
    hidden = min(1.0, max(0.0, (copy_s + c["step_s"] - c["per_batch_s"]) / copy_s))
    return f"{cells} | {hidden:.0%}"


def report(raw: dict, cells: dict, plan, limits: dict, header: dict, args) -> tuple[str, bool]:
    f = _bl._fmt
    batch_bytes = args.batch * (int(np.prod(ITEM)) + 8)
    L = [f"## loaderx.torch vs torch.utils.data.DataLoader{' (--quick)' if args.quick else ''}", "",
         "| machine | value |", "|---|---|"]
    L += [f"| {k} | {v} |" for k, v in header.items()]
    L += ["", (f"{args.records:,} records uint8{ITEM} + int64 label; batch {args.batch} "
               f"({batch_bytes / MiB:.1f} MiB); {args.verify} fully verified + {args.warmup} warm-up batches, "
               f"then {args.batches} timed; torch sampler: {args.torch_sampler}; device: {args.device}"
               f"{f'; every cell is the median of {args.rounds} rounds' if args.rounds > 1 else ''}."), "",
          ("| loader | step | batches/s | MiB/s | p95 wait | peak PSS | CPU ms/batch | step alone | "
           "vs best torch (batches/s · peak PSS) | H2D GB/s (copy alone) | copy hidden |"),
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    failed = False
    for step in args.steps:
        keys = [k for k, s in plan if s == step]
        torch_rows = [cells[f"{k}/{step}"] for k in keys if ROWS[k][1] and "error" not in cells[f"{k}/{step}"]]
        best = max(torch_rows, key=lambda c: c["batches_s"], default=None)
        for key in keys:
            s = cells[f"{key}/{step}"]
            if "error" in s:
                failed = True
                msg = s["error"].replace("|", "\\|").replace("\n", " ")[:200]
                L.append(f"| {ROWS[key][0]} | `{step}` | ERROR: {msg} | | | | | | | | |")
                continue
            vs = (f"{s['batches_s'] / best['batches_s']:.2f}x · {s['peak_pss'] / best['peak_pss']:.2f}x"
                  if best else "n/a")
            alone = f"{f(s['step_s'] * 1e3)} ms" if step != "none" else "–"
            L.append(f"| {ROWS[key][0]} | `{step}` | {f(s['batches_s'])} | {f(s['mib_s'])} | "
                     f"{f(s['p95_ms'])} ms | {f(s['peak_pss'])} MiB | {f(s['cpu_ms'])} | {alone} | {vs} | "
                     f"{_cuda_cells(s, step, batch_bytes)} |")
    L.append("")
    m = limits["memcpy_s"]
    lim = [(f"single-thread memcpy of one {limits['batch_image_bytes'] / MiB:.1f} MiB image batch: "
            f"{m * 1e3:.1f} ms = {limits['batch_image_bytes'] / MiB / m:,.0f} MiB/s ({1 / m:.0f} batches/s)")]
    for codec in args.codecs:
        g, c = limits[f"gather_{codec}_s"], limits[f"gather_{codec}_cpu_s"]
        lim.append(f"isolated native gather of one planned image batch, {codec} store: {g * 1e3:.1f} ms "
                   f"({1 / g:.0f} batches/s; {c * 1e3:.0f} ms CPU, i.e. {c / g:.1f} cores busy)")
    L += ["**Limits measured in this run** (driver process, nothing else running): " + "; ".join(lim) + ".", ""]
    L.append("Load average (1/5/15 min) after each row: "
             + ", ".join(f"{k} {'; '.join(r['load'] for r in v)}" for k, v in raw.items()) + ".")
    return "\n".join(L), failed


def _machine_header(bz, args) -> dict:
    import loaderx
    import torch
    m = bz.machine_info()
    cores = f"{m['cpu_count']} logical CPUs, {m['affinity']} usable"
    if args.device == "cuda":
        cuda = torch.cuda.get_device_name(0)
    elif torch.cuda.is_available():
        cuda = f"available ({torch.cuda.get_device_name(0)}), not used (--device cpu)"
    else:
        cuda = "absent (torch.cuda.is_available() is False): CPU rows only"
    return {"CPU": m["cpu"], "cores": cores, "memory": m["memory"], "kernel": m["kernel"],
            "python": f"{m['python']}, numpy {m['numpy']}", "torch": torch.__version__,
            "CUDA": cuda,
            "loaderx": f"{loaderx.__version__} ({loaderx.__file__})",
            "load average at start": m.get("loadavg", "?")}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 1,024 records, 30 timed batches after 3 warm-up")
    p.add_argument("--records", type=int, help="records in the source (default 2500; --quick 1024)")
    p.add_argument("--batches", type=int, help="timed batches per row (default 200; --quick 30)")
    p.add_argument("--warmup", type=int, help="checked warm-up batches (default 10; --quick 3)")
    p.add_argument("--verify", type=int, default=2, help="batches compared byte for byte first (default 2)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="num_workers of the torch DataLoader rows")
    p.add_argument("--rows", default=",".join(ROWS), help=f"subset of {','.join(ROWS)}")
    p.add_argument("--steps", default="none,sleep:20,mean",
                   help="step stubs: none, mean, sleep:MS (default none,sleep:20,mean)")
    p.add_argument("--step-threads", type=int, default=1, help="torch intra-op threads for the step (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--torch-sampler", choices=("shuffle", "plan"), default="shuffle",
                   help="torch rows: shuffle=True / RandomSampler as users write it (default), or a replay "
                        "of ours' CYCLIC plan (identical batches, no epoch restarts)")
    p.add_argument("--seed", type=int, default=20240611, help="seed of the image generator")
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out" / "loader",
                   help="data directory, shared with bench_loader.py")
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "frameworks",
                   help="where the markdown report and the JSON dump go")
    p.add_argument("--rounds", type=int, default=1,
                   help="run every row N times, rotating the order, and report per-metric medians (default 1)")
    p.add_argument("--interval", type=float, default=0.05, help="memory sampling period in seconds")
    p.add_argument("--timeout", type=float, default=600, help="per-row timeout in seconds")
    p.add_argument("--regenerate", action="store_true")
    args = p.parse_args(argv)
    q = args.quick
    args.records = args.records or (1024 if q else 2500)
    args.batches = args.batches or (30 if q else 200)
    args.warmup = args.warmup if args.warmup is not None else (3 if q else 10)
    args.workdir = args.workdir.resolve()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    args.steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    args.codecs = sorted({r[len("ours-"):] for r in args.rows if r.startswith("ours-")} | {"raw"})
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    if not args.rows or any(r not in ROWS for r in args.rows):
        p.error(f"--rows: choose from {','.join(ROWS)}")
    for s in args.steps:
        if s not in ("none", "mean") and not (s.startswith("sleep:") and s[6:].replace(".", "", 1).isdigit()):
            p.error(f"--steps: {s!r} is not none, mean or sleep:MS")
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "--worker":
        _bl.worker = worker  # bench_loader's worker_main: JSON in, one JSON line out, os._exit
        return _bl.worker_main(argv[1])
    args = parse_args(argv)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        log("[frameworks] --device cuda: CUDA is absent on this machine (torch.cuda.is_available() is False); "
            "skipping the host-to-device columns and running the CPU rows")
        args.device = "cpu"
    bz = _bl._bench_zrecord()
    header = _machine_header(bz, args)
    data = _bl.prepare_data(args, bz)
    base = {"images": str(data["images"]), "labels": str(data["labels"]), "stores": str(data["stores"]),
            "records": args.records, "batch": args.batch, "batches": args.batches, "warmup": args.warmup,
            "verify": args.verify, "seed": 42, "workers": args.workers, "device": args.device,
            "torch_sampler": args.torch_sampler, "step_threads": args.step_threads}
    plan = [(key, step) for step in args.steps for key in args.rows]
    raw, cells = run_rows(plan, base, data, bz, args)
    limits = physical_limits(data, args.codecs, args.batch, 42)
    text, failed = report(raw, cells, plan, limits, header, args)
    print(text, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / ("quick" if args.quick else "full")
    stem.with_suffix(".md").write_text(text + "\n")
    stem.with_suffix(".json").write_text(json.dumps(
        {"header": header, "limits": limits, "cells": cells, "results": raw,
         "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}, indent=1))
    log(f"[frameworks] report and raw numbers written to {stem}.md / {stem}.json")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
