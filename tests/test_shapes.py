"""Fixed-shape batches from Ragged streams: DataLoader(pad=..., pack=...).

Every batch is checked against a plain-numpy reference of the documented
layout (docs/shapes.md), built from the records the batch holds (an "id"
Dense stream says which).
"""

from pathlib import Path

import numpy as np
import pytest

from loaderx.dataloader import DataLoader, Pack, Pad
from loaderx.zrecord import Dense, Ragged

N = 97
DOC = Path(__file__).resolve().parents[1] / "docs" / "shapes.md"


def lognormal_lengths(seed, n=N, hi=300):
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.lognormal(3.0, 1.0, n)), 1, hi).astype(int)


def make_records(lengths, rest=(), dtype=np.int32):
    # Record k's items are distinct across the whole store: k * 10_000 + j.
    return [
        (np.arange(int(n) * int(np.prod(rest)), dtype=np.int64).reshape((int(n), *rest)) + 10_000 * k).astype(dtype)
        for k, n in enumerate(lengths)
    ]


def open_streams(tmp_path, records, name="t"):
    with Dense.create(tmp_path / f"{name}-id", np.int64, ()) as w:
        w.append(np.arange(len(records), dtype=np.int64))
    with Ragged.create(tmp_path / name, records[0].dtype) as w:
        w.append(records)
    return Dense.open(tmp_path / f"{name}-id"), Ragged.open(tmp_path / name)


@pytest.fixture
def lognormal(tmp_path):
    """Lengths 1..300 (lognormal), with some of exactly 64 and 128 and
    some longer than 300 added, so every max_tokens below meets records of
    exactly its length and longer ones."""
    lengths = lognormal_lengths(0)
    lengths[:6] = [64, 128, 1, 300, 513, 64]
    records = make_records(lengths)
    ids, t = open_streams(tmp_path, records)
    yield records, ids, t
    ids.close()
    t.close()


# -- references -------------------------------------------------------------


def ref_pad(recs, p: Pad):
    values, mask, lengths = [], [], []
    for r in recs:
        keep = r[: p.length] if p.truncate == "right" else r[max(0, len(r) - p.length) :]
        fill = np.full((p.length - len(keep), *r.shape[1:]), p.value, r.dtype)
        parts = [keep, fill] if p.side == "right" else [fill, keep]
        values.append(np.concatenate(parts))
        m = np.zeros(p.length, bool)
        if p.side == "right":
            m[: len(keep)] = True
        else:
            m[p.length - len(keep) :] = True
        mask.append(m)
        lengths.append(len(keep))
    return np.stack(values), np.stack(mask), np.array(lengths, np.int32)


def ref_plan(lengths, mt, rows, policy):
    """First-fit in batch order / best-fit decreasing, by brute force."""
    room = [mt] * rows
    out = [None] * len(lengths)
    order = range(len(lengths))
    if policy == "best_fit":
        order = sorted(order, key=lambda k: (-lengths[k], k))
    for k in order:
        fits = [r for r in range(rows) if room[r] >= lengths[k]]
        if not fits:
            continue
        r = fits[0] if policy == "first_fit" else min(fits, key=lambda r: (room[r], r))
        out[k] = (r, mt - room[r])
        room[r] -= lengths[k]
    return out


def ref_pack(recs, p: Pack):
    mt = p.max_tokens
    rows = p.rows if p.rows is not None else len(recs)
    rest = recs[0].shape[1:]
    placed = [min(len(r), mt) for r in recs]
    plan = ref_plan(placed, mt, rows, p.policy)
    values = np.full((rows, mt, *rest), p.value, recs[0].dtype)
    seg = np.zeros((rows, mt), np.int32)
    pos = np.zeros((rows, mt), np.int32)
    placement = np.zeros((len(recs), 3), np.int32)
    segments = [0] * rows
    for k in sorted(range(len(recs)), key=lambda k: plan[k] or (rows, 0)):
        if plan[k] is None:
            placement[k] = (-1, -1, 0)
            continue
        r, s = plan[k]
        n = placed[k]
        values[r, s : s + n] = recs[k][:n]
        segments[r] += 1
        seg[r, s : s + n] = segments[r]
        pos[r, s : s + n] = np.arange(n)
        placement[k] = (r, s, n)
    return values, seg, pos, placement, sum(q is None for q in plan)


