"""Index keys, differentially: the same table of keys runs under loaderx
2.0.0 (its own venv) and under ours; both must return the same records, or
both raise the same exception type. (Messages may differ; see #14.)"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import loaderx_child_env

SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    from loaderx.zrecord import Dense, Ragged

    root = sys.argv[1]
    with Dense.create(os.path.join(root, "d"), np.int32, (2,), codec="raw") as w:
        w.append(np.arange(20, dtype=np.int32).reshape(10, 2))
    with Ragged.create(os.path.join(root, "r"), np.int32, codec="zstd") as w:
        w.append([np.arange(n, dtype=np.int32) for n in range(1, 11)])
    stores = {"dense": Dense.open(os.path.join(root, "d")),
              "ragged": Ragged.open(os.path.join(root, "r"))}
    keys = {
        "int": 3, "np.int64": np.int64(7), "negative int": -1, "past the end": 10,
        "slice": slice(2, 5), "slice step": slice(None, None, 3), "slice negative": slice(-3, None),
        "empty slice": slice(5, 2), "range": range(2, 8, 2), "list": [4, 0, 4],
        "tuple": (1, 2), "empty list": [], "negative in list": [1, -1],
        "float in list": [1.0], "str": "1", "none": None, "bool": True,
        "int array": np.array([3, 1]), "uint8 array": np.array([9, 0], dtype=np.uint8),
        "2-d array": np.array([[1, 2], [3, 4]]), "0-d array": np.array(6),
        "0-d bool": np.array(True), "empty float array": np.array([]),
        "float array": np.array([1.0, 2.0]), "bool mask": np.arange(10) % 3 == 0,
        "short mask": np.array([True, False]),
        "array [5, 1]": np.array([5, 1]), "array [2, 8]": np.array([2, 8]),
    }
    try:
        import pandas as pd
        keys["pandas Series"] = pd.Series([5, 1])
        keys["pandas Index"] = pd.Index([2, 8])
    except ImportError:
        pass

    def plain(v):
        if isinstance(v, list):
            return ["list", [np.asarray(a).tolist() for a in v]]
        return [type(v).__name__, np.asarray(v).tolist(), list(np.shape(v))]

    out = {}
    for kind, store in stores.items():
        for name, key in keys.items():
            for how, call in (("getitem", lambda: store[key]),
                              ("getitems", lambda: store.__getitems__(key))):
                try:
                    out[f"{kind} {how} {name}"] = ["ok", plain(call())]
                except Exception as e:
                    out[f"{kind} {how} {name}"] = ["error", type(e).__name__]
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)
''')


def test_index_keys_match_loaderx_2(tmp_path, run_reference):
    script = tmp_path / "keys.py"
    script.write_text(SCRIPT)
    (tmp_path / "ref").mkdir()
    (tmp_path / "ours").mkdir()
    ref = json.loads(run_reference(script, tmp_path / "ref").stdout.splitlines()[-1])
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ours")], capture_output=True,
                          text=True, timeout=120, env=loaderx_child_env())
    assert proc.returncode == 0, proc.stderr
    ours = json.loads(proc.stdout.splitlines()[-1])
    # pandas keys run where pandas is installed (ours has it; the reference
    # venv may not): they must select what the same NumPy array selects.
    assert set(ref) <= set(ours) and all("pandas" in k for k in set(ours) - set(ref))
    differ = {k: (ref[k], ours[k]) for k in ref if ref[k] != ours[k]}
    assert not differ, json.dumps(differ, indent=1)[:4000]
    for kind in ("dense", "ragged"):
        for how in ("getitem", "getitems"):
            for pandas_key, same in (("pandas Series", "array [5, 1]"), ("pandas Index", "array [2, 8]")):
                got = ours.get(f"{kind} {how} {pandas_key}")
                if got is None:
                    pytest.skip("pandas is not installed")
                assert got == ours[f"{kind} {how} {same}"], (kind, how, pandas_key)
