"""Interoperability with the published loaderx 2.0.0 (the reference).

The reference lives in its own virtualenv (``<repo>/.venv-ref``, built once by
``scripts/reference_env.py``) and is only ever run in subprocesses, since both
packages import as ``loaderx``.  Directions covered:

1. stores we write are read back exactly by the reference;
2. stores the reference writes are read back exactly by us;
3. OS locks interoperate (a writer on either side makes the other's open busy);
4. a writer of ours that dies before close() leaves a store the reference
   refuses to open.
"""
from __future__ import annotations

import json
import queue
import subprocess
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from loaderx.utils import train_dict
from loaderx.zrecord import Dense, Ragged, ZrecordError

BUSY = -13
STEP_TIMEOUT = 60          # seconds for any single reference subprocess step


# --------------------------------------------------------------------------
# the case matrix (shared by both directions)
# --------------------------------------------------------------------------

def _structured_u8(n, shape, seed):
    rng = np.random.default_rng(seed)
    grids = np.indices(shape)
    out = np.empty((n, *shape), dtype=np.uint8)
    for i in range(n):
        v = sum(g * (k + 1 + i % (k + 3)) for k, g in enumerate(grids))
        out[i] = (v % 200).astype(np.uint8) ^ rng.integers(0, 3, size=shape, dtype=np.uint8)
    return out


def _bits(dtype, shape, seed):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    return rng.integers(0, 256, size=count * dt.itemsize, dtype=np.uint8).view(dt).reshape(shape)


def _strings(n, width, seed):
    rng = np.random.default_rng(seed)
    alphabet = list("abcxyz019 é漢\U0001F600")
    return np.array(["".join(rng.choice(alphabet, size=int(rng.integers(0, width + 1))))
                     for _ in range(n)], dtype=f"<U{width}")


def _build_cases():
    rng = np.random.default_rng(2024)
    cases = {}

    def dense(name, data, codec, dict_source=None):
        cases[name] = {"kind": "dense", "codec": codec, "dtype": data.dtype.str,
                       "item_shape": list(data.shape[1:]), "data": data, "dict": dict_source}

    def ragged(name, recs, dtype, codec, dict_source=None):
        cases[name] = {"kind": "ragged", "codec": codec, "dtype": np.dtype(dtype).str,
                       "data": recs, "dict": dict_source}

    dense("dense_f32_raw", _bits("<f4", (20, 3, 5), 1), "raw")
    dense("dense_u8_zstd", _structured_u8(30, (2, 8, 8), 2), "zstd")
    dense("dense_u8_zstd_dict_trained", _structured_u8(300, (16, 32), 3), "zstd_dict", "train")
    dense("dense_f64_zstd_dict_fixture", rng.standard_normal((40, 6)), "zstd_dict", "fixture")
    dense("dense_i64_scalar_zstd", rng.integers(-10**12, 10**12, size=100), "zstd")
    dense("dense_i64_scalar_raw", rng.integers(0, 10, size=33), "raw")
    dense("dense_bool_raw", rng.integers(0, 2, size=(17, 3, 3)).astype(bool), "raw")
    dense("dense_bool_zstd", rng.integers(0, 2, size=(50, 4)).astype(bool), "zstd")
    dense("dense_f16_zstd", _bits("<f2", (25, 4), 4), "zstd")
    dense("dense_f16_scalar_raw", _bits("<f2", (9,), 5), "raw")
    dense("dense_c8_zstd", _bits("<c8", (7, 2), 6), "zstd")
    dense("dense_U5_raw", _strings(24, 5, 7).reshape(8, 3), "raw")
    dense("dense_M8_zstd", _bits("<i8", (6, 2), 8).view("<M8[ns]"), "zstd")

    lengths = [1, 5, 17, 3, 64, 2, 9]
    ragged("ragged_i32_raw", [rng.integers(-2**31, 2**31, size=n, dtype=np.int32) for n in lengths],
           "<i4", "raw")
    ragged("ragged_f64_mixed_zstd",
           [np.array(1.5), rng.standard_normal(4), rng.standard_normal((2, 3)),
            rng.standard_normal((1, 2, 3)), np.array(-0.0), rng.standard_normal((5, 1)),
            rng.standard_normal((2, 2, 2, 2))], "<f8", "zstd")
    ragged("ragged_f64_mixed_raw",
           [np.array(2.5), np.arange(3.0), np.arange(6.0).reshape(3, 2), np.array(np.inf)],
           "<f8", "raw")
    imgs = _structured_u8(12, (3, 20, 20), 9)
    ragged("ragged_u8_zstd_dict_fixture",
           [imgs[i][:, : 5 + i, : 20 - i] for i in range(12)], "|u1", "zstd_dict", "fixture")
    rows = _structured_u8(300, (16, 32), 10).reshape(300, -1)
    ragged("ragged_u8_zstd_dict_trained", [rows[i][: 64 + i] for i in range(300)], "|u1",
           "zstd_dict", "train")
    ragged("ragged_bool_zstd",
           [np.array(True), np.array([True, False, True]), np.zeros((2, 2), bool),
            np.ones((1,), bool)], "|b1", "zstd")
    ragged("ragged_f16_raw",
           [_bits("<f2", (), 11), _bits("<f2", (3,), 12), _bits("<f2", (), 13),
            _bits("<f2", (2, 2), 14)], "<f2", "raw")
    ragged("ragged_scalars_zstd", [np.array(v, dtype=np.int64) for v in (0, -1, 2**62, 7)],
           "<i8", "zstd")
    ragged("ragged_U5_raw", [_strings(3, 5, 15), _strings(1, 5, 16).reshape(()),
                             _strings(4, 5, 17).reshape(2, 2)], "<U5", "raw")
    ragged("ragged_M8_zstd", [_bits("<i8", (3,), 18).view("<M8[ns]"),
                              _bits("<i8", (), 19).view("<M8[ns]")], "<M8[ns]", "zstd")
    ragged("ragged_S3_zstd", [np.array([b"ab", b"", b"xyz"], dtype="|S3"),
                              np.array(b"q", dtype="|S3")], "|S3", "zstd")
    return cases


