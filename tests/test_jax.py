"""Tests of loaderx.jax.JaxLoader: global jax.Arrays sharded along the batch
axis, built from each process's slice of the DataLoader's global batch.

Every store here is built so that record ``i`` is a known function of ``i``
(``x``: float32 ``i * 4 + [0, 1, 2, 3]``; ``y``: int32 ``i``; ``h``:
bfloat16 ``[i, i + 0.5]``; ``r``: Ragged int32 ``arange(i % 3 + 1) + i``),
and every batch is compared exactly with what a plain DataLoader with the
same arguments yields.

JAX fixes its number of CPU devices when its backend starts, which may
already have happened in this pytest process (other test files import JAX),
so the checks that need several devices (4 in one process; 2 processes of 2
devices each) run in child interpreters that call this file's ``child_*``
functions and pickle what they saw; the tests compare that with the
DataLoader here. Every child runs under a timeout.
"""
from __future__ import annotations

import os
import pickle
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax", reason="loaderx.jax needs JAX (pip install 'loaderx[jax]')")

from conftest import REPO_ROOT, loaderx_child_env
from loaderx.dataloader import DataLoader
from loaderx.jax import JaxLoader, batch_shard
from loaderx.zrecord import Dense, Ragged

try:
    import ml_dtypes
except ImportError:  # bfloat16 stores need it; the rest of the file does not
    ml_dtypes = None

N = 40               # records per store
BATCH = 8            # global batch of the multi-device checks: 2 rows per device
STEPS = 4            # batches compared per scenario
TIMEOUT = 180        # seconds; only ever reached when a child hangs
TESTS = Path(__file__).resolve().parent
DENSE = ["x", "y", "h"] if ml_dtypes is not None else ["x", "y"]


# --------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------

def build(root: Path) -> Path:
    """Writes the stores under ``root`` (see the module docstring)."""
    i = np.arange(N)
    with Dense.create(root / "x", np.float32, (4,), codec="raw") as w:
        w.append((i[:, None] * 4 + np.arange(4)).astype(np.float32))
    with Dense.create(root / "y", np.int32, ()) as w:
        w.append(i.astype(np.int32))
    if ml_dtypes is not None:
        with Dense.create(root / "h", ml_dtypes.bfloat16, (2,)) as w:
            w.append(np.stack([i, i + 0.5], axis=1).astype(ml_dtypes.bfloat16))
    with Ragged.create(root / "r", np.int32) as w:
        w.append(np.arange(k % 3 + 1, dtype=np.int32) + k for k in range(N))
    return root


def streams(root: Path | str, names: list[str] | None = None) -> dict:
    root = Path(root)
    names = DENSE if names is None else names
    return {n: (Ragged if n == "r" else Dense).open(root / n) for n in names}


def expected(root: Path, steps: int, start: int = 0, **kwargs: Any) -> list[dict]:
    """The global batches ``start .. start + steps - 1`` of a plain DataLoader."""
    kwargs.setdefault("batch_size", BATCH)
    with DataLoader(streams(root, kwargs.pop("names", None)), start_step=start, **kwargs) as dl:
        return [next(dl) for _ in range(steps)]


def assert_batch(got: dict, want: dict) -> None:
    """``got`` ({name: jax.Array or ndarray}) equals ``want`` exactly, dtypes too."""
    assert list(got) == list(want)
    for name, value in got.items():
        value = np.asarray(value)
        assert value.dtype == want[name].dtype, (name, value.dtype, want[name].dtype)
        np.testing.assert_array_equal(value, want[name], err_msg=name)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("jax_stores"))


@pytest.fixture
def one_device():
    """A batch sharding over one device: the same whatever JAX was configured with."""
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    return NamedSharding(Mesh(np.array(jax.devices()[:1]), ("data",)), P("data"))


# --------------------------------------------------------------------------
# children
# --------------------------------------------------------------------------

def _child_env() -> dict:
    env = loaderx_child_env()
    env["JAX_PLATFORMS"] = "cpu"
    env.pop("XLA_FLAGS", None)  # the device count is set by jax.config in the child
    return env