def check_pack_invariants(batch, recs, p: Pack):
    """What the layout promises, independently of the reference."""
    v, seg, pos = batch["t"], batch["t_segment_ids"], batch["t_positions"]
    placement = batch["t_placement"]
    claimed = np.zeros(seg.shape, bool)
    for k, r in enumerate(recs):
        row, slot, n = placement[k]
        if row < 0:
            assert (slot, n) == (-1, 0)
            continue
        assert n == min(len(r), p.max_tokens)
        assert not claimed[row, slot : slot + n].any(), "a slot holds two items"
        claimed[row, slot : slot + n] = True
        np.testing.assert_array_equal(v[row, slot : slot + n], r[:n])
        np.testing.assert_array_equal(pos[row, slot : slot + n], np.arange(n))
        assert len(set(seg[row, slot : slot + n].tolist())) == 1 and seg[row, slot] > 0
    assert (seg[~claimed] == 0).all() and (pos[~claimed] == 0).all()
    assert int(batch["t_dropped"]) == int((placement[:, 0] < 0).sum())
    for row in seg:
        ids = row[row > 0]
        # 1, 2, ... in slot order, padding only at the end.
        assert (np.diff(ids) >= 0).all() and (np.diff(ids) <= 1).all()
        assert len(ids) == 0 or ids[0] == 1
        assert (row[: len(ids)] > 0).all()


# -- padding ----------------------------------------------------------------


@pytest.mark.parametrize(
    "spec",
    [
        Pad(64),
        Pad(64, value=-7, side="left"),
        Pad(128, value=3, truncate="left"),
        Pad(1, side="left", truncate="left", mask=False),
        Pad(300, lengths=False),
    ],
)
def test_pad_matches_the_reference_every_batch(lognormal, spec):
    records, ids, t = lognormal
    with DataLoader({"id": ids, "t": t}, batch_size=16, mode=1, seed=5, pad={"t": spec}) as dl:
        for _ in range(8):
            b = next(dl)
            recs = [records[i] for i in b["id"]]
            values, mask, lengths = ref_pad(recs, spec)
            expected = ["id", "t"] + ["t_mask"] * spec.mask + ["t_lengths"] * spec.lengths
            assert list(b) == expected
            assert b["t"].shape == (16, spec.length) and b["t"].dtype == np.int32
            np.testing.assert_array_equal(b["t"], values)
            if spec.mask:
                assert b["t_mask"].dtype == np.bool_ and b["t_mask"].shape == (16, spec.length)
                np.testing.assert_array_equal(b["t_mask"], mask)
            if spec.lengths:
                assert b["t_lengths"].dtype == np.int32
                np.testing.assert_array_equal(b["t_lengths"], lengths)
            for a in b.values():
                assert a.flags.c_contiguous and a.ctypes.data % 64 == 0


def test_pad_shorthands_and_multi_dimensional_records(tmp_path):
    records = make_records([3, 1, 5, 2], rest=(2, 3), dtype=np.float32)
    ids, t = open_streams(tmp_path, records)
    with ids, t:
        for spec in [(4, 0.5), 4, Pad(4, value=0.5)]:
            with DataLoader({"id": ids, "t": t}, batch_size=4, mode=0, pad={"t": spec}) as dl:
                b = next(dl)
            p = Pad(*spec) if isinstance(spec, tuple) else Pad(spec) if isinstance(spec, int) else spec
            values, mask, lengths = ref_pad(records, p)
            assert b["t"].shape == (4, 4, 2, 3) and b["t"].dtype == np.float32
            np.testing.assert_array_equal(b["t"], values)
            np.testing.assert_array_equal(b["t_mask"], mask)
            assert b["t_lengths"].tolist() == [3, 1, 4, 2]