CASES = _build_cases()
CASE_NAMES = sorted(CASES)


def save_source(case, path: Path) -> Path:
    if case["kind"] == "dense":
        out = path.with_suffix(".npy")
        np.save(out, case["data"], allow_pickle=False)
    else:
        out = path.with_suffix(".npz")
        np.savez(out, **{"r%05d" % i: r for i, r in enumerate(case["data"])})
    return out


def load_result(kind, path: Path):
    if kind == "dense":
        return np.load(path, allow_pickle=False)
    with np.load(path, allow_pickle=False) as z:
        keys = sorted(z.files)
        assert keys == ["r%05d" % i for i in range(len(keys))]
        return [z[k] for k in keys]


def assert_same_records(case, got):
    want = case["data"]
    if case["kind"] == "dense":
        assert isinstance(got, np.ndarray)
        assert got.dtype.str == case["dtype"]
        assert got.shape == want.shape
        assert got.tobytes() == np.ascontiguousarray(want).tobytes()
    else:
        assert isinstance(got, list) and len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            assert isinstance(g, np.ndarray), i
            assert g.dtype.str == case["dtype"], i
            assert g.shape == w.shape, (i, g.shape, w.shape)
            assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes(), i


# --------------------------------------------------------------------------
# reference-side scripts (run with the reference interpreter, -I)
# --------------------------------------------------------------------------

# loaderx 2.0.0 now and then dies with SIGSEGV while the interpreter tears
# down (its native worker pool at exit), after the script's work is done and
# reported. Every reference script therefore ends by flushing and leaving
# with os._exit(0): a failure inside the script still exits non-zero, and a
# teardown crash of the reference is not what these tests are about.
REF_EXIT = textwrap.dedent("""
    import os as _os, sys as _sys
    _sys.stdout.flush()
    _sys.stderr.flush()
    _os._exit(0)
""")

REF_READ = textwrap.dedent("""
    import json, sys, traceback
    from pathlib import Path
    import numpy as np
    import loaderx
    from loaderx.zrecord import Dense, Ragged
    assert loaderx.__version__ == "2.0.0", loaderx.__version__
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    results = {}
    for item in spec:
        name, kind, path = item["name"], item["kind"], item["path"]
        try:
            cls = Dense if kind == "dense" else Ragged
            with cls.open(path) as ds:
                info = {"len": len(ds), "codec": ds.codec, "dtype": ds.dtype.str,
                        "has_dict": ds.has_dict()}
                if kind == "dense":
                    info["item_shape"] = list(ds.item_shape)
                    np.save(out / (name + ".npy"), ds[:], allow_pickle=False)
                else:
                    recs = ds[:]
                    np.savez(out / (name + ".npz"), **{"r%05d" % i: r for i, r in enumerate(recs)})
            results[name] = {"ok": True, **info}
        except Exception as exc:
            results[name] = {"ok": False, "error": type(exc).__name__, "code": getattr(exc, "code", None),
                             "message": str(exc), "tb": traceback.format_exc()}
    (out / "results.json").write_text(json.dumps(results))
""") + REF_EXIT