def _child_command(func: str, *args: Any) -> list[str]:
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_jax; test_jax.{func}(*sys.argv[1:])"
    return [sys.executable, "-c", code, *map(str, args)]


def run_child(func: str, *args: Any, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(_child_command(func, *args), check=False, env=_child_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, f"child {func} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def _cpu_devices(n: int) -> None:
    jax.config.update("jax_num_cpu_devices", n)


def _record(batch: dict, sharding: Any) -> dict:
    """What a child reports of one batch: for each value, its dtype, global
    shape, whether its sharding is the one given, and every addressable
    shard as (device id, process, index as (start, stop) per axis, data)."""
    out = {}
    for name, arr in batch.items():
        given = sharding[name] if isinstance(sharding, dict) else sharding
        out[name] = {
            "dtype": str(arr.dtype),
            "shape": tuple(arr.shape),
            "same_sharding": arr.sharding == given,
            "shards": [
                (s.device.id, s.device.process_index,
                 tuple(sl.indices(n)[:2] for sl, n in zip(s.index, arr.shape)),
                 np.asarray(s.data))
                for s in arr.addressable_shards
            ],
            "global": np.asarray(arr) if arr.is_fully_addressable else None,
        }
    return out


def _error(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - reported to the parent by type and text
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def child_single(root: str, out: str) -> None:
    """One process, 4 CPU devices: the scenarios of the single-process tests."""
    _cpu_devices(4)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.device_count() == 4, jax.devices()
    devs = np.array(jax.devices())
    line = Mesh(devs, ("data",))
    grid = Mesh(devs.reshape(2, 2), ("data", "model"))
    scenarios = {
        "line": NamedSharding(line, P("data")),
        "grid": NamedSharding(grid, P("data")),  # replicated over "model"
        "per_stream": {
            "x": NamedSharding(grid, P("data", "model")),  # columns split too
            "y": NamedSharding(grid, P("data")),
            "h": NamedSharding(line, P("data")),
        },
    }
    report: dict[str, Any] = {"device_ids": [d.id for d in jax.devices()], "errors": {}}
    for key, sharding in scenarios.items():
        with JaxLoader(streams(root), sharding, batch_size=BATCH, mode=1, seed=3) as jl:
            report[key] = {
                "shard": (jl.shard_index, jl.shard_count),
                "steps": [_record(next(jl), sharding) for _ in range(STEPS)],
            }
    errors = report["errors"]
    errors["line_6"] = _error(lambda: JaxLoader(streams(root), scenarios["line"], batch_size=6))
    flat = NamedSharding(grid, P(("data", "model")))
    errors["flat_6"] = _error(lambda: JaxLoader(streams(root), flat, batch_size=6))
    # A transform changing the rows: caught at the batch, naming the stream.
    shrink = lambda b: {**b, "y": b["y"][:3]}
    jl = JaxLoader(streams(root), scenarios["line"], batch_size=BATCH, transform=shrink)
    errors["transform_3"] = _error(lambda: next(jl))
    jl.close()
    with open(out, "wb") as f:
        pickle.dump(report, f)


def child_multi(root: str, out: str, process_id: str, port: str) -> None:
    """Process ``process_id`` of 2, with 2 CPU devices each."""
    _cpu_devices(2)
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                               process_id=int(process_id), initialization_timeout=60)
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    assert jax.process_count() == 2 and jax.device_count() == 4, jax.devices()
    devs = jax.devices()  # process 0's two devices, then process 1's
    assert [d.process_index for d in devs] == [0, 0, 1, 1], devs
    scenarios = {
        "grouped": NamedSharding(Mesh(np.array(devs), ("data",)), P("data")),
        # Each process's devices at alternate mesh positions, as a
        # topology-ordered mesh can have them.
        "interleaved": NamedSharding(Mesh(np.array([devs[i] for i in (0, 2, 1, 3)]), ("data",)),
                                     P("data")),
    }
    report: dict[str, Any] = {"process": jax.process_index(), "errors": {}}
    for key, sharding in scenarios.items():
        with JaxLoader(streams(root), sharding, batch_size=BATCH, mode=1, seed=3) as jl:
            report[key] = {
                "shard": (jl.shard_index, jl.shard_count),
                "steps": [_record(next(jl), sharding) for _ in range(STEPS)],
            }
    grouped = scenarios["grouped"]
    errors = report["errors"]
    errors["shard_count_1"] = _error(
        lambda: JaxLoader(DataLoader(streams(root), batch_size=BATCH), grouped))
    errors["shard_index_0"] = _error(
        lambda: JaxLoader(DataLoader(streams(root), batch_size=BATCH, shard_index=0, shard_count=2),
                          grouped))
    with open(out, "wb") as f:
        pickle.dump(report, f)


@pytest.fixture(scope="module")
def single(root, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("jax_single") / "report.pkl"
    run_child("child_single", root, out)
    with open(out, "rb") as f:
        return pickle.load(f)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def multi(root, tmp_path_factory) -> list[dict]:
    """The reports of the two processes of one 2-process JAX run."""
    outdir = tmp_path_factory.mktemp("jax_multi")
    port = _free_port()
    procs = [
        subprocess.Popen(_child_command("child_multi", root, outdir / f"{i}.pkl", i, port),
                         env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT)[0])
    finally:
        for p in procs:  # only after a timeout: never leave a child behind
            if p.poll() is None:
                p.kill()
                p.wait()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"process {i} failed:\n{logs[i]}"
    reports = []
    for i in range(2):
        with open(outdir / f"{i}.pkl", "rb") as f:
            reports.append(pickle.load(f))
    return reports


# --------------------------------------------------------------------------
# one process, 4 devices
# --------------------------------------------------------------------------

@pytest.mark.parametrize("scenario", ["line", "grid", "per_stream"])
def test_global_arrays_equal_the_dataloader_batches(single, root, scenario):
    want = expected(root, STEPS, mode=1, seed=3)
    run = single[scenario]
    assert run["shard"] == (0, 1)
    for step, (got, w) in enumerate(zip(run["steps"], want)):
        assert list(got) == DENSE
        for name, rec in got.items():
            assert rec["shape"] == w[name].shape, (step, name)
            assert rec["dtype"] == str(w[name].dtype), (step, name)
            assert rec["global"].dtype == w[name].dtype
            np.testing.assert_array_equal(rec["global"], w[name], err_msg=f"{scenario} {step} {name}")


@pytest.mark.parametrize("scenario", ["line", "grid", "per_stream"])
def test_arrays_carry_the_given_sharding(single, scenario):
    for got in single[scenario]["steps"]:
        for name, rec in got.items():
            assert rec["same_sharding"] is True, (scenario, name)


def _rows_by_device(single: dict, scenario: str, name: str, step: int) -> dict:
    return {dev: (index, data) for dev, _, index, data in single[scenario]["steps"][step][name]["shards"]}


def test_line_mesh_splits_the_batch_over_four_devices(single, root):
    want = expected(root, STEPS, mode=1, seed=3)
    ids = single["device_ids"]
    for step in range(STEPS):
        for name in DENSE:
            shards = _rows_by_device(single, "line", name, step)
            assert sorted(shards) == sorted(ids)
            for pos, dev in enumerate(ids):  # mesh position pos holds rows 2 pos, 2 pos + 1
                index, data = shards[dev]
                assert index[0] == (2 * pos, 2 * pos + 2)
                np.testing.assert_array_equal(data, want[step][name][2 * pos: 2 * pos + 2])


def test_grid_mesh_replicates_over_the_second_axis(single, root):
    want = expected(root, STEPS, mode=1, seed=3)
    ids = single["device_ids"]  # grid row r is devices 2r, 2r + 1
    for step in range(STEPS):
        for name in DENSE:
            shards = _rows_by_device(single, "grid", name, step)
            for pos, dev in enumerate(ids):
                r = pos // 2
                index, data = shards[dev]
                assert index[0] == (4 * r, 4 * r + 4)
                assert all(ax == (0, n) for ax, n in zip(index[1:], want[step][name].shape[1:]))
                np.testing.assert_array_equal(data, want[step][name][4 * r: 4 * r + 4])


def test_per_stream_sharding_splits_columns_too(single, root):
    want = expected(root, STEPS, mode=1, seed=3)
    ids = single["device_ids"]
    for step in range(STEPS):
        shards = _rows_by_device(single, "per_stream", "x", step)
        for pos, dev in enumerate(ids):
            r, c = divmod(pos, 2)
            index, data = shards[dev]
            assert index == ((4 * r, 4 * r + 4), (2 * c, 2 * c + 2))
            np.testing.assert_array_equal(data, want[step]["x"][4 * r: 4 * r + 4, 2 * c: 2 * c + 2])


def test_batch_not_divisible_by_the_devices_is_a_clear_error(single):
    errors = single["errors"]
    assert errors["line_6"].startswith("ValueError: stream 'x': the global batch of 6 rows"), errors
    assert "4 devices" in errors["line_6"] and "multiple of 4" in errors["line_6"]
    assert errors["flat_6"].startswith("ValueError: stream 'x': the global batch of 6 rows"), errors
    # Rows changed by a transform: caught when the batch is made.
    assert errors["transform_3"].startswith("ValueError: stream 'y': the global batch of 3 rows"), errors


@pytest.mark.skipif(ml_dtypes is None, reason="bfloat16 stores need ml-dtypes")
def test_bfloat16_comes_through_as_jax_bfloat16(single):
    import jax.numpy as jnp

    rec = single["line"]["steps"][0]["h"]
    assert rec["dtype"] == "bfloat16" and np.dtype(jnp.bfloat16) == rec["global"].dtype


# --------------------------------------------------------------------------
# two processes, 2 devices each
# --------------------------------------------------------------------------

def _assemble(reports: list[dict], scenario: str, step: int, name: str, rows: int) -> tuple:
    """The global array put together from both processes' shards, and the
    rows each process held."""
    first = reports[0][scenario]["steps"][step][name]
    glob = np.zeros(first["shape"], first["shards"][0][3].dtype)
    seen = np.zeros(rows, int)
    held: dict[int, set] = {0: set(), 1: set()}
    for report in reports:
        for _, proc, index, data in report[scenario]["steps"][step][name]["shards"]:
            assert proc == report["process"]  # a process sees only its own devices
            (a, b), rest = index[0], index[1:]
            assert all(ax == (0, n) for ax, n in zip(rest, first["shape"][1:]))
            glob[a:b] = data
            seen[a:b] += 1
            held[proc].update(range(a, b))
    assert (seen == 1).all(), seen  # every row held by exactly one device
    return glob, held


def test_two_processes_each_hold_their_slice(multi, root):
    want = expected(root, STEPS, mode=1, seed=3)
    for report in multi:
        p = report["process"]
        assert report["grouped"]["shard"] == (p, 2)
    for step in range(STEPS):
        for name in DENSE:
            glob, held = _assemble(multi, "grouped", step, name, BATCH)
            assert multi[0]["grouped"]["steps"][step][name]["shape"] == want[step][name].shape
            assert held == {0: set(range(4)), 1: set(range(4, 8))}
            np.testing.assert_array_equal(glob, want[step][name])


def test_two_processes_slices_equal_the_dataloaders_slices(multi, root):
    # Process p's rows are exactly what DataLoader(shard_index=p, shard_count=2) gathers.
    for p in range(2):
        want = expected(root, STEPS, mode=1, seed=3, shard_index=p, shard_count=2)
        for step in range(STEPS):
            for name in DENSE:
                shards = sorted(multi[p]["grouped"]["steps"][step][name]["shards"], key=lambda s: s[2])
                local = np.concatenate([data for *_, data in shards])
                np.testing.assert_array_equal(local, want[step][name])


def test_two_processes_interleaved_mesh_holds_each_row_once(multi, root):
    # Mesh positions 0..3 belong to processes 0, 1, 0, 1: process p fills
    # positions p and p + 2 with its slice (rows 4p .. 4p + 3) in order.
    want = expected(root, STEPS, mode=1, seed=3)
    order = [0, 1, 4, 5, 2, 3, 6, 7]
    for report in multi:
        assert report["interleaved"]["shard"] == (report["process"], 2)
    for step in range(STEPS):
        for name in DENSE:
            glob, held = _assemble(multi, "interleaved", step, name, BATCH)
            assert held == {0: {0, 1, 4, 5}, 1: {2, 3, 6, 7}}
            np.testing.assert_array_equal(glob, want[step][name][order])


def test_two_processes_reject_a_mismatched_dataloader(multi):
    for report in multi:
        msg = report["errors"]["shard_count_1"]
        assert msg.startswith("ValueError: the DataLoader has shard_index=0, shard_count=1"), msg
        assert "jax.process_count()=2" in msg
        assert f"use shard_index={report['process']}, shard_count=2" in msg
    assert multi[0]["errors"]["shard_index_0"] == "no error"
    msg = multi[1]["errors"]["shard_index_0"]
    assert msg.startswith("ValueError: the DataLoader has shard_index=0, shard_count=2"), msg


# --------------------------------------------------------------------------
# in this process (one device)
# --------------------------------------------------------------------------

def test_batches_equal_the_dataloader_in_process(root, one_device):
    want = expected(root, 6, mode=1, seed=9)
    with JaxLoader(streams(root), one_device, batch_size=BATCH, mode=1, seed=9) as jl:
        assert (jl.shard_index, jl.shard_count) == (0, 1)
        for step in range(6):
            assert jl.step == step
            batch = next(jl)
            assert all(isinstance(v, jax.Array) and v.sharding == one_device for v in batch.values())
            assert_batch(batch, want[step])


def test_int64_follows_jax_x64_setting(tmp_path, one_device):
    # As for any NumPy input to JAX (docs/frameworks.md says so).
    with Dense.create(tmp_path / "ids", np.int64, ()) as w:
        w.append(np.arange(16, dtype=np.int64))
    with JaxLoader({"ids": Dense.open(tmp_path / "ids")}, one_device, batch_size=4, mode=0) as jl:
        got = next(jl)["ids"]
    assert got.dtype == (np.int64 if jax.config.jax_enable_x64 else np.int32)
    np.testing.assert_array_equal(np.asarray(got), np.arange(4))


@pytest.mark.parametrize("prefetch", [0, 1, 2, 3])
@pytest.mark.parametrize("k", [0, 1, 3])
def test_state_dict_counts_batches_received_not_prefetched(root, one_device, k, prefetch):
    want = expected(root, k + 3, mode=1, seed=5)
    kwargs = {"batch_size": BATCH, "mode": 1, "seed": 5}
    with JaxLoader(streams(root), one_device, prefetch=prefetch, **kwargs) as jl:
        for step in range(k):
            assert_batch(next(jl), want[step])
        state = jl.state_dict()
        assert state == {"step": k}
        # The DataLoader underneath is ahead by the batches already put on the device.
        assert jl.loader.step == (k + prefetch if k else 0)
        # A new JaxLoader started from the state gives batch k next ...
        with JaxLoader(streams(root), one_device, prefetch=prefetch, start_step=state["step"],
                       **kwargs) as resumed:
            assert_batch(next(resumed), want[k])
            assert_batch(next(resumed), want[k + 1])
        # ... and so do load_state_dict and a DataLoader built with start_step.
        with JaxLoader(streams(root), one_device, prefetch=prefetch, **kwargs) as other:
            next(other)
            other.load_state_dict(state)
            assert other.step == k
            assert_batch(next(other), want[k])
            assert other.state_dict() == {"step": k + 1}
        dl = DataLoader(streams(root), start_step=state["step"], **kwargs)
        with JaxLoader(dl, one_device, prefetch=prefetch) as given:
            assert_batch(next(given), want[k])
        # The first loader itself continues where its user left off.
        assert_batch(next(jl), want[k])
        assert jl.state_dict() == {"step": k + 1}


def test_mismatched_shard_count_is_a_value_error(root, one_device):
    dl = DataLoader(streams(root), batch_size=BATCH, shard_index=1, shard_count=2)
    with pytest.raises(ValueError, match=re.escape(
            "the DataLoader has shard_index=1, shard_count=2, but the sharding puts slice 0 of 1")) as e:
        JaxLoader(dl, one_device)
    assert "jax.process_count()=1" in str(e.value) and "shard_index=0, shard_count=1" in str(e.value)
    dl.close()
    with pytest.raises(ValueError, match="you gave shard_index=0, shard_count=2"):
        JaxLoader(streams(root), one_device, batch_size=BATCH, shard_count=2)
    # Matching values are fine.
    with JaxLoader(streams(root), one_device, batch_size=BATCH, shard_index=0, shard_count=1) as jl:
        assert jl.loader.batch_size == BATCH


def test_ragged_stream_is_refused_at_construction(root, one_device):
    with pytest.raises(TypeError, match=r"stream 'r' gives variable-shape records .*transform"):
        JaxLoader(streams(root, ["y", "r"]), one_device, batch_size=BATCH)
    with pytest.raises(TypeError, match=r"stream 'r' gives variable-shape records"):
        JaxLoader(streams(root, ["y", "r"]), one_device, batch_size=BATCH, packed=True)


def test_ragged_list_left_by_a_transform_is_refused_at_its_batch(root, one_device):
    jl = JaxLoader(streams(root, ["y", "r"]), one_device, batch_size=BATCH, transform=lambda b: b)
    with pytest.raises(TypeError, match=r"stream 'r' gives variable-shape records"):
        next(jl)
    assert jl.step == 0
    with pytest.raises(StopIteration):  # a failure stops the loader
        next(jl)


def test_ragged_padded_by_a_transform_comes_through(root, one_device):
    def pad(batch: dict) -> dict:
        out = np.zeros((len(batch["r"]), 3), np.int32)
        for j, rec in enumerate(batch["r"]):
            out[j, : len(rec)] = rec
        return {"y": batch["y"], "r": out, "len": np.array([len(r) for r in batch["r"]], np.int32)}

    want = [pad(b) for b in expected(root, 3, names=["y", "r"], mode=1, seed=1)]
    with JaxLoader(streams(root, ["y", "r"]), one_device, batch_size=BATCH, mode=1, seed=1,
                   transform=pad) as jl:
        for w in want:
            assert_batch(next(jl), w)


def test_other_values_are_refused_naming_the_stream(root, one_device):
    with JaxLoader(streams(root, ["y"]), one_device, batch_size=BATCH,
                   transform=lambda b: {"y": b["y"], "n": 3}) as jl, \
            pytest.raises(TypeError, match=r"stream 'n' has type int; JaxLoader takes NumPy arrays"):
        next(jl)
    with JaxLoader(streams(root, ["y"]), one_device, batch_size=BATCH,
                   transform=lambda b: b["y"]) as jl, \
            pytest.raises(TypeError, match="must return a dict of arrays"):
        next(jl)


def test_failures_surface_at_their_own_step(root, one_device):
    def fail_at_step_2(batch: dict) -> dict:
        if batch["y"][0] == 2 * 4:  # sequential, batch 4: step 2 starts at record 8
            raise RuntimeError("bad record")
        return batch

    want = expected(root, 2, names=["y"], batch_size=4, mode=0)
    with JaxLoader(streams(root, ["y"]), one_device, batch_size=4, mode=0, transform=fail_at_step_2,
                   prefetch=2) as jl:
        assert_batch(next(jl), want[0])  # step 2 is already prefetched (and failed) here
        assert_batch(next(jl), want[1])
        with pytest.raises(RuntimeError, match="bad record"):
            next(jl)
        assert jl.step == 2
        with pytest.raises(StopIteration):
            next(jl)


def test_per_stream_sharding_needs_every_stream(root, one_device):
    with pytest.raises(ValueError, match=r"sharding has no entry for the streams \['x'\]"):
        JaxLoader(streams(root, ["x", "y"]), {"y": one_device}, batch_size=BATCH)
    with JaxLoader(streams(root, ["x", "y"]), {"y": one_device, "x": one_device}, batch_size=BATCH) as jl:
        assert_batch(next(jl), expected(root, 1, names=["x", "y"])[0])


def test_argument_errors(root, one_device):
    dl = DataLoader(streams(root), batch_size=BATCH)
    with pytest.raises(TypeError, match=r"DataLoader arguments \['batch_size'\] apply only"):
        JaxLoader(dl, one_device, batch_size=BATCH)
    dl.close()
    with pytest.raises(TypeError, match="sharding must be a jax.sharding.Sharding"):
        JaxLoader(streams(root), "data")
    with pytest.raises(TypeError, match=r"sharding\['x'\] is a str"):
        JaxLoader(streams(root), {"x": "data"})
    with pytest.raises(ValueError, match="prefetch must be an int >= 0"):
        JaxLoader(streams(root), one_device, prefetch=-1)
    with pytest.raises(TypeError, match="loader must be a DataLoader or a dict"):
        JaxLoader([1, 2], one_device)


def test_close_and_context_manager(root, one_device):
    with JaxLoader(streams(root), one_device, batch_size=BATCH) as jl:
        next(jl)
        inner = jl.loader
        assert "JaxLoader(step=1, prefetch=2, shard=0/1" in repr(jl)
    with pytest.raises(StopIteration):
        next(jl)
    with pytest.raises(StopIteration):
        next(inner)  # the DataLoader underneath is closed too
    jl.close()  # twice is fine
    with pytest.raises(TypeError, match="no length"):
        len(jl)


def test_batch_shard_of_one_process(one_device):
    assert batch_shard(one_device) == (0, 1, 1)


def test_import_is_lazy_and_missing_jax_is_a_clear_error(tmp_path):
    code = textwrap.dedent("""
        import sys
        sys.modules["jax"] = None  # as if JAX were not installed
        import loaderx.jax as lj
        try:
            lj.JaxLoader({}, None)
        except ImportError as e:
            print("ImportError:", e)
    """)
    proc = subprocess.run([sys.executable, "-c", code], check=False, env=loaderx_child_env(),
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr
    assert "install it with: pip install 'loaderx[jax]'" in proc.stdout, proc.stdout
    proc = subprocess.run([sys.executable, "-c", "import sys, loaderx.jax; print('jax' in sys.modules)"],
                          check=False, env=loaderx_child_env(), capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr


# --------------------------------------------------------------------------
# docs/frameworks.md
# --------------------------------------------------------------------------

def _docs_example() -> str:
    text = (REPO_ROOT / "docs" / "frameworks.md").read_text()
    section = re.search(r"^## JAX\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert section, "docs/frameworks.md has no '## JAX' section"
    code = re.search(r"```python\n(.*?)```", section.group(1), re.DOTALL)
    assert code, "the JAX section has no python example"
    return code.group(1)


def child_docs_example(path: str) -> None:
    """Runs the docs example on 4 CPU devices."""
    _cpu_devices(4)
    code = compile(Path(path).read_text(), "frameworks.md", "exec")
    exec(code, {"__name__": "__main__"})  # noqa: S102 - our own docs, run as a script


def test_docs_example_runs_on_four_devices(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(_docs_example())
    proc = run_child("child_docs_example", script, cwd=tmp_path)
    loss = float(re.search(r"loss after 100 steps: (\S+)", proc.stdout).group(1))
    assert loss < 1e-3, proc.stdout
    assert os.path.isdir(tmp_path / "features")


def test_a_finite_pass_has_a_len_carries_the_mask_and_ends(root, one_device):
    # 12 does not divide 40: the last batch is padded, and masked.
    want = expected(root, 4, batch_size=12, mode=0, epochs=1)
    with JaxLoader(streams(root), one_device, batch_size=12, mode=0, epochs=1) as jl:
        assert len(jl) == len(want) == 4
        got = list(jl)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_batch(g, w)
    real = np.concatenate([np.asarray(g["y"])[np.asarray(g["mask"])] for g in got])
    assert sorted(real.tolist()) == list(range(N))
