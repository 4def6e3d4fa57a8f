#!/usr/bin/env python3
"""Charts of the loader benchmark: batches/s and peak PSS per loader.

Reads the JSON that ``benches/bench_loader.py --json`` writes and draws,
with matplotlib (Agg), into ``docs/img/``:

    loader-peers.png       the loader comparison (#17): batches/s and peak
                           PSS of the process tree for every loader, no
                           transform
    loader-transforms.png  loaders under transforms (#10): the same two
                           measures per transform, for ours (threads and
                           processes), loaderx 2.0.0 and torch's DataLoader

    .venv-peers/bin/python benches/loader_charts.py bench-out/loader.json

Rows that did not run (missing peers, unavailable options) are left out of
the charts; the tables in docs/benchmarks.md list them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _rows(rep: dict, table: str) -> list[tuple[dict, dict]]:
    """(row, summary) of every measured row of ``table``, in run order."""
    out = []
    for row in rep["rows"]:
        summary = rep["summaries"].get(row["key"])
        if table in row.get("tables", []) and summary and "batches_s" in summary:
            out.append((row, summary))
    return out


def _name(row: dict) -> str:
    label = row["label"].replace("**", "").replace("`", "")
    if row["loader"].startswith("torch"):
        label += f" ({row['model'].split()[1]})"  # fork or spawn
    return f"{label}\n{row['storage']}"


def _ordered(rows: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """Ours first, then loaderx 2.0.0, then the peers in run order."""
    rank = {"ours-thread": 0, "ours-process": 1, "reference": 2}
    return sorted(rows, key=lambda rs: rank.get(rs[0]["loader"], 3))


def _bars(ax, names: list[str], values: list[float], colors: list[str], xlabel: str, log: bool) -> None:
    ys = range(len(names))
    ax.barh(list(ys), values, color=colors)
    ax.set_yticks(list(ys), names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel, fontsize=8)
    if log:
        ax.set_xscale("log")
    ax.tick_params(axis="x", labelsize=7)
    for y, v in zip(ys, values, strict=True):
        ax.text(v, y, f" {v:.3g}", va="center", fontsize=6)


def _color(row: dict) -> str:
    loader = row["loader"]
    if loader.startswith("ours"):
        return "#1f77b4" if "thread" in loader else "#17becf"
    if loader == "reference":
        return "#ff7f0e"
    return "#7f7f7f"


def peers_chart(rep: dict, out: Path, plt) -> bool:
    # Without a transform, workers="process" starts no process: the same
    # loader as threads, so its row is left out.
    rows = _ordered(
        [
            (r, s)
            for r, s in _rows(rep, "peers")
            if r["transform"] in (None, "none") and r["loader"] != "ours-process"
        ]
    )
    if not rows:
        return False
    names = [_name(r) for r, _ in rows]
    colors = [_color(r) for r, _ in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 0.38 * len(rows) + 1.2))
    _bars(left, names, [s["batches_s"] for _, s in rows], colors, "batches/s (higher is better)", False)
    _bars(right, names, [s["peak_pss"] for _, s in rows], colors, "peak PSS of the process tree, MiB", False)
    right.set_yticks([])
    fig.suptitle("Dense vision, batch 256 of uint8 (3, 224, 224), 2 workers, no transform", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def transforms_chart(rep: dict, out: Path, plt) -> bool:
    rows = _rows(rep, "transforms")
    if not rows:
        return False
    transforms = list(dict.fromkeys(r["transform"] for r, _ in rows))
    fig, axes = plt.subplots(len(transforms), 2, figsize=(10, 2.4 * len(transforms)), squeeze=False)
    for (left, right), t in zip(axes, transforms, strict=True):
        sub = _ordered([(r, s) for r, s in rows if r["transform"] == t])
        names = [_name(r) for r, _ in sub]
        colors = [_color(r) for r, _ in sub]
        _bars(left, names, [s["batches_s"] for _, s in sub], colors, f"{t}: batches/s", False)
        _bars(right, names, [s["peak_pss"] for _, s in sub], colors, f"{t}: peak PSS, MiB", False)
        right.set_yticks([])
    fig.suptitle("Loaders under transforms, 2 workers each (blue: ours, threads; cyan: ours, processes; "
                 "orange: loaderx 2.0.0; grey: torch)", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path, help="bench_loader.py --json output")
    p.add_argument("--img", type=Path, default=REPO / "docs" / "img")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rep = json.loads(args.json.read_text())
    args.img.mkdir(parents=True, exist_ok=True)
    for name, draw in (("loader-peers.png", peers_chart), ("loader-transforms.png", transforms_chart)):
        if draw(rep, args.img / name, plt):
            print(f"wrote {args.img / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
