"""Stores written by the published loaderx 2.0.0 must read back exactly.

Walks ``shared/fixtures/loaderx-2.0.0/manifest.json``; every store there was
produced by the reference wheel, with its expected records saved beside it.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from pathlib import Path

import numpy as np
import pytest

from loaderx.zrecord import Dense, Ragged

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "loaderx-2.0.0"


def _manifest():
    path = FIXTURES / "manifest.json"
    if not path.is_file():
        return {}
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


MANIFEST = _manifest()
NAMES = sorted(MANIFEST)
DENSE = [n for n in NAMES if MANIFEST[n]["kind"] == "dense"]
RAGGED = [n for n in NAMES if MANIFEST[n]["kind"] == "ragged"]


@pytest.fixture(scope="module", autouse=True)
def _require_fixtures(fixtures_dir):
    assert fixtures_dir == FIXTURES
    assert NAMES, "manifest.json lists no stores"


def load_expected(name):
    entry = MANIFEST[name]
    path = FIXTURES / entry["expected"]
    if entry["kind"] == "dense":
        return np.load(path, allow_pickle=False)
    with np.load(path, allow_pickle=False) as z:
        keys = sorted(z.files)
        assert keys == ["r%05d" % i for i in range(entry["length"])]
        return [z[k] for k in keys]


def open_fixture(name, root=FIXTURES):
    cls = Dense if MANIFEST[name]["kind"] == "dense" else Ragged
    return cls.open(root / name)


def snapshot(directory: Path):
    """Names, sizes, mtimes and bytes of every file in a store directory."""
    out = {}
    for f in sorted(directory.iterdir()):
        st = f.stat()
        out[f.name] = (st.st_size, st.st_mtime_ns, stat.S_IMODE(st.st_mode), f.read_bytes())
    return out


def test_manifest_covers_both_kinds_and_all_codecs():
    assert DENSE and RAGGED
    assert {MANIFEST[n]["codec"] for n in NAMES} == {"raw", "zstd", "zstd_dict"}
    for n in NAMES:
        assert (FIXTURES / n / "meta.zr").is_file()
        assert (FIXTURES / n / "data.zr").is_file()


@pytest.mark.parametrize("name", NAMES)
def test_fixture_attributes(name):
    entry = MANIFEST[name]
    with open_fixture(name) as ds:
        assert isinstance(ds, Dense if entry["kind"] == "dense" else Ragged)
        assert isinstance(ds.path, Path)
        assert ds.path == FIXTURES / name
        assert ds.codec == entry["codec"]
        assert isinstance(ds.dtype, np.dtype)
        assert ds.dtype.str == entry["dtype"]
        assert len(ds) == entry["length"]
        assert ds.has_dict() is (entry["codec"] == "zstd_dict")
        if entry["kind"] == "dense":
            assert ds.item_shape == tuple(entry["item_shape"])
            assert type(ds.item_shape) is tuple


@pytest.mark.parametrize("name", DENSE)
def test_dense_fixture_contents(name):
    expected = load_expected(name)
    entry = MANIFEST[name]
    assert expected.shape == (entry["length"], *entry["item_shape"])
    with open_fixture(name) as ds:
        got = ds[:]
        assert isinstance(got, np.ndarray)
        assert got.dtype == expected.dtype and got.dtype.str == entry["dtype"]
        assert got.shape == expected.shape
        assert got.flags.c_contiguous and got.flags.writeable
        assert got.tobytes() == expected.tobytes()
        for i in (0, len(expected) // 2, len(expected) - 1):
            one = np.asarray(ds[i])
            assert one.shape == expected.shape[1:] and one.dtype == expected.dtype
            assert one.tobytes() == expected[i].tobytes()


@pytest.mark.parametrize("name", RAGGED)
def test_ragged_fixture_contents(name):
    expected = load_expected(name)
    with open_fixture(name) as ds:
        got = ds[:]
        assert isinstance(got, list) and len(got) == len(expected)
        for g, e in zip(got, expected):
            assert isinstance(g, np.ndarray)
            assert g.dtype == e.dtype and g.dtype.str == MANIFEST[name]["dtype"]
            assert g.shape == e.shape
            assert np.ascontiguousarray(g).tobytes() == e.tobytes()
        for i in (0, len(expected) - 1):
            one = ds[i]
            assert isinstance(one, np.ndarray)
            assert one.shape == expected[i].shape and one.dtype == expected[i].dtype
            assert np.ascontiguousarray(one).tobytes() == expected[i].tobytes()


def test_mixed_rank_fixture_has_mixed_ranks():
    expected = load_expected("ragged_f64_mixed_rank_raw")
    assert len({e.ndim for e in expected}) > 1
    assert any(e.ndim == 0 for e in expected)


@pytest.mark.parametrize("name", NAMES)
def test_fixture_random_gathers(name):
    expected = load_expected(name)
    n = MANIFEST[name]["length"]
    rng = np.random.default_rng(len(name))
    with open_fixture(name) as ds:
        for size in (1, 7, n, 2 * n):
            idx = rng.integers(0, n, size=size)
            for sel in (idx, list(map(int, idx)), tuple(map(int, idx))):
                got = ds[sel]
                if MANIFEST[name]["kind"] == "dense":
                    want = expected[idx]
                    assert isinstance(got, np.ndarray)
                    assert got.shape == want.shape and got.dtype == want.dtype
                    assert got.tobytes() == want.tobytes()
                else:
                    assert isinstance(got, list) and len(got) == size
                    for g, i in zip(got, idx):
                        assert g.shape == expected[i].shape and g.dtype == expected[i].dtype
                        assert np.ascontiguousarray(g).tobytes() == expected[i].tobytes()
            got = ds.__getitems__(idx)
            assert len(got) == size
        mask = rng.integers(0, 2, size=n).astype(bool)
        got = ds[mask]
        assert len(got) == int(mask.sum())
        sl = ds[1:n:3]
        assert len(sl) == len(range(1, n, 3))


def test_many_readers_on_one_fixture():
    name = DENSE[0]
    expected = load_expected(name)
    readers = [open_fixture(name) for _ in range(4)]
    try:
        for r in readers:
            assert r[:].tobytes() == expected.tobytes()
    finally:
        for r in readers:
            r.close()


def test_fixture_dictionary_is_the_stores_dictionary():
    d = (FIXTURES / "dict_fast_images.zdict").read_bytes()
    assert (FIXTURES / "dense_u8_zstd_dict" / "dict.zr").read_bytes() == d


@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_fixture_dictionary_writes_new_store(tmp_path, kind):
    d = (FIXTURES / "dict_fast_images.zdict").read_bytes()
    images = load_expected("dense_u8_zstd_dict")
    p = tmp_path / "s"
    if kind == "dense":
        with Dense.create(p, images.dtype, images.shape[1:], codec="zstd_dict", dict_bytes=d) as w:
            assert w.has_dict()
            w.append(images[:60])
            w.append(images[60:])
        with Dense.open(p) as r:
            assert r.codec == "zstd_dict" and r.has_dict()
            assert r[:].tobytes() == images.tobytes()
    else:
        recs = [img[:, : 4 + i % 12] for i, img in enumerate(images[:50])]
        with Ragged.create(p, np.uint8, codec="zstd_dict", dict_bytes=d) as w:
            w.append(recs)
        with Ragged.open(p) as r:
            got = r[:]
            assert [g.shape for g in got] == [x.shape for x in recs]
            assert all(np.array_equal(g, x) for g, x in zip(got, recs))
    assert (p / "dict.zr").read_bytes() == d


def _store_fds_and_maps(store: Path):
    """(open flags of fds on store files, permission strings of mappings)."""
    fds, maps = [], []
    prefix = str(store.resolve())
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(prefix + os.sep):
            with open(f"/proc/self/fdinfo/{fd}") as f:
                flags = next(line for line in f if line.startswith("flags:"))
            fds.append((target, int(flags.split()[1], 8)))
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].strip().startswith(prefix + os.sep):
                maps.append((parts[5].strip(), parts[1]))
    return fds, maps


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc")
@pytest.mark.parametrize("name", NAMES)
def test_readers_open_store_files_read_only(name):
    """Fixture dirs are read-only; a reader must never ask for write access."""
    before = snapshot(FIXTURES / name)
    ds = open_fixture(name)
    try:
        ds[:]
        fds, maps = _store_fds_and_maps(FIXTURES / name)
        for target, flags in fds:
            assert flags & os.O_ACCMODE == os.O_RDONLY, (target, oct(flags))
        for target, perms in maps:
            assert "w" not in perms, (target, perms)
    finally:
        ds.close()
    assert snapshot(FIXTURES / name) == before
    assert not list((FIXTURES / name).glob("*.tmp"))


@pytest.mark.parametrize("name", [DENSE[0], RAGGED[0], "dense_u8_zstd_dict"])
def test_open_from_read_only_copy(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    for f in dst.iterdir():
        f.chmod(0o444)
    dst.chmod(0o555)
    try:
        before = snapshot(dst)
        with open_fixture(name, root=tmp_path) as ds:
            got = ds[:]
            assert len(got) == MANIFEST[name]["length"]
        assert snapshot(dst) == before
    finally:
        dst.chmod(0o755)
