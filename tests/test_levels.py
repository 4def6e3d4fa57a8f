"""The compression level outside ``create``: ``convert(level=)``, ``loaderx
convert --level`` and ``sets.write_shard(level=)``. (``create`` itself:
tests/test_zrecord.py; reading by loaderx 2.0.0: tests/test_interop.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaderx import sets, tools
from loaderx.zrecord import Dense, Ragged

from conftest import loaderx_child_env


def _images(n: int = 60) -> np.ndarray:
    yy, xx = np.indices((24, 24))
    return np.stack([((yy * (i % 5 + 1) + xx * (i % 3 + 1)) // 3 % 64).astype(np.uint8) for i in range(n)])


def _payload(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("data.zr"))


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "loaderx", *map(str, args)], capture_output=True,
                          text=True, timeout=120, env=loaderx_child_env())


def test_convert_writes_at_the_level(tmp_path):
    data = _images()
    sizes = {}
    for level in (None, -5, 3, 19):
        dst = tmp_path / f"out{level}"
        tools.convert(data, dst, level=level)
        with Dense.open(dst) as ds:
            np.testing.assert_array_equal(ds[:], data)
        sizes[level] = _payload(dst)
    assert sizes[None] == sizes[3]
    assert sizes[-5] > sizes[3] > sizes[19]


def test_convert_level_reaches_sets_and_dict_stores(tmp_path):
    data = _images()
    tools.convert(data, tmp_path / "set19", level=19, shard_records=25)
    tools.convert(data, tmp_path / "set-5", level=-5, shard_records=25)
    with Dense.open(tmp_path / "set19") as ds:
        assert len(ds.shards) == 3
        np.testing.assert_array_equal(ds[:], data)
    assert _payload(tmp_path / "set-5") > _payload(tmp_path / "set19")

    tools.convert(data, tmp_path / "d1", codec="zstd_dict", tier="fast", level=1)
    tools.convert(data, tmp_path / "ddefault", codec="zstd_dict", tier="fast")
    for name in ("d1", "ddefault"):
        with Dense.open(tmp_path / name) as ds:
            assert ds.codec == "zstd_dict"
            np.testing.assert_array_equal(ds[:], data)
    assert _payload(tmp_path / "d1") > _payload(tmp_path / "ddefault")


def test_convert_refuses_bad_levels_before_writing(tmp_path):
    data = _images(4)
    with pytest.raises(ValueError, match=r"^level applies only to codec='zstd' and codec='zstd_dict'"):
        tools.convert(data, tmp_path / "raw", codec="raw", level=3)
    with pytest.raises(ValueError, match=r"^level must be in zstd's range -131072\.\.22, got 23$"):
        tools.convert(data, tmp_path / "big", level=23)
    with pytest.raises(TypeError, match="level must be an int or None"):
        tools.convert(data, tmp_path / "float", level=1.5)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


def test_cli_convert_level(tmp_path):
    data = _images()
    np.save(tmp_path / "x.npy", data)
    for level in ("-7", "19"):
        out = _cli("convert", tmp_path / "x.npy", tmp_path / f"s{level}", "--level", level, "-q")
        assert out.returncode == 0, out.stderr
        with Dense.open(tmp_path / f"s{level}") as ds:
            np.testing.assert_array_equal(ds[:], data)
    assert _payload(tmp_path / "s-7") > _payload(tmp_path / "s19")

    out = _cli("convert", tmp_path / "x.npy", tmp_path / "raw", "--codec", "raw", "--level", "3")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "level applies only to codec='zstd' and codec='zstd_dict'" in out.stderr
    assert not (tmp_path / "raw").exists()
    out = _cli("convert", tmp_path / "x.npy", tmp_path / "f", "--level", "high")
    assert out.returncode == 2 and "--level" in out.stderr
    assert "zstd compression level" in _cli("convert", "--help").stdout


def test_write_shard_level(tmp_path):
    data = _images()
    infos = [sets.write_shard(str(tmp_path / "set"), f"p{k}", [data[k * 30:(k + 1) * 30]],
                              dtype=np.uint8, item_shape=(24, 24), level=level)
             for k, level in enumerate((-5, 19))]
    assert infos[0]["data_bytes"] > infos[1]["data_bytes"]
    sets.commit(str(tmp_path / "set"), infos, dtype=np.uint8, item_shape=(24, 24))
    with Dense.open(tmp_path / "set") as ds:
        np.testing.assert_array_equal(ds[:], data)

    recs = [np.arange(1, 2 + i % 40, dtype=np.int32) for i in range(1, 50)]
    info = sets.write_shard(str(tmp_path / "tok"), "p0", [recs], dtype=np.int32, level=9)
    sets.commit(str(tmp_path / "tok"), [info], dtype=np.int32)
    with Ragged.open(tmp_path / "tok") as ds:
        for got, want in zip(ds[:], recs):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="raw stores are not compressed"):
        sets.write_shard(str(tmp_path / "raw"), "p0", [data], dtype=np.uint8, item_shape=(24, 24),
                         codec="raw", level=1)


def test_auto_applies_the_level_to_the_stores_it_compresses_only(tmp_path):
    """``codec="auto"`` (convert's default) with a level: the stores it
    leaves raw (tiny labels) take no level, the others are written, and
    measured, at it."""
    src = tmp_path / "d.npz"
    np.savez(src, label=np.arange(400, dtype=np.int64), image=_images(400))
    sizes = {}
    for level in (1, 19):
        out = tools.convert(src, tmp_path / f"out{level}", level=level)
        with Dense.open(out["label"]) as labels, Dense.open(out["image"]) as images:
            assert labels.codec == "raw"
            assert images.codec in ("zstd", "zstd_dict")
            np.testing.assert_array_equal(labels[:], np.arange(400))
            np.testing.assert_array_equal(images[:], _images(400))
        sizes[level] = _payload(Path(out["image"]))
    assert sizes[1] > sizes[19]
    with pytest.raises(ValueError, match="level applies only to codec='zstd'"):
        tools.convert(src, tmp_path / "raw", codec="raw", level=3)
