"""loaderx.torch: tensors without copies, lent (pinned) memory recycled,
Stateful resume, and torch.utils.data.DataLoader with workers. The CUDA
paths run only where CUDA is present (marked ``cuda``)."""

from __future__ import annotations

import gc
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import loaderx.torch as lt
from loaderx import _native
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged
from loaderx.zsampler import Sampler

N = 40
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def stores(tmp_path):
    with Dense.create(tmp_path / "x", np.float32, (3, 4)) as w:
        w.append(np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4))
    with Dense.create(tmp_path / "y", np.int64, ()) as w:
        w.append(np.arange(N, dtype=np.int64) * 10)
    with Ragged.create(tmp_path / "r", np.int32, codec="raw") as w:
        w.append([np.full(i % 5 + 1, i, dtype=np.int32) for i in range(N)])
    opened = {"x": Dense.open(tmp_path / "x"), "y": Dense.open(tmp_path / "y"), "r": Ragged.open(tmp_path / "r")}
    yield opened
    for s in opened.values():
        s.close()


def expected(step: int, batch_size: int = 8, mode: int = 2, seed: int = 42) -> np.ndarray:
    return Sampler(N, batch_size, mode, seed).batch_at(step).astype(np.int64)


def check_batch(batch, idx) -> None:
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].dtype == torch.float32
    assert batch["x"].shape == (len(idx), 3, 4)
    np.testing.assert_array_equal(batch["x"].numpy(), np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)[idx])
    assert batch["y"].tolist() == [10 * i for i in idx]
    assert [t.tolist() for t in batch["r"]] == [[i] * (i % 5 + 1) for i in idx]


# -- TorchLoader on the CPU ------------------------------------------------------


def test_torch_loader_yields_the_dataloaders_batches_as_tensors(stores):
    with lt.TorchLoader(stores, batch_size=8, transform=None) as tl:
        for step in range(7):
            assert tl.step == step
            check_batch(next(tl), expected(step))


def test_tensors_share_the_loaders_memory(stores):
    with DataLoader(stores, batch_size=8, transform=None) as dl:
        raw = next(dl)
    t = lt.to_tensors(raw)
    assert t["x"].data_ptr() == raw["x"].ctypes.data
    assert t["r"][3].data_ptr() == raw["r"][3].ctypes.data
    # DLPack takes the arrays without a copy too.
    assert torch.from_dlpack(raw["x"]).data_ptr() == raw["x"].ctypes.data
    assert torch.from_dlpack(raw["r"][1]).data_ptr() == raw["r"][1].ctypes.data


def test_packed_streams_become_tuples_of_tensors(stores):
    with lt.TorchLoader(stores, batch_size=8, packed=["r"], transform=None) as tl:
        values, cu, shapes = next(tl)["r"]
    idx = expected(0)
    assert values.tolist() == [i for i in idx for _ in range(i % 5 + 1)]
    assert cu.tolist() == np.concatenate([[0], np.cumsum([i % 5 + 1 for i in idx])]).tolist()
    assert cu.dtype == torch.int32 and shapes.dtype == torch.int64
    assert shapes[:, 0].tolist() == [i % 5 + 1 for i in idx]


def test_a_transforms_output_is_converted_where_it_holds_arrays(stores):
    def transform(b):
        return {"x2": b["x"] * 2, "n": len(b["r"]), "pair": (b["y"], "tag")}

    with lt.TorchLoader(stores, batch_size=8, transform=transform) as tl:
        b = next(tl)
    idx = expected(0)
    assert b["n"] == 8 and b["pair"][1] == "tag"
    assert b["pair"][0].tolist() == [10 * i for i in idx]
    assert torch.equal(b["x2"], torch.from_numpy(np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)[idx] * 2))


def test_state_dict_resumes_exactly_and_is_torchdata_stateful(stores):
    stateful = pytest.importorskip("torchdata.stateful_dataloader").Stateful
    tl = lt.TorchLoader(stores, batch_size=8, transform=None)
    assert isinstance(tl, stateful)
    for _ in range(3):
        next(tl)
    state = tl.state_dict()
    assert state == {"step": 3}
    after = [next(tl)["y"].tolist() for _ in range(2)]
    tl.close()

    resumed = lt.TorchLoader(DataLoader(stores, batch_size=8, transform=None))
    resumed.load_state_dict(state)
    assert [next(resumed)["y"].tolist() for _ in range(2)] == after
    resumed.close()


def test_pin_memory_without_an_accelerator_warns_like_torch(stores, monkeypatch):
    monkeypatch.setattr(lt, "_accelerator_available", lambda: False)
    with pytest.warns(UserWarning, match="no accelerator"):
        tl = lt.TorchLoader(stores, batch_size=8, pin_memory=True, transform=None)
    assert tl.pinned_stats() is None
    check_batch(next(tl), expected(0))
    assert not next(tl)["x"].is_pinned()
    tl.close()


