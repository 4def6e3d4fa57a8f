#!/usr/bin/env python3
"""Encoded images decoded in the DataLoader's transform workers: decoded
images per second with 1, 2 and 4 workers.

    .venv/bin/python benches/bench_decode.py            # ~1 minute on 2 cores
    .venv/bin/python benches/bench_decode.py --quick    # ~15 s

Workload: ``--images`` deterministic synthetic JPEGs (smooth shading, edges
and noise, quality 90, 224 x 224 RGB by default) in a Ragged uint8 store of
their bytes, as ``loaderx convert`` stores an image column (``--codec auto``
keeps JPEG bytes raw: they do not compress). A ``DataLoader`` (batch 32,
cyclic) with ``transform=loaderx.tools.decode_images("image")`` decodes every
record with Pillow into a uint8 (224, 224, 3) array; the consumer only takes
batches. Each configuration runs ``--batches`` timed batches after
``--warmup``, in ``--rounds`` rotated rounds in one process; the table gives
medians, the range over rounds and the process's CPU time per image (all
threads; on a shared machine it moves less than the wall-clock rate). A
baseline row decodes the same records in one plain Python loop (no loader),
the rate one core reaches.

Pillow releases the GIL while it decodes, so transform worker threads decode
in parallel, up to the cores the machine gives.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import PIL
from PIL import Image

import loaderx
from loaderx import tools
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Ragged

BATCH = 32


def jpegs(n: int, size: int, seed: int) -> list[bytes]:
    """``n`` deterministic JPEGs: shaded gradients, a few rectangles, noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = []
    for _ in range(n):
        a, b, c = rng.uniform(0.2, 1.0, size=3)
        img = np.stack([xx * a, yy * b, (xx + yy) * c / 2], axis=-1) * 200
        for _ in range(4):
            y0, x0 = rng.integers(0, size - size // 4, size=2)
            img[y0 : y0 + size // 4, x0 : x0 + size // 4] = rng.uniform(0, 255, size=3)
        img += rng.normal(0, 6, size=img.shape)
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def loader_rate(store: Ragged, workers: int, batches: int, warmup: int) -> tuple[float, float]:
    """(decoded images/s, process CPU ms per image) of the loader."""
    transform = tools.decode_images("image")
    with DataLoader({"image": store}, batch_size=BATCH, mode=2, seed=1, transform=transform,
                    transform_workers=workers) as dl:
        for _ in range(warmup):
            next(dl)
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(batches):
            batch = next(dl)
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    assert batch["image"][0].dtype == np.uint8 and batch["image"][0].ndim == 3
    n = batches * BATCH
    return n / elapsed, cpu / n * 1e3


def loop_rate(records: list[np.ndarray], n: int) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.perf_counter()
    for i in range(n):
        tools.decode_image(records[i % len(records)])
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    return n / elapsed, cpu / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=384)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--batches", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="256 images, 20 batches, 2 rounds")
    args = ap.parse_args()
    if args.quick:
        args.images, args.batches, args.warmup, args.rounds = 256, 20, 2, 2
    workers = [int(w) for w in args.workers.split(",")]

    data = jpegs(args.images, args.size, args.seed)
    mean_kib = sum(map(len, data)) / len(data) / 1024
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        path = Path(tmp) / "image"
        tools.convert(np.array(data, dtype=object), path)
        info = tools.info(path)
        with Ragged.open(path) as store:
            records = store[:]
            rates: dict[str, list[tuple[float, float]]] = {f"{w}": [] for w in workers}
            rates["loop"] = []
            names = list(rates)
            for r in range(args.rounds):
                order = names[r % len(names):] + names[: r % len(names)]  # no config always first
                for name in order:
                    if name == "loop":
                        rates[name].append(loop_rate(records, args.batches * BATCH))
                    else:
                        rates[name].append(loader_rate(store, int(name), args.batches, args.warmup))

    print(f"loaderx {loaderx.__version__}, Pillow {PIL.__version__}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs ({platform.machine()})")
    print(f"{args.images} JPEGs {args.size}x{args.size} RGB, quality 90, mean {mean_kib:.1f} KiB; store: "
          f"Ragged uint8, codec {info['codec']} (auto); batch {BATCH}, {args.batches} timed batches "
          f"after {args.warmup} warm-up, median of {args.rounds} rotated rounds")
    print()
    def row(label: str, name: str, base: float) -> str:
        speeds = [r for r, _ in rates[name]]
        m = statistics.median(speeds)
        cpu = statistics.median(c for _, c in rates[name])
        return (f"| {label} | {m:,.0f} | {min(speeds):,.0f}-{max(speeds):,.0f} | {m / base:.2f}x | "
                f"{cpu:.2f} |")

    base = statistics.median(r for r, _ in rates["loop"])
    print("| decoding | decoded images/s (median) | rounds | vs plain loop | CPU ms / image |")
    print("|---|---:|---:|---:|---:|")
    print(row("plain Python loop, no loader", "loop", base))
    for w in workers:
        print(row(f"DataLoader, transform_workers={w}", f"{w}", base))

if __name__ == "__main__":
    main()
