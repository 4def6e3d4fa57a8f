"""Faults from outside the process: files changed under open readers, and
a create that runs out of space."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import loaderx_child_env
from loaderx.zrecord import Dense, ZrecordError

# The child builds a store, opens it, lets a file be cut short, then reads:
# it must get a ZrecordError (printed), not die of SIGBUS (exit -7 / 135).
CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from loaderx.zrecord import Dense, ZrecordError
    path, codec, access, victim = sys.argv[1:5]
    data = np.arange(1000 * 64, dtype=np.uint8).reshape(1000, 64)
    with Dense.create(path, np.uint8, (64,), codec=codec) as w:
        w.append(data)
    ds = Dense.open(path, data_access=None if access == "default" else access)
    print("access", ds.data_access)
    os.truncate(os.path.join(path, victim), 4096)
    try:
        ds[500]
    except ZrecordError as e:
        print("ZrecordError", e.code, e)
    else:
        print("no error")
""")


@pytest.mark.parametrize("codec", ["raw", "zstd"])
@pytest.mark.parametrize("access", ["default", "read", "map"])
@pytest.mark.parametrize("victim", ["meta.zr", "data.zr"])
def test_a_file_cut_short_under_a_reader_is_an_error_not_a_signal(tmp_path, codec, access, victim):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "s"), codec, access, victim],
                          capture_output=True, text=True, timeout=60, env=loaderx_child_env())
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    lines = proc.stdout.splitlines()
    expected_access = "map" if access == "map" or (access == "default" and codec == "raw") else "read"
    assert lines[0] == f"access {expected_access}"
    assert lines[1].startswith("ZrecordError -2 "), lines
    assert victim in lines[1] or "record table" in lines[1], lines


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 64 KiB tmpfs, so a create can run out of space for real."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_a_create_that_runs_out_of_space_leaves_nothing(tiny_filesystem):
    target = tiny_filesystem / "parent" / "store"
    big_dict = os.urandom(256 << 10)  # dict.zr cannot fit in 64 KiB
    with pytest.raises(ZrecordError) as info:
        Dense.create(target, np.uint8, (8,), codec="zstd_dict", dict_bytes=big_dict)
    assert info.value.code == -2 and "No space left" in str(info.value)
    assert list(tiny_filesystem.iterdir()) == [], "no directory or file is left behind"
    # The retry at the same path works.
    with Dense.create(target, np.uint8, (8,), codec="raw") as w:
        w.append(np.ones((3, 8), np.uint8))
    with Dense.open(target) as ds:
        assert len(ds) == 3


def test_a_set_whose_first_shard_fails_leaves_nothing(tiny_filesystem):
    target = tiny_filesystem / "set"
    with pytest.raises(ZrecordError):
        Dense.create(target, np.uint8, (8,), codec="zstd_dict", dict_bytes=os.urandom(256 << 10),
                     shard_records=10)
    assert list(tiny_filesystem.iterdir()) == []


def test_a_reader_of_an_unchanged_prefix_of_a_cut_file_still_reads_it(tmp_path):
    """Only what the cut removed is an error: records before it still read."""
    data = np.random.default_rng(0).integers(0, 255, size=(100, 4096), dtype=np.uint8)
    with Dense.create(tmp_path / "s", np.uint8, (4096,), codec="raw") as w:
        w.append(data)
    with Dense.open(tmp_path / "s", data_access="read") as ds:
        os.truncate(tmp_path / "s" / "data.zr", 50 * 4096)
        np.testing.assert_array_equal(ds[49], data[49])
        with pytest.raises(ZrecordError, match="data.zr"):
            ds[50]