def test_a_cuda_device_without_cuda_is_refused(stores, monkeypatch):
    monkeypatch.setattr(lt, "_accelerator_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available"):
        lt.TorchLoader(stores, device="cuda", transform=None)


def test_bad_arguments(stores):
    with pytest.raises(ValueError, match="prefetch must be an int of at least 1"):
        lt.TorchLoader(stores, prefetch=0)
    dl = DataLoader(stores, batch_size=8)
    with pytest.raises(TypeError, match=r"DataLoader options \(seed\) only apply"):
        lt.TorchLoader(dl, seed=3)
    dl.close()
    with pytest.raises(TypeError, match="not list"):
        lt.TorchLoader([1, 2])


def test_ml_dtypes_become_torch_dtypes_bit_for_bit(tmp_path):
    ml = pytest.importorskip("ml_dtypes")
    values = np.array([1.5, -2.0, 0.25, 3.0], dtype=np.float32)
    for np_name, torch_name in [("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")]:
        dt = np.dtype(getattr(ml, np_name))
        with Dense.create(tmp_path / np_name, dt, (2,)) as w:
            w.append(values.astype(dt).reshape(2, 2))
        with Dense.open(tmp_path / np_name) as s:
            t = lt.to_tensor(s[[1, 0]])
        assert t.dtype == getattr(torch, torch_name)
        assert t.float().tolist() == [[0.25, 3.0], [1.5, -2.0]]
    with pytest.raises(TypeError, match="torch has no dtype for"):
        lt.to_tensor(np.zeros(2, dtype=ml.int4))


# -- lent memory (what pinned buffers are built on) ----------------------------------


def test_dense_batches_land_in_lent_regions_which_are_recycled(stores):
    rows, nbytes = 8, 8 * 12 * 4
    regions = [np.zeros(nbytes + 16, dtype=np.uint8) for _ in range(12)]
    spans = [(r.ctypes.data, r.ctypes.data + r.nbytes) for r in regions]
    pool = _native.LentPool()
    for r in regions:
        pool.lend(r)
    dl = DataLoader({"x": stores["x"], "r": stores["r"]}, batch_size=rows, prefetch_size=2, transform=None)
    dl._lend(pool)
    for step in range(30):
        batch = next(dl)
        start = batch["x"].ctypes.data
        assert any(lo <= start and start + nbytes <= hi for lo, hi in spans), step
        assert batch["x"].flags.writeable
        np.testing.assert_array_equal(
            batch["x"], np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)[expected(step)]
        )
        del batch
    lent, fallback, _free = pool.stats()
    assert fallback == 0 and lent >= 30
    dl.close()
    gc.collect()
    # Every region is back once the loader and its batches are gone.
    assert pool.stats()[2] == 12


def test_a_full_pool_falls_back_to_engine_memory(stores):
    region = np.zeros(8 * 12 * 4, dtype=np.uint8)
    pool = _native.LentPool()
    pool.lend(region)
    dl = DataLoader({"x": stores["x"]}, batch_size=8, prefetch_size=2, transform=None)
    dl._lend(pool)
    kept = [next(dl)["x"] for _ in range(5)]  # the consumer keeps them all
    inside = [k.ctypes.data == region.ctypes.data for k in kept]
    assert inside.count(True) == 1
    for step, k in enumerate(kept):
        np.testing.assert_array_equal(k, np.arange(N * 12, dtype=np.float32).reshape(N, 3, 4)[expected(step)])
    assert pool.stats()[1] >= 4
    dl.close()


def test_lent_memory_must_be_a_writable_contiguous_byte_array():
    pool = _native.LentPool()
    ro = np.zeros(64, dtype=np.uint8)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writable C-contiguous uint8"):
        pool.lend(ro)
    with pytest.raises(ValueError, match="writable C-contiguous uint8"):
        pool.lend(np.zeros(64, dtype=np.uint8)[::2])
    with pytest.raises(TypeError):
        pool.lend(np.zeros(8, dtype=np.float32))


# -- torch.utils.data.DataLoader ---------------------------------------------------------


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_store_dataset_with_a_batch_sampler_and_workers(stores, context):
    ds = lt.StoreDataset(stores)
    assert len(ds) == N
    sampler = torch.utils.data.BatchSampler(range(N), batch_size=8, drop_last=False)
    loader = torch.utils.data.DataLoader(
        ds, batch_sampler=sampler, collate_fn=lt.collate, num_workers=2, multiprocessing_context=context
    )
    batches = list(loader)
    assert len(batches) == 5
    for k, b in enumerate(batches):
        check_batch(b, list(range(8 * k, 8 * k + 8)))


