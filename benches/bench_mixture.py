#!/usr/bin/env python3
"""Mixture overhead: a DataLoader over a Mixture of 3 sources vs one source of
the same total size.

    .venv/bin/python benches/bench_mixture.py            # ~1 minute
    .venv/bin/python benches/bench_mixture.py --quick

Workload: Dense int32[512] token blocks (2 KiB records), 30,000 records in
all: one store of 30,000 (the single source) and three stores of 15,000,
9,000 and 6,000 (the mixture, weights 0.5 / 0.3 / 0.2, so the records drawn
per batch match the sources' sizes). Same record generator, same codec, batch
256, mode 2 (cyclic), identity transform. Each configuration is timed for
``--batches`` batches after ``--warmup``, in ``--rounds`` rotated rounds in
one process. Every store of a row is opened with the same ``data_access``
(raw stores: both ``map`` and ``read``; zstd: ``read``), since ``auto`` would
map the smaller mixture parts and read the larger single store, which
measures the access path rather than the mixture; the table gives medians and each row's ratio to the single
source's batches/s within the same round (median over rounds).

A mixture step does extra work over a single-source step: the (source,
record) draw per slot, one gather per source instead of one, and a copy
that interleaves the per-source gathers into slot order.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from loaderx.dataloader import DataLoader, Mixture
from loaderx.zrecord import Dense

SIZES = (15_000, 9_000, 6_000)
WEIGHTS = (0.5, 0.3, 0.2)
WIDTH = 512


def records(first: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(first)
    # Token-like values: small integers, compressible like real token ids.
    return rng.integers(0, 32_000, size=(n, WIDTH), dtype=np.int32)


def build(root: Path, codec: str) -> tuple[Path, list[Path]]:
    single = root / f"single-{codec}"
    with Dense.create(single, np.int32, (WIDTH,), codec=codec) as w:
        first = 0
        for n in SIZES:
            w.append(records(first, n))
            first += n
    parts = []
    first = 0
    for k, n in enumerate(SIZES):
        p = root / f"part{k}-{codec}"
        with Dense.create(p, np.int32, (WIDTH,), codec=codec) as w:
            w.append(records(first, n))
        first += n
        parts.append(p)
    return single, parts


def rate(make, batches: int, warmup: int) -> float:
    with make() as loader:
        for _ in range(warmup):
            next(loader)
        t0 = time.perf_counter()
        for _ in range(batches):
            next(loader)
        return batches / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    # 300 batches of ~70 us is a 20 ms window: too short for a shared machine.
    ap.add_argument("--batches", type=int, default=3000)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--codecs", default="raw,zstd")
    args = ap.parse_args()
    if args.quick:
        args.batches, args.warmup, args.rounds = 60, 5, 2
    with tempfile.TemporaryDirectory(prefix="bench-mixture-") as tmp:
        root = Path(tmp)
        print(f"| codec | access | loader | batches/s (median of {args.rounds}) | ratio to single source |")
        print("|---|---|---|---:|---:|")
        runs = []
        for codec in args.codecs.split(","):
            single_path, part_paths = build(root, codec)
            for access in ("map", "read") if codec == "raw" else ("read",):
                runs.append((codec, access, single_path, part_paths))
        for codec, access, single_path, part_paths in runs:
            single = Dense.open(single_path, data_access=access)
            parts = [Dense.open(p, data_access=access) for p in part_paths]
            kw = dict(batch_size=256, mode=2, seed=1)
            configs = {
                "single source": lambda: DataLoader({"x": single}, **kw),
                "mixture of 3, exact": lambda: DataLoader(
                    Mixture({f"s{k}": ({"x": p}, w) for k, (p, w) in enumerate(zip(parts, WEIGHTS))}), **kw
                ),
                "mixture of 3, iid": lambda: DataLoader(
                    Mixture(
                        {f"s{k}": ({"x": p}, w) for k, (p, w) in enumerate(zip(parts, WEIGHTS))},
                        proportions="iid",
                    ),
                    **kw,
                ),
            }
            rates: dict[str, list[float]] = {name: [] for name in configs}
            ratios: dict[str, list[float]] = {name: [] for name in configs}
            names = list(configs)
            for r in range(args.rounds):
                # Rotate the order so no configuration always runs first.
                order = names[r % len(names):] + names[: r % len(names)]
                got = {name: rate(configs[name], args.batches, args.warmup) for name in order}
                for name in names:
                    rates[name].append(got[name])
                    ratios[name].append(got[name] / got["single source"])
            for name in names:
                print(
                    f"| {codec} | {access} | {name} | {statistics.median(rates[name]):.1f} | "
                    f"{statistics.median(ratios[name]):.3f} |"
                )
            for s in [single, *parts]:
                s.close()


if __name__ == "__main__":
    main()