REF_WRITE = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    import numpy as np
    import loaderx
    from loaderx.utils import train_dict
    from loaderx.zrecord import Dense, Ragged
    assert loaderx.__version__ == "2.0.0", loaderx.__version__
    spec = json.loads(Path(sys.argv[1]).read_text())
    for item in spec:
        if item["kind"] == "dense":
            data = np.load(item["source"], allow_pickle=False)
        else:
            with np.load(item["source"], allow_pickle=False) as z:
                data = [z[k] for k in sorted(z.files)]
        d = None
        if item["dict"] == "train":
            d = train_dict(data, tier="fast")
        elif item["dict"]:
            d = Path(item["dict"]).read_bytes()
        dtype = np.dtype(item["dtype"])
        if item["kind"] == "dense":
            with Dense.create(item["path"], dtype, tuple(item["item_shape"]), codec=item["codec"],
                              dict_bytes=d) as w:
                half = max(1, len(data) // 2)
                w.append(data[:half])
                if len(data) > half:
                    w.append(data[half:])
        else:
            with Ragged.create(item["path"], dtype, codec=item["codec"], dict_bytes=d) as w:
                w.append(data[:1])
                if len(data) > 1:
                    w.append(iter(data[1:]))
    print("done")
""") + REF_EXIT

REF_HOLD = textwrap.dedent("""
    import sys
    import numpy as np
    from loaderx.zrecord import Dense
    mode, path = sys.argv[1], sys.argv[2]
    if mode == "writer":
        h = Dense.create(path, np.int32, (3,), codec="zstd")
        h.append(np.arange(12, dtype=np.int32).reshape(4, 3))
    else:
        h = Dense.open(path)
        assert len(h) > 0
    print("READY", flush=True)
    sys.stdin.readline()
    h.close()
    print("CLOSED", flush=True)
""") + REF_EXIT

REF_TRY_OPEN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from loaderx.zrecord import Dense, Ragged
    kind, path = sys.argv[1], sys.argv[2]
    cls = Dense if kind == "dense" else Ragged
    try:
        ds = cls.open(path)
    except Exception as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__,
                          "code": getattr(exc, "code", None), "message": str(exc)}))
    else:
        recs = ds[:]
        n = len(ds)
        flat = recs.tolist() if kind == "dense" else [r.tolist() for r in recs]
        ds.close()
        print(json.dumps({"ok": True, "len": n, "records": flat}))
""") + REF_EXIT


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text(body)
    return path


def read_with_reference(run_reference, tmp_path: Path, spec: list[dict]) -> tuple[dict, Path]:
    """Has loaderx 2.0.0 (the ``run_reference`` fixture) read every store of
    ``spec`` (REF_READ): its per-store results, and the folder holding the
    arrays it read."""
    out = tmp_path / "ref_out"
    out.mkdir()
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    run_reference(write_script(tmp_path, "ref_read.py", REF_READ), tmp_path / "spec.json", out,
                  timeout=STEP_TIMEOUT)
    return json.loads((out / "results.json").read_text()), out


def last_json(proc):
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# 1. we write, the reference reads
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fixture_dict(fixtures_dir) -> Path:
    return fixtures_dir / "dict_fast_images.zdict"


def _dict_for(case, fixture_dict, ours: bool):
    if case["dict"] == "train":
        return train_dict(case["data"], tier="fast") if ours else "train"
    if case["dict"] == "fixture":
        return fixture_dict.read_bytes() if ours else str(fixture_dict)
    return None


