"""Finite evaluation passes: DataLoader(..., epochs=N).

Record ``i`` of every store here has ``id`` ``i`` (and, in mixtures,
``k * 10000 + i`` for source ``k``), so coverage is checked record by record.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from loaderx.dataloader import DataLoader, Mixture
from loaderx.zrecord import Dense, Ragged


def build(root, n: int, k: int = 0) -> dict:
    with Dense.create(root / "id", np.int64, ()) as w:
        w.append(np.arange(n, dtype=np.int64) + k * 10000)
    with Ragged.create(root / "tok", np.int32) as w:
        w.append([np.full(i % 3 + 1, i, np.int32) for i in range(n)])
    return {"id": Dense.open(root / "id"), "tok": Ragged.open(root / "tok")}


@pytest.fixture(scope="module")
def sets(tmp_path_factory):
    root = tmp_path_factory.mktemp("eval")
    opened = {n: build(root / str(n), n) for n in (7, 50, 53)}
    opened["a"] = build(root / "a", 20, 0)
    opened["b"] = build(root / "b", 9, 1)
    opened["c"] = build(root / "c", 4, 2)
    yield opened
    for streams in opened.values():
        for s in streams.values():
            s.close()


def run(loader) -> list[dict]:
    with loader:
        return list(loader)


@pytest.mark.parametrize("n", [7, 50, 53])
@pytest.mark.parametrize("batch_size", [12, 24])
@pytest.mark.parametrize("mode", [0, 2])
def test_every_record_once_on_any_rank_count(sets, n, batch_size, mode):
    steps = math.ceil(n / batch_size)
    for ranks in (1, 2, 3, 4):
        seen = Counter()
        counts = []
        for rank in range(ranks):
            loader = DataLoader(sets[n], batch_size=batch_size, mode=mode, seed=5, epochs=1,
                                shard_index=rank, shard_count=ranks)
            assert len(loader) == steps
            batches = run(loader)
            counts.append(len(batches))
            for b in batches:
                mask = b["mask"]
                assert mask.dtype == np.bool_ and mask.shape == (batch_size // ranks,)
                assert len(b["id"]) == len(b["tok"]) == batch_size // ranks
                ids = b["id"]
                assert ((0 <= ids) & (ids < n)).all()  # padding is a valid record too
                for t, i in zip(b["tok"], ids):
                    np.testing.assert_array_equal(t, np.full(i % 3 + 1, i, np.int32))
                seen.update(ids[mask].tolist())
        assert counts == [steps] * ranks, "every rank takes the same number of steps"
        assert seen == {i: 1 for i in range(n)}, (ranks, seen)


def test_mask_marks_the_padding_of_the_last_batch(sets):
    batches = run(DataLoader(sets[53], batch_size=12, mode=0, epochs=1))
    assert len(batches) == 5
    for b in batches[:4]:
        assert b["mask"].all()
    last = batches[4]
    assert last["mask"].tolist() == [True] * 5 + [False] * 7
    assert last["id"][:5].tolist() == [48, 49, 50, 51, 52]
    # In order: the real records are 0..52.
    real = np.concatenate([b["id"][b["mask"]] for b in batches])
    assert real.tolist() == list(range(53))
    # Rank 1 of 2 holds slots 6..11 of the last batch: all padding.
    (*_, last1) = run(DataLoader(sets[53], batch_size=12, mode=0, epochs=1, shard_index=1, shard_count=2))
    assert not last1["mask"].any()


def test_shuffled_epochs_differ_and_each_is_complete(sets):
    loader = DataLoader(sets[53], batch_size=12, mode=2, seed=1, epochs=3)
    assert len(loader) == 15
    batches = run(loader)
    assert len(batches) == 15
    epochs = [np.concatenate([b["id"][b["mask"]] for b in batches[e * 5:(e + 1) * 5]]) for e in range(3)]
    for order in epochs:
        assert sorted(order.tolist()) == list(range(53))
    assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()
    assert epochs[0].tolist() != list(range(53))


def test_iteration_stops_and_stays_stopped(sets):
    loader = DataLoader(sets[7], batch_size=4, epochs=1, transform=lambda b: b)
    assert len(list(loader)) == 2
    with pytest.raises(StopIteration):
        next(loader)
    assert loader.step == 2
    loader.close()


@pytest.mark.parametrize("mode", [0, 2])
def test_resume_inside_a_pass(sets, mode):
    kw = dict(batch_size=8, mode=mode, seed=3, epochs=2)
    full = [b["id"].tolist() for b in run(DataLoader(sets[53], **kw))]
    assert len(full) == 14
    for start in (1, 6, 7, 13, 14):
        loader = DataLoader(sets[53], start_step=start, **kw)
        assert len(loader) == 14  # the whole pass, wherever it starts
        assert [b["id"].tolist() for b in run(loader)] == full[start:]
    with DataLoader(sets[53], **kw) as loader:
        for _ in range(4):
            next(loader)
        state = loader.state_dict()
        loader.load_state_dict({"step": 10})
        assert [b["id"].tolist() for b in loader] == full[10:]
    assert state == {"step": 4}
    assert [b["id"].tolist() for b in run(DataLoader(sets[53], start_step=state["step"], **kw))] == full[4:]
    # Resume on another rank count: the shards still split the same batches.
    joined = [[] for _ in range(14 - 6)]
    for rank in range(4):
        loader = DataLoader(sets[53], start_step=6, shard_index=rank, shard_count=4, **kw)
        for t, b in enumerate(run(loader)):
            joined[t].extend(b["id"].tolist())
    assert joined == full[6:]


def test_finite_pass_arguments_are_checked(sets, tmp_path):
    with pytest.raises(ValueError, match="mode 1"):
        DataLoader(sets[7], batch_size=4, mode=1, epochs=1)
    with pytest.raises(ValueError, match="epochs"):
        DataLoader(sets[7], batch_size=4, epochs=0)
    with pytest.raises(TypeError, match="epochs"):
        DataLoader(sets[7], batch_size=4, epochs="1")
    with pytest.raises(ValueError, match="past the end"):
        DataLoader(sets[7], batch_size=4, epochs=1, start_step=3)
    assert run(DataLoader(sets[7], batch_size=4, epochs=1, start_step=2)) == []
    with Dense.create(tmp_path / "m", np.bool_, ()) as w:
        w.append(np.ones(7, np.bool_))
    with Dense.open(tmp_path / "m") as m:
        with pytest.raises(ValueError, match="'mask'"):
            DataLoader({"id": sets[7]["id"], "mask": m}, batch_size=4, epochs=1)
        # Endless loaders add no mask, so the name stays free there.
        DataLoader({"id": sets[7]["id"], "mask": m}, batch_size=4).close()


def test_endless_loaders_have_no_len(sets):
    loader = DataLoader(sets[7], batch_size=4)
    with pytest.raises(TypeError):
        len(loader)
    assert "mask" not in next(loader)
    loader.close()


@pytest.mark.parametrize("mode", [0, 2])
def test_mixture_pass_takes_every_source_once(sets, mode):
    mix = Mixture({"a": (sets["a"], 0.2), "b": (sets["b"], 0.5), "c": (sets["c"], 0.3)}, source_stream="src")
    for ranks in (1, 2, 3, 4):
        seen = []
        for rank in range(ranks):
            loader = DataLoader(mix, batch_size=12, mode=mode, epochs=1, shard_index=rank, shard_count=ranks)
            assert len(loader) == 3  # 33 records in batches of 12
            batches = run(loader)
            assert len(batches) == 3
            for b in batches:
                np.testing.assert_array_equal(b["src"], b["id"] // 10000)
                seen.append([i for i, m in zip(b["id"].tolist(), b["mask"].tolist()) if m])
        # Steps are interleaved rank by rank; put each step's slices together.
        by_step = [sum((seen[r * 3 + t] for r in range(ranks)), []) for t in range(3)]
        flat = sum(by_step, [])
        want = list(range(20)) + list(range(10000, 10009)) + list(range(20000, 20004))
        if mode == 0:
            assert flat == want  # sources laid end to end, in order
        assert sorted(flat) == want


def test_packed_pass(sets):
    batches = run(DataLoader(sets[7], batch_size=4, epochs=1, packed=True, mode=0))
    values, cu, shapes = batches[1]["tok"]
    assert batches[1]["id"].tolist() == [4, 5, 6, 4]
    assert batches[1]["mask"].tolist() == [True, True, True, False]
    assert cu.tolist() == [0, 2, 5, 6, 8]
    assert values.tolist() == [4, 4, 5, 5, 5, 6, 4, 4]
