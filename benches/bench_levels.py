#!/usr/bin/env python3
"""Compression level benchmark: write speed, ratio and gather speed per zstd level.

Run it with the interpreter that imports OUR loaderx:

    .venv/bin/python benches/bench_levels.py --quick
    .venv/bin/python benches/bench_levels.py --json bench-out/levels.json

For two workloads it writes one store per (codec, level) with
``create(..., level=N)`` and measures what ``bench_zrecord.py`` measures
(the same measuring code: ``_zrecord_worker.measure_codec``):

    dense-vision   uint8 (3, 224, 224) image-like records (bench_zrecord's generator)
    ragged-tokens  int32 token sequences: the paragraphs of a real tokenized
                   corpus (benches/corpus.py output, ``--corpus``), or
                   bench_zrecord's synthetic token model when there is none

Levels: zstd at -5, -1, 1, 3, 9, 19 and zstd_dict at 1, 3, 9, 19 (``--levels``,
``--dict-levels``). Every zstd_dict row of a workload uses one dictionary,
trained once by ``train_dict`` (not timed as writing). Our default levels
are also written with ``checksums=False`` (frames without zstd's content
checksum, like 2.0.0's), to show what the checksum costs, and right after
them loaderx 2.0.0 (``--reference-python``, run as a subprocess: same import
name) writes the same records at its fixed levels (3, and 19 with the same
dictionary). ``--rounds N`` repeats that whole sequence N times and reports
medians, so the rows compared are always measured side by side.

Columns: *write* divides the records' logical (uncompressed) bytes by the
time of the append calls; *ratio* is logical bytes over allocated disk
bytes; *gather* is logical bytes over the time of random batch reads (each
batch checked for exact values first, then timed once after a warm-up).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MiB = 2**20

ZSTD_LEVELS = "-5,-1,1,3,9,19"
DICT_LEVELS = "1,3,9,19"
DEFAULTS = {"zstd": 3, "zstd_dict": 19}

# name -> kind, records (full, quick), batch, batches, records per append
WORKLOADS = {
    "dense-vision": dict(kind="dense", records=(512, 48), batch=32, batches=(40, 8), chunk=64,
                         title="Dense vision: uint8 (3, 224, 224) image-like records"),
    "ragged-tokens": dict(kind="ragged", records=(108_476, 4_000), batch=256, batches=(60, 10), chunk=1024,
                          title="Ragged tokens: int32 sequences"),
}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


zr = load("bench_zrecord", HERE / "bench_zrecord.py")
worker = load("_zrecord_worker", HERE / "_zrecord_worker.py")


# =========================================================================== sources


def make_vision(n: int, seed: int, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, zlib.crc32(b"dense-vision")])
    arr = np.lib.format.open_memmap(out / "source.npy", mode="w+", dtype=np.uint8, shape=(n, 3, 224, 224))
    for i in range(0, n, 64):
        m = min(64, n - i)
        arr[i:i + m] = zr.make_images(rng, m, 224, 224)
    arr.flush()
    del arr
    return f"bench_zrecord.make_images, seed {seed}"


def make_tokens(n: int, seed: int, corpus: Path, out: Path) -> str:
    """The first ``n`` sequences (all of them at full size) of the corpus's
    ragged-tokens workload, or synthetic ones."""
    out.mkdir(parents=True, exist_ok=True)
    src = corpus / "ragged-tokens"
    if (src / "flat.npy").exists():
        offsets = np.load(src / "offsets.npy")
        which = "all" if n >= len(offsets) - 1 else "the first"
        n = min(n, len(offsets) - 1)
        flat = np.load(src / "flat.npy", mmap_mode="r")
        np.save(out / "flat.npy", np.ascontiguousarray(flat[: offsets[n]]))
        np.save(out / "offsets.npy", offsets[: n + 1])
        np.save(out / "shapes.npy", np.load(src / "shapes.npy")[:n])
        meta = json.loads((corpus / "corpus.json").read_text())
        return (f"{which} {n:,} sequences of {meta['corpus']['package']} {meta['corpus']['version']} "
                f"docs tokenized by {meta['tokenizer']['package']} (benches/corpus.py)")
    log(f"no corpus at {corpus}: synthetic tokens (bench_zrecord.TokenModel)")
    zr.generate_source("ragged-tokens", zr.WORKLOADS["ragged-tokens"], n, seed, out)
    return f"bench_zrecord.TokenModel (synthetic), seed {seed}"


# =========================================================================== measuring


class LevelBackend(worker.LoaderxBackend):
    """Our loaderx writing at ``level``, with one dictionary for every level."""

    def __init__(self, level: int, dict_bytes: bytes | None, checksums: bool = True):
        super().__init__()
        self.level, self.dict_bytes, self.checksums = level, dict_bytes, checksums

    def train(self, src, tier):
        return self.dict_bytes

    def create(self, path, src, codec, dict_bytes):
        if src.kind == "dense":
            return self.Dense.create(str(path), src.dtype, src.item_shape, codec=codec,
                                     dict_bytes=dict_bytes, level=self.level, checksums=self.checksums)
        return self.Ragged.create(str(path), src.dtype, codec=codec, dict_bytes=dict_bytes, level=self.level,
                                  checksums=self.checksums)


def summarize(res: dict) -> dict:
    s = zr.summarize(res)
    s.pop("train_s", None)
    s.pop("dict_len", None)
    return s


def train(wl: dict, src, args) -> bytes:
    """The one dictionary of every zstd_dict row of the workload (2.0.0's too)."""
    from loaderx.utils import train_dict

    data = src.array if src.kind == "dense" else src.records
    t0 = time.perf_counter()
    blob = train_dict(data, tier=args.dict_tier)
    wl["train_s"], wl["dict_len"] = time.perf_counter() - t0, len(blob)
    (wl["dir"] / "dict.bin").write_bytes(blob)
    log(f"[{wl['name']}] train_dict(tier={args.dict_tier!r}) {wl['train_s']:.1f} s -> {len(blob):,} B")
    return blob


def cells(args) -> list[tuple[str, str, int, bool]]:
    """(writer, codec, level, checksums) of every row, in the order they run:
    2.0.0 right after our cells at its level, so the rows compared are
    measured seconds apart."""
    ours = [("ours", "zstd", lv, True) for lv in args.levels]
    ours += [("ours", "zstd_dict", lv, True) for lv in args.dict_levels]
    out = []
    for cell in ours:
        out.append(cell)
        _, codec, level, _ = cell
        if DEFAULTS[codec] == level:
            # The default once more without content checksums (frames like 2.0.0's), then 2.0.0.
            out.append(("ours", codec, level, False))
            if not args.no_reference:
                out.append(("reference", codec, level, False))
    for codec, level in DEFAULTS.items():
        # Without our cell at 2.0.0's level (--levels left it out), 2.0.0 still runs, last.
        if not args.no_reference and ("reference", codec, level, False) not in out:
            out.append(("reference", codec, level, False))
    return out


def run_ours(wl: dict, src, plan, args, blob: bytes, codec: str, level: int, checksums: bool) -> dict:
    """One round of one of our cells."""
    label = f"ours {codec} {level}" + ("" if checksums else " no-checksums")
    spec = {"label": label, "chunk": wl["chunk"],
            "store_root": str(wl["dir"] / "stores" / f"ours{level}"), "dict_tier": args.dict_tier}
    backend = LevelBackend(level, blob if codec == "zstd_dict" else None, checksums)
    try:
        return summarize(worker.measure_codec(backend, src, plan, codec, spec))
    finally:
        shutil.rmtree(spec["store_root"], ignore_errors=True)


def run_reference(wl: dict, args, codec: str) -> dict | None:
    """One round of loaderx 2.0.0 writing ``codec`` at its fixed level, in its own interpreter."""
    spec = {"workload": wl["name"], "kind": wl["kind"], "source_dir": str(wl["source"]),
            "plan": str(wl["plan"]), "backend": "loaderx", "label": "loaderx 2.0.0",
            "codecs": [codec], "chunk": wl["chunk"], "dict_tier": args.dict_tier,
            "store_root": str(wl["dir"] / "stores" / "reference"), "keep_stores": False}
    path = wl["dir"] / "spec-reference.json"
    path.write_text(json.dumps(spec))
    # The worker, with our dictionary in place of its own training, so both
    # write the same frames' content. -I: the reference imports its own
    # loaderx, never this repo's (benches/ holds no package of that name).
    code = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import _zrecord_worker as w; "
            f"blob = open({str(wl['dir'] / 'dict.bin')!r}, 'rb').read(); "
            "w.LoaderxBackend.train = lambda self, src, tier: blob; "
            f"sys.exit(w.main(['_zrecord_worker.py', {str(path)!r}]))")
    proc = subprocess.run([str(args.reference_python), "-I", "-c", code],
                          stdout=subprocess.PIPE, text=True, cwd=str(wl["dir"]))
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        log(f"[{wl['name']}] reference: no result (exit {proc.returncode})")
        return None
    out = json.loads(line)
    wl["reference_version"] = out.get("info", {}).get("loaderx_version", "2.0.0")
    res = out["results"][0]
    if "error" in res:
        log(f"[{wl['name']}] reference {codec}: {res['error']}")
        return None
    return summarize(res)


