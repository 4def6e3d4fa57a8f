"""The ``loaderx`` command line and ``loaderx.tools``: demo, info, verify, convert.

Commands run through the real entry module in a subprocess
(``python -m loaderx ...``); conversions are checked record by record against
their sources. Parquet/Arrow/datasets tests need the optional ``convert``
extra and skip without it.
"""
from __future__ import annotations

import importlib.metadata
import io
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import loaderx
from loaderx import tools
from loaderx._progress import Progress, make_progress
from loaderx.dataloader import DataLoader
from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged, ZrecordError

EXTRA_HINT = "pip install 'loaderx[convert]'"
PAGE, ENTRY = 4096, 16


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def child_env(**extra: str) -> dict:
    """Environment for a child interpreter importing this loaderx."""
    env = dict(os.environ)
    pkg_parent = str(Path(loaderx.__file__).resolve().parent.parent)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    front = [p for p in extra.pop("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(front + [pkg_parent] + paths)
    env["HF_DATASETS_OFFLINE"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    env.update(extra)
    return env


def cli(*args, cwd=None, timeout=120, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loaderx", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=child_env(**env))


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return proc


def fails(proc: subprocess.CompletedProcess, *needles: str, code: int = 1) -> str:
    """Asserts a clean failure: exit ``code``, no traceback, every needle in the output."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, f"exit {proc.returncode}\n{out}"
    assert "Traceback" not in out, out
    for needle in needles:
        assert needle in out, f"{needle!r} not in:\n{out}"
    return out


def records_of(path: Path) -> list[np.ndarray]:
    with tools.open_store(path) as s:
        return list(s[:]) if isinstance(s, Ragged) else [r for r in s[:]]


def assert_dense(path: Path, expected: np.ndarray, codec: str | None = None) -> None:
    with Dense.open(path) as s:
        assert s.dtype == expected.dtype
        assert s.item_shape == expected.shape[1:]
        assert len(s) == expected.shape[0]
        if codec:
            assert s.codec == codec
        got = s[:]
    np.testing.assert_array_equal(got, expected)


def assert_ragged(path: Path, expected: list[np.ndarray], codec: str | None = None) -> None:
    with Ragged.open(path) as s:
        assert len(s) == len(expected)
        if codec:
            assert s.codec == codec
        got = s[:]
    for i, (g, e) in enumerate(zip(got, expected)):
        assert g.dtype == e.dtype and g.shape == e.shape, (i, g, e)
        np.testing.assert_array_equal(g, e)


def loc(path: Path, i: int) -> tuple[int, int, int]:
    """(offset, phys_length, logic_length) of record i, from meta.zr."""
    raw = (path / "meta.zr").read_bytes()[PAGE + i * ENTRY: PAGE + (i + 1) * ENTRY]
    return struct.unpack("<QII", raw)


DENSE = np.arange(40 * 3 * 4, dtype=np.float32).reshape(40, 3, 4) * 0.5
RAGGED = [np.arange(1 + i % 7, dtype=np.int32).reshape(-1) * i for i in range(30)] + \
         [np.arange(6, dtype=np.int32).reshape(2, 3), np.array(5, dtype=np.int32)]


@pytest.fixture
def stores(tmp_path) -> dict[str, Path]:
    """A Dense zstd, a Ragged raw and a Dense zstd_dict store."""
    paths = {"dense": tmp_path / "dense", "ragged": tmp_path / "ragged", "dict": tmp_path / "dict"}
    with Dense.create(paths["dense"], np.float32, (3, 4), codec="zstd") as w:
        w.append(DENSE)
    with Ragged.create(paths["ragged"], np.int32, codec="raw") as w:
        w.append(RAGGED)
    tiles = np.tile(np.arange(64, dtype=np.uint8), (400, 1)) + (np.arange(400, dtype=np.uint8) % 3)[:, None]
    blob = train_dict(tiles, tier="fast")
    with Dense.create(paths["dict"], np.uint8, (64,), codec="zstd_dict", dict_bytes=blob) as w:
        w.append(tiles)
    paths["dict_bytes"] = blob  # type: ignore[assignment]
    return paths


# ---------------------------------------------------------------------------
# the command line itself
# ---------------------------------------------------------------------------


def test_help_for_every_subcommand():
    top = ok(cli("--help")).stdout
    assert "usage: loaderx" in top
    for command in ("demo", "info", "verify", "convert"):
        assert command in top
        text = ok(cli(command, "--help")).stdout
        assert f"usage: loaderx {command}" in text
    fails(cli("convert", "a.npy", "b", "--codec", "gzip"), "invalid choice", code=2)


def test_usage_errors_in_process(capsys):
    from loaderx.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"loaderx {loaderx.__version__}"
    assert main([]) == 2 and "usage: loaderx" in capsys.readouterr().err
    for argv, needle in ((["bogus"], "invalid choice"), (["demo", "--records", "0"], "at least 1"),
                         (["verify"], "required"), (["convert", "only-src"], "required")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2 and needle in capsys.readouterr().err


def test_console_script_entry_point():
    scripts = [ep for ep in importlib.metadata.entry_points(group="console_scripts") if ep.name == "loaderx"]
    if not scripts:
        pytest.skip("the loaderx console script is not declared in the installed metadata yet")
    assert scripts[0].value == "loaderx.cli:main"
    exe = Path(sys.executable).parent / ("loaderx.exe" if os.name == "nt" else "loaderx")
    assert exe.exists(), f"{exe} is missing; reinstall the package"
    proc = subprocess.run([str(exe), "verify", "--help"], capture_output=True, text=True,
                          timeout=60, env=child_env())
    assert proc.returncode == 0 and "usage: loaderx verify" in proc.stdout


# ---------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------


def test_demo_defaults_use_a_temporary_directory():
    t0 = time.perf_counter()
    out = ok(cli("demo", timeout=120)).stdout
    elapsed = time.perf_counter() - t0
    assert elapsed < 60
    for word in ("image", "label", "tokens", "zstd_dict", "raw", "batches/s", "records/s", "MiB/s",
                 "each equal to its source records",
                 # it says what the rows mean, that it warms up, which cache it read, what to try next
                 "32 B on disk per 8-byte label", "writes at zstd level 19", "warm-up  50 batches",
                 "median round", "page cache (warm)", "(cold)", "Next:",
                 "loaderx demo --dir demo-stores", "loaderx info demo-stores/label",
                 "loaderx verify demo-stores/*"):
        assert word in out, out
    first = out.splitlines()[0]
    where = first.split(" in ", 1)[1].split(" (temporary")[0]
    assert not Path(where).exists(), "the temporary demo directory was not removed"


def test_demo_keeps_dir_and_reports_json(tmp_path):
    d = tmp_path / "demo"
    report = json.loads(ok(cli("demo", "--dir", d, "--records", "300", "--steps", "12",
                               "--batch-size", "16", "--json")).stdout)
    assert report["records"] == 300 and report["kept"] is True
    loader = report["loader"]
    assert loader["steps"] == loader["verified_batches"] == 12
    assert loader["warmup_steps"] == 12 and loader["rounds"] == 3  # warm-up: at most 50, at most --steps
    assert len(loader["round_batches_per_s"]) == 3
    assert min(loader["round_batches_per_s"]) <= loader["batches_per_s"] <= max(loader["round_batches_per_s"])
    assert loader["batches_per_s"] > 0 and loader["records_per_s"] > 0 and loader["mib_per_s"] > 0
    stores = report["stores"]
    assert stores["image"]["item_shape"] == [3, 64, 64] and stores["image"]["codec"] == "zstd"
    assert stores["label"]["dtype"] == "int64" and stores["label"]["codec"] == "raw"
    assert stores["tokens"]["kind"] == "Ragged" and stores["tokens"]["dict_bytes"] > 0
    for s in stores.values():
        assert s["records"] == 300 and s["write_mib_per_s"] > 0 and s["ratio"] > 0
    ok(cli("verify", d / "image", d / "label", d / "tokens"))
    fails(cli("demo", "--dir", d, "--records", "10", "--steps", "1"), "already exists")
    # with --dir, the next commands point at the kept stores
    text = ok(cli("demo", "--dir", tmp_path / "kept", "--records", "64", "--steps", "2",
                  "--batch-size", "8")).stdout
    assert f"loaderx info {tmp_path / 'kept'}/label" in text and "loaderx demo --dir" not in text


# ---------------------------------------------------------------------------
# info
# ---------------------------------------------------------------------------


def _disk(p: Path) -> int:
    return sum((p / f).stat().st_size for f in ("meta.zr", "data.zr", "dict.zr", "sums.zr") if (p / f).exists())


def test_info_json_and_text(stores):
    got = json.loads(ok(cli("info", "--json", stores["dense"], stores["ragged"], stores["dict"])).stdout)
    dense, ragged, zdict = got
    assert dense == {
        "path": str(stores["dense"]), "kind": "Dense", "shards": 0, "dtype": "float32",
        "item_shape": [3, 4], "codec": "zstd", "layout": "2.0.0",
        "layout_releases": "loaderx 2.0.0–2.0.7", "records": 40, "logical_bytes": DENSE.nbytes,
        "disk_bytes": _disk(stores["dense"]), "ratio": DENSE.nbytes / _disk(stores["dense"]),
        "dict_bytes": 0, "features": None,  # built by create, not convert: no sidecar
    }
    # A Ragged record's logic length is its payload plus its u64 shape prefix.
    logical = sum(r.nbytes + 8 + 8 * r.ndim for r in RAGGED)
    assert ragged["kind"] == "Ragged" and ragged["item_shape"] is None
    assert ragged["records"] == len(RAGGED) and ragged["codec"] == "raw"
    assert ragged["logical_bytes"] == logical == sum(loc(stores["ragged"], i)[2] for i in range(len(RAGGED)))
    assert ragged["disk_bytes"] == _disk(stores["ragged"])
    assert zdict["codec"] == "zstd_dict" and zdict["dict_bytes"] == len(stores["dict_bytes"])
    assert zdict["disk_bytes"] == _disk(stores["dict"])  # counts dict.zr
    assert tools.info(stores["dense"]) == dense

    text = ok(cli("info", stores["dense"], stores["dict"])).stdout
    for needle in ("Dense", "float32", "(3, 4)", "zstd", "records     40", "ratio", "dictionary  none",
                   "zstd_dict", "KiB"):
        assert needle in text, text


def test_info_failures(tmp_path, stores):
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("hi")
    fails(cli("info", tmp_path / "missing"), "no such file or directory")
    fails(cli("info", tmp_path / "empty"), "not a Zrecord store")
    fails(cli("info", tmp_path / "file.txt"), "not a store directory")
    # a parent of stores names them
    fails(cli("info", tmp_path), "not a Zrecord store", "dense")
    proc = cli("info", "--json", stores["dense"], tmp_path / "missing")
    assert proc.returncode == 1
    got = json.loads(proc.stdout)
    assert got[0]["kind"] == "Dense" and "no such file" in got[1]["error"]


# ---------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------


def test_verify_sound_stores(stores):
    proc = ok(cli("verify", stores["dense"], stores["ragged"], stores["dict"]))
    assert proc.stdout.count("ok ") == 3 and "3 of 3 stores sound" in proc.stdout
    assert proc.stderr == ""  # no progress drawing into a pipe
    r = tools.verify(stores["ragged"])
    assert r == tools.VerifyResult(str(stores["ragged"]), True, len(RAGGED), None, None, "Ragged",
                                   "sidecar")
    assert r
    assert "matches its checksum (sums.zr)" in proc.stdout
    assert "matches its checksum (zstd frame checksums)" in proc.stdout


def test_verify_finds_a_corrupt_zstd_frame(tmp_path, stores):
    bad = tmp_path / "bad_zstd"
    shutil.copytree(stores["dense"], bad)
    offset, phys, _ = loc(bad, 17)
    data = bytearray((bad / "data.zr").read_bytes())
    for k in range(offset, offset + 4):  # the frame's magic number
        data[k] ^= 0xFF
    (bad / "data.zr").write_bytes(bytes(data))

    r = tools.verify(bad)
    assert not r.ok and r.first_bad_index == 17 and r.records == 40
    assert "-7" in r.error
    out = fails(cli("verify", stores["ragged"], bad), "record 17", "FAILED", "1 failed")
    assert "ok " in out  # the sound store is still reported as sound
    got = json.loads(cli("verify", "--json", bad).stdout)
    assert got[0]["first_bad_index"] == 17 and got[0]["ok"] is False


def test_verify_finds_a_bad_ragged_shape_prefix(tmp_path, stores):
    bad = tmp_path / "bad_shape"
    shutil.copytree(stores["ragged"], bad)
    # Without its checksums, the structure checks alone find the damage.
    (bad / "sums.zr").unlink()
    offset, _, _ = loc(bad, 9)
    data = bytearray((bad / "data.zr").read_bytes())
    assert struct.unpack_from("<Q", data, offset)[0] == 1  # ndim of a 1-D record
    struct.pack_into("<Q", data, offset + 8, 1000)  # its one dimension
    (bad / "data.zr").write_bytes(bytes(data))
    r = tools.verify(bad)
    assert (r.ok, r.first_bad_index) == (False, 9)
    assert "shape" in r.error
    fails(cli("verify", bad), "record 9", "shape")


def test_verify_checks_content_where_checksums_exist(tmp_path):
    """Bytes overwritten inside a record are found by its checksum (zstd
    frames, or a raw store's sums.zr); a store without checksums passes on
    structure alone, and verify says that is all it checked."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 8, size=(1000, 64), dtype=np.uint8)
    for codec, checksums in (("zstd", True), ("raw", True), ("raw", False)):
        path = tmp_path / f"{codec}-{checksums}"
        with Dense.create(path, np.uint8, (64,), codec=codec, checksums=checksums) as w:
            w.append(data)
        offset, phys, _ = loc(path, 498)
        raw = bytearray((path / "data.zr").read_bytes())
        middle = offset + phys // 2 - 4
        raw[middle:middle + 8] = bytes(b ^ 0x5A for b in raw[middle:middle + 8])
        (path / "data.zr").write_bytes(bytes(raw))
        r = tools.verify(path)
        if checksums:
            assert (r.ok, r.first_bad_index) == (False, 498), r
            assert r.content == ("frames" if codec == "zstd" else "sidecar")
            with pytest.raises(ZrecordError):
                Dense.open(path, verify_checksums=True)[498]
        else:
            assert r.ok and r.content is None
            out = ok(cli("verify", path)).stdout
            assert "structure only: the store has no checksums" in out


def test_verify_missing_and_non_stores(tmp_path, stores):
    (tmp_path / "not_a_store").mkdir()
    (tmp_path / "not_a_store" / "notes.txt").write_text("x")
    fails(cli("verify", tmp_path / "nope"), "no such file or directory")
    fails(cli("verify", tmp_path / "not_a_store"), "not a Zrecord store")
    # a store whose header is damaged does not open: reported, not crashed
    broken = tmp_path / "broken"
    shutil.copytree(stores["dense"], broken)
    meta = bytearray((broken / "meta.zr").read_bytes())
    meta[31] = 9  # unknown codec byte
    (broken / "meta.zr").write_bytes(bytes(meta))
    r = tools.verify(broken)
    assert not r.ok and r.records is None and r.error
    fails(cli("verify", broken), "FAILED", str(broken))


# ---------------------------------------------------------------------------
# convert: NumPy
# ---------------------------------------------------------------------------


def test_convert_npy_in_chunks(tmp_path):
    src = tmp_path / "big.npy"
    arr = (np.arange(1003 * 15, dtype=np.float32).reshape(1003, 3, 5) * 0.25)
    np.save(src, arr)
    out = ok(cli("convert", src, tmp_path / "s", "--chunk-records", "64")).stdout
    assert "1,003 records" in out and "Dense float32 (3, 5)" in out
    # --codec auto (the default): 60-byte records of distinct floats do not pay for zstd frames
    assert "raw (auto)" in out
    assert_dense(tmp_path / "s", arr, codec="raw")
    # the same through the API, counting the chunks
    calls = []
    tools.convert(src, tmp_path / "s2", codec="raw", chunk_records=100,
                  progress=lambda done, total: calls.append((done, total)))
    assert calls == [(min(1003, 100 * (i + 1)), 1003) for i in range(11)]
    assert_dense(tmp_path / "s2", arr, codec="raw")
    # a column-major array converts in order too
    np.save(tmp_path / "f.npy", np.asfortranarray(arr))
    tools.convert(tmp_path / "f.npy", tmp_path / "f", chunk_records=128)
    assert_dense(tmp_path / "f", arr)
    # dictionary codec, and a scalar-per-record array
    labels = np.arange(5000, dtype=np.int64) % 7
    np.save(tmp_path / "labels.npy", labels)
    ok(cli("convert", tmp_path / "labels.npy", tmp_path / "l", "--codec", "zstd_dict", "--tier", "fast",
           "--quiet", "--chunk-records", "999"))
    assert_dense(tmp_path / "l", labels, codec="zstd_dict")
    # failures: existing destination, missing source, unknown format
    fails(cli("convert", src, tmp_path / "s"), "already exists")
    fails(cli("convert", tmp_path / "missing.npy", tmp_path / "x"), "no such file")
    (tmp_path / "data.csv").write_text("1,2\n")
    fails(cli("convert", tmp_path / "data.csv", tmp_path / "x"), "cannot convert data.csv")
    assert not (tmp_path / "x").exists()


def test_convert_npz_arrays(tmp_path):
    arrays = {
        "x": np.arange(300 * 4, dtype=np.int16).reshape(300, 2, 2),
        "y": np.linspace(0, 1, 77),
        "z": (np.arange(50 * 8) % 251).astype(np.uint8).reshape(50, 8),
    }
    src = tmp_path / "a.npz"
    np.savez_compressed(src, **arrays)
    out = ok(cli("convert", src, tmp_path / "all", "--chunk-records", "32")).stdout
    for name, arr in arrays.items():
        assert f"{name} -> " in out
        assert_dense(tmp_path / "all" / name, arr)
    ok(cli("convert", src, tmp_path / "one", "--key", "y", "--codec", "raw"))
    assert_dense(tmp_path / "one", arrays["y"], codec="raw")
    ok(cli("convert", src, tmp_path / "two", "--columns", "z,x", "--quiet"))
    assert sorted(os.listdir(tmp_path / "two")) == ["x", "z"]
    fails(cli("convert", src, tmp_path / "k", "--key", "w"), "no array 'w'")
    assert not (tmp_path / "k").exists()
    # object arrays are refused, and nothing is left behind
    np.savez(tmp_path / "obj.npz", good=np.arange(3), bad=np.array([{"a": 1}], dtype=object))
    fails(cli("convert", tmp_path / "obj.npz", tmp_path / "o"), "unsupported column type", "bad", "object")
    assert not (tmp_path / "o").exists()


def test_convert_store_to_another_codec(tmp_path, stores):
    ok(cli("convert", stores["ragged"], tmp_path / "r", "--codec", "zstd_dict", "--tier", "fast",
           "--quiet"))
    assert_ragged(tmp_path / "r", RAGGED, codec="zstd_dict")
    tools.convert(stores["dense"], tmp_path / "d", codec="raw", chunk_records=7)
    assert_dense(tmp_path / "d", DENSE, codec="raw")


# ---------------------------------------------------------------------------
# convert: Parquet / Arrow / Hugging Face datasets (optional extra)
# ---------------------------------------------------------------------------


N_ROWS = 257
_rng = np.random.default_rng(7)
FIXED = _rng.random((N_ROWS, 4)).astype(np.float32)
VAR = [_rng.integers(0, 1000, size=int(k)).astype(np.int32) for k in _rng.integers(1, 12, size=N_ROWS)]
NESTED = [_rng.random((int(k), 3)).astype(np.float64) for k in _rng.integers(1, 5, size=N_ROWS)]
SCALAR = _rng.integers(-5, 5, size=N_ROWS).astype(np.int64)
EQUAL = _rng.integers(0, 9, size=(N_ROWS, 2, 3)).astype(np.int16)


def _table():
    pa = pytest.importorskip("pyarrow")
    return pa.table({
        "fixed": pa.FixedSizeListArray.from_arrays(pa.array(FIXED.reshape(-1)), 4),
        "var": pa.array([v.tolist() for v in VAR], pa.list_(pa.int32())),
        "nested": pa.array([x.tolist() for x in NESTED], pa.list_(pa.list_(pa.float64()))),
        "scalar": pa.array(SCALAR),
        "equal": pa.array([e.tolist() for e in EQUAL], pa.list_(pa.list_(pa.int16()))),
        "text": pa.array([f"row {i}" for i in range(N_ROWS)]),
    })


NUMERIC = "fixed,var,nested,scalar,equal"


def _check_columns(dst: Path, codec: str | None = None) -> None:
    assert_dense(dst / "fixed", FIXED, codec)
    assert_ragged(dst / "var", VAR, codec)
    assert_ragged(dst / "nested", NESTED, codec)
    assert_dense(dst / "scalar", SCALAR, codec)
    assert_dense(dst / "equal", EQUAL, codec)  # equal-length nested lists become Dense


def test_convert_parquet(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "t.parquet"
    pq.write_table(_table(), src, row_group_size=60)
    out = ok(cli("convert", src, tmp_path / "p", "--columns", NUMERIC, "--chunk-records", "50")).stdout
    assert "Ragged int32" in out and "Dense float32 (4,)" in out
    _check_columns(tmp_path / "p")
    assert not (tmp_path / "p" / "text").exists()
    # the stores have equal lengths and load together as one DataLoader dict
    streams = {name: tools.open_store(tmp_path / "p" / name) for name in NUMERIC.split(",")}
    try:
        with DataLoader(streams, batch_size=8, mode=0) as dl:
            batch = next(dl)
        assert batch["fixed"].shape == (8, 4) and len(batch["var"]) == 8
        np.testing.assert_array_equal(batch["scalar"], SCALAR[:8])
    finally:
        for s in streams.values():
            s.close()
    # zstd_dict trains one dictionary per column
    ok(cli("convert", src, tmp_path / "pd", "--columns", "var,fixed", "--codec", "zstd_dict",
           "--tier", "fast", "--quiet"))
    assert_ragged(tmp_path / "pd" / "var", VAR, "zstd_dict")
    assert_dense(tmp_path / "pd" / "fixed", FIXED, "zstd_dict")
    # one column straight into DST
    assert tools.convert(src, tmp_path / "one", key="nested") == {"nested": tmp_path / "one"}
    assert_ragged(tmp_path / "one", NESTED)


def pa_struct_column():
    pa = pytest.importorskip("pyarrow")
    return pa.array([{"a": i, "b": float(i)} for i in range(N_ROWS)])


def test_convert_unsupported_column_type(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "t.parquet"
    pq.write_table(_table(), src)
    table = _table().append_column("pair", pa_struct_column())
    pq.write_table(table, src)
    fails(cli("convert", src, tmp_path / "p"), "unsupported column type", "'pair'", "struct")
    assert not (tmp_path / "p").exists()
    fails(cli("convert", src, tmp_path / "p", "--columns", "scalar,nope"), "no column 'nope'")
    with pytest.raises(tools.UnsupportedColumnError, match="null value in row 1"):
        import pyarrow as pa

        tools.convert(pa.table({"a": pa.array([[1], None, [2]])}), tmp_path / "n")
    assert not (tmp_path / "n").exists()


def test_convert_arrow_ipc_and_feather(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.feather as feather

    table = _table().drop_columns(["text"])
    feather.write_feather(table, tmp_path / "t.feather", chunksize=100)
    ok(cli("convert", tmp_path / "t.feather", tmp_path / "f", "--quiet"))
    _check_columns(tmp_path / "f")
    with pa.OSFile(str(tmp_path / "s.arrow"), "wb") as sink:  # the streaming IPC format
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table, max_chunksize=40)
    ok(cli("convert", tmp_path / "s.arrow", tmp_path / "s", "--quiet", "--chunk-records", "30"))
    _check_columns(tmp_path / "s")


def test_convert_hugging_face_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({
        "pixels": FIXED.reshape(N_ROWS, 2, 2).tolist(),
        "tokens": [v.tolist() for v in VAR],
        "label": SCALAR.tolist(),
        "meta": [{"source": f"s{i}", "page": i} for i in range(N_ROWS)],
    })
    ds.save_to_disk(str(tmp_path / "hf"))
    fails(cli("convert", tmp_path / "hf", tmp_path / "bad"), "unsupported column type", "meta")
    assert not (tmp_path / "bad").exists()
    ok(cli("convert", tmp_path / "hf", tmp_path / "out", "--columns", "pixels,tokens,label",
           "--chunk-records", "100"))
    assert_dense(tmp_path / "out" / "pixels", FIXED.reshape(N_ROWS, 2, 2).astype(np.float64))
    assert_ragged(tmp_path / "out" / "tokens", [v.astype(np.int64) for v in VAR])
    assert_dense(tmp_path / "out" / "label", SCALAR)
    # a DatasetDict: one directory per split, or --key for one split
    datasets.DatasetDict({"train": ds, "test": ds.select(range(5))}).save_to_disk(str(tmp_path / "hfd"))
    ok(cli("convert", tmp_path / "hfd", tmp_path / "dd", "--columns", "label", "--quiet"))
    assert_dense(tmp_path / "dd" / "train" / "label", SCALAR)
    assert_dense(tmp_path / "dd" / "test" / "label", SCALAR[:5])
    tools.convert(tmp_path / "hfd", tmp_path / "t", key="test", columns=["label"])
    assert_dense(tmp_path / "t" / "label", SCALAR[:5])


def test_convert_dataset_object(tmp_path):
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({
        "image": datasets.Array2D((2, 3), "float32"),
        "seq": datasets.Sequence(datasets.Value("int32")),
        "label": datasets.ClassLabel(num_classes=10),
    })
    images = _rng.random((40, 2, 3)).astype(np.float32)
    seqs = [np.arange(1 + i % 5, dtype=np.int32) + i for i in range(40)]
    labels = np.arange(40, dtype=np.int64) % 10
    ds = datasets.Dataset.from_dict(
        {"image": images, "seq": seqs, "label": labels, "rid": np.arange(40)},
        features=datasets.Features({**features, "rid": datasets.Value("int64")}),
    )
    view = ds.shuffle(seed=3).select(range(25))  # an indices mapping over the table
    idx = np.array(view["rid"])
    assert not np.array_equal(idx, np.arange(25))
    got = tools.convert(view, tmp_path / "o", codec="zstd_dict", tier="fast", columns="image,seq,label")
    assert set(got) == {"image", "seq", "label"}
    assert_dense(tmp_path / "o" / "image", images[idx], "zstd_dict")
    assert_ragged(tmp_path / "o" / "seq", [seqs[i] for i in idx], "zstd_dict")
    assert_dense(tmp_path / "o" / "label", labels[idx], "zstd_dict")


def test_missing_optional_extra(tmp_path):
    """Without pyarrow/datasets, the tabular formats fail naming the extra; .npy still works."""
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    for name in ("pyarrow", "datasets"):
        (shadow / f"{name}.py").write_text(f"raise ImportError('{name} is hidden by this test')\n")
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    (tmp_path / "t.arrow").write_bytes(b"ARROW1")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "dataset_info.json").write_text("{}")
    (hf / "state.json").write_text("{}")
    for src in ("t.parquet", "t.arrow", "hf"):
        fails(cli("convert", tmp_path / src, tmp_path / "out", PYTHONPATH=str(shadow)), EXTRA_HINT, "pyarrow")
    assert not (tmp_path / "out").exists()
    np.save(tmp_path / "a.npy", np.arange(10))
    ok(cli("convert", tmp_path / "a.npy", tmp_path / "a", PYTHONPATH=str(shadow)))
    assert_dense(tmp_path / "a", np.arange(10))


# ---------------------------------------------------------------------------
# progress line
# ---------------------------------------------------------------------------


class FakeTTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_only_on_a_terminal_and_throttles():
    tty = FakeTTY()
    p = Progress(1_000_000, "convert x", stream=tty, interval=0.05)
    t0 = time.monotonic()
    for _ in range(200_000):
        p.update(1)
    elapsed = time.monotonic() - t0
    p.update(0)
    draws = tty.getvalue().count("\r")
    assert draws <= elapsed / 0.05 + 2
    time.sleep(0.06)
    p.update(5)
    text = tty.getvalue()
    assert "convert x: 200,005/1,000,000 records" in text and "records/s" in text and "ETA" in text
    p.close()
    assert tty.getvalue().endswith("\r")  # the line is erased for what follows
    assert not p.enabled

    pipe = io.StringIO()  # not a terminal: counts, never draws
    q = Progress(10, stream=pipe, interval=0)
    q.update(10)
    q.close()
    assert q.done == 10 and pipe.getvalue() == ""
    quiet = Progress(10, stream=FakeTTY(), enabled=False, interval=0)
    quiet.update(3)
    assert quiet.stream.getvalue() == ""

    seen = []
    cb = make_progress(lambda d, t: seen.append((d, t)), 7, "x")
    cb.update(3)
    cb.update(4)
    assert seen == [(3, 7), (7, 7)]
    with pytest.raises(TypeError):
        make_progress(42, 1, "x")


def test_api_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="unknown codec"):
        tools.convert(np.arange(3), tmp_path / "a", codec="lz4")
    with pytest.raises(ValueError, match="tier"):
        tools.convert(np.arange(3), tmp_path / "a", codec="zstd_dict", tier="huge")
    with pytest.raises(ValueError, match="chunk_records"):
        tools.convert(np.arange(3), tmp_path / "a", chunk_records=0)
    with pytest.raises(TypeError):
        tools.convert(object(), tmp_path / "a")
    with pytest.raises(FileNotFoundError):
        tools.info(tmp_path / "nothing")
    with pytest.raises(tools.NotAStoreError):
        tools.open_store(tmp_path)
    assert not (tmp_path / "a").exists()
    got = tools.convert(np.arange(12, dtype=np.uint16).reshape(4, 3), tmp_path / "arr")
    assert got == {"arr": tmp_path / "arr"}
    assert_dense(tmp_path / "arr", np.arange(12, dtype=np.uint16).reshape(4, 3))
    assert math.isclose(tools.info(tmp_path / "arr")["logical_bytes"], 24)
