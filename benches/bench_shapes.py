#!/usr/bin/env python3
"""Fixed-shape batches: packing efficiency and loader throughput.

    .venv/bin/python benches/bench_shapes.py            # about a minute on 2 cores
    .venv/bin/python benches/bench_shapes.py --quick

Workload: token-like Ragged int32 records, lengths lognormal (median 90,
sigma 0.8) clipped to 16..512, in a raw store; batches of 256 records (IID).

Part 1, packing efficiency (real tokens / slots), for first-fit and best-fit
at a few ``max_tokens``, measured on the loader's own batches:

* ``rows needed``: mean and max over the batches of the rows that hold a
  record, with the default ``rows`` (one per record, never drops);
* ``eff @ needed``: tokens / (rows needed x max_tokens), averaged: the
  efficiency if each batch could have its own row count;
* ``eff @ static``: the same with ``rows`` fixed at the max needed over the
  sample, a static shape that dropped nothing here;
* ``drop @ mean``: with ``rows`` fixed at the mean needed (rounded up), the
  share of records dropped (counted in ``{name}_dropped``) and of tokens
  lost with them.

Padding every record to 512 is given for comparison.

Part 2, loader throughput (batches/s and million tokens/s, identity
transform, nothing done with the batch; the best of 3 interleaved rounds)
for the plain Ragged list, ``packed=True``, ``pad`` to 512 and ``pack`` at
4096.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time

import numpy as np

from loaderx.dataloader import DataLoader, Pack, Pad
from loaderx.zrecord import Dense, Ragged

BATCH = 256
ROUNDS = 3


def make_store(path: str, n: int, seed: int = 0) -> np.ndarray:
    """The token store at ``path`` and a Dense ``path-id`` of record numbers;
    returns the lengths."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(90), 0.8, n)), 16, 512).astype(int)
    tokens = rng.integers(0, 50_000, int(lengths.sum()), dtype=np.int32)
    cuts = np.cumsum(lengths)[:-1]
    with Ragged.create(path, np.int32, codec="raw") as w:
        w.append(np.split(tokens, cuts))
    with Dense.create(path + "-id", np.int64, ()) as w:
        w.append(np.arange(n, dtype=np.int64))
    return lengths


def efficiency(store: Ragged, ids: Dense, lengths: np.ndarray, steps: int) -> list[str]:
    rows = [
        "| max_tokens | policy | rows needed (mean / max) | eff @ needed | eff @ static "
        "| drop @ mean: records / tokens |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for mt in (512, 1024, 2048, 4096):
        for policy in ("first_fit", "best_fit"):
            needed, tokens = [], []
            with DataLoader({"t": store}, batch_size=BATCH, mode=1, seed=1, pack={"t": Pack(mt, policy=policy)}) as dl:
                for _ in range(steps):
                    b = next(dl)
                    needed.append(int((b["t_segment_ids"][:, 0] > 0).sum()))
                    tokens.append(int(b["t_placement"][:, 2].sum()))
            needed_a, tokens_a = np.array(needed), np.array(tokens)
            static = int(needed_a.max())
            mean_rows = int(np.ceil(needed_a.mean()))
            dropped = lost = total = 0
            with DataLoader(
                {"id": ids, "t": store},
                batch_size=BATCH,
                mode=1,
                seed=1,
                pack={"t": Pack(mt, rows=mean_rows, policy=policy)},
            ) as dl:
                for _ in range(steps):
                    b = next(dl)
                    dropped += int(b["t_dropped"])
                    out = b["t_placement"][:, 0] < 0
                    lost += int(lengths[b["id"][out]].sum())
                    total += int(lengths[b["id"]].sum())
            rows.append(
                f"| {mt} | {policy} | {needed_a.mean():.1f} / {static} "
                f"| {np.mean(tokens_a / (needed_a * mt)):.1%} | {np.mean(tokens_a / (static * mt)):.1%} "
                f"| {dropped / (steps * BATCH):.2%} / {lost / total:.2%} |"
            )
    with DataLoader({"t": store}, batch_size=BATCH, mode=1, seed=1, pad={"t": Pad(512)}) as dl:
        eff = np.mean([next(dl)["t_lengths"].sum() / (BATCH * 512) for _ in range(steps)])
    rows.append(f"| (pad to 512) | | {BATCH} rows of 512 | | {eff:.1%} | 0 / 0 |")
    return rows


def throughput(store: Ragged, steps: int, rows_4096: int) -> list[str]:
    cases = {
        "plain (list of arrays)": {},
        "packed=True": {"packed": True},
        "pad 512": {"pad": {"t": Pad(512)}},
        "pack 4096, first_fit, rows=256": {"pack": {"t": Pack(4096)}},
        f"pack 4096, best_fit, rows={rows_4096}": {"pack": {"t": Pack(4096, rows=rows_4096, policy="best_fit")}},
    }
    out = ["| layout | batches/s | M tokens/s | output MiB/batch |", "|---|---:|---:|---:|"]
    # The best of a few interleaved rounds: on a shared machine the other
    # load only ever makes a round slower.
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(ROUNDS):
        for name, kwargs in cases.items():
            rate = run_case(store, steps, kwargs)
            if name not in best or rate[0] > best[name][0]:
                best[name] = rate
    for name, (bps, tps, mib) in best.items():
        out.append(f"| {name} | {bps:,.0f} | {tps / 1e6:,.1f} | {mib:.2f} |")
    return out


def run_case(store: Ragged, steps: int, kwargs: dict) -> tuple[float, float, float]:
    """(batches/s, tokens/s, output MiB a batch) of one loader."""
    with DataLoader({"t": store}, batch_size=BATCH, mode=1, seed=2, **kwargs) as dl:
        for _ in range(10):
            next(dl)
        tokens = 0
        nbytes = 0
        t0 = time.perf_counter()
        for _ in range(steps):
            b = next(dl)
            v = b["t"]
            if isinstance(v, list):
                tokens += sum(len(a) for a in v)
                nbytes += sum(a.nbytes for a in v)
            elif isinstance(v, tuple):
                tokens += len(v[0])
                nbytes += sum(a.nbytes for a in v)
            else:
                tokens += int(b["t_lengths"].sum()) if "t_lengths" in b else int(b["t_placement"][:, 2].sum())
                nbytes += sum(a.nbytes for a in b.values())
        dt = time.perf_counter() - t0
    return steps / dt, tokens / dt, nbytes / steps / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer records and steps")
    args = ap.parse_args()
    n, eff_steps, tp_steps = (5_000, 20, 100) if args.quick else (50_000, 200, 2_000)
    with tempfile.TemporaryDirectory() as tmp:
        lengths = make_store(os.path.join(tmp, "t"), n)
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} CPUs visible, Python {platform.python_version()}; "
            f"{n} records, lengths 16..512 (mean {lengths.mean():.0f}, median {np.median(lengths):.0f}), "
            f"batch {BATCH}\n"
        )
        path = os.path.join(tmp, "t")
        with Ragged.open(path) as store, Dense.open(path + "-id") as ids:
            eff_rows = efficiency(store, ids, lengths, eff_steps)
            print("\n".join(eff_rows) + "\n")
            # The static row count best-fit needed at 4096 in part 1.
            best_4096 = [r for r in eff_rows if r.startswith("| 4096 | best_fit")][0]
            rows_4096 = int(best_4096.split("|")[3].split("/")[1])
            print("\n".join(throughput(store, tp_steps, rows_4096)))


if __name__ == "__main__":
    main()