def test_store_dataset_items_and_default_batching(stores):
    ds = lt.StoreDataset({"x": stores["x"], "y": stores["y"]})
    assert ds[3]["y"].item() == 30
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=lt.collate)
    first = next(iter(loader))
    assert first["y"].tolist() == [0, 10, 20, 30] and first["x"].shape == (4, 3, 4)
    assert pickle.loads(pickle.dumps(ds))[5]["y"].item() == 50


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_iterable_streams_match_the_loader_whatever_the_workers(stores, workers):
    ds = lt.IterableStreams(stores, batch_size=8, steps=7, start_step=2)
    kw = {"num_workers": workers}
    if workers:
        kw["multiprocessing_context"] = "fork"
    got = list(torch.utils.data.DataLoader(ds, batch_size=None, **kw))
    # Workers divide 7 steps unevenly; torch still delivers them in order.
    assert len(got) == 7
    for k, b in enumerate(got):
        check_batch(b, expected(2 + k))


def test_iterable_streams_shards_and_packs(stores):
    halves = []
    for shard in range(2):
        ds = lt.IterableStreams(stores, batch_size=8, steps=2, shard_index=shard, shard_count=2, packed=True)
        halves.append(list(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")))
    for step in range(2):
        idx = expected(step)
        assert halves[0][step]["y"].tolist() + halves[1][step]["y"].tolist() == [10 * i for i in idx]
        values = torch.cat([halves[0][step]["r"][0], halves[1][step]["r"][0]])
        assert values.tolist() == [i for i in idx for _ in range(i % 5 + 1)]


def test_iterable_streams_check_arguments_up_front(stores):
    with pytest.raises(ValueError, match="divisible by shard_count"):
        lt.IterableStreams(stores, batch_size=7, shard_count=2)
    with pytest.raises(ValueError, match="steps must be"):
        lt.IterableStreams(stores, steps=-1)


# -- CUDA (skipped without a device) -----------------------------------------------------


@cuda
def test_cuda_batches_arrive_on_the_device_from_recycled_pinned_buffers(stores):
    with lt.TorchLoader(stores, batch_size=8, device="cuda", prefetch=2, transform=None) as tl:
        for step in range(25):
            b = next(tl)
            assert b["x"].is_cuda and b["y"].is_cuda and all(t.is_cuda for t in b["r"])
            check_batch({k: (v.cpu() if k != "r" else [t.cpu() for t in v]) for k, v in b.items()}, expected(step))
        stats = tl.pinned_stats()
    assert stats is not None and stats["fallback"] == 0 and stats["lent"] >= 2 * 25


@cuda
def test_cuda_pinned_host_batches(stores):
    with lt.TorchLoader(stores, batch_size=8, pin_memory=True, transform=None) as tl:
        b = next(tl)
        assert b["x"].is_pinned() and not b["x"].is_cuda
        check_batch(b, expected(0))


@cuda
def test_cuda_copies_overlap_a_busy_stream_and_stay_correct(stores):
    # A long kernel on the consumer's stream while copies run on the side
    # stream: every batch must still match, with no buffer reused early.
    with lt.TorchLoader(stores, batch_size=8, device="cuda", prefetch=3, transform=None) as tl:
        big = torch.randn(2048, 2048, device="cuda")
        for step in range(40):
            b = next(tl)
            big = big @ big  # keeps the current stream busy
            big /= big.norm()
            assert b["y"].tolist() == [10 * i for i in expected(step)]
        state = tl.state_dict()
    assert state == {"step": 40}


def test_built_from_streams_it_reads_this_ranks_slice(stores, monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with lt.TorchLoader(stores, batch_size=8, transform=None) as tl:
        assert next(tl)["y"].tolist() == [10 * i for i in expected(0)[4:]]
    # Explicit arguments win over the environment.
    with lt.TorchLoader(stores, batch_size=8, shard_index=0, shard_count=1, transform=None) as tl:
        assert next(tl)["y"].tolist() == [10 * i for i in expected(0)]


def test_a_finite_pass_ends_with_its_len_and_mask(stores):
    with lt.TorchLoader(stores, batch_size=16, mode=0, epochs=1, transform=None) as tl:
        assert len(tl) == 3  # ceil(40 / 16)
        batches = list(tl)
    assert len(batches) == 3
    assert [b["mask"].dtype for b in batches] == [torch.bool] * 3
    real = torch.cat([b["y"][b["mask"]] for b in batches])
    assert real.tolist() == [10 * i for i in range(N)]
