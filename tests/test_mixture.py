"""Weighted mixtures: DataLoader(Mixture({...}), ...).

Every store here encodes where its records come from: record ``i`` of source
``k`` has ``id`` ``k * 10000 + i`` and Ragged ``tok`` ``tok(k, i)``, so each
delivered record is checked against the source number the loader reports.
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import loaderx.dataloader as dl
from loaderx.dataloader import DataLoader, Mixture
from loaderx.zrecord import Dense, Ragged

LENGTHS = {"web": 100, "code": 33, "math": 8}
SOURCE = {name: k for k, name in enumerate(LENGTHS)}


def tok(k: int, i: int) -> np.ndarray:
    return np.arange(i % 5 + 1, dtype=np.int32) + k * 10000 + i


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    opened = {}
    for name, n in LENGTHS.items():
        k = SOURCE[name]
        with Dense.create(root / name / "id", np.int64, ()) as w:
            w.append(np.arange(n, dtype=np.int64) + k * 10000)
        with Ragged.create(root / name / "tok", np.int32, codec="zstd") as w:
            w.append([tok(k, i) for i in range(n)])
        opened[name] = {"id": Dense.open(root / name / "id"), "tok": Ragged.open(root / name / "tok")}
    yield opened
    for streams in opened.values():
        for s in streams.values():
            s.close()


def mix(stores, weights=(0.5, 0.3, 0.2), **kw) -> Mixture:
    return Mixture({name: (stores[name], w) for name, w in zip(LENGTHS, weights)}, **kw)


def take(loader, steps: int) -> list[dict]:
    out = []
    with loader:
        for _ in range(steps):
            out.append(next(loader))
    return out


def check(batch) -> None:
    """Each record's id and tokens come from the source the loader names."""
    src = batch["source"]
    assert src.dtype == np.int32
    ids = batch["id"]
    np.testing.assert_array_equal(ids // 10000, src)
    lengths = np.array(list(LENGTHS.values()))
    assert ((ids % 10000) < lengths[src]).all()
    for t, i in zip(batch["tok"], ids):
        np.testing.assert_array_equal(t, tok(int(i) // 10000, int(i) % 10000))


def test_mixture_is_exported():
    assert "Mixture" in dl.__all__
    assert dl.Mixture is Mixture


@pytest.mark.parametrize("mode", [0, 1, 2])
def test_exact_quotas_in_every_batch(stores, mode):
    loader = DataLoader(mix(stores, source_stream="source"), batch_size=20, mode=mode, seed=3)
    layouts = set()
    for b in take(loader, 60):
        check(b)
        assert Counter(b["source"].tolist()) == {0: 10, 1: 6, 2: 4}
        layouts.add(tuple(b["source"].tolist()))
    assert len(layouts) > 50  # slots are placed at random


def test_exact_weights_are_largest_remainder_quotas(stores):
    # 20 * (0.45, 0.35, 0.2) = 9, 7, 4; 10 * (0.45, 0.35, 0.2) = 4.5, 3.5, 2:
    # floors 4, 3, 2 and the one seat left to the larger remainder (a tie:
    # the lower source number, web).
    loader = DataLoader(mix(stores, (45, 35, 20), source_stream="source"), batch_size=10)
    for b in take(loader, 10):
        assert Counter(b["source"].tolist()) == {0: 5, 1: 3, 2: 2}


def test_exact_mode_walks_each_source_through_its_own_epochs(stores):
    # Quotas 10, 6, 4 of 20: in 110 steps web (100 records) is walked 11
    # times, code (33) 20 times, math (8) 55 times; cyclic order never
    # repeats a record within a source's epoch, so every record of a source
    # has come exactly as often as the others.
    loader = DataLoader(mix(stores, source_stream="source"), batch_size=20, mode=2, seed=9)
    seen = {k: Counter() for k in range(3)}
    for b in take(loader, 110):
        for k, i in zip(b["source"].tolist(), b["id"].tolist()):
            seen[k][i % 10000] += 1
    for (name, n), times in zip(LENGTHS.items(), (11, 20, 55)):
        assert seen[SOURCE[name]] == {i: times for i in range(n)}, name


def test_iid_proportions_follow_the_weights(stores):
    weights = (0.6, 0.3, 0.1)
    loader = DataLoader(mix(stores, weights, proportions="iid", source_stream="source"), batch_size=64, seed=5)
    total = Counter()
    per_batch = set()
    for b in take(loader, 600):
        check(b)
        c = Counter(b["source"].tolist())
        total.update(c)
        per_batch.add(c[0])
    n = 600 * 64
    for k, w in enumerate(weights):
        sd = math.sqrt(n * w * (1 - w))
        assert abs(total[k] - n * w) < 5 * sd, (k, total)
    assert len(per_batch) > 5  # counts vary from batch to batch


@pytest.mark.parametrize("proportions", ["exact", "iid"])
def test_same_arguments_same_batches(stores, proportions):
    a = take(DataLoader(mix(stores, proportions=proportions), batch_size=12, seed=1), 20)
    b = take(DataLoader(mix(stores, proportions=proportions), batch_size=12, seed=1), 20)
    c = take(DataLoader(mix(stores, proportions=proportions), batch_size=12, seed=2), 20)
    assert [x["id"].tolist() for x in a] == [x["id"].tolist() for x in b]
    assert [x["id"].tolist() for x in a] != [x["id"].tolist() for x in c]


@pytest.mark.parametrize("proportions", ["exact", "iid"])
@pytest.mark.parametrize("mode", [0, 2])
def test_resume_at_any_step_on_any_shard_count(stores, proportions, mode):
    kw = dict(batch_size=12, mode=mode, seed=4)
    full = [b["id"].tolist() for b in take(DataLoader(mix(stores, proportions=proportions), **kw), 16)]
    for start in (0, 1, 7, 15):
        for shards in (1, 2, 3, 4):
            joined = [[] for _ in range(16 - start)]
            for shard in range(shards):
                loader = DataLoader(
                    mix(stores, proportions=proportions), start_step=start,
                    shard_index=shard, shard_count=shards, **kw,
                )
                for t, b in enumerate(take(loader, 16 - start)):
                    assert len(b["id"]) == 12 // shards
                    joined[t].extend(b["id"].tolist())
            assert joined == full[start:], (start, shards)


def test_state_dict_round_trip(stores):
    with DataLoader(mix(stores), batch_size=8, seed=6) as loader:
        first = [next(loader)["id"].tolist() for _ in range(5)]
        state = loader.state_dict()
        assert state == {"step": 5}
        after = [next(loader)["id"].tolist() for _ in range(3)]
        loader.load_state_dict({"step": 2})
        assert [next(loader)["id"].tolist() for _ in range(3)] == first[2:5]
    with DataLoader(mix(stores), batch_size=8, seed=6, start_step=state["step"]) as again:
        assert [next(again)["id"].tolist() for _ in range(3)] == after


def test_source_stream_is_optional(stores):
    (b,) = take(DataLoader(mix(stores), batch_size=8), 1)
    assert set(b) == {"id", "tok"}
    (b,) = take(DataLoader(mix(stores, source_stream="from"), batch_size=8), 1)
    assert set(b) == {"id", "tok", "from"}
    np.testing.assert_array_equal(b["from"], b["id"] // 10000)


@pytest.mark.parametrize("proportions", ["exact", "iid"])
def test_packed_ragged_mixture(stores, proportions):
    loader = DataLoader(mix(stores, proportions=proportions, source_stream="source"),
                        batch_size=16, packed=True, seed=2)
    for b in take(loader, 20):
        values, cu, shapes = b["tok"]
        assert cu.dtype == np.int32 and len(cu) == 17 and cu[0] == 0
        assert shapes.shape == (16, 1)
        for r, i in enumerate(b["id"].tolist()):
            want = tok(i // 10000, i % 10000)
            np.testing.assert_array_equal(values[cu[r]:cu[r + 1]], want)
            assert shapes[r].tolist() == list(want.shape)
        np.testing.assert_array_equal(b["source"], b["id"] // 10000)


def test_mixture_with_a_transform_and_shards(stores):
    def count(batch):
        return {k: len(v) if not isinstance(v, tuple) else len(v[1]) - 1 for k, v in batch.items()}

    loader = DataLoader(mix(stores, source_stream="source"), batch_size=20, transform=count,
                        transform_workers=3, shard_index=1, shard_count=2)
    for b in take(loader, 10):
        assert b == {"id": 10, "tok": 10, "source": 10}


def test_plain_dict_loader_is_unchanged(stores):
    # The dict form neither mixes nor adds streams, and yields the sampler's ids.
    from loaderx.zsampler import Sampler

    loader = DataLoader(stores["code"], batch_size=8, mode=2, seed=42)
    s = Sampler(33, 8, 2, 42)
    for b in take(loader, 10):
        assert set(b) == {"id", "tok"}
        assert (b["id"] - 10000).tolist() == next(s).tolist()


def test_bad_mixtures_are_refused(stores, tmp_path):
    web, code = stores["web"], stores["code"]
    with pytest.raises(ValueError, match="non-empty"):
        Mixture({})
    with pytest.raises(ValueError, match="non-empty"):
        Mixture([("web", (web, 1.0))])
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="weight of source 'code'"):
            Mixture({"web": (web, 1.0), "code": (code, bad)})
    for bad in ("1", True, None):
        with pytest.raises(ValueError, match="weight of source 'code'"):
            Mixture({"web": (web, 1.0), "code": (code, bad)})
    with pytest.raises(ValueError, match="pair"):
        Mixture({"web": web})
    with pytest.raises(ValueError, match="source 'code'.*stream names"):
        Mixture({"web": (web, 1.0), "code": ({"id": code["id"]}, 1.0)})
    with pytest.raises(ValueError, match="streams of source 'bad' must hold the same number of records"):
        Mixture({"web": (web, 1.0), "bad": ({"id": web["id"], "tok": code["tok"]}, 1.0)})
    with Dense.create(tmp_path / "f32", np.float32, ()) as w:
        w.append(np.zeros(33, np.float32))
    with Dense.create(tmp_path / "wide", np.int64, (2,)) as w:
        w.append(np.zeros((33, 2), np.int64))
    with Dense.open(tmp_path / "f32") as f32, Dense.open(tmp_path / "wide") as wide:
        with pytest.raises(ValueError, match="stream 'id' of source 'code' has dtype float32"):
            Mixture({"web": (web, 1.0), "code": ({"id": f32, "tok": code["tok"]}, 1.0)})
        with pytest.raises(ValueError, match=r"stream 'id' of source 'code' has item shape \(2,\)"):
            Mixture({"web": (web, 1.0), "code": ({"id": wide, "tok": code["tok"]}, 1.0)})
        with pytest.raises(ValueError, match="stream 'tok' of source 'code' is Dense"):
            Mixture({"web": (web, 1.0), "code": ({"id": code["id"], "tok": code["id"]}, 1.0)})
    with pytest.raises(ValueError, match="proportions"):
        mix(stores, proportions="roughly")
    with pytest.raises(ValueError, match="already the name"):
        mix(stores, source_stream="id")
    with pytest.raises(TypeError):
        mix(stores, source_stream=3)
    # Exact quotas need a slot for every source.
    with pytest.raises(ValueError, match="no slot"):
        DataLoader(mix(stores, (0.9, 0.05, 0.05)), batch_size=10)
    DataLoader(mix(stores, (0.9, 0.05, 0.05), proportions="iid"), batch_size=10).close()
    with pytest.raises(ValueError, match="divisible"):
        DataLoader(mix(stores), batch_size=10, shard_count=3)


def test_weights_normalise(stores):
    m = mix(stores, (5, 3, 2))
    assert m.shares == pytest.approx([0.5, 0.3, 0.2])
    a = take(DataLoader(mix(stores, (5, 3, 2)), batch_size=10, seed=1), 5)
    b = take(DataLoader(mix(stores, (0.5, 0.3, 0.2)), batch_size=10, seed=1), 5)
    assert [x["id"].tolist() for x in a] == [x["id"].tolist() for x in b]
    assert "web" in repr(m)