# -- packing ----------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("policy", ["first_fit", "best_fit"])
@pytest.mark.parametrize("max_tokens,rows", [(64, None), (128, 6), (300, 3), (512, None)])
def test_every_token_lands_in_exactly_one_slot(tmp_path, seed, policy, max_tokens, rows):
    lengths = lognormal_lengths(seed, n=61, hi=700)
    lengths[:3] = [max_tokens, max_tokens + 1, 1]
    records = make_records(lengths)
    ids, t = open_streams(tmp_path, records)
    spec = Pack(max_tokens, rows=rows, policy=policy)
    with ids, t, DataLoader({"id": ids, "t": t}, batch_size=12, mode=1, seed=seed, pack={"t": spec}) as dl:
        for _ in range(10):
            b = next(dl)
            recs = [records[i] for i in b["id"]]
            n_rows = rows or 12
            assert list(b) == ["id", "t", "t_segment_ids", "t_positions", "t_placement", "t_dropped"]
            assert b["t"].shape == (n_rows, max_tokens)
            assert b["t_segment_ids"].shape == b["t_positions"].shape == (n_rows, max_tokens)
            assert b["t_placement"].shape == (12, 3) and b["t_dropped"].shape == ()
            assert all(b[k].dtype == np.int32 for k in b if k.startswith("t_"))
            check_pack_invariants(b, recs, spec)
            values, seg, pos, placement, dropped = ref_pack(recs, spec)
            np.testing.assert_array_equal(b["t"], values)
            np.testing.assert_array_equal(b["t_segment_ids"], seg)
            np.testing.assert_array_equal(b["t_positions"], pos)
            np.testing.assert_array_equal(b["t_placement"], placement)
            assert int(b["t_dropped"]) == dropped
            if rows is None:
                assert dropped == 0


def test_first_fit_and_best_fit_are_deterministic_and_differ(tmp_path):
    # 6-slot rows: first-fit (batch order) [2 3 1] [4] [5] [3]: 4 rows;
    # best-fit decreasing [5 1] [4 2] [3 3]: 3 rows.
    records = make_records([2, 3, 4, 5, 1, 3])
    ids, t = open_streams(tmp_path, records)
    got = {}
    with ids, t:
        for policy in ["first_fit", "best_fit"]:
            runs = []
            for _ in range(2):
                with DataLoader({"t": t}, batch_size=6, mode=0, pack={"t": Pack(6, policy=policy)}) as dl:
                    runs.append(next(dl))
            for k in runs[0]:
                np.testing.assert_array_equal(runs[0][k], runs[1][k])
            got[policy] = runs[0]
    ff, bf = got["first_fit"], got["best_fit"]
    used = lambda b: int((b["t_segment_ids"] > 0).any(axis=1).sum())  # noqa: E731
    assert (used(ff), used(bf)) == (4, 3)
    assert ff["t_placement"][:, :2].tolist() == [[0, 0], [0, 2], [1, 0], [2, 0], [0, 5], [3, 0]]
    assert bf["t_placement"][:, :2].tolist() == [[1, 4], [2, 0], [1, 0], [0, 0], [0, 5], [2, 3]]
    assert bf["t_segment_ids"][:3].tolist() == [[1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 2, 2], [1, 1, 1, 2, 2, 2]]


def test_fixed_rows_count_dropped_records(tmp_path):
    records = make_records([5, 5, 5, 1])
    ids, t = open_streams(tmp_path, records)
    with ids, t, DataLoader({"t": t}, batch_size=4, mode=0, pack={"t": Pack(6, rows=2, value=-1)}) as dl:
        b = next(dl)
    assert int(b["t_dropped"]) == 1
    assert b["t_placement"].tolist() == [[0, 0, 5], [1, 0, 5], [-1, -1, 0], [0, 5, 1]]
    assert b["t"][1].tolist() == [10_000, 10_001, 10_002, 10_003, 10_004, -1]
    assert b["t_segment_ids"].tolist() == [[1, 1, 1, 1, 1, 2], [1, 1, 1, 1, 1, 0]]


def test_pack_multi_dimensional_records(tmp_path):
    records = make_records([2, 4, 3], rest=(3,), dtype=np.uint16)
    ids, t = open_streams(tmp_path, records)
    spec = Pack(5, policy="best_fit", value=9)
    with ids, t, DataLoader({"t": t}, batch_size=3, mode=0, pack={"t": spec}) as dl:
        b = next(dl)
    assert b["t"].shape == (3, 5, 3) and b["t"].dtype == np.uint16
    values, seg, pos, placement, _ = ref_pack(records, spec)
    np.testing.assert_array_equal(b["t"], values)
    np.testing.assert_array_equal(b["t_segment_ids"], seg)
    np.testing.assert_array_equal(b["t_placement"], placement)