def write_ours(case, path: Path, fixture_dict: Path):
    d = _dict_for(case, fixture_dict, ours=True)
    data = case["data"]
    if case["kind"] == "dense":
        with Dense.create(path, np.dtype(case["dtype"]), tuple(case["item_shape"]),
                          codec=case["codec"], dict_bytes=d) as w:
            half = max(1, len(data) // 2)
            w.append(data[:half])
            if len(data) > half:
                w.append(data[half:])
    else:
        with Ragged.create(path, np.dtype(case["dtype"]), codec=case["codec"], dict_bytes=d) as w:
            w.append(data[:1])
            if len(data) > 1:
                w.append(iter(data[1:]))
    return d


@pytest.fixture(scope="module")
def ours_read_by_reference(tmp_path_factory, run_reference, fixture_dict):
    root = tmp_path_factory.mktemp("ours_written")
    spec = []
    for name in CASE_NAMES:
        write_ours(CASES[name], root / name, fixture_dict)
        spec.append({"name": name, "kind": CASES[name]["kind"], "path": str(root / name)})
    out = root / "ref_out"
    out.mkdir()
    (root / "spec.json").write_text(json.dumps(spec))
    script = write_script(root, "ref_read.py", REF_READ)
    run_reference(script, root / "spec.json", out, timeout=STEP_TIMEOUT)
    results = json.loads((out / "results.json").read_text())
    return root, out, results


@pytest.mark.parametrize("name", CASE_NAMES)
def test_reference_reads_our_stores(ours_read_by_reference, name):
    root, out, results = ours_read_by_reference
    case = CASES[name]
    res = results[name]
    assert res["ok"], res.get("tb", res)
    assert res["len"] == len(case["data"])
    assert res["codec"] == case["codec"]
    assert res["dtype"] == case["dtype"]
    assert res["has_dict"] is (case["codec"] == "zstd_dict")
    if case["kind"] == "dense":
        assert res["item_shape"] == case["item_shape"]
        got = load_result("dense", out / (name + ".npy"))
    else:
        got = load_result("ragged", out / (name + ".npz"))
    assert_same_records(case, got)


# --------------------------------------------------------------------------
# 2. the reference writes, we read
# --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reference_written(tmp_path_factory, run_reference, fixture_dict):
    root = tmp_path_factory.mktemp("ref_written")
    spec = []
    for name in CASE_NAMES:
        case = CASES[name]
        source = save_source(case, root / ("src_" + name))
        item = {"name": name, "kind": case["kind"], "path": str(root / name),
                "dtype": case["dtype"], "codec": case["codec"], "source": str(source),
                "dict": _dict_for(case, fixture_dict, ours=False)}
        if case["kind"] == "dense":
            item["item_shape"] = case["item_shape"]
        spec.append(item)
    (root / "spec.json").write_text(json.dumps(spec))
    script = write_script(root, "ref_write.py", REF_WRITE)
    run_reference(script, root / "spec.json", timeout=STEP_TIMEOUT)
    return root


@pytest.mark.parametrize("name", CASE_NAMES)
def test_we_read_reference_stores(reference_written, name):
    case = CASES[name]
    path = reference_written / name
    cls = Dense if case["kind"] == "dense" else Ragged
    with cls.open(path) as ds:
        assert len(ds) == len(case["data"])
        assert ds.codec == case["codec"]
        assert ds.dtype.str == case["dtype"]
        assert ds.has_dict() is (case["codec"] == "zstd_dict")
        if case["kind"] == "dense":
            assert ds.item_shape == tuple(case["item_shape"])
        assert_same_records(case, ds[:])
        rng = np.random.default_rng(len(name))
        idx = rng.integers(0, len(ds), size=2 * len(ds) + 1)
        got = ds[idx]
        if case["kind"] == "dense":
            assert got.tobytes() == np.ascontiguousarray(case["data"][idx]).tobytes()
        else:
            for g, i in zip(got, idx):
                assert g.shape == case["data"][i].shape
                assert np.ascontiguousarray(g).tobytes() == case["data"][i].tobytes()


RAW_CASES = [n for n in CASE_NAMES if CASES[n]["codec"] == "raw"]


@pytest.mark.parametrize("name", RAW_CASES)
def test_raw_stores_are_byte_compatible(reference_written, ours_read_by_reference, name):
    """Same records, raw codec: identical static page and identical record bytes."""
    ours = ours_read_by_reference[0] / name
    ref = reference_written / name
    ours_meta = (ours / "meta.zr").read_bytes()
    ref_meta = (ref / "meta.zr").read_bytes()
    assert ours_meta[:4096] == ref_meta[:4096]
    n = int.from_bytes(ref_meta[0:8], "little")
    assert len(ours_meta) >= 4096 + 16 * n
    ours_data = (ours / "data.zr").read_bytes()
    ref_data = (ref / "data.zr").read_bytes()

    def record(meta, data, i):
        e = meta[4096 + 16 * i: 4096 + 16 * (i + 1)]
        off = int.from_bytes(e[0:8], "little")
        phys = int.from_bytes(e[8:12], "little")
        logic = int.from_bytes(e[12:16], "little")
        assert phys == logic
        return data[off:off + phys]

    for i in range(n):
        assert record(ours_meta, ours_data, i) == record(ref_meta, ref_data, i), i
    # Ours adds the checksum sidecar the reference ignores (it reads them above).
    assert {p.name for p in ours.iterdir()} == {p.name for p in ref.iterdir()} | {"sums.zr"}


@pytest.mark.parametrize("name", [n for n in CASE_NAMES if CASES[n]["dict"] == "fixture"])
def test_dict_file_matches_reference(reference_written, ours_read_by_reference, name):
    ours = ours_read_by_reference[0] / name
    ref = reference_written / name
    assert (ours / "dict.zr").read_bytes() == (ref / "dict.zr").read_bytes()


# --------------------------------------------------------------------------
# 3. locks across implementations
# --------------------------------------------------------------------------

class RefHolder:
    """A reference process holding a writer or reader open until told to close."""

    def __init__(self, reference_python, reference_env, script, mode, path):
        self.proc = subprocess.Popen(
            [str(reference_python), "-I", str(script), mode, str(path)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env=reference_env.clean_env(), cwd=str(script.parent))
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def expect(self, word, timeout=STEP_TIMEOUT):
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"reference holder did not say {word} within {timeout}s")
        if line != word:
            self.proc.kill()
            raise AssertionError(f"reference holder said {line!r}, expected {word}: "
                                 f"{self.proc.stderr.read()[-3000:]}")

    def release(self):
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        self.expect("CLOSED")
        assert self.proc.wait(timeout=STEP_TIMEOUT) == 0

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=STEP_TIMEOUT)


