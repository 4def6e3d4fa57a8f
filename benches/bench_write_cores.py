#!/usr/bin/env python3
"""How many cores a compressed append keeps busy: ours against loaderx 2.0.0.

    .venv/bin/python benches/bench_write_cores.py                 # 512 images, appends of 64, zstd
    .venv/bin/python benches/bench_write_cores.py --chunk 256 --processes 6

Writes the Dense vision records of ``bench_levels.py`` (uint8 (3, 224, 224),
``bench_zrecord.make_images``) into a fresh zstd store, ``--rounds`` times in
one process, and reports per writer the median write speed (logical MiB over
the time of the append calls) and the median *cores busy*: the process's CPU
time (user + system, every thread) over the wall time of those appends. A
writer that keeps a 2-core machine fully busy reads 2.0; the shortfall is
time a thread waited, e.g. for the last task of an append. Processes
alternate (ours, 2.0.0, ours, ...) so a slow spell of the machine falls on
both. The first round of every process is left out (a fresh process's first
write runs slower on this VM, whatever the writer).
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MiB = 2**20


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def worker(source: Path, store: Path, codec: str, chunk: int, rounds: int) -> None:
    """Runs in the writer's own interpreter; prints one JSON line of (wall_s, cpu_s) per round."""
    import numpy as np

    from loaderx.zrecord import Dense

    data = np.load(source)  # fully in memory: the timed appends never fault the source in
    out = []
    for _ in range(rounds):
        shutil.rmtree(store, ignore_errors=True)
        writer = Dense.create(str(store), data.dtype, data.shape[1:], codec=codec)
        c0, t0 = cpu_s(), time.perf_counter()
        for i in range(0, len(data), chunk):
            writer.append(data[i : i + chunk])
        out.append((time.perf_counter() - t0, cpu_s() - c0))
        writer.close()
    shutil.rmtree(store, ignore_errors=True)
    print(json.dumps({"rounds": out, "mib": data.nbytes / MiB}))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=512)
    p.add_argument("--chunk", type=int, default=64, help="records per append (default 64, as bench_levels)")
    p.add_argument("--codec", default="zstd", choices=["raw", "zstd"])
    p.add_argument("--rounds", type=int, default=4, help="writes per process, the first left out")
    p.add_argument("--processes", type=int, default=4, help="processes per writer, alternating")
    p.add_argument("--reference-python", type=Path, default=REPO / ".venv-ref" / "bin" / "python")
    p.add_argument("--worker", nargs=2, metavar=("SOURCE", "STORE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(Path(args.worker[0]), Path(args.worker[1]), args.codec, args.chunk, args.rounds)
        return 0

    sys.path.insert(0, str(HERE))
    import bench_levels

    writers = {"ours": Path(sys.executable)}
    if args.reference_python.exists():
        writers["loaderx 2.0.0"] = args.reference_python
    else:
        print(f"no reference interpreter at {args.reference_python}: its rows left out", file=sys.stderr)
    with tempfile.TemporaryDirectory(
        dir=REPO / "bench-out" if (REPO / "bench-out").is_dir() else None
    ) as tmp:
        src_dir = Path(tmp) / "source"
        bench_levels.make_vision(args.records, 20240611, src_dir)
        samples: dict[str, list[tuple[float, float]]] = {w: [] for w in writers}
        mib = 0.0
        for _ in range(args.processes):
            for name, python in writers.items():
                cmd = [
                    str(python),
                    "-I",
                    str(Path(__file__).resolve()),
                    "--codec",
                    args.codec,
                    "--chunk",
                    str(args.chunk),
                    "--rounds",
                    str(args.rounds),
                    "--worker",
                    str(src_dir / "source.npy"),
                    str(Path(tmp) / "store"),
                ]
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True)
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                samples[name] += [tuple(r) for r in res["rounds"][1:]]
                mib = res["mib"]
    print(
        f"{args.records} records ({mib:.1f} MiB), {args.codec}, appends of {args.chunk}; "
        f"{args.processes} processes x {args.rounds - 1} timed writes per writer\n"
    )
    print("| writer | write MiB/s (median) | cores busy (median) |")
    print("|---|---:|---:|")
    for name, rows in samples.items():
        speed = statistics.median(mib / wall for wall, _ in rows)
        cores = statistics.median(cpu / wall for wall, cpu in rows)
        print(f"| {name} | {speed:.0f} | {cores:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