# -- loader integration -----------------------------------------------------


def batches(dl, n):
    return [next(dl) for _ in range(n)]


def assert_same(a, b):
    assert list(a) == list(b)
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("shaping", [{"pad": {"t": (50, 0)}}, {"pack": {"t": Pack(256, rows=4, policy="best_fit")}}])
def test_resume_gives_identical_shaped_batches(lognormal, shaping):
    _, ids, t = lognormal
    streams = {"id": ids, "t": t}
    with DataLoader(streams, batch_size=10, mode=1, seed=11, **shaping) as dl:
        full = batches(dl, 9)
    with DataLoader(streams, batch_size=10, mode=1, seed=11, start_step=5, **shaping) as dl:
        for a, b in zip(full[5:], batches(dl, 4)):
            assert_same(a, b)
        dl.load_state_dict({"step": 2})
        assert_same(full[2], next(dl))


def test_shards_shape_their_own_slice(lognormal):
    records, ids, t = lognormal
    streams = {"id": ids, "t": t}
    spec = Pack(128)
    with DataLoader(streams, batch_size=12, mode=1, seed=3) as dl:
        global_ids = [next(dl)["id"] for _ in range(5)]
    for shard in range(3):
        sharded = dict(shard_index=shard, shard_count=3)
        with DataLoader(streams, batch_size=12, mode=1, seed=3, pack={"t": spec}, **sharded) as dl:
            for step in range(5):
                b = next(dl)
                np.testing.assert_array_equal(b["id"], global_ids[step][4 * shard : 4 * shard + 4])
                # Default rows: one per record of this shard's batch.
                assert b["t"].shape == (4, 128)
                values, *_ = ref_pack([records[i] for i in b["id"]], spec)
                np.testing.assert_array_equal(b["t"], values)


def test_a_transform_sees_the_shaped_batch(lognormal):
    _, ids, t = lognormal
    seen = []

    def transform(batch):
        seen.append(sorted(batch))
        return batch["t"].shape, int(batch["t_mask"].sum()), int(batch["t_lengths"].sum())

    with DataLoader({"id": ids, "t": t}, batch_size=8, pad={"t": 32}, transform=transform) as dl:
        shape, masked, total = next(dl)
    assert shape == (8, 32) and masked == total
    assert seen[0] == ["id", "t", "t_lengths", "t_mask"]


def test_plain_streams_beside_shaped_ones(lognormal, tmp_path):
    records, ids, t = lognormal
    other = make_records([1 + i % 3 for i in range(N)])
    with Ragged.create(tmp_path / "o", np.int32) as w:
        w.append(other)
    with Ragged.open(tmp_path / "o") as o:
        streams = {"id": ids, "t": t, "o": o, "p": o}
        with DataLoader(streams, batch_size=4, mode=0, pad={"t": 8}, packed=["p"]) as dl:
            b = next(dl)
    assert list(b) == ["id", "t", "t_mask", "t_lengths", "o", "p"]
    assert isinstance(b["o"], list) and isinstance(b["p"], tuple)


# -- errors -----------------------------------------------------------------


def test_bad_arguments_are_refused(lognormal):
    _, ids, t = lognormal
    streams = {"id": ids, "t": t}
    cases = [
        (ValueError, "not a stream", {"pad": {"nope": 4}}),
        (ValueError, "Dense stream", {"pack": {"id": 4}}),
        (ValueError, "both pad= and pack=", {"pad": {"t": 4}, "pack": {"t": 4}}),
        (ValueError, "both packed= and pad=", {"pad": {"t": 4}, "packed": True}),
        (ValueError, "Pad length", {"pad": {"t": 0}}),
        (ValueError, "Pad length", {"pad": {"t": -3}}),
        (ValueError, "Pack max_tokens", {"pack": {"t": 2**31}}),
        (TypeError, "pad\\['t'\\]", {"pad": {"t": 4.0}}),
        (TypeError, "pad\\['t'\\]", {"pad": {"t": True}}),
        (TypeError, "pack\\['t'\\]", {"pack": {"t": (4, 0)}}),
        (TypeError, "must be a dict", {"pad": [("t", 4)]}),
        (ValueError, "does not fit dtype", {"pad": {"t": (4, 0.5)}}),
        (ValueError, "does not fit dtype", {"pack": {"t": Pack(4, value=2**40)}}),
        (ValueError, "over the limit", {"pack": {"t": Pack(2**30, rows=2**10)}}),
    ]
    for exc, match, kwargs in cases:
        with pytest.raises(exc, match=match):
            DataLoader(streams, **kwargs)
    with pytest.raises(ValueError, match="Pack rows"):
        Pack(8, rows=0)
    with pytest.raises(TypeError, match="Pad mask"):
        Pad(8, mask=1)
    with pytest.raises(ValueError, match="policy"):
        Pack(8, policy="worst_fit")
    with pytest.raises(ValueError, match="side"):
        Pad(8, side="middle")
    with pytest.raises(ValueError, match="truncate"):
        Pad(8, truncate="both")