@pytest.fixture
def ref_holder(tmp_path, reference_python, reference_env):
    holders = []
    script = write_script(tmp_path, "ref_hold.py", REF_HOLD)

    def start(mode, path):
        h = RefHolder(reference_python, reference_env, script, mode, path)
        holders.append(h)
        h.expect("READY")
        return h

    yield start
    for h in holders:
        h.kill()


@pytest.fixture
def ref_try_open(tmp_path, run_reference):
    script = write_script(tmp_path, "ref_try_open.py", REF_TRY_OPEN)

    def run(kind, path):
        return last_json(run_reference(script, kind, path, timeout=STEP_TIMEOUT))

    return run


def _busy(fn):
    with pytest.raises(ZrecordError) as ei:
        fn()
    assert ei.value.code == BUSY, (ei.value.code, str(ei.value))


def test_reference_writer_blocks_our_open(tmp_path, ref_holder):
    p = tmp_path / "held"
    holder = ref_holder("writer", p)
    _busy(lambda: Dense.open(p))
    _busy(lambda: Ragged.open(p))
    holder.release()
    with Dense.open(p) as ds:
        assert ds[:].tolist() == np.arange(12, dtype=np.int32).reshape(4, 3).tolist()


def test_reference_reader_shares_with_our_reader(tmp_path, ref_holder):
    p = tmp_path / "shared"
    with Dense.create(p, np.int32, (3,)) as w:
        w.append(np.arange(9, dtype=np.int32).reshape(3, 3))
    holder = ref_holder("reader", p)
    with Dense.open(p) as a, Dense.open(p) as b:
        assert a[:].tolist() == b[:].tolist() == np.arange(9).reshape(3, 3).tolist()
    _busy(lambda: Dense.create(p, np.int32, (3,)))
    holder.release()


def test_our_writer_blocks_reference_open(tmp_path, ref_try_open):
    p = tmp_path / "ours_held"
    w = Dense.create(p, np.int32, (2,))
    try:
        w.append(np.arange(4, dtype=np.int32).reshape(2, 2))
        res = ref_try_open("dense", p)
        assert res["ok"] is False, res
        assert res["error"] == "ZrecordError" and res["code"] == BUSY, res
        res = ref_try_open("ragged", p)
        assert res["ok"] is False and res["code"] == BUSY, res
    finally:
        w.close()
    res = ref_try_open("dense", p)
    assert res == {"ok": True, "len": 2, "records": [[0, 1], [2, 3]]}


