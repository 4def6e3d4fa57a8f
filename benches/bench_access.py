"""How a reader gets at its files: random gathers of small raw records and
of zstd records, by data access mode, side by side with NumPy's memory map.

Measures the cost of the default access path (positional reads of the record
table and of data.zr, which no file change can turn into a signal) against
memory maps (`data_access="map"`), on stores in the page cache.

    .venv/bin/python benches/bench_access.py [--records N] [--rounds R] [--json PATH]

Each round times every backend once, in a rotating order; the table shows
medians over rounds, and each row's ratio to NumPy fancy indexing of an
`np.load(mmap_mode="r")` array holding the same records.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from loaderx.zrecord import Dense


def _time_gathers(fn, plans: list[np.ndarray]) -> float:
    """Microseconds per gather over ``plans`` (after one warm-up pass)."""
    for idx in plans[:20]:
        fn(idx)
    t0 = time.perf_counter()
    for idx in plans:
        fn(idx)
    return (time.perf_counter() - t0) / len(plans) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--width", type=int, default=2048, help="record bytes (uint8)")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--gathers", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    # Compressible records (so zstd rows are meaningful): small-alphabet bytes.
    data = rng.integers(0, 16, size=(args.records, args.width), dtype=np.uint8)
    plans = [rng.integers(0, args.records, size=args.batch) for _ in range(args.gathers)]
    with tempfile.TemporaryDirectory(prefix="loaderx-bench-access-") as tmp:
        root = Path(tmp)
        np.save(root / "data.npy", data)
        for codec in ("raw", "zstd"):
            with Dense.create(root / codec, np.uint8, (args.width,), codec=codec) as w:
                w.append(data)
        npy = np.load(root / "data.npy", mmap_mode="r")
        stores = {
            "raw, default": Dense.open(root / "raw"),
            "raw, read": Dense.open(root / "raw", data_access="read"),
            "raw, map": Dense.open(root / "raw", data_access="map"),
            "zstd, default": Dense.open(root / "zstd"),
        }
        for s in stores.values():  # every page in the page cache before timing
            s[np.arange(args.records)]
        backends = {"numpy mmap": lambda idx: npy[idx]}
        backends.update({name: (lambda s: lambda idx: s[idx])(s) for name, s in stores.items()})
        results: dict[str, list[float]] = {name: [] for name in backends}
        names = list(backends)
        for r in range(args.rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            for name in order:
                results[name].append(_time_gathers(backends[name], plans))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        access = {name: s.data_access for name, s in stores.items()}
        for s in stores.values():
            s.close()

    base = statistics.median(results["numpy mmap"])
    print(f"\nRandom gathers of {args.batch} x {args.width}-byte uint8 records from "
          f"{args.records:,} records in the page cache; medians of {args.rounds} rounds of "
          f"{args.gathers} gathers.\n")
    print(f"Machine: {platform.machine()}, {os.cpu_count()} logical CPUs, "
          f"Python {platform.python_version()}, NumPy {np.__version__}.\n")
    print("| backend | data.zr read by | us per gather | vs NumPy mmap |")
    print("|---|---|---:|---:|")
    for name in names:
        med = statistics.median(results[name])
        print(f"| {name} | {access.get(name, '-')} | {med:.1f} | {base / med:.2f}x |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "us_per_gather": results, "access": access}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
