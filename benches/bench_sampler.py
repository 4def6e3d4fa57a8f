#!/usr/bin/env python3
"""Sampler benchmark: ``Sampler.next()`` vs ``numpy.random.default_rng().integers``.

Run it with the interpreter that imports OUR loaderx:

    .venv/bin/python benches/bench_sampler.py --quick
    .venv/bin/python benches/bench_sampler.py              # full size

It times one index draw over a 1,000,000-element index space at batch sizes
256, 1024 and 8192 for

    numpy       rng.integers(0, 1_000_000, size=b) on np.random.default_rng(0)
    ours        loaderx.zsampler.Sampler(...).next() in IID mode (the
                like-for-like comparison: uniform with replacement), plus
                CYCLIC and SEQUENTIAL for information
    reference   the same three modes of loaderx 2.0.0's Sampler

Every implementation runs in a fresh subprocess of its own interpreter (the
reference with ``-I`` from its own virtualenv), and every subprocess runs the
same timing code: this file in ``--worker`` mode.  Each worker times its NumPy
baseline next to its samplers, so each ratio compares two numbers taken in one
process, interleaved in time.  See ``benches/README.md`` ("bench_sampler.py").
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
import timeit
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SPACE = 1_000_000
BATCHES = (256, 1024, 8192)
MODES = ("IID", "CYCLIC", "SEQUENTIAL")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# =========================================================================== worker (any interpreter)
# Only stdlib + numpy + the public loaderx API below this line, because the
# reference interpreter runs this same file.


def _check_draws(kind: str, mode: str | None, draw, b: int, n: int) -> None:
    """Untimed sanity check of a few draws, so a broken sampler cannot post a fast time."""
    first = np.array(draw(), copy=True)
    second = np.array(draw(), copy=True)
    for arr in (first, second):
        if arr.shape != (b,):
            raise AssertionError(f"{kind}/{mode}: shape {arr.shape}, expected ({b},)")
        if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n):
            raise AssertionError(f"{kind}/{mode}: index outside 0..{n - 1}")
    if kind == "numpy" or mode == "IID":
        if np.array_equal(first, second):
            raise AssertionError(f"{kind}/{mode}: two consecutive draws are identical")
        if b >= 1024 and len(np.unique(first)) < b // 2:
            raise AssertionError(f"{kind}/{mode}: draws do not look uniform")
        return
    if first.dtype != np.uint64:
        raise AssertionError(f"{kind}/{mode}: dtype {first.dtype}, expected uint64")
    if mode == "SEQUENTIAL":
        if not (np.array_equal(first, np.arange(b)) and np.array_equal(second, np.arange(b, 2 * b))):
            raise AssertionError(f"{kind}/{mode}: the first two draws are not 0..{b - 1}, {b}..{2 * b - 1}")
    elif mode == "CYCLIC":
        both = np.concatenate([first, second])
        if len(np.unique(both)) != 2 * b:
            raise AssertionError(f"{kind}/{mode}: an index repeats within one cycle")
        if np.array_equal(first, np.arange(b)):
            raise AssertionError(f"{kind}/{mode}: the first draw is not shuffled")


def worker(spec: dict) -> dict:
    """Time numpy and (if spec['samplers']) this interpreter's loaderx Sampler."""
    n, repeats, target = spec["space"], spec["repeats"], spec["target_s"]
    info = {"python": f"{platform.python_implementation()} {platform.python_version()}",
            "executable": sys.executable, "numpy": np.__version__}
    Sampler = None
    if spec["samplers"]:
        import loaderx
        from loaderx.zsampler import Sampler
        info["loaderx_version"] = getattr(loaderx, "__version__", "?")
        info["loaderx_file"] = loaderx.__file__
    results = []
    for b in spec["batches"]:
        # name -> (kind, mode, zero-argument callable returning one batch)
        cands = []
        rng = np.random.default_rng(0)
        cands.append(("numpy", None, functools.partial(rng.integers, 0, n, size=b)))
        if Sampler is not None:
            for mode in spec["modes"]:
                s = Sampler(n, b, getattr(Sampler.Mode, mode), 42)
                cands.append(("loaderx", mode, s.next))  # bound method: the call a user makes
        for kind, mode, fn in cands:
            _check_draws(kind, mode, fn, b, n)
        # Calibrate loops per repeat so one repeat takes about target_s.
        timers = []
        for kind, mode, fn in cands:
            t = timeit.Timer(fn)
            number = 1
            while True:
                el = t.timeit(number)
                if el >= target / 5 or number >= 10_000_000:
                    break
                number *= 10
            el = min(el, t.timeit(number), t.timeit(number))  # one slow calibration loop must not shrink the count
            number = max(1, int(number * target / max(el, 1e-9)))
            timers.append((kind, mode, t, number))
        best = [float("inf")] * len(timers)
        samples = [[] for _ in timers]
        # Interleave the repeats across candidates, so slow phases of a busy
        # machine hit every candidate rather than one.
        for _ in range(repeats):
            for k, (kind, mode, t, number) in enumerate(timers):
                per = t.timeit(number) / number  # timeit disables gc while timing
                samples[k].append(per)
                best[k] = min(best[k], per)
        for k, (kind, mode, t, number) in enumerate(timers):
            results.append({"kind": kind, "mode": mode, "batch": b, "number": number,
                            "best_s": best[k], "median_s": float(np.median(samples[k])),
                            "samples_s": samples[k]})
        gc.collect()
    return {"info": info, "results": results}


