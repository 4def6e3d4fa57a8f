#!/usr/bin/env python3
"""What ``loaderx convert --codec auto`` chooses on typical columns, against
the size every codec actually gives.

    .venv/bin/python benches/bench_codec_auto.py      # about a minute on 2 cores

Each column is generated deterministically (no downloads), converted with
``codec="auto"`` and with each codec by name (zstd_dict: tier ``balanced``),
and the table gives the choice, its reason's first words, the ratios ``auto``
estimated from its sample (raw store size / codec store size) and the ratios
measured on the written stores (raw store bytes / that store's bytes, as
``loaderx info`` counts them). ``auto`` must never be bigger than raw.
"""
from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

import numpy as np

from loaderx import tools


def digits(n: int, rng: np.random.Generator) -> np.ndarray:
    """8 x 8 float64 images of values 0..16, like scikit-learn's digits."""
    base = rng.integers(0, 17, size=(10, 8, 8)).astype(np.float64)
    base[:, :, [0, 7]] = 0
    noisy = base[rng.integers(0, 10, size=n)] + rng.integers(-2, 3, size=(n, 8, 8))
    return np.clip(noisy, 0, 16)


def jpegs(n: int, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    yy, xx = np.mgrid[0:128, 0:128].astype(np.float32) / 128
    out = []
    for _ in range(n):
        a, b = rng.uniform(0.2, 1.0, size=2)
        img = np.stack([xx * a, yy * b, (xx + yy) / 2], axis=-1) * 200 + rng.normal(0, 6, (128, 128, 3))
        buf = io.BytesIO()
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return np.array(out, dtype=object)


WORDS = ("the of and to in is was for on that with as by at from his her it an were are which this be "
         "a photo picture dog cat man woman red blue small large standing sitting near").split()


def columns() -> dict[str, object]:
    rng = np.random.default_rng(0)
    zipf = np.minimum(rng.zipf(1.3, size=4_200_000), 50_000).astype(np.int32)
    lengths = rng.integers(16, 512, size=8_000)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    return {
        "labels int64 (50,000)": rng.integers(0, 10, size=50_000).astype(np.int64),
        "digits 8x8 float64 (1,797)": digits(1797, rng),
        "JPEG bytes 128x128 (400)": jpegs(400, rng),
        "captions text (20,000)": np.array([" ".join(rng.choice(WORDS, size=int(k)))
                                            for k in rng.integers(8, 30, size=20_000)]),
        "token ids int32 Ragged (8,000)": [zipf[bounds[i]:bounds[i + 1]] for i in range(len(lengths))],
        "embeddings float32 (5,000, 256)": rng.standard_normal((5_000, 256)).astype(np.float32),
        "random bytes 512 B (3,000)": rng.integers(0, 256, size=(3_000, 512), dtype=np.uint8),
    }


def _source(data: object, root: Path, name: str) -> object:
    if isinstance(data, list):  # Ragged records: convert takes them as a store
        from loaderx.zrecord import Ragged

        with Ragged.create(root / f"src-{name}", data[0].dtype, codec="raw") as w:
            w.append(data)
        return root / f"src-{name}"
    return data


def main() -> None:
    print("| column | auto chose | why | auto's estimates raw / zstd / zstd_dict | "
          "measured zstd / zstd_dict / auto | auto s |")
    print("|---|---|---|---|---|---:|")
    with tempfile.TemporaryDirectory(prefix="bench-codec-auto-") as tmp:
        root = Path(tmp)
        for k, (label, data) in enumerate(columns().items()):
            src = _source(data, root, str(k))
            sizes = {}
            for codec in ("raw", "zstd", "zstd_dict"):
                out = root / f"{k}-{codec}"
                tools.convert(src, out, codec=codec)
                sizes[codec] = tools.info(out)["disk_bytes"]
            t0 = time.perf_counter()
            tools.convert(src, root / f"{k}-auto")
            auto_s = time.perf_counter() - t0
            d = tools.info(root / f"{k}-auto")
            assert d["disk_bytes"] <= sizes["raw"], (label, d["disk_bytes"], sizes["raw"])
            c = d["features"]["codec"]
            est = " / ".join("-" if c["estimates"][x] is None else f"{c['estimates'][x]:.2f}x"
                             for x in ("raw", "zstd", "zstd_dict"))
            meas = " / ".join(f"{sizes['raw'] / v:.2f}x"
                              for v in (sizes["zstd"], sizes["zstd_dict"], d["disk_bytes"]))
            why = c["reason"].split(":")[0]
            print(f"| {label} | {d['codec']} | {why} | {est} | {meas} | {auto_s:.2f} |")


if __name__ == "__main__":
    main()
