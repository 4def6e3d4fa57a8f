"""Runs one function per rank in spawned processes and collects what each
sends back: the multi-process ("multi-node") pattern of the sharding tests."""
from __future__ import annotations

import multiprocessing
import queue
import traceback
from typing import Any, Callable

import pytest


def _run(target: Callable[..., Any], rank: int, args: tuple, out: Any) -> None:
    try:
        out.put(("ok", rank, target(*args)))
    except BaseException:  # noqa: BLE001 - reported to the parent
        out.put(("error", rank, traceback.format_exc()))


def run_ranks(target: Callable[..., Any], args_per_rank: list[tuple], timeout: float = 120) -> dict:
    """``{rank: target(*args_per_rank[rank])}``, each call in its own spawned
    process (``target`` must be importable: a module-level function). A rank
    that raises fails the test with its traceback; one that never answers
    fails it with the exit codes."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_run, args=(target, r, args, out), daemon=True)
             for r, args in enumerate(args_per_rank)]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=timeout) for _ in procs]
    except queue.Empty:
        pytest.fail(f"ranks did not answer (exit codes {[p.exitcode for p in procs]})")
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [r[2] for r in results if r[0] == "error"]
    assert not errors, "\n".join(errors)
    return {r[1]: r[2] for r in results}