def measure(wl: dict, src, plan, args) -> list[dict]:
    """Every row, as the median of ``args.rounds`` rounds. Each round runs
    every cell once (see ``cells``), so a slow spell of the machine falls on
    the cells of that moment in one round, not on all rounds of one cell."""
    blob = train(wl, src, args)
    runs: dict[tuple, list[dict]] = {}
    for _ in range(args.rounds):
        for who, codec, level, checksums in cells(args):
            if who == "ours":
                numbers = run_ours(wl, src, plan, args, blob, codec, level, checksums)
            else:
                numbers = run_reference(wl, args, codec)
            if numbers is not None:
                runs.setdefault((who, codec, level, checksums), []).append(numbers)
    return [{"who": who, "codec": codec, "level": level, "checksums": checksums, **median(r)}
            for (who, codec, level, checksums), r in runs.items()]


def median(runs: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


# =========================================================================== report


def render(wl: dict, rows: list[dict], args) -> str:
    mib = wl["logical_bytes"] / MiB
    ref = wl.get("reference_version", "2.0.0")
    lines = [f"### {wl['name']} — {wl['title']}", "",
             f"{wl['records']:,} records, {mib:.1f} MiB logical ({wl['source_desc']}); "
             f"appends of {wl['chunk']} records; {wl['batches']} random batches of {wl['batch']}. "
             f"Dictionary (every zstd_dict row, 2.0.0's too): `train_dict(tier={args.dict_tier!r})`, "
             f"{wl['dict_len']:,} B, trained in {wl['train_s']:.1f} s (not counted as writing).", "",
             "| writer | codec | level | write | ratio | gather | gather p50 |",
             "|---|---|---:|---:|---:|---:|---:|"]
    order = {"zstd": 0, "zstd_dict": 1}
    rank = {"ours": 0, "ours-unchecked": 1, "reference": 2}

    def place(r: dict) -> tuple:
        who = "ours-unchecked" if r["who"] == "ours" and not r.get("checksums", True) else r["who"]
        return order[r["codec"]], r["level"], rank[who]

    for r in sorted(rows, key=place):
        who = "ours" if r["who"] == "ours" else f"loaderx {ref}"
        if r["who"] == "ours" and not r.get("checksums", True):
            who = "ours, `checksums=False`"
        default = r["who"] == "ours" and r.get("checksums", True) and DEFAULTS[r["codec"]] == r["level"]
        level = f"{r['level']}" + (" (default)" if default else "")
        lines.append(f"| {who} | {r['codec']} | {level} | {zr._fmt(r['write_mib_s'])} MiB/s | "
                     f"{r['ratio']:.2f}x | {zr._fmt(r['gather_mib_s'])} MiB/s | {zr._fmt(r['p50_ms'])} ms |")
    lines.append("")
    return "\n".join(lines)


def update_docs(tables: list[str], total_s: float, doc: Path = REPO / "docs" / "benchmarks.md") -> None:
    """Writes this run's tables between the ``levels`` markers of ``doc``
    (the hand-written guide around them stays as it is)."""
    begin, end = "<!-- levels:begin -->", "<!-- levels:end -->"
    text = doc.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{doc} has no {begin} / {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    body = f"Run {stamp}, {total_s:.0f} s in all.\n\n" + "\n".join(tables)
    doc.write_text(f"{head}{begin}\n{body}\n{end}{tail}")
    log(f"{doc}: updated the level tables")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, default=REPO / "bench-out" / "levels",
                   help="sources, plans and temporary stores (default: <repo>/bench-out/levels)")
    p.add_argument("--corpus", type=Path, default=REPO / "bench-out" / "peers" / "corpus",
                   help="output folder of benches/corpus.py (default: <repo>/bench-out/peers/corpus, "
                        "where bench_peers.py builds it); synthetic tokens when absent")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python",
                   help="python of a virtualenv with loaderx==2.0.0 (default: <repo>/.venv-ref/bin/python)")
    p.add_argument("--no-reference", action="store_true", help="leave out the loaderx 2.0.0 rows")
    p.add_argument("--quick", action="store_true", help="a few seconds per level, for a smoke run")
    p.add_argument("--only", default=",".join(WORKLOADS), help=f"workloads (default: {','.join(WORKLOADS)})")
    p.add_argument("--levels", default=ZSTD_LEVELS, help=f"zstd levels (default: {ZSTD_LEVELS})")
    p.add_argument("--dict-levels", default=DICT_LEVELS, help=f"zstd_dict levels (default: {DICT_LEVELS})")
    p.add_argument("--dict-tier", default="balanced", help="train_dict tier (default: balanced)")
    p.add_argument("--rounds", type=int, default=1, help="measure every cell N times, report medians (default 1)")
    p.add_argument("--seed", type=int, default=20240611)
    p.add_argument("--json", type=Path, help="also write every number to this JSON file")
    p.add_argument("--update-docs", action="store_true",
                   help="replace the tables between <!-- levels:begin --> and <!-- levels:end --> "
                        "in docs/benchmarks.md with this run's")
    args = p.parse_args(argv)
    args.only = [w for w in args.only.split(",") if w]
    if any(w not in WORKLOADS for w in args.only):
        p.error(f"--only takes {','.join(WORKLOADS)}")
    args.levels = [int(v) for v in args.levels.split(",") if v]
    args.dict_levels = [int(v) for v in args.dict_levels.split(",") if v]
    args.workdir = args.workdir.resolve()
    args.reference_python = Path(os.path.abspath(args.reference_python))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.no_reference and not args.reference_python.exists():
        log(f"no reference interpreter at {args.reference_python}: reference rows left out")
        args.no_reference = True
    t_start = time.perf_counter()
    machine = zr.machine_info()
    impls = {"ours": worker.probe("loaderx")}
    if not args.no_reference:
        proc = subprocess.run([str(args.reference_python), "-I", str(HERE / "_zrecord_worker.py"), "--probe"],
                              stdout=subprocess.PIPE, text=True)
        impls["reference"] = json.loads(proc.stdout.strip().splitlines()[-1])
    header = zr.render_header(machine, impls, argparse.Namespace(quick=args.quick, workdir=args.workdir))
    print(header.replace("## loaderx store benchmark", "## Compression levels"), flush=True)
    report = {"machine": machine, "implementations": impls, "args": {k: str(v) for k, v in vars(args).items()},
              "workloads": {}}
    tables: list[str] = []
    for name in args.only:
        spec = WORKLOADS[name]
        n = spec["records"][1 if args.quick else 0]
        wdir = args.workdir / ("quick" if args.quick else "full") / name
        shutil.rmtree(wdir, ignore_errors=True)
        src_dir = wdir / "source"
        log(f"[{name}] preparing {n:,} records ...")
        if spec["kind"] == "dense":
            desc = make_vision(n, args.seed, src_dir)
        else:
            desc = make_tokens(n, args.seed, args.corpus, src_dir)
        src = worker.Source(spec["kind"], src_dir)
        batches = spec["batches"][1 if args.quick else 0]
        prng = np.random.default_rng([args.seed, zlib.crc32(name.encode()), 1])
        plan = np.stack([prng.choice(src.n, size=spec["batch"], replace=False) for _ in range(batches)])
        np.save(wdir / "plan.npy", plan.astype(np.int64))
        wl = {"name": name, "title": spec["title"], "kind": spec["kind"], "dir": wdir, "source": src_dir,
              "plan": wdir / "plan.npy", "records": src.n, "logical_bytes": src.logical_bytes,
              "chunk": spec["chunk"], "batch": spec["batch"], "batches": batches, "source_desc": desc}
        rows = measure(wl, src, plan.astype(np.int64), args)
        tables.append(render(wl, rows, args))
        print(tables[-1], flush=True)
        report["workloads"][name] = {k: (str(v) if isinstance(v, Path) else v) for k, v in wl.items()} | {"rows": rows}
        shutil.rmtree(wdir / "stores", ignore_errors=True)
    report["total_s"] = time.perf_counter() - t_start
    print(f"_Total run time {report['total_s']:.0f} s._", flush=True)
    if args.update_docs and not args.quick:
        update_docs(tables, report["total_s"])
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
