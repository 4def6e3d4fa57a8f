"""Every array a gather or the loader returns crosses DLPack without a copy,
checked by data pointer: into NumPy and PyTorch, all of them; into JAX on
the CPU, every 64-byte aligned one (Dense batches and records, packed
values), which is XLA's condition for not copying."""
from __future__ import annotations

import numpy as np
import pytest

from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged


@pytest.fixture
def stores(tmp_path):
    with Dense.create(tmp_path / "x", np.float32, (3, 4)) as w:
        w.append(np.arange(10 * 12, dtype=np.float32).reshape(10, 3, 4))
    with Ragged.create(tmp_path / "r", np.int32, codec="raw") as w:
        w.append([np.arange(n, dtype=np.int32) for n in range(1, 11)])
    x, r = Dense.open(tmp_path / "x"), Ragged.open(tmp_path / "r")
    yield x, r
    x.close()
    r.close()


def returned_arrays(x: Dense, r: Ragged) -> dict[str, np.ndarray]:
    """One of each kind of array loaderx hands out."""
    out = {"dense batch": x[[7, 1, 2]], "dense record": x[4], "ragged record": r[3]}
    out.update({f"ragged list[{i}]": a for i, a in enumerate(r[[2, 9]])})
    out.update(zip(("packed values", "packed cu_seqlens", "packed shapes"), r.gather_packed([1, 5])))
    loader = DataLoader({"x": x, "r": r}, batch_size=4, transform=None)
    batch = next(iter(loader))
    out["loader dense"], out["loader ragged[0]"] = batch["x"], batch["r"][0]
    loader.close()
    return out


def test_numpy_from_dlpack_shares_memory(stores):
    for name, array in returned_arrays(*stores).items():
        # Writable and C-contiguous: DLPack can export it, with no copy.
        assert array.flags.writeable and array.flags.c_contiguous, name
        view = np.from_dlpack(array)
        assert view.ctypes.data == array.ctypes.data, name
        np.testing.assert_array_equal(view, array)


def test_alignment(stores):
    """The alignment DLPack consumers (and SIMD loads) can rely on: every
    batch buffer starts at a 64-byte boundary (what XLA's CPU client needs to
    import without a copy), so Dense batches and packed values do; Ragged
    records sit at 16-byte offsets inside theirs."""
    x, r = stores
    arrays = returned_arrays(x, r)
    for name in ("dense batch", "packed values", "loader dense"):
        assert arrays[name].ctypes.data % 64 == 0, name
    assert all(a.ctypes.data % 16 == 0 for a in r[[0, 4, 8]])


def test_torch_from_dlpack_shares_memory(stores):
    torch = pytest.importorskip("torch")
    for name, array in returned_arrays(*stores).items():
        tensor = torch.from_dlpack(array)
        assert tensor.data_ptr() == array.ctypes.data, name
        assert tensor.shape == array.shape, name
        np.testing.assert_array_equal(tensor.numpy(), array)


def test_jax_from_dlpack_shares_memory(stores):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    for name, array in returned_arrays(*stores).items():
        if array.dtype == np.int64 and not jax.config.jax_enable_x64:
            # Without x64, JAX has no int64 and must convert (a copy).
            continue
        if name.startswith(("ragged", "loader ragged")):
            # 16-byte aligned inside their batch: XLA's CPU client copies
            # anything not 64-byte aligned (documented).
            continue
        imported = jnp.from_dlpack(array)
        pointer = imported.unsafe_buffer_pointer()
        assert pointer == array.ctypes.data, name
        np.testing.assert_array_equal(np.asarray(imported), array)
