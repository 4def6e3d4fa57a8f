"""The demo: three stores built from generated data and streamed together
through a :class:`~loaderx.dataloader.DataLoader`, every batch checked."""

from __future__ import annotations

import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, TextIO

import numpy as np

from loaderx import _validate
from loaderx.tools._common import PathLike, _MiB
from loaderx.tools.inspect import info
from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged


class DemoError(RuntimeError):
    """The demo's loader delivered a batch that differs from its source."""


def _demo_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Deterministic image-like uint8 (n, 3, 64, 64), int64 labels, int32 token lists."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n, dtype=np.int64)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    bases = np.empty((10, 3, 64, 64), dtype=np.uint8)
    for c in range(10):
        for ch in range(3):
            wave = np.sin((xx * (c + 1) + yy * (ch + 2)) / 23.0) * np.cos(yy * (c % 3 + 1) / 17.0)
            bases[c, ch] = (120 + 24 * np.round(wave * 4)).astype(np.uint8)  # banded shading
    images = bases[labels]
    images += rng.integers(0, 24, size=(n, 1, 1, 1), dtype=np.uint8)  # per-image brightness
    images += rng.integers(0, 3, size=images.shape, dtype=np.uint8)  # sensor noise
    phrases = [rng.integers(3, 32000, size=int(k), dtype=np.int32) for k in rng.integers(3, 13, size=256)]
    counts = rng.integers(2, 20, size=n)
    picks = rng.integers(0, len(phrases), size=int(counts.sum()))
    bos, eos = np.array([1], np.int32), np.array([2], np.int32)
    tokens = []
    at = 0
    for k in counts.tolist():
        tokens.append(np.concatenate([bos, *(phrases[j] for j in picks[at : at + k]), eos]))
        at += k
    return images, labels, tokens


def _normalise(x: np.ndarray) -> np.ndarray:
    y: np.ndarray = np.multiply(x, np.float32(1.0 / 255.0), dtype=np.float32)
    return y


def _demo_transform(batch: dict[str, Any]) -> dict[str, Any]:
    batch["image"] = _normalise(batch["image"])
    return batch


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


#: Timed rounds of the loader (the report gives their median and range) and
#: the most batches delivered, untimed, before them.
_ROUNDS = 3
_WARMUP = 50