# =========================================================================== driver (our interpreter)


def _load_bench_zrecord():
    """machine_info() etc. from bench_zrecord.py, without running it."""
    spec = importlib.util.spec_from_file_location("_bench_zrecord_for_sampler", HERE / "bench_zrecord.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_worker(python: str, isolated: bool, spec: dict, timeout: float) -> dict:
    cmd = [python] + (["-I"] if isolated else []) + [str(Path(__file__).resolve()), "--worker", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              timeout=timeout, cwd=str(REPO if not isolated else "/"))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    except OSError as exc:
        return {"error": f"cannot run {python}: {exc}"}
    for ln in reversed(proc.stdout.splitlines()):
        if ln.startswith("{"):
            try:
                res = json.loads(ln)
            except ValueError:
                continue
            if proc.returncode != 0:
                res["exit_note"] = f"exited with status {proc.returncode} after printing its result"
            return res
    tail = proc.stderr.strip().splitlines()[-3:]
    return {"error": f"worker exited {proc.returncode}: " + " / ".join(tail)}


def fmt_time(s: float) -> str:
    us = s * 1e6
    if us >= 100:
        return f"{us:.0f} µs"
    if us >= 10:
        return f"{us:.1f} µs"
    return f"{us:.2f} µs"


def render(machine: dict, runs: dict, args) -> tuple[str, bool]:
    ok = True
    lines = [f"## loaderx Sampler benchmark{' (--quick)' if args.quick else ''}", ""]
    cores = f"{machine['cpu_count']} logical CPUs, {machine['affinity']} usable (sched_getaffinity)"
    if "cgroup_cpus" in machine:
        cores += f", cgroup quota {machine['cgroup_cpus']} CPUs"
    lines += ["| machine | value |", "|---|---|",
              f"| CPU | {machine['cpu']} |", f"| cores | {cores} |", f"| memory | {machine['memory']} |",
              f"| kernel | {machine['kernel']} |"]
    for name, run in runs.items():
        if "error" in run:
            lines.append(f"| {name} | ERROR: {run['error']} |")
            continue
        i = run["info"]
        lib = f"loaderx {i['loaderx_version']} from {i['loaderx_file']}; " if "loaderx_version" in i else ""
        lines.append(f"| {name} | {lib}{i['python']} ({i['executable']}), numpy {i['numpy']} |")
    lines.append(f"| load average at start / end | {machine.get('loadavg', '?')} / {_loadavg()} |")
    lines.append("")
    ours_f = runs.get("ours", {}).get("info", {}).get("loaderx_file")
    ref_f = runs.get("reference", {}).get("info", {}).get("loaderx_file")
    if ours_f and ref_f and Path(ours_f).resolve() == Path(ref_f).resolve():
        lines += ["**warning: 'ours' and 'reference' imported the same loaderx package.**", ""]
        ok = False
    lines.append(f"Index space {SPACE:,}; per call = best of {args.repeats} repeats of a timeit loop "
                 f"(~{args.target * 1e3:.0f} ms each, loop count in brackets; median of the repeats after the slash). "
                 "`vs numpy` = numpy's per-call time in the same process ÷ this row's (>1 = faster than numpy).")
    lines.append("")
    lines.append("| sampler | mode | batch | per call (best / median) | vs numpy |")
    lines.append("|---|---|---:|---:|---:|")
    ref_version = runs.get("reference", {}).get("info", {}).get("loaderx_version", "2.0.0")
    names = {"ours": "**ours** zsampler", "reference": f"loaderx {ref_version} zsampler"}
    pairs = []
    for b in args.batches:
        base = {}
        for name, run in runs.items():
            for r in run.get("results", []):
                if r["batch"] == b and r["kind"] == "numpy":
                    base[name] = r
        blocks = []
        # Like-for-like first: numpy, then the IID rows; CYCLIC/SEQUENTIAL after, for information.
        np_row = base.get("ours") or next(iter(base.values()), None)
        if np_row:
            blocks.append(("numpy default_rng().integers", "uniform, with replacement", np_row, np_row))
        if "reference" in base and "ours" in base and \
                runs["reference"]["info"]["numpy"] != runs["ours"]["info"]["numpy"]:
            blocks.append((f"numpy default_rng().integers (reference venv, numpy {runs['reference']['info']['numpy']})",
                           "uniform, with replacement", base["reference"], base["reference"]))
        for mode in args.modes:
            for name in ("ours", "reference"):
                run = runs.get(name, {})
                r = next((x for x in run.get("results", []) if x["batch"] == b and x["mode"] == mode), None)
                if r is not None:
                    blocks.append((names[name], mode, r, base.get(name)))
        for label, mode, r, ref in blocks:
            ratio = f"{ref['best_s'] / r['best_s']:.2f}x" if ref else "n/a"
            if mode == "IID" and "ours" in label:
                ratio = f"**{ratio}**"
            lines.append(f"| {label} | {mode} | {b} | {fmt_time(r['best_s'])} [{r['number']:,}] / "
                         f"{fmt_time(r['median_s'])} | {ratio} |")
        for mode in args.modes:
            o = next((x for x in runs.get("ours", {}).get("results", []) if x["batch"] == b and x["mode"] == mode), None)
            f = next((x for x in runs.get("reference", {}).get("results", []) if x["batch"] == b and x["mode"] == mode), None)
            if o and f:
                pairs.append(f"{mode}@{b} {f['best_s'] / o['best_s']:.2f}x")
    lines.append("")
    if pairs:
        lines.append(f"**ours vs loaderx {ref_version}** (reference per-call ÷ ours, >1 = ours faster): "
                     + ", ".join(pairs) + ".")
        lines.append("")
    for name, run in runs.items():
        if "error" in run:
            ok = False
        if run.get("exit_note"):
            lines.append(f"Note — {name}: {run['exit_note']}.")
    return "\n".join(lines), ok


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if len(argv) == 2 and argv[0] == "--worker":
        try:
            res = worker(json.loads(argv[1]))
        except Exception as exc:  # report, and fail the run
            import traceback
            traceback.print_exc()
            print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}), flush=True)
            return 1
        print(json.dumps(res), flush=True)
        return 0

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="5 repeats of ~20 ms loops (smoke run, a few seconds)")
    p.add_argument("--repeats", type=int, help="timeit repeats per candidate (default 15; --quick 5)")
    p.add_argument("--target", type=float, help="seconds per timeit loop (default 0.2; --quick 0.02)")
    p.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of IID,CYCLIC,SEQUENTIAL")
    p.add_argument("--backends", default="ours,reference", help="comma-separated subset of ours,reference")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python",
                   help="python of a virtualenv with loaderx==2.0.0 (default: <repo>/.venv-ref/bin/python)")
    p.add_argument("--json", type=Path, help="also write the raw numbers to this file")
    args = p.parse_args(argv)
    args.repeats = args.repeats or (5 if args.quick else 15)
    args.target = args.target or (0.02 if args.quick else 0.2)
    args.batches = [int(x) for x in args.batches.split(",") if x.strip()]
    args.modes = [m.strip().upper() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in args.modes) or not args.modes:
        p.error(f"--modes: choose from {','.join(MODES)}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if any(b not in ("ours", "reference") for b in backends) or not backends:
        p.error("--backends: choose from ours,reference")

    machine = _load_bench_zrecord().machine_info()
    spec = {"space": SPACE, "batches": args.batches, "modes": args.modes, "repeats": args.repeats,
            "target_s": args.target, "samplers": True}
    budget = len(args.batches) * (1 + len(args.modes)) * (args.repeats + 3) * args.target * 3 + 120
    runs = {}
    for name in backends:
        log(f"[sampler] {name} ...")
        t0 = time.perf_counter()
        if name == "ours":
            runs[name] = run_worker(sys.executable, False, spec, budget)
        else:
            if not args.reference_python.exists():
                runs[name] = {"error": f"reference python {args.reference_python} not found"}
                continue
            runs[name] = run_worker(str(args.reference_python), True, spec, budget)
        log(f"[sampler] {name}: {'ERROR ' + runs[name]['error'] if 'error' in runs[name] else 'done'}"
            f" in {time.perf_counter() - t0:.1f} s")
    text, ok = render(machine, runs, args)
    print(text, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"machine": machine, "runs": runs, "space": SPACE}, indent=1))
        log(f"raw numbers written to {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
