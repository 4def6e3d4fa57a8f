"""Error parity with loaderx 2.0.0, differentially (#14).

One table of calls covers every error path of the public API: construction,
``create`` arguments (dtypes, item shapes, codecs, dictionaries), appends,
index keys, reads on writers and appends on readers, use after close,
``Sampler`` and ``DataLoader`` arguments and streams, ``train_dict`` sources,
and ``open`` of missing, corrupt and foreign directories. A script runs the
table under loaderx 2.0.0 (its own venv) and under ours, one subprocess each,
and prints one JSON line per call. Each row then asserts:

* the same outcome: both return (an object of the same type, and the same
  value where it is a plain scalar), or both raise;
* when both raise: our exception is 2.0.0's type or a subclass of it, a
  ``ZrecordError`` carries the same ``code``, and our message *starts with*
  2.0.0's message, word for word. Ours may add context after it. Paths and
  addresses in messages are replaced by placeholders in both runs, so rows
  that name the store compare everything else verbatim.

``DEVIATIONS`` lists, with the reason, where 2.0.0's behaviour is a defect we
deliberately do not copy (docs/compatibility.md, "Deliberate differences");
those rows assert both implementations' exact outcomes instead. ``PENDING``
rows are known mismatches in code outside this change; they are strict
xfails, so fixing one fails the test until the row moves back to the table.

A crash (abort, segfault) of either interpreter does not lose the run: the
driver records the crashing row and restarts the script after it.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import loaderx_child_env

# Shared by both runs: fixtures built on demand under a root directory, and
# the loop that runs the rows. Rows are Python expressions over these names.
SCRIPT = textwrap.dedent(r'''
    import json, os, re, shutil, subprocess, sys
    import numpy as np
    from loaderx.zrecord import Dense, Ragged, ZrecordError
    from loaderx.zsampler import Sampler
    from loaderx.dataloader import DataLoader
    from loaderx.utils import train_dict

    root, cases_file, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    u8, i4 = np.uint8, np.int32
    _fresh = iter(range(10**6))


    def fresh():
        """A new, not yet existing store path."""
        while True:
            p = os.path.join(root, f"new{next(_fresh)}")
            if not os.path.exists(p):  # after a restart, numbers are reused
                return p


    def build(name, kind="dense", n=10, codec="raw"):
        """The path of a committed store of n int32 records (built once)."""
        p = os.path.join(root, name)
        if not os.path.exists(p):
            if kind == "dense":
                with Dense.create(p, i4, (2,), codec=codec) as w:
                    if n:
                        w.append(np.arange(2 * n, dtype=i4).reshape(n, 2))
            else:
                with Ragged.create(p, i4, codec=codec) as w:
                    if n:
                        w.append([np.arange(k + 1, dtype=i4) for k in range(n)])
        return p


    def dense(name="d10", n=10):
        return Dense.open(build(name, "dense", n))


    def ragged(name="r10", n=10):
        return Ragged.open(build(name, "ragged", n))


    def dwriter():
        return Dense.create(fresh(), i4, (2,), codec="raw")


    def rwriter():
        return Ragged.create(fresh(), i4, codec="raw")


    def closed(store):
        store.close()
        return store


    def a_file():
        p = os.path.join(root, "a_file")
        with open(p, "wb") as f:
            f.write(b"hello")
        return p


    def dir_with(name, files):
        p = os.path.join(root, name)
        os.makedirs(p, exist_ok=True)
        for f, data in files.items():
            with open(os.path.join(p, f), "wb") as out:
                out.write(data)
        return p


    def zeroed(name, kind="dense"):
        """A copy of a committed store with every byte of every file zeroed."""
        q = os.path.join(root, name)
        if not os.path.exists(q):
            shutil.copytree(build(name + "_src", kind, 4), q)
            for f in os.listdir(q):
                fp = os.path.join(q, f)
                size = os.path.getsize(fp)
                with open(fp, "wb") as out:
                    out.write(bytes(size))
        return q


    def flipped(name):
        """A committed zstd store whose payload bytes are all flipped."""
        p = build(name, "dense", 4, codec="zstd")
        fp = os.path.join(p, "data.zr")
        with open(fp, "rb") as f:
            data = f.read()
        with open(fp, "wb") as f:
            f.write(bytes(b ^ 0x5A for b in data))
        return p


    def unclosed(name):
        """A store whose writer process died before close()."""
        p = os.path.join(root, name)
        code = ("import os, sys, numpy as np; from loaderx.zrecord import Dense; "
                "w = Dense.create(sys.argv[1], np.int32, (2,), codec='raw'); "
                "w.append(np.zeros((3, 2), np.int32)); os._exit(0)")
        subprocess.run([sys.executable, "-c", code, p], check=True)
        return p


    def held_writer(name):
        """The path of a store a live writer is building (the writer stays open)."""
        p = os.path.join(root, name)
        _held.append(Dense.create(p, i4, (2,), codec="raw"))
        return p


    _held = []


    def loader(streams, **kw):
        """Builds a DataLoader and closes it again (success rows)."""
        dl = DataLoader(streams, **kw)
        dl.close()
        return dl


    def norm(msg):
        """Removes what differs between runs: the root path, fresh paths'
        numbers (a restart after a crash renumbers them), addresses."""
        msg = re.sub(r"<root>/new[0-9]+", "<root>/new?", msg.replace(root, "<root>"))
        return re.sub(r"0x[0-9a-fA-F]+", "0x?", msg)


    def plain(value):
        """A JSON value for rows that return a simple result, else None."""
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, tuple) and all(isinstance(v, int) for v in value):
            return list(value)
        if isinstance(value, type):
            return value.__name__
        return None


    with open(cases_file) as f:
        cases = json.load(f)
    for i, (name, expr) in enumerate(cases):
        if i < start:
            continue
        print(json.dumps({"start": i}), flush=True)
        try:
            value = eval(expr)
            out = {"ok": type(value).__name__, "value": plain(value)}
        except Exception as e:
            out = {"error": [c.__name__ for c in type(e).__mro__], "message": norm(str(e)),
                   "code": getattr(e, "code", None)}
        print(json.dumps({"case": name, "out": out}), flush=True)
    print(json.dumps({"done": True}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # no teardown: rows leave writers and loaders behind on purpose
''')


# (name, expression). Names are unique; the expression runs in SCRIPT.
CASES: list[tuple[str, str]] = [
    # construction
    ("Dense()", "Dense()"),
    ("Ragged()", "Ragged()"),
    ("Dense(path)", "Dense(fresh())"),
    ("Ragged(path, dtype)", "Ragged(fresh(), u8)"),
    # paths
    ("create path int", "Dense.create(5, u8, (2,))"),
    ("create path None", "Ragged.create(None, u8)"),
    ("create path bytes", "Dense.create(fresh().encode(), u8, (2,))"),
    ("open path int", "Dense.open(5)"),
    ("create path is a file", "Dense.create(a_file(), i4, (2,))"),
    ("ragged create path is a file", "Ragged.create(a_file(), i4)"),
    ("create in missing parents", "len(Dense.create(os.path.join(fresh(), 'a', 'b'), u8, (2,)))"),
    ("create existing store", "Dense.create(build('d10'), i4, (2,))"),
    ("create while a writer holds it", "Dense.create(held_writer('held1'), i4, (2,))"),
    ("open while a writer holds it", "Dense.open(held_writer('held2'))"),
    # codecs and dictionaries
    ("create unknown codec", "Dense.create(fresh(), u8, (2,), codec='lz4')"),
    ("create codec None", "Dense.create(fresh(), u8, (2,), codec=None)"),
    ("create codec int", "Dense.create(fresh(), u8, (2,), codec=1)"),
    ("create codec upper case", "Dense.create(fresh(), u8, (2,), codec='ZSTD')"),
    ("create zstd_dict without dict", "Dense.create(fresh(), u8, (2,), codec='zstd_dict')"),
    ("create zstd_dict empty dict", "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=b'')"),
    ("create zstd_dict dict 0", "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=0)"),
    ("create zstd_dict dict str", "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes='abc')"),
    ("create zstd_dict dict int", "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=5)"),
    ("create zstd_dict dict list", "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=[1, 2])"),
    ("create zstd_dict dict bytearray",
     "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=bytearray(b'abc')).has_dict()"),
    ("create zstd_dict dict memoryview",
     "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=memoryview(b'abc')).has_dict()"),
    ("create zstd with dict", "Dense.create(fresh(), u8, (2,), codec='zstd', dict_bytes=b'abc')"),
    ("create zstd with empty dict", "Dense.create(fresh(), u8, (2,), codec='zstd', dict_bytes=b'')"),
    ("create raw with dict", "Dense.create(fresh(), u8, (2,), codec='raw', dict_bytes=b'abc')"),
    ("create unknown codec with dict", "Dense.create(fresh(), u8, (2,), codec='lz4', dict_bytes=b'abc')"),
    ("ragged unknown codec", "Ragged.create(fresh(), u8, codec='lz4')"),
    ("ragged zstd_dict without dict", "Ragged.create(fresh(), u8, codec='zstd_dict')"),
    ("ragged zstd with dict", "Ragged.create(fresh(), u8, codec='zstd', dict_bytes=b'abc')"),
    ("ragged zstd_dict dict str", "Ragged.create(fresh(), u8, codec='zstd_dict', dict_bytes='abc')"),
    # dtypes
    ("dtype metadata", "Dense.create(fresh(), np.dtype(i4, metadata={'a': 1}), (2,))"),
    ("dtype empty metadata", "Dense.create(fresh(), np.dtype(i4, metadata={}), (2,))"),
    ("dtype object", "Dense.create(fresh(), object, (2,))"),
    ("dtype object with metadata", "Dense.create(fresh(), np.dtype(object, metadata={'a': 1}), (2,))"),
    ("dtype structured", "Dense.create(fresh(), np.dtype([('a', i4)]), (2,))"),
    ("dtype structured with metadata",
     "Dense.create(fresh(), np.dtype([('a', i4)], metadata={'a': 1}), (2,))"),
    ("dtype structured of objects", "Dense.create(fresh(), np.dtype([('a', object)]), (2,))"),
    ("dtype subarray", "Dense.create(fresh(), np.dtype((i4, (2,))), (2,))"),
    ("dtype subarray with metadata",
     "Dense.create(fresh(), np.dtype((i4, (2,)), metadata={'a': 1}), (2,))"),
    ("dtype S0", "Dense.create(fresh(), 'S', (2,))"),
    ("dtype U0", "Dense.create(fresh(), 'U', (2,))"),
    ("dtype unknown name", "Dense.create(fresh(), 'bogus', (2,))"),
    ("dtype None is float64", "str(Dense.create(fresh(), None, (2,)).dtype)"),
    ("dtype datetime64", "str(Dense.create(fresh(), 'M8[s]', (2,)).dtype)"),
    ("ragged dtype metadata", "Ragged.create(fresh(), np.dtype(i4, metadata={'a': 1}))"),
    ("ragged dtype object", "Ragged.create(fresh(), object)"),
    ("ragged dtype structured", "Ragged.create(fresh(), np.dtype([('a', i4)]))"),
    ("ragged dtype subarray", "Ragged.create(fresh(), np.dtype((i4, (2,))))"),
    ("ragged dtype S0 without dict", "Ragged.create(fresh(), 'S', codec='zstd_dict')"),
    ("ragged dtype S0 unknown codec", "Ragged.create(fresh(), 'S', codec='lz4')"),
    # item shapes
    ("shape negative", "Dense.create(fresh(), u8, (-1,))"),
    ("shape numpy negative", "Dense.create(fresh(), u8, (np.int8(-1),))"),
    ("shape float", "Dense.create(fresh(), u8, (2.0,))"),
    ("shape bool", "Dense.create(fresh(), u8, (True,))"),
    ("shape numpy bool", "Dense.create(fresh(), u8, (np.True_,))"),
    ("shape negative then float", "Dense.create(fresh(), u8, (-1, 1.5))"),
    ("shape float then negative", "Dense.create(fresh(), u8, (1.5, -1))"),
    ("shape int", "Dense.create(fresh(), u8, 5)"),
    ("shape None", "Dense.create(fresh(), u8, None)"),
    ("shape str", "Dense.create(fresh(), u8, 'ab')"),
    ("shape 2-d array", "Dense.create(fresh(), u8, np.array([[2]]))"),
    ("shape zero width", "Dense.create(fresh(), u8, (0,))"),
    ("shape zero times huge", "Dense.create(fresh(), u8, (0, 2**40))"),
    ("shape one past 2^31 bytes", "Dense.create(fresh(), u8, (2**31 + 1,))"),
    ("shape 2^31 + 4 bytes of int32", "Dense.create(fresh(), i4, (2**29 + 1,))"),
    ("shape 2^64", "Dense.create(fresh(), u8, (2**64,))"),
    ("shape exactly 2^31 bytes", "Dense.create(fresh(), u8, (2**31,)).item_shape"),
    ("shape list", "Dense.create(fresh(), u8, [2, 3]).item_shape"),
    ("shape generator", "Dense.create(fresh(), u8, (d for d in (2, 3))).item_shape"),
    ("shape numpy ints", "Dense.create(fresh(), u8, (np.uint64(3), np.int8(2))).item_shape"),
    ("shape 0-d array dimension", "Dense.create(fresh(), u8, (np.array(3),)).item_shape"),
    ("shape empty", "Dense.create(fresh(), u8, ()).item_shape"),
    # argument order: 2.0.0 reports dtype, dictionary, shape, codec, dictionary type
    ("metadata and bad shape", "Dense.create(fresh(), np.dtype(i4, metadata={'a': 1}), (-1,))"),
    ("object and unknown codec", "Dense.create(fresh(), object, (2,), codec='lz4')"),
    ("bad shape and unknown codec", "Dense.create(fresh(), u8, (-1,), codec='lz4')"),
    ("bad shape and missing dict", "Dense.create(fresh(), u8, (-1,), codec='zstd_dict')"),
    ("bad shape and extra dict", "Dense.create(fresh(), u8, 5, codec='raw', dict_bytes=b'x')"),
    ("bad shape and dict str", "Dense.create(fresh(), u8, (1.5,), codec='zstd_dict', dict_bytes='x')"),
    ("too wide and unknown codec", "Dense.create(fresh(), u8, (2**32,), codec='lz4')"),
    ("S0 and missing dict", "Dense.create(fresh(), 'S', (2,), codec='zstd_dict')"),
    ("bad path and bad dtype", "Dense.create(5, object, (-1,))"),
    # appends
    ("dense append list", "dwriter().append([[1, 2]])"),
    ("dense append wrong dtype", "dwriter().append(np.zeros((1, 2), np.int64))"),
    ("dense append wrong shape", "dwriter().append(np.zeros((1, 3), i4))"),
    ("dense append one record without batch axis", "dwriter().append(np.zeros((2,), i4))"),
    ("dense append 3-d", "dwriter().append(np.zeros((1, 2, 1), i4))"),
    ("dense append 0-d to shaped store", "dwriter().append(np.array(1, i4))"),
    ("dense append empty batch", "dwriter().append(np.zeros((0, 2), i4))"),
    ("dense append wrong dtype and shape", "dwriter().append(np.zeros((0, 3), np.int64))"),
    ("dense append returns None", "dwriter().append(np.zeros((1, 2), i4))"),
    ("dense append 0-d to scalar store", "Dense.create(fresh(), i4, ()).append(np.array(1, i4))"),
    ("dense append non-contiguous", "dwriter().append(np.zeros((4, 4), i4)[:, ::2])"),
    ("ragged append int", "rwriter().append(5)"),
    ("ragged append None", "rwriter().append(None)"),
    ("ragged append list of lists", "rwriter().append([[1, 2]])"),
    ("ragged append array then list", "rwriter().append([np.zeros(2, i4), [1]])"),
    ("ragged append wrong dtype", "rwriter().append([np.zeros(2, np.int64)])"),
    ("ragged append zero-byte record", "rwriter().append([np.zeros(0, i4)])"),
    ("ragged append empty list", "rwriter().append([])"),
    ("ragged append empty generator", "rwriter().append(x for x in [])"),
    ("ragged append 0-d array", "rwriter().append(np.array(1, i4))"),
    ("ragged append 1-d array", "rwriter().append(np.arange(3, dtype=i4))"),
    ("ragged append 0-d records", "rwriter().append([np.array(1, i4), np.array(2, i4)])"),
    # reads on writers, appends on readers, use after close
    ("writer[0]", "dwriter()[0]"),
    ("writer[[0]]", "dwriter()[[0]]"),
    ("writer.__getitems__", "dwriter().__getitems__([0])"),
    ("writer iteration", "list(dwriter())"),
    ("writer len", "len(dwriter())"),
    ("writer has_dict", "dwriter().has_dict()"),
    ("ragged writer[0]", "rwriter()[0]"),
    ("reader append", "dense().append(np.zeros((1, 2), i4))"),
    ("ragged reader append", "ragged().append([np.zeros(2, i4)])"),
    ("closed reader[0]", "closed(dense())[0]"),
    ("closed reader.__getitems__", "closed(dense()).__getitems__([0])"),
    ("closed reader len", "len(closed(dense()))"),
    ("closed reader iteration", "list(closed(dense()))"),
    ("closed reader append", "closed(dense()).append(np.zeros((1, 2), i4))"),
    ("closed reader has_dict", "closed(dense()).has_dict()"),
    ("closed reader dtype", "str(closed(dense()).dtype)"),
    ("closed reader closed twice", "closed(dense()).close()"),
    ("closed ragged reader[0]", "closed(ragged())[0]"),
    ("closed writer append", "closed(dwriter()).append(np.zeros((1, 2), i4))"),
    ("closed ragged writer append", "closed(rwriter()).append([np.zeros(2, i4)])"),
    ("closed writer len", "len(closed(dwriter()))"),
    ("closed writer[0]", "closed(dwriter())[0]"),
    ("closed writer.__getitems__", "closed(dwriter()).__getitems__([0])"),
    ("closed writer closed twice", "closed(dwriter()).close()"),
    # Sampler
    ("Sampler length 0", "Sampler(0, 1, 0)"),
    ("Sampler length -1", "Sampler(-1, 1, 0)"),
    ("Sampler length 2^64", "Sampler(2**64, 1, 0)"),
    ("Sampler length float", "Sampler(1.0, 1, 0)"),
    ("Sampler length str", "Sampler('1', 1, 0)"),
    ("Sampler length None", "Sampler(None, 1, 0)"),
    ("Sampler batch_size 0", "Sampler(10, 0, 0)"),
    ("Sampler batch_size 2^64", "Sampler(10, 2**64, 0)"),
    ("Sampler batch_size float", "Sampler(10, 1.5, 0)"),
    ("Sampler batch_size numpy bool", "Sampler(10, np.True_, 0)"),
    ("Sampler mode 3", "Sampler(10, 2, 3)"),
    ("Sampler mode -1", "Sampler(10, 2, -1)"),
    ("Sampler mode str", "Sampler(10, 2, 'iid')"),
    ("Sampler mode float", "Sampler(10, 2, 1.0)"),
    ("Sampler mode enum", "Sampler(10, 2, Sampler.Mode.IID).next().size"),
    ("Sampler seed -1", "Sampler(10, 2, 0, seed=-1)"),
    ("Sampler seed 2^64", "Sampler(10, 2, 0, seed=2**64)"),
    ("Sampler seed float", "Sampler(10, 2, 0, seed=1.5)"),
    ("Sampler seed None", "Sampler(10, 2, 0, seed=None)"),
    ("Sampler seed numpy int", "Sampler(10, 2, 1, seed=np.uint64(7)).next().size"),
    ("Sampler length 0 and batch_size float", "Sampler(0, 1.5, 5, -1)"),
    ("Sampler batch_size 0 and bad mode", "Sampler(10, 0, 5, -1)"),
    ("Sampler bad mode and seed", "Sampler(10, 1, 5, -1)"),
    ("Sampler length float and mode str", "Sampler(1.5, 'x', 0, 0)"),
    ("Sampler seek -1", "Sampler(10, 2, 0).seek(-1)"),
    ("Sampler seek 2^64", "Sampler(10, 2, 0).seek(2**64)"),
    ("Sampler seek float", "Sampler(10, 2, 0).seek(1.5)"),
    # DataLoader
    ("DataLoader {}", "loader({})"),
    ("DataLoader list of stores", "loader([dense()])"),
    ("DataLoader list of pairs", "loader([('d', dense())])"),
    ("DataLoader None", "loader(None)"),
    ("DataLoader int stream", "loader({'d': 5})"),
    ("DataLoader writer", "loader({'d': dwriter()})"),
    ("DataLoader two writers", "loader({'d': dwriter(), 'e': dense(), 'f': rwriter()})"),
    ("DataLoader closed stream", "loader({'d': closed(dense())})"),
    ("DataLoader empty store", "loader({'d': dense('d0', 0)})"),
    ("DataLoader unequal lengths", "loader({'d': dense(), 'e': dense('d5', 5)})"),
    ("DataLoader writer and unequal lengths", "loader({'d': dense(), 'e': dense('d5', 5), 'f': dwriter()})"),
    ("DataLoader batch_size 0", "loader({'d': dense()}, batch_size=0)"),
    ("DataLoader batch_size -1", "loader({'d': dense()}, batch_size=-1)"),
    ("DataLoader batch_size float", "loader({'d': dense()}, batch_size=1.5)"),
    ("DataLoader batch_size 2^64", "loader({'d': dense()}, batch_size=2**64)"),
    ("DataLoader batch_size larger than the store", "loader({'d': dense()}, batch_size=64)"),
    ("DataLoader mode 3", "loader({'d': dense()}, mode=3)"),
    ("DataLoader mode -1", "loader({'d': dense()}, mode=-1)"),
    ("DataLoader mode 2^64", "loader({'d': dense()}, mode=2**64)"),
    ("DataLoader mode str", "loader({'d': dense()}, mode='iid')"),
    ("DataLoader mode float", "loader({'d': dense()}, mode=1.0)"),
    ("DataLoader prefetch_size 0", "loader({'d': dense()}, prefetch_size=0)"),
    ("DataLoader prefetch_size -1", "loader({'d': dense()}, prefetch_size=-1)"),
    ("DataLoader prefetch_size float", "loader({'d': dense()}, prefetch_size=1.5)"),
    ("DataLoader prefetch_size bool", "loader({'d': dense()}, prefetch_size=True)"),
    ("DataLoader transform_workers 0", "loader({'d': dense()}, transform_workers=0)"),
    ("DataLoader transform_workers -1", "loader({'d': dense()}, transform_workers=-1)"),
    ("DataLoader transform_workers float", "loader({'d': dense()}, transform_workers=1.5)"),
    ("DataLoader transform_workers bool", "loader({'d': dense()}, transform_workers=True)"),
    ("DataLoader transform_workers numpy int", "loader({'d': dense()}, transform_workers=np.int64(2))"),
    ("DataLoader seed -1", "loader({'d': dense()}, seed=-1)"),
    ("DataLoader seed 2^64", "loader({'d': dense()}, seed=2**64)"),
    ("DataLoader seed float", "loader({'d': dense()}, seed=1.5)"),
    ("DataLoader seed numpy int", "loader({'d': dense()}, seed=np.int64(3))"),
    ("DataLoader transform None", "loader({'d': dense()}, transform=None)"),
    # DataLoader argument order: streams, workers, prefetch, types, length, values
    ("DataLoader empty store and bad workers", "loader({'d': dense('d0', 0)}, transform_workers=0)"),
    ("DataLoader empty store and batch float", "loader({'d': dense('d0', 0)}, batch_size=1.5)"),
    ("DataLoader empty store and batch 0", "loader({'d': dense('d0', 0)}, batch_size=0)"),
    ("DataLoader batch 0 and seed float", "loader({'d': dense()}, batch_size=0, seed=1.5)"),
    ("DataLoader batch float and bad prefetch", "loader({'d': dense()}, batch_size=1.5, prefetch_size=0)"),
    ("DataLoader bad prefetch and bad workers", "loader({'d': dense()}, prefetch_size=0, transform_workers=0)"),
    ("DataLoader bad mode and seed", "loader({'d': dense()}, mode=5, seed=-1)"),
    ("DataLoader writer and bad workers", "loader({'d': dwriter()}, transform_workers=0)"),
    # train_dict
    ("train_dict writer", "train_dict(dwriter())"),
    ("train_dict closed reader", "train_dict(closed(dense()))"),
    ("train_dict empty store", "train_dict(dense('d0', 0))"),
    ("train_dict empty array", "train_dict(np.zeros((0, 4), u8))"),
    ("train_dict 0-d array", "train_dict(np.array(1, u8))"),
    ("train_dict empty list", "train_dict([])"),
    ("train_dict empty generator", "train_dict(x for x in [])"),
    ("train_dict unknown tier", "train_dict(np.zeros((4, 4), u8), tier='huge')"),
    ("train_dict tier int", "train_dict(np.zeros((4, 4), u8), tier=5)"),
    ("train_dict writer and unknown tier", "train_dict(dwriter(), tier='huge')"),
    ("train_dict int", "train_dict(5)"),
    ("train_dict None", "train_dict(None)"),
    ("train_dict too few records", "train_dict([b'ab'])"),
    ("train_dict two ints", "train_dict([1, 2])"),
    ("train_dict empty records", "train_dict([b''] * 100)"),
    ("train_dict zero-size arrays", "train_dict([np.empty(0)] * 100)"),
    ("train_dict dict of str", "train_dict({'a': 1})"),
    ("train_dict path in missing directory",
     "train_dict(np.arange(100 * 64, dtype=u8).reshape(100, 64) % 7, path=os.path.join(fresh(), 'x'))"),
    ("train_dict ints", "type(train_dict(list(range(20000))))"),
    ("train_dict str records", "type(train_dict(['abc %d' % i * 5 for i in range(2000)]))"),
    ("train_dict reader", "type(train_dict(Dense.open(build('d2k', 'dense', 2000))))"),
    # open
    ("open missing", "Dense.open(os.path.join(root, 'missing'))"),
    ("ragged open missing", "Ragged.open(os.path.join(root, 'missing'))"),
    ("open a file", "Dense.open(a_file())"),
    ("open empty directory", "Dense.open(dir_with('emptydir', {}))"),
    ("open foreign directory", "Dense.open(dir_with('foreign', {'README': b'hi', 'x.txt': b'data'}))"),
    ("open garbage meta.zr", "Dense.open(dir_with('garbage', {'meta.zr': b'garbage' * 3, 'data.zr': b''}))"),
    ("open zeroed store", "Dense.open(zeroed('zeroed'))"),
    ("ragged open zeroed store", "Ragged.open(zeroed('rzeroed', 'ragged'))"),
    ("read flipped zstd payload", "Dense.open(flipped('flipped'))[0]"),
    ("open Ragged store as Dense", "Dense.open(build('r10', 'ragged'))"),
    ("open Dense store as Ragged", "Ragged.open(build('d10'))"),
    ("open unclosed store", "len(Dense.open(unclosed('unclosed')))"),
]

# Index keys: the same table for both kinds, through [] and __getitems__.
_KEYS = [
    ("10", "10"), ("-1", "-1"), ("-11", "-11"), ("2^64", "2**64"), ("float", "1.0"),
    ("str", "'1'"), ("None", "None"), ("True", "True"), ("numpy bool", "np.True_"),
    ("[1.0]", "[1.0]"), ("['1']", "['1']"), ("float array", "np.array([1.0])"),
    ("slice -1:", "slice(-1, None)"), ("slice :-1", "slice(None, -1)"),
    ("slice step 0", "slice(0, 5, 0)"), ("slice float", "slice(1.0, 2)"),
    ("short mask", "np.array([True, False])"), ("2-d mask", "np.ones((2, 5), bool)"),
    ("0-d bool array", "np.array(True)"), ("empty bool array", "np.array([], bool)"), ("short bool list", "[True, False]"),
    ("[10]", "[10]"), ("[-1]", "[-1]"), ("[2^64]", "[2**64]"), ("uint8 [10]", "np.array([10], u8)"),
    ("int8 [-1]", "np.array([-1], np.int8)"), ("uint64 huge", "np.array([2**63 + 5], np.uint64)"),
    ("tuple with slice", "(1, slice(0, 2))"), ("mixed numpy ints", "[np.int8(1), np.uint64(2)]"),
    ("dict", "{}"), ("object", "object()"),
]
for _kind in ("dense", "ragged"):
    for _key_name, _key in _KEYS:
        CASES.append((f"{_kind}[{_key_name}]", f"{_kind}()[{_key}]"))
        CASES.append((f"{_kind}.__getitems__({_key_name})", f"{_kind}().__getitems__({_key})"))


def _error(name: str, code: int | None = None) -> dict:
    return {"error": name, "code": code}


def _ok(name: str, value=None) -> dict:
    return {"ok": name, "value": value}


# Where 2.0.0's behaviour is a defect we deliberately do not copy: the row's
# outcome under 2.0.0, ours, and why (docs/compatibility.md says the same).
DEVIATIONS: dict[str, tuple[dict, dict, str]] = {
    "open unclosed store": (
        _ok("int", 0), _error("ZrecordError", -8),
        ("a store whose writer never closed opens as empty in 2.0.0; an empty training "
         "set is a silent failure, so we refuse it (invalid format, -8)")),
    "DataLoader transform non-callable": (
        _ok("DataLoader"), _error("TypeError"),
        ("2.0.0 fails only when the first batch is transformed, on a worker thread; we "
         "refuse a transform that is not callable at construction")),
    "shape bytes": (
        _ok("tuple", [97, 98]), _error("ValueError"),
        "2.0.0 reads item_shape=b'ab' as the shape (97, 98)"),
    "ragged dtype S0": (
        _ok("Ragged"), _error("ValueError"),
        ("2.0.0 creates a Ragged store of a zero-size dtype (S0, U0, V0) that can never "
         "hold a record (every record would be zero bytes); we refuse it at create")),
    "create zstd_dict dict ndarray": (
        _error("ValueError"), _ok("bool", True),
        ("2.0.0 tests dict_bytes for truth, so a dictionary held in a NumPy array fails "
         "with NumPy's 'truth value of an array is ambiguous'; we take any bytes-like object")),
    "train_dict str": (
        _ok("type", "bytes"), _error("TypeError"),
        ("2.0.0 trains on the characters of a str source one by one (a path passed by "
         "mistake trains a useless dictionary); we refuse str and bytes sources")),
    "train_dict bytes": (
        _ok("type", "bytes"), _error("TypeError"),
        "2.0.0 trains on the byte values of a bytes source one by one; as for str"),
    "train_dict None records": (
        _ok("type", "bytes"), _error("TypeError"),
        ("2.0.0 trains on the bytes of object arrays, i.e. on memory addresses; we refuse "
         "records NumPy can only hold as Python objects")),
    "dense[2^64 int]": (
        _error("TypeError"), _error("IndexError"),
        ("an int index beyond the int64/uint64 range is out of range, so IndexError "
         "(the spec's rule for out-of-range indices); 2.0.0 raises TypeError")),
    "Sampler batch_size beyond memory": (
        _error("ValueError"), _error("MemoryError"),
        ("2.0.0 raises whatever NumPy raises allocating the batch buffer (ValueError "
         "past 2^63 bytes, MemoryError below); ours refuses any draw over 2^40 indices "
         "with MemoryError before allocating")),
    "Sampler batch_size bool": (
        _ok("Sampler"), _error("TypeError"),
        ("2.0.0 takes True as 1; a bool where a count or seed is expected is a mistake, "
         "and our DataLoader already refuses bool transform_workers/prefetch_size, as "
         "2.0.0 does")),
    "Sampler length bool": (_ok("Sampler"), _error("TypeError"), "as 'Sampler batch_size bool'"),
    "Sampler seek bool": (_ok("NoneType"), _error("TypeError"), "as 'Sampler batch_size bool'"),
    "DataLoader batch_size bool": (_ok("DataLoader"), _error("TypeError"), "as 'Sampler batch_size bool'"),
    "DataLoader mode bool": (_ok("DataLoader"), _error("TypeError"), "as 'Sampler batch_size bool'"),
    "DataLoader seed bool": (_ok("DataLoader"), _error("TypeError"), "as 'Sampler batch_size bool'"),
    "DataLoader prefetch_size 2^70": (
        _ok("DataLoader"), _error("OverflowError"),
        ("2.0.0 takes any int as a queue bound; ours keeps the bound in 64 bits and "
         "refuses what does not fit")),
}
_DEVIATION_EXPRS = {
    "open unclosed store": None,  # already in CASES
    "DataLoader transform non-callable": "loader({'d': dense()}, transform=5)",
    "shape bytes": "Dense.create(fresh(), u8, b'ab').item_shape",
    "ragged dtype S0": "Ragged.create(fresh(), 'S')",
    "create zstd_dict dict ndarray":
        "Dense.create(fresh(), u8, (2,), codec='zstd_dict', dict_bytes=np.arange(1, 9, dtype=u8)).has_dict()",
    "train_dict str": "type(train_dict('abcdefgh' * 5000))",
    "train_dict bytes": "type(train_dict(b'abcdef' * 1000))",
    "train_dict None records": "type(train_dict([None] * 10))",
    "dense[2^64 int]": "dense()[2**64]",
    "Sampler batch_size beyond memory": "Sampler(10, 2**62, 0)",
    "Sampler batch_size bool": "Sampler(10, True, 0)",
    "Sampler length bool": "Sampler(True, 1, 0)",
    "Sampler seek bool": "Sampler(10, 2, 0).seek(True)",
    "DataLoader batch_size bool": "loader({'d': dense()}, batch_size=True)",
    "DataLoader mode bool": "loader({'d': dense()}, mode=True)",
    "DataLoader seed bool": "loader({'d': dense()}, seed=True)",
    "DataLoader prefetch_size 2^70": "loader({'d': dense()}, prefetch_size=2**70)",
}
CASES += [(name, expr) for name, expr in _DEVIATION_EXPRS.items() if expr is not None]
# The table's own 2^64 key rows are deviations too (same reason as "dense[2^64 int]").
for _kind in ("dense", "ragged"):
    for _how in (f"{_kind}[2^64]", f"{_kind}.__getitems__(2^64)"):
        DEVIATIONS[_how] = (_error("TypeError"), _error("IndexError"),
                            DEVIATIONS["dense[2^64 int]"][2])

# Mismatches in code this change does not own; reported, strict xfail.
PENDING: dict[str, str] = {}
CASES.append(("DataLoader len", "len(loader({'d': dense()}))"))

assert len({name for name, _ in CASES}) == len(CASES), "case names must be unique"
assert set(DEVIATIONS) <= {name for name, _ in CASES}


def _run(cmd_for, root, cases_file) -> dict:
    """Runs SCRIPT from row 0; after a crash, records the row and goes on after it."""
    results: dict = {}
    start = 0
    while True:
        proc = cmd_for(start)
        last = None
        for line in proc.stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                last = msg["start"]
            elif "done" in msg:
                return results
            else:
                results[msg["case"]] = msg["out"]
        if last is None:
            raise AssertionError(f"script failed before any row:\n{proc.stderr[-3000:]}")
        results[CASES[last][0]] = {"crash": proc.returncode, "stderr": proc.stderr[-500:]}
        start = last + 1


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, run_reference):
    """``{"ref": {row: outcome}, "ours": {row: outcome}}``, one run each."""
    tmp = tmp_path_factory.mktemp("errors_parity")
    script = tmp / "errors.py"
    script.write_text(SCRIPT)
    cases_file = tmp / "cases.json"
    cases_file.write_text(json.dumps(CASES))
    out = {}
    for who in ("ref", "ours"):
        root = tmp / who
        root.mkdir()
        if who == "ref":
            def cmd(start, root=root):
                return run_reference(script, root, cases_file, start, timeout=300, check=False)
        else:
            def cmd(start, root=root):
                return subprocess.run(
                    [sys.executable, str(script), str(root), str(cases_file), str(start)],
                    check=False, capture_output=True, text=True, timeout=300,
                    env=loaderx_child_env(), cwd=str(tmp))
        out[who] = _run(cmd, str(root), cases_file)
    return out


def _summary(outcome: dict) -> dict:
    """An outcome reduced to what DEVIATIONS pin: the type (and code or value)."""
    if "error" in outcome:
        return _error(outcome["error"][0], outcome["code"])
    if "ok" in outcome:
        return _ok(outcome["ok"], outcome["value"])
    return outcome


@pytest.mark.parametrize("name", [name for name, _ in CASES])
def test_error_parity(outcomes, name):
    ref, ours = outcomes["ref"][name], outcomes["ours"][name]
    if name in PENDING:
        if _mismatch(ref, ours) is None:
            pytest.fail(f"{name!r} matches 2.0.0 now: move it out of PENDING")
        pytest.xfail(PENDING[name])
    if name in DEVIATIONS:
        want_ref, want_ours, why = DEVIATIONS[name]
        assert (_summary(ref), _summary(ours)) == (want_ref, want_ours), why
        return
    assert "crash" not in ours, ours
    assert "crash" not in ref, f"2.0.0 crashes here; list the row in DEVIATIONS: {ref}"
    problem = _mismatch(ref, ours)
    assert problem is None, f"{problem}\n2.0.0: {ref}\nours:  {ours}"


def _mismatch(ref: dict, ours: dict) -> str | None:
    if "ok" in ref:
        if "ok" not in ours:
            return "2.0.0 succeeds, ours raises"
        if (ref["ok"], ref["value"]) != (ours["ok"], ours["value"]):
            return "different results"
        return None
    if "error" not in ours:
        return "2.0.0 raises, ours succeeds"
    if ref["error"][0] not in ours["error"]:
        return f"ours raises {ours['error'][0]}, not {ref['error'][0]} or a subclass"
    if ref["code"] != ours["code"]:
        return "different ZrecordError codes"
    if not ours["message"].startswith(ref["message"]):
        return "our message does not start with 2.0.0's"
    return None