def demo(
    dir: PathLike | None = None,
    records: int = 8192,
    steps: int = 500,
    batch_size: int = 64,
    seed: int = 0,
    out: TextIO | None = sys.stdout,
) -> dict[str, Any]:
    """Builds three stores from generated data and streams them together.

    In ``dir`` (default: a temporary directory, removed afterwards) it writes
    ``image`` (Dense uint8 (3, 64, 64), zstd), ``label`` (Dense int64, raw) and
    ``tokens`` (Ragged int32, zstd_dict with a dictionary from
    :func:`~loaderx.utils.train_dict`), and says what each row of sizes means.
    Then a DataLoader whose transform normalises images to float32 delivers
    up to 50 untimed warm-up batches, then ``steps`` timed batches three times
    (the report gives the median and the range), and the first ``steps``
    batches of the same stream are replayed with every batch compared to the
    source records (indices from :class:`~loaderx.zsampler.Sampler`). Prints a
    report ending with the next commands to try to ``out`` (None: silent) and
    returns it as a dict. Raises DemoError when a batch differs.
    """
    from loaderx.dataloader import DataLoader
    from loaderx.zsampler import Sampler

    for name, value in (("records", records), ("steps", steps), ("batch_size", batch_size)):
        _validate.bounded(name, value, 1)
    t_start = time.perf_counter()
    temp = dir is None
    root = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-demo-")) if dir is None else pathlib.Path(dir)
    paths = {name: root / name for name in ("image", "label", "tokens")}
    if not temp:
        for p in paths.values():
            if p.exists():
                raise FileExistsError(f"{p} already exists; give --dir a new or empty directory")
        root.mkdir(parents=True, exist_ok=True)

    def say(line: str = "") -> None:
        if out is not None:
            print(line, file=out, flush=True)

    try:
        t0 = time.perf_counter()
        images, labels, tokens = _demo_data(records, seed)
        gen_s = time.perf_counter() - t0
        token_bytes = np.array([t.nbytes for t in tokens], dtype=np.int64)
        say(
            f"loaderx demo: {records:,} generated records in {root}"
            f"{' (temporary, removed afterwards)' if temp else ''}"
        )
        say(f"  generated in {gen_s:.2f} s: images uint8 (3, 64, 64) with banded shading and noise,")
        say(
            f"  labels int64 0-9, token sequences int32 of {min(len(t) for t in tokens)}-"
            f"{max(len(t) for t in tokens)} tokens"
        )

        write: dict[str, float] = {}
        t0 = time.perf_counter()
        with Dense.create(paths["image"], np.uint8, (3, 64, 64), codec="zstd") as w:
            w.append(images)
        write["image"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with Dense.create(paths["label"], np.int64, (), codec="raw") as w:
            w.append(labels)
        write["label"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        blob = train_dict(tokens, tier="fast")
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with Ragged.create(paths["tokens"], np.int32, codec="zstd_dict", dict_bytes=blob) as tw:
            tw.append(tokens)
        write["tokens"] = time.perf_counter() - t0

        stores = {name: info(p) for name, p in paths.items()}
        source_bytes = {"image": images.nbytes, "label": labels.nbytes, "tokens": int(token_bytes.sum())}
        for name, d in stores.items():
            d["write_seconds"] = write[name]
            d["write_mib_per_s"] = source_bytes[name] / _MiB / max(write[name], 1e-9)
        write_total = sum(write.values())

        say()
        say("built three stores")
        head = (
            f"  {'store':<7} {'kind':<7} {'dtype':<6} {'item_shape':<12} {'codec':<10} "
            f"{'records':>8} {'logical':>10} {'on disk':>10} {'ratio':>7} {'write':>12}"
        )
        say(head)
        for name, d in stores.items():
            shape = str(tuple(d["item_shape"])) if d["item_shape"] is not None else "-"
            say(
                f"  {name:<7} {d['kind']:<7} {d['dtype']:<6} {shape:<12} {d['codec']:<10} "
                f"{d['records']:>8,} {_fmt_bytes(d['logical_bytes']):>10} "
                f"{_fmt_bytes(d['disk_bytes']):>10} {d['ratio']:>6.2f}x "
                f"{d['write_mib_per_s']:>7.1f} MiB/s"
            )
        for line in _explain_stores(stores, len(blob), train_s):
            say(line)

        workers = max(1, min(4, os.cpu_count() or 1))
        warmup = min(_WARMUP, steps)
        readers = {name: (Dense.open(p) if name != "tokens" else Ragged.open(p)) for name, p in paths.items()}
        try:

            def loader() -> DataLoader:
                return DataLoader(
                    readers,
                    transform_workers=workers,
                    batch_size=batch_size,
                    mode=2,
                    seed=seed,
                    transform=_demo_transform,
                )

            # 1. timed: the consumer only takes batches, after a warm-up.
            rounds: list[float] = []
            with loader() as dl:
                for _ in range(warmup):
                    next(dl)
                for _ in range(_ROUNDS):
                    t0 = time.perf_counter()
                    for _ in range(steps):
                        next(dl)
                    rounds.append(time.perf_counter() - t0)
            # 2. checked: the stream's first batches again, each against the source.
            sampler = Sampler(records, batch_size, Sampler.Mode.CYCLIC, seed=seed)
            delivered = 0
            t0 = time.perf_counter()
            with loader() as dl:
                for step in range(steps):
                    idx = next(sampler).astype(np.int64)
                    batch = next(dl)
                    problems = []
                    if not (
                        batch["image"].dtype == np.float32
                        and np.array_equal(batch["image"], _normalise(images[idx]))
                    ):
                        problems.append("image")
                    if not np.array_equal(batch["label"], labels[idx]):
                        problems.append("label")
                    got = batch["tokens"]
                    if len(got) != len(idx) or not all(
                        g.dtype == np.int32 and np.array_equal(g, tokens[i])
                        for g, i in zip(got, idx.tolist(), strict=True)
                    ):
                        problems.append("tokens")
                    if problems:
                        raise DemoError(f"step {step}: {', '.join(problems)} differ from the source records")
                    delivered += (
                        images[0].nbytes * len(idx)
                        + labels[0].nbytes * len(idx)
                        + int(token_bytes[idx].sum())
                    )
            check_s = time.perf_counter() - t0
        finally:
            for r in readers.values():
                r.close()

        n_rec = steps * batch_size
        load_s = statistics.median(rounds)
        rates = [steps / max(r, 1e-9) for r in rounds]
        loader_stats = {
            "steps": steps,
            "batch_size": batch_size,
            "transform_workers": workers,
            "warmup_steps": warmup,
            "rounds": _ROUNDS,
            "round_batches_per_s": rates,
            "seconds": load_s,
            "batches_per_s": steps / max(load_s, 1e-9),
            "records_per_s": n_rec / max(load_s, 1e-9),
            "mib_per_s": delivered / _MiB / max(load_s, 1e-9),
            "verified_batches": steps,
            "verify_seconds": check_s,
        }
        say()
        say(
            f"loaded the three stores together with a DataLoader: batch_size {batch_size}, cyclic "
            "sampling (each"
        )
        say(f"record once per epoch, reshuffled), {workers} transform workers normalising images to float32")
        say(
            f"  warm-up  {warmup} batches, not timed: worker threads start, buffers are allocated, "
            "pages mapped in"
        )
        say(
            f"  timed    {_ROUNDS} rounds of {steps:,} batches, each {n_rec:,} records "
            f"({_fmt_bytes(delivered)}):"
        )
        say(
            f"           {loader_stats['batches_per_s']:,.0f} batches/s, "
            f"{loader_stats['records_per_s']:,.0f} records/s, {loader_stats['mib_per_s']:,.1f} MiB/s "
            f"(median round; rounds {min(rates):,.0f}-{max(rates):,.0f} batches/s)"
        )
        say("           The files were just written, so every read came from the OS page cache (warm);")
        say("           stores not read since a reboot come from disk on the first pass (cold), slower.")
        say("           Other work on the machine moves these figures from run to run.")
        say(
            f"  checked  the stream's first {steps:,} batches, replayed: each equal to its source "
            f"records ({check_s:.2f} s)"
        )
        total_s = time.perf_counter() - t_start
        say()
        say(f"done in {total_s:.1f} s. Next:")
        keep = "demo-stores" if temp else str(root)
        nexts = [(f"loaderx demo --dir {keep}", "build the stores in a folder and keep them")] if temp else []
        nexts += [
            (f"loaderx info {keep}/label", "what a store holds: kind, codec, records, sizes"),
            (f"loaderx verify {keep}/*", "decode every record and check its checksum"),
            ("loaderx convert data.parquet train/", "your data: a store per column, codec chosen"),
        ]
        for command, why in nexts:
            say(f"  {command:<38} # {why}")
        return {
            "dir": str(root),
            "kept": not temp,
            "records": records,
            "generate_seconds": gen_s,
            "dict_train_seconds": train_s,
            "write_seconds": write_total,
            "stores": stores,
            "loader": loader_stats,
            "total_seconds": total_s,
        }
    finally:
        if temp:
            shutil.rmtree(root, ignore_errors=True)


def _explain_stores(stores: dict[str, dict[str, Any]], dict_bytes: int, train_s: float) -> list[str]:
    """What the rows of the demo's store table mean, from their figures."""
    image, label, tokens = stores["image"], stores["label"], stores["tokens"]
    # Per label, beside the fixed 4 KiB header page and sums.zr's 16-byte header.
    per_label = (label["disk_bytes"] - 4096 - 16) / max(1, label["records"])
    best = "The best ratio here" if tokens["ratio"] >= max(d["ratio"] for d in stores.values()) else "Ratio"
    return [
        "  logical: the records' own bytes. on disk: every file of the store (payload, record table,",
        "  checksums, dictionary). ratio: logical / on disk, above 1 when compression pays. write: source",
        "  bytes written per second (a store as small as label mostly measures creating its files).",
        f"  image   zstd (level 3) keeps these image-like records in {1 / image['ratio']:.0%} of their size.",
        f"  label   {per_label:.0f} B on disk per 8-byte label: each record also has a 16-byte entry in the",
        "          record table and an 8-byte checksum. On records this small that overhead is most",
        "          of the store (ratio below 1) and no codec wins it back: `loaderx convert` keeps",
        "          such columns raw (--codec auto).",
        f"  tokens  zstd_dict: each record compressed against a {_fmt_bytes(dict_bytes)} dictionary "
        "trained on the",
        f"          data ({train_s:.2f} s). {best} ({tokens['ratio']:.2f}x), but it writes at zstd level 19,",
        f"          hence {tokens['write_mib_per_s']:.1f} MiB/s; reading does not pay for the level. "
        "Use zstd where write time matters.",
    ]