def test_name_collisions_are_refused(lognormal):
    _, ids, t = lognormal
    with pytest.raises(ValueError, match="'t_mask'"):
        DataLoader({"t": t, "t_mask": ids}, pad={"t": 4})
    with pytest.raises(ValueError, match="'t_positions'"):
        DataLoader({"t_positions": ids, "t": t}, pack={"t": 4})
    # Entries turned off are free to use.
    with DataLoader({"t": t, "t_mask": ids}, batch_size=2, pad={"t": Pad(4, mask=False)}) as dl:
        assert list(next(dl)) == ["t", "t_lengths", "t_mask"]


def test_records_that_cannot_be_shaped_fail_the_step(tmp_path):
    recs = [np.zeros((2, 3), np.int32), np.zeros((4, 3), np.int32), np.zeros((1, 2), np.int32)]
    with Ragged.create(tmp_path / "m", np.int32) as w:
        w.append(recs + [np.array(5, np.int32)])
    with Ragged.open(tmp_path / "m") as m:
        with DataLoader({"m": m}, batch_size=3, mode=0, pad={"m": 4}) as dl:
            both = r"record 0 \(batch position 0\) has shape \(2, 3\), record 2 \(batch position 2\) has shape \(1, 2\)"
            with pytest.raises(ValueError, match=both):
                next(dl)
        with DataLoader({"m": m}, batch_size=1, mode=0, start_step=3, pack={"m": 4}) as dl:
            with pytest.raises(ValueError, match=r"record 3 \(batch position 0\) is a scalar"):
                next(dl)
    # A default rows (one per record) that is too large is refused at the first batch.
    big = make_records([1] * 8)
    ids, t = open_streams(tmp_path, big, "big")
    with ids, t, DataLoader({"t": t}, batch_size=8, pack={"t": 2**29}) as dl:
        with pytest.raises(ValueError, match="over the limit"):
            next(dl)


def test_the_jax_example_in_the_docs_compiles_once(tmp_path, monkeypatch):
    pytest.importorskip("jax")
    block = DOC.read_text().split("## A jitted JAX step", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, str(DOC), "exec"), scope)
    assert scope["traces"] == [1]


def test_pad_in_a_finite_pass_keeps_both_masks(tmp_path):
    recs = make_records([3, 1, 4, 1, 5])
    ids, t = open_streams(tmp_path, recs)
    with DataLoader({"id": ids, "t": t}, batch_size=4, mode=0, epochs=1, pad={"t": (4, -1)},
                    transform=None) as dl:
        assert len(dl) == 2
        first, last = list(dl)
    assert list(first) == ["id", "t", "t_mask", "t_lengths", "mask"]
    assert first["t_lengths"].tolist() == [3, 1, 4, 1]
    assert last["mask"].tolist() == [True, False, False, False]  # 5 records, batches of 4
    assert last["t"][0].tolist() == recs[4][:4].tolist()


def test_shaping_a_mixture_is_refused(tmp_path):
    from loaderx.dataloader import Mixture

    a = open_streams(tmp_path, make_records([2, 3]), name="a")
    b = open_streams(tmp_path, make_records([4, 5]), name="b")
    mix = Mixture({"a": ({"id": a[0], "t": a[1]}, 1.0), "b": ({"id": b[0], "t": b[1]}, 1.0)})
    for kwargs in ({"pad": {"t": 8}}, {"pack": {"t": 8}}):
        with pytest.raises(ValueError, match="do not apply to a Mixture"):
            DataLoader(mix, batch_size=2, **kwargs)