def test_our_reader_shares_with_reference_reader(tmp_path, ref_try_open):
    p = tmp_path / "ours_shared"
    with Ragged.create(p, np.int16, codec="raw") as w:
        w.append([np.array([1, 2], np.int16), np.array(3, np.int16)])
    with Ragged.open(p) as r:
        res = ref_try_open("ragged", p)
        assert res == {"ok": True, "len": 2, "records": [[1, 2], 3]}
        assert len(r) == 2


# --------------------------------------------------------------------------
# 4. a killed writer of ours leaves nothing the reference will open
# --------------------------------------------------------------------------

OUR_KILLED_WRITER = textwrap.dedent("""
    import os, sys
    import numpy as np
    from loaderx.zrecord import Dense, Ragged
    path, kind, appends = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "dense":
        w = Dense.create(path, np.float32, (2, 2), codec="zstd")
        for i in range(appends):
            w.append(np.full((3, 2, 2), i, dtype=np.float32))
    else:
        w = Ragged.create(path, np.float32, codec="raw")
        for i in range(appends):
            w.append([np.full(i + 1, i, dtype=np.float32)])
    print("appended", flush=True)
    os._exit(0)
""")


@pytest.mark.parametrize("kind", ["dense", "ragged"])
@pytest.mark.parametrize("appends", [0, 2])
def test_reference_refuses_our_killed_writer(tmp_path, run_ours, ref_try_open, kind, appends):
    p = tmp_path / "killed"
    proc = run_ours(OUR_KILLED_WRITER, p, kind, appends, timeout=STEP_TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "appended"
    for k in ("dense", "ragged"):
        res = ref_try_open(k, p)
        assert res["ok"] is False, res
        assert res["error"] in ("ZrecordError", "ValueError"), res
    with pytest.raises(ZrecordError) as ei:
        (Dense if kind == "dense" else Ragged).open(p)
    assert ei.value.code == -8


# --------------------------------------------------------------------------
# store sets: every shard is a plain store the reference opens
# --------------------------------------------------------------------------

def test_reference_reads_each_shard_of_our_sets(tmp_path, run_reference, fixture_dict):
    rng = np.random.default_rng(5)
    dense = rng.integers(0, 255, size=(45, 3, 5), dtype=np.uint8)
    ragged = [rng.standard_normal(int(n)).astype(np.float32) for n in rng.integers(1, 30, 23)]
    with Dense.create(tmp_path / "dense", np.uint8, (3, 5), codec="zstd_dict",
                      dict_bytes=fixture_dict.read_bytes(), shard_records=20) as w:
        w.append(dense)
    with Ragged.create(tmp_path / "ragged", np.float32, codec="zstd", shard_bytes=400) as w:
        w.append(ragged)
    spec, expected = [], {}
    for kind, data in (("dense", dense), ("ragged", ragged)):
        cls = Dense if kind == "dense" else Ragged
        with cls.open(tmp_path / kind) as s:
            start = 0
            for shard in s.shards:
                name = f"{kind}-{shard['path']}"
                spec.append({"name": name, "kind": kind, "path": str(tmp_path / kind / shard["path"])})
                expected[name] = data[start:start + shard["records"]]
                start += shard["records"]
            assert start == len(data) and len(s.shards) > 1
    results, out = read_with_reference(run_reference, tmp_path, spec)
    for name, want in expected.items():
        assert results[name]["ok"], results[name]
        if name.startswith("dense"):
            np.testing.assert_array_equal(np.load(out / f"{name}.npy"), want)
        else:
            got = np.load(out / f"{name}.npz")
            assert len(got.files) == len(want)
            for i, w in enumerate(want):
                np.testing.assert_array_equal(got["r%05d" % i], w)


# --------------------------------------------------------------------------
# converted stores: the features.json sidecar does not stop the reference
# --------------------------------------------------------------------------

def test_reference_reads_converted_stores_with_their_sidecar(tmp_path, run_reference):
    """`convert` output (encoded images, text, a ClassLabel, with --codec auto
    and with zstd_dict) carries features.json beside the store files; loaderx
    2.0.0 opens every store and reads exact values."""
    datasets = pytest.importorskip("datasets")
    image = pytest.importorskip("PIL.Image")
    import io

    from loaderx import tools

    rng = np.random.default_rng(9)
    pngs = []
    for h, w in rng.integers(2, 12, size=(40, 2)):
        buf = io.BytesIO()
        image.fromarray(rng.integers(0, 256, size=(int(h), int(w), 3), dtype=np.uint8)).save(buf, "PNG")
        pngs.append(buf.getvalue())
    texts = [f"caption {i} " + "word " * (i % 7) for i in range(40)]
    labels = rng.integers(0, 3, size=40)
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in pngs], "text": texts, "label": labels.tolist()},
        features=datasets.Features({"image": datasets.Image(), "text": datasets.Value("string"),
                                    "label": datasets.ClassLabel(names=["a", "b", "c"])}))
    ds.save_to_disk(str(tmp_path / "hf"))
    expected = {"image": [np.frombuffer(b, np.uint8) for b in pngs],
                "text": [np.frombuffer(t.encode(), np.uint8) for t in texts], "label": labels}
    spec = []
    for codec in ("auto", "zstd_dict"):
        out = tools.convert(tmp_path / "hf", tmp_path / codec, codec=codec, tier="fast")
        for name, path in out.items():
            assert (path / "features.json").is_file()
            spec.append({"name": f"{codec}-{name}", "kind": "dense" if name == "label" else "ragged",
                         "path": str(path)})
        assert tools.class_names(out["label"]) == ["a", "b", "c"]
    results, ref_out = read_with_reference(run_reference, tmp_path, spec)
    for item in spec:
        name = item["name"]
        res = results[name]
        assert res["ok"], res
        column = name.split("-", 1)[1]
        if name.startswith("zstd_dict"):
            assert res["codec"] == "zstd_dict" and res["has_dict"]
        if column == "label":
            np.testing.assert_array_equal(np.load(ref_out / f"{name}.npy"), expected["label"])
            continue
        got = np.load(ref_out / f"{name}.npz")
        assert len(got.files) == 40 and res["dtype"] == "|u1"
        for i, want in enumerate(expected[column]):
            np.testing.assert_array_equal(got["r%05d" % i], want)
