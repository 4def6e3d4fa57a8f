"""Tests of loaderx.zsampler.Sampler."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

from loaderx.zsampler import Sampler

MODES = [Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC]
U64_MAX = 2**64 - 1


def draws(sampler: Sampler, count: int) -> list[np.ndarray]:
    return [sampler.next().copy() for _ in range(count)]


# -- modes -------------------------------------------------------------------


def test_mode_values():
    assert Sampler.Mode.SEQUENTIAL == 0
    assert Sampler.Mode.IID == 1
    assert Sampler.Mode.CYCLIC == 2
    assert [m.name for m in Sampler.Mode] == ["SEQUENTIAL", "IID", "CYCLIC"]
    assert isinstance(Sampler.Mode.IID, int)


@pytest.mark.parametrize("mode", [0, 1, 2, np.int64(2), np.uint8(1)])
def test_mode_accepts_plain_integers(mode):
    s = Sampler(10, 2, mode)
    assert s.mode is Sampler.Mode(int(mode))
    assert isinstance(s.mode, Sampler.Mode)


@pytest.mark.parametrize("mode", [-1, 3, 2**64])
def test_mode_out_of_range(mode):
    with pytest.raises(ValueError):
        Sampler(10, 2, mode)


@pytest.mark.parametrize("mode", [True, False, 1.0, "iid", None, np.True_])
def test_mode_not_an_integer(mode):
    with pytest.raises(TypeError):
        Sampler(10, 2, mode)


# -- argument errors ----------------------------------------------------------


@pytest.mark.parametrize("name", ["length", "batch_size"])
@pytest.mark.parametrize("value", [0, -1, 2**64, 2**70])
def test_size_out_of_range(name, value):
    args = {"length": 10, "batch_size": 2, "mode": Sampler.Mode.IID}
    args[name] = value
    with pytest.raises(ValueError):
        Sampler(**args)


@pytest.mark.parametrize("name", ["length", "batch_size", "seed"])
@pytest.mark.parametrize("value", [1.0, 2.5, "3", None, True, False, np.float64(4), np.True_, [1]])
def test_non_integer_arguments(name, value):
    args = {"length": 10, "batch_size": 2, "mode": Sampler.Mode.IID, "seed": 1}
    args[name] = value
    with pytest.raises(TypeError):
        Sampler(**args)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_out_of_range(seed):
    with pytest.raises(ValueError):
        Sampler(10, 2, Sampler.Mode.IID, seed=seed)


def test_bounds_are_inclusive():
    s = Sampler(U64_MAX, 3, Sampler.Mode.IID, seed=U64_MAX)
    assert s.length == U64_MAX and s.seed == U64_MAX
    assert (s.next() <= U64_MAX - 1).all()
    s.seek(U64_MAX)
    assert s.step == U64_MAX
    s.next()
    Sampler(1, 1, 0, seed=0).next()
    # A CYCLIC sampler over a small space never needs more than `length`.
    c = Sampler(5, U64_MAX, Sampler.Mode.CYCLIC)
    assert c.batch_size == U64_MAX
    assert sorted(c.next().tolist()) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("mode", [Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID])
def test_unallocatable_batch(mode):
    with pytest.raises(MemoryError):
        Sampler(10, U64_MAX, mode)


def test_numpy_integer_scalars():
    s = Sampler(np.uint64(10), np.int32(4), np.int8(0), seed=np.uint64(U64_MAX))
    assert (s.length, s.batch_size, s.seed) == (10, 4, U64_MAX)
    assert type(s.length) is int
    s.seek(np.int16(2))
    assert s.step == 2
    assert s.batch_at(np.uint32(0)).tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize("method", ["seek", "batch_at"])
def test_step_errors(method):
    s = Sampler(10, 2, Sampler.Mode.CYCLIC)
    call = getattr(s, method)
    for bad in (-1, 2**64):
        with pytest.raises(ValueError):
            call(bad)
    for bad in (1.0, "1", None, True, np.False_):
        with pytest.raises(TypeError):
            call(bad)
    assert s.step == 0


def test_default_seed():
    assert Sampler(10, 2, Sampler.Mode.IID).seed == 42
    a = Sampler(1000, 16, Sampler.Mode.CYCLIC)
    b = Sampler(1000, 16, Sampler.Mode.CYCLIC, seed=42)
    np.testing.assert_array_equal(a.next(), b.next())


def test_read_only_properties():
    s = Sampler(10, 2, Sampler.Mode.IID, seed=3)
    for name in ("length", "batch_size", "mode", "seed", "step", "indices"):
        with pytest.raises(AttributeError):
            setattr(s, name, 1)
    assert repr(s) == "Sampler(length=10, batch_size=2, mode=Sampler.Mode.IID, seed=3, step=0)"


# -- sequential ---------------------------------------------------------------


def test_sequential_values():
    s = Sampler(10, 4, Sampler.Mode.SEQUENTIAL)
    got = [b.tolist() for b in draws(s, 4)]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    s = Sampler(3, 7, Sampler.Mode.SEQUENTIAL)
    assert s.next().tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert s.next().tolist() == [1, 2, 0, 1, 2, 0, 1]


def test_sequential_huge_step():
    s = Sampler(U64_MAX, 4, Sampler.Mode.SEQUENTIAL)
    step = U64_MAX // 4
    start = (step * 4) % U64_MAX
    assert s.batch_at(step).tolist() == [start, start + 1, start + 2, 0]
    s = Sampler(1000, 7, Sampler.Mode.SEQUENTIAL)
    start = (U64_MAX * 7) % 1000
    assert s.batch_at(U64_MAX).tolist() == [(start + j) % 1000 for j in range(7)]


# -- the reusable buffer --------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_next_returns_the_reusable_buffer(mode):
    s = Sampler(100, 8, mode, seed=1)
    assert s.indices.dtype == np.uint64
    assert s.indices.shape == (8,)
    a = s.next()
    assert a.dtype == np.uint64 and a.shape == (8,)
    assert np.shares_memory(a, s.indices)
    first = a.copy()
    b = s.next()
    assert np.shares_memory(b, s.indices)
    # The second draw overwrote the first batch in place.
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(b, s.batch_at(1))
    np.testing.assert_array_equal(first, s.batch_at(0))
    assert s.indices.flags.c_contiguous and s.indices.flags.writeable


def test_iteration_is_endless_and_shares_the_buffer():
    s = Sampler(5, 2, Sampler.Mode.SEQUENTIAL)
    assert iter(s) is s
    seen = []
    for i, batch in enumerate(s):
        assert np.shares_memory(batch, s.indices)
        seen.append(batch.tolist())
        if i == 6:
            break
    assert seen[:3] == [[0, 1], [2, 3], [4, 0]]
    assert len(seen) == 7
    assert s.step == 7
    assert next(s).tolist() == Sampler(5, 2, 0).batch_at(7).tolist()
    with pytest.raises(TypeError):
        len(s)


def test_batch_at_returns_fresh_arrays():
    s = Sampler(100, 8, Sampler.Mode.CYCLIC)
    a = s.batch_at(3)
    b = s.batch_at(3)
    assert not np.shares_memory(a, b)
    assert not np.shares_memory(a, s.indices)
    np.testing.assert_array_equal(a, b)
    assert s.step == 0


# -- position -----------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("length,batch_size", [(100, 7), (5, 8), (1_000_003, 256)])
def test_seek_matches_a_fresh_stream(mode, length, batch_size):
    stream = draws(Sampler(length, batch_size, mode, seed=9), 30)
    for k in (0, 1, 13, 14, 29):
        s = Sampler(length, batch_size, mode, seed=9)
        s.seek(k)
        assert s.step == k
        np.testing.assert_array_equal(s.next(), stream[k])
        assert s.step == k + 1
        np.testing.assert_array_equal(s.batch_at(k), stream[k])
    # Seeking backwards replays the stream as well.
    s = Sampler(length, batch_size, mode, seed=9)
    draws(s, 20)
    s.seek(2)
    np.testing.assert_array_equal(s.next(), stream[2])


def test_step_wraps_after_the_last_step():
    s = Sampler(10, 2, Sampler.Mode.IID)
    s.seek(U64_MAX)
    s.next()
    assert s.step == 0


@pytest.mark.parametrize("mode", MODES)
def test_state_dict_round_trip(mode):
    s = Sampler(1000, 10, mode, seed=5)
    draws(s, 17)
    state = s.state_dict()
    assert state == {"step": 17}
    assert type(state["step"]) is int
    expected = draws(s, 5)
    t = Sampler(1000, 10, mode, seed=5)
    t.load_state_dict(state)
    assert t.step == 17
    for want in expected:
        np.testing.assert_array_equal(t.next(), want)


def test_load_state_dict_errors():
    s = Sampler(10, 2, Sampler.Mode.IID)
    with pytest.raises(TypeError):
        s.load_state_dict([("step", 1)])
    with pytest.raises(KeyError):
        s.load_state_dict({})
    with pytest.raises(ValueError):
        s.load_state_dict({"step": 1, "epoch": 2})
    with pytest.raises(ValueError):
        s.load_state_dict({"step": -1})
    with pytest.raises(TypeError):
        s.load_state_dict({"step": 1.5})
    assert s.step == 0
    s.load_state_dict({"step": np.uint64(U64_MAX)})
    assert s.step == U64_MAX


@pytest.mark.parametrize("mode", MODES)
def test_copy_and_pickle_keep_the_position(mode):
    s = Sampler(1000, 10, mode, seed=5)
    draws(s, 3)
    for clone in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
        assert clone.step == 3
        assert not np.shares_memory(clone.indices, s.indices)
        assert (clone.length, clone.batch_size, clone.mode, clone.seed) == (1000, 10, mode, 5)
        np.testing.assert_array_equal(clone.next(), s.batch_at(3))


# -- determinism and randomness ----------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_deterministic(mode):
    a = draws(Sampler(977, 64, mode, seed=11), 20)
    b = draws(Sampler(977, 64, mode, seed=11), 20)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("mode", [Sampler.Mode.IID, Sampler.Mode.CYCLIC])
def test_seeds_change_the_order(mode):
    a = Sampler(1000, 100, mode, seed=1).next().copy()
    b = Sampler(1000, 100, mode, seed=2).next().copy()
    assert not np.array_equal(a, b)


def test_sequential_ignores_the_seed():
    a = Sampler(50, 7, Sampler.Mode.SEQUENTIAL, seed=1).batch_at(3)
    b = Sampler(50, 7, Sampler.Mode.SEQUENTIAL, seed=2).batch_at(3)
    np.testing.assert_array_equal(a, b)


def test_iid_range_and_uniformity():
    s = Sampler(10, 1000, Sampler.Mode.IID, seed=2024)
    counts = np.zeros(10, dtype=np.int64)
    for _ in range(100):
        batch = s.next()
        assert batch.max() < 10
        counts += np.bincount(batch.astype(np.int64), minlength=10)
    expected = counts.sum() / 10
    chi2 = ((counts - expected) ** 2 / expected).sum()
    assert chi2 < 27.877  # 99.9% critical value, 9 degrees of freedom
    big = Sampler(3 * 2**62, 5000, Sampler.Mode.IID, seed=3).next()
    assert int(big.max()) < 3 * 2**62
    # Plain modulo reduction would put about half of these in the lowest third.
    low = np.count_nonzero(big < 2**62) / big.size
    assert abs(low - 1 / 3) < 0.03


@pytest.mark.parametrize("length", [1, 2, 3, 7, 31, 1023, 1024, 1025, 4097])
def test_cyclic_cycles_are_permutations(length):
    s = Sampler(length, 1, Sampler.Mode.CYCLIC, seed=7)
    for _ in range(2):
        cycle = np.concatenate(draws(s, length))
        np.testing.assert_array_equal(np.sort(cycle), np.arange(length, dtype=np.uint64))


@pytest.mark.parametrize("length,batch_size", [(10, 3), (97, 10), (1000, 64), (4097, 100)])
def test_cyclic_batches_are_full_and_distinct(length, batch_size):
    s = Sampler(length, batch_size, Sampler.Mode.CYCLIC, seed=4)
    per_cycle = length // batch_size
    cycles = []
    for _ in range(3):
        batches = draws(s, per_cycle)
        for b in batches:
            assert b.shape == (batch_size,)
            assert int(b.max()) < length
        cycle = np.concatenate(batches)
        # No index repeats within a cycle; the remainder is skipped.
        assert np.unique(cycle).size == per_cycle * batch_size
        cycles.append(cycle)
    assert not np.array_equal(cycles[0], cycles[1])
    assert not np.array_equal(cycles[1], cycles[2])


def test_cyclic_space_smaller_than_a_batch():
    s = Sampler(5, 8, Sampler.Mode.CYCLIC, seed=0)
    assert s.batch_size == 8
    assert s.indices.shape == (5,)
    orders = set()
    for _ in range(40):
        batch = s.next()
        assert sorted(batch.tolist()) == [0, 1, 2, 3, 4]
        orders.add(tuple(batch.tolist()))
    assert len(orders) > 5
    one = Sampler(1, 4, Sampler.Mode.CYCLIC)
    assert one.next().tolist() == [0]
    assert one.next().tolist() == [0]


def test_cyclic_large_space_is_lazy():
    s = Sampler(10**12, 4096, Sampler.Mode.CYCLIC, seed=1)
    seen = np.concatenate(draws(s, 20))
    assert int(seen.max()) < 10**12
    assert np.unique(seen).size == seen.size


def test_large_batch():
    # Above the size at which the native fill releases the GIL and splits
    # the batch between threads; the result is the same pure function.
    s = Sampler(1_000_003, 300_000, Sampler.Mode.CYCLIC, seed=3)
    for _ in range(3):
        batch = s.next()
        assert np.unique(batch).size == batch.size
    np.testing.assert_array_equal(s.batch_at(2), batch)
    i = Sampler(1_000_003, 300_001, Sampler.Mode.IID, seed=3)
    np.testing.assert_array_equal(i.next(), i.batch_at(0))