# compression levels: the level is not part of the format
# --------------------------------------------------------------------------

LEVEL_CASES = [("zstd", -5), ("zstd", 1), ("zstd", 9), ("zstd", 19), ("zstd", 0),
               ("zstd_dict", 1), ("zstd_dict", 19), ("zstd_dict", -3)]


def test_reference_reads_stores_written_at_any_level(tmp_path, run_reference, fixture_dict):
    dense = _structured_u8(40, (3, 20, 20), 21)
    rng = np.random.default_rng(22)
    ragged = [rng.integers(0, 50, size=int(n)).astype(np.int32) for n in rng.integers(1, 300, 37)]
    blob = fixture_dict.read_bytes()
    spec, expected, sizes = [], {}, {}
    for codec, level in LEVEL_CASES:
        d = blob if codec == "zstd_dict" else None
        for kind, data in (("dense", dense), ("ragged", ragged)):
            name = f"{kind}_{codec}_{level}"
            path = tmp_path / name
            if kind == "dense":
                w = Dense.create(path, np.uint8, (3, 20, 20), codec=codec, dict_bytes=d, level=level)
            else:
                w = Ragged.create(path, np.int32, codec=codec, dict_bytes=d, level=level)
            with w:
                w.append(data[:17])
                w.append(data[17:])
            spec.append({"name": name, "kind": kind, "path": str(path)})
            expected[name] = data
            sizes[name] = (path / "data.zr").stat().st_size
    # The level took effect: stronger levels wrote fewer bytes.
    assert sizes["dense_zstd_-5"] > sizes["dense_zstd_1"] > sizes["dense_zstd_19"]
    assert sizes["dense_zstd_dict_1"] > sizes["dense_zstd_dict_19"]
    results, out = read_with_reference(run_reference, tmp_path, spec)
    for name, want in expected.items():
        res = results[name]
        assert res["ok"], res.get("tb", res)
        assert res["len"] == len(want), name
        assert res["has_dict"] == ("zstd_dict" in name), name
        if name.startswith("dense"):
            got = np.load(out / f"{name}.npy")
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), name
        else:
            z = np.load(out / f"{name}.npz")
            assert len(z.files) == len(want), name
            for i, w in enumerate(want):
                g = z["r%05d" % i]
                assert g.dtype == w.dtype and g.shape == w.shape and g.tobytes() == w.tobytes(), (name, i)
