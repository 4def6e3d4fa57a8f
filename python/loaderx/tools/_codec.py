"""``codec="auto"``: the codec of each converted store, chosen by measuring.

A sample of the column's records, spread evenly over it, is written to
scratch stores with each real codec (zstd at level 3, zstd_dict at level 19
against a dictionary, see :func:`choose`), so every
per-record cost of the format is counted: a raw record's 8-byte checksum in
``sums.zr``, a zstd frame's header and 4-byte checksum, the dictionary file.
The record table (16 bytes a record) and ``meta.zr``'s page are the same for
every codec and are added on paper. From the sample, the whole store's size is
estimated per codec, and:

* raw is kept unless a codec makes the store at least ``_MIN_GAIN`` (10%)
  smaller: below that, compression costs a decode on every read for little;
  tiny records (a label, a few pixels) land here, since a frame's own bytes
  outweigh what zstd saves on them;
* zstd_dict is taken over zstd only when its store, dictionary included, is
  at least ``_MIN_GAIN`` smaller than zstd's (how it is measured: see
  :func:`choose`);
* after the write, :func:`ensure_not_bigger_than_raw` rewrites a compressed
  store raw if it came out bigger than the raw store would be, so an unlucky
  sample can never make a store bigger than raw.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, TypedDict

import numpy as np

from loaderx import _sidecar
from loaderx._errors import ZrecordError
from loaderx.tools._common import _MiB, _set_layout
from loaderx.utils import train_dict
from loaderx.zrecord import DICT_TIERS, Dense, Ragged

#: Sample bounds: at most this many records and bytes (evenly spread).
SAMPLE_RECORDS = 1024
SAMPLE_BYTES = 4 * _MiB
#: At most this many records in a dictionary's training sample (its bytes
#: are bounded by the tier): enough for zstd's trainer, and a bound on the
#: memory one small array per record costs.
DICT_SAMPLE_RECORDS = 1 << 17
#: A codec must shrink the store by at least this factor to be chosen.
_MIN_GAIN = 1.1
_PAGE = 4096  # meta.zr's static page
_ENTRY = 16  # one record-table entry
_SUMS_HEADER = 16  # sums.zr: magic and record count
_SUM = 8  # sums.zr: one checksum per raw record
_MIN_DICT_RECORDS = 8  # zstd's trainer needs a few samples on each side of the split


class CodecChoice(TypedDict):
    """How a converted store's codec was chosen (the sidecar's ``codec`` field)."""

    #: The codec asked for: "auto", or the one given.
    requested: str
    #: The codec the store was written with.
    chosen: str
    #: The estimated size of a raw store over that of the chosen one, from
    #: the sample (None when the codec was given, not measured).
    ratio: float | None
    #: The same estimate for every codec measured ("raw" is 1.0); None when given.
    estimates: dict[str, float | None] | None
    #: Records and logical bytes in the sample (None when given).
    sample_records: int | None
    sample_bytes: int | None
    #: Why, in words (None when given).
    reason: str | None


def given(codec: str) -> CodecChoice:
    """The record of a codec that was asked for by name."""
    return {
        "requested": codec,
        "chosen": codec,
        "ratio": None,
        "estimates": None,
        "sample_records": None,
        "sample_bytes": None,
        "reason": None,
    }


class SpreadSample:
    """Keeps an evenly spread sample of a stream of records whose length may
    be unknown: every ``stride``-th record, the stride doubling (and every
    other kept record dropped) whenever the sample outgrows its bounds."""

    def __init__(self, max_records: int = SAMPLE_RECORDS, max_bytes: int = SAMPLE_BYTES) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.stride = 1
        self.seen = 0
        self._kept: list[tuple[int, np.ndarray]] = []
        self._bytes = 0

    def offer(self, n: int, get: Callable[[int], np.ndarray]) -> None:
        """Offers the next ``n`` records, ``get(j)`` being the ``j``-th of
        them; only the records kept are fetched (and copied, so no kept
        record pins a whole source block)."""
        start = self.seen
        j = (-start) % self.stride
        while j < n:
            a = np.array(get(j), copy=True)
            self._kept.append((start + j, a))
            self._bytes += a.nbytes
            while len(self._kept) > 1 and (
                len(self._kept) > self.max_records or self._bytes > self.max_bytes
            ):
                self.stride *= 2
                self._kept = [(i, x) for i, x in self._kept if i % self.stride == 0]
                self._bytes = sum(x.nbytes for _, x in self._kept)
            after = start + j + 1
            j = after + (-after) % self.stride - start
        self.seen = start + n

    def push(self, records: Sequence[np.ndarray] | np.ndarray) -> None:
        """Offers the next records (a list, or the rows of a Dense block)."""
        self.offer(len(records), records.__getitem__)

    @property
    def records(self) -> list[np.ndarray]:
        """The kept records, in order."""
        return [x for _, x in self._kept]

    @property
    def indexed(self) -> list[tuple[int, np.ndarray]]:
        """The kept records with their positions in the stream."""
        return list(self._kept)


def spread_indices(n: int, max_records: int = SAMPLE_RECORDS) -> np.ndarray:
    """Up to ``max_records`` indices spread evenly over ``range(n)``."""
    k = max(1, min(n, max_records))
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def _stored_bytes(root: pathlib.Path) -> int:
    """Bytes of a scratch store's files that differ by codec (meta.zr excluded)."""
    return sum((root / f).stat().st_size for f in ("data.zr", "dict.zr", "sums.zr") if (root / f).exists())


def _write(
    root: pathlib.Path,
    records: Sequence[np.ndarray],
    dtype: np.dtype,
    item_shape: tuple[int, ...] | None,
    codec: str,
    blob: bytes | None = None,
) -> int:
    # At the level the store will be written at, if one was asked for.
    level = _set_layout(codec).get("level")
    if item_shape is not None:
        with Dense.create(root, dtype, item_shape, codec=codec, dict_bytes=blob, level=level) as w:
            w.append(np.stack(list(records)).astype(dtype, copy=False).reshape((len(records), *item_shape)))
    else:
        with Ragged.create(root, dtype, codec=codec, dict_bytes=blob, level=level) as r:
            r.append(list(records))
    return _stored_bytes(root)


def _logical(records: Sequence[np.ndarray], ragged: bool) -> int:
    # A Ragged record also stores its shape prefix: [u64 ndim][u64 dim] * ndim.
    return sum(r.nbytes + (8 + 8 * r.ndim if ragged else 0) for r in records)


class Choice(NamedTuple):
    """What :func:`choose` decided, and, when it chose zstd_dict with the
    store's own dictionary (trained by ``train``), that dictionary to reuse."""

    codec: CodecChoice
    dict_bytes: bytes | None


def choose(
    records: Sequence[np.ndarray],
    total: int,
    dtype: np.dtype,
    item_shape: tuple[int, ...] | None,
    tier: str,
    train: Callable[[], bytes] | None = None,
) -> Choice:
    """Chooses the codec of a store of ``total`` records from ``records``, an
    evenly spread sample of them (``item_shape`` None: a Ragged store).

    ``train`` trains the dictionary the store would get with zstd_dict (on
    the conversion's own training sample). When that sample is the whole
    column (the column fits the tier's budget), zstd_dict is measured with
    that very dictionary: the store will compress records it was trained on,
    as the sample is. A larger column is mostly records the dictionary never
    saw, so then a dictionary trained on half of the sample is measured on the
    other half (a dictionary compressing its own training records would
    flatter itself), and counted at the tier's full size."""
    s = len(records)
    if s == 0 or total == 0:
        return Choice(
            {
                "requested": "auto",
                "chosen": "raw",
                "ratio": 1.0,
                "estimates": {"raw": 1.0, "zstd": None, "zstd_dict": None},
                "sample_records": 0,
                "sample_bytes": 0,
                "reason": "no records to measure",
            },
            None,
        )
    ragged = item_shape is None
    logical = _logical(records, ragged)
    column_bytes = total * logical / s
    budget = DICT_TIERS[tier]["samples"]
    whole = train is not None and column_bytes <= budget and total <= DICT_SAMPLE_RECORDS
    dict_size = DICT_TIERS[tier]["size"]
    real_dict: bytes | None = None
    dict_frames: float | None = None  # zstd_dict bytes a record, for the whole store
    dict_note = ""
    tmp = tempfile.mkdtemp(prefix="loaderx-codec-", dir=os.environ.get("LOADERX_STAGING_DIR") or None)
    try:
        root = pathlib.Path(tmp)
        raw = _write(root / "raw", records, dtype, item_shape, "raw")
        zstd = _write(root / "zstd", records, dtype, item_shape, "zstd")
        held = list(records[1::2])
        if column_bytes < dict_size * _MIN_GAIN:
            dict_note = f"the column is smaller than a {dict_size // 1024} KiB dictionary"
        elif not whole and len(held) < _MIN_DICT_RECORDS:
            dict_note = "too few records to train a dictionary on"
        else:
            try:
                blob = train() if whole and train is not None else train_dict(list(records[0::2]), tier)
            except (ZrecordError, ValueError):
                dict_note = "zstd could not train a dictionary on the sample"
            else:
                measured = records if whole else held
                with_dict = _write(root / "dict", measured, dtype, item_shape, "zstd_dict", blob)
                with_dict -= (root / "dict" / "dict.zr").stat().st_size  # counted below, once
                if whole:
                    real_dict, dict_size = blob, len(blob)
                    dict_frames = with_dict / s
                else:
                    plain = _write(root / "held", held, dtype, item_shape, "zstd")
                    dict_frames = zstd / s * (with_dict / max(1, plain))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    fixed = _PAGE + _ENTRY * total  # the same for every codec
    scale = total / s
    # sums.zr's header is in the scratch raw store once, and once in the real one.
    sizes: dict[str, float] = {
        "raw": fixed + (raw - _SUMS_HEADER) * scale + _SUMS_HEADER,
        "zstd": fixed + zstd * scale,
    }
    if dict_frames is not None:
        sizes["zstd_dict"] = fixed + dict_frames * total + dict_size
    estimates: dict[str, float | None] = {c: sizes["raw"] / v for c, v in sizes.items()}
    estimates.setdefault("zstd_dict", None)

    mean = logical / s
    z = sizes["raw"] / sizes["zstd"]
    dict_pays = "zstd_dict" in sizes and sizes["zstd"] / sizes["zstd_dict"] >= _MIN_GAIN
    best = "zstd_dict" if dict_pays else "zstd"
    gain = sizes["raw"] / sizes[best]
    if gain < _MIN_GAIN:
        chosen = "raw"
        if gain < 1.0:
            reason = (
                f"compression would make the store bigger ({best} {gain:.2f}x): records average "
                f"{mean:,.0f} B, and every zstd frame adds its header and a 4-byte checksum"
            )
        else:
            reason = (
                f"compression saves under {_MIN_GAIN - 1:.0%} ({best} {gain:.2f}x): "
                "not worth a decode per read"
            )
    elif best == "zstd_dict":
        chosen = "zstd_dict"
        reason = f"a dictionary pays: zstd_dict {gain:.2f}x against zstd {z:.2f}x"
    else:
        chosen = "zstd"
        if dict_frames is None:
            reason = f"zstd {z:.2f}x; no dictionary tried: {dict_note}"
        else:
            reason = f"zstd {z:.2f}x; a dictionary does not pay (zstd_dict {estimates['zstd_dict']:.2f}x)"
    choice: CodecChoice = {
        "requested": "auto",
        "chosen": chosen,
        "ratio": sizes["raw"] / sizes[chosen],
        "estimates": estimates,
        "sample_records": s,
        "sample_bytes": logical,
        "reason": reason,
    }
    return Choice(choice, real_dict if chosen == "zstd_dict" else None)


def raw_store_bytes(store: Dense | Ragged, logical: int) -> int:
    """The size on disk (as ``info`` counts it) of a raw copy of ``store``
    with the same shards, holding ``logical`` record bytes: the record table,
    the payload and ``sums.zr`` with one checksum a record."""
    n = len(store)
    parts = max(1, len(store.shards))
    return parts * (_PAGE + _SUMS_HEADER) + n * (_ENTRY + _SUM) + logical


def ensure_not_bigger_than_raw(target: pathlib.Path, choice: CodecChoice, what: str) -> CodecChoice:
    """If the store at ``target``, written with a codec ``auto`` chose, is
    bigger than a raw store of the same records would be, rewrites it raw
    (same layout) and returns the choice updated to say so."""
    from loaderx.tools.inspect import _chunks_of, _logical_bytes, open_store

    if choice["requested"] != "auto" or choice["chosen"] == "raw":
        return choice
    with open_store(target) as store:
        disk = store._require_reader().disk_bytes
        raw = raw_store_bytes(store, _logical_bytes(store))
        if disk <= raw:
            return choice
        scratch = target.parent / f".{target.name}.loaderx-raw"
        shutil.rmtree(scratch, ignore_errors=True)
        try:
            if isinstance(store, Dense):
                writer: Dense | Ragged = Dense.create(
                    scratch, store.dtype, store.item_shape, codec="raw", **_set_layout("raw")
                )
            else:
                writer = Ragged.create(scratch, store.dtype, codec="raw", **_set_layout("raw"))
            with writer:
                for a, b in _chunks_of(store, 0, len(store)):
                    writer.append(store[a:b])
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    for entry in list(target.iterdir()):
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in list(scratch.iterdir()):
        os.replace(entry, target / entry.name)
    scratch.rmdir()
    updated: CodecChoice = {**choice, "chosen": "raw", "ratio": 1.0}
    updated["reason"] = (
        f"{choice['reason']}; but the {choice['chosen']} store of the whole {what} came out "
        f"bigger than raw ({disk:,} > {raw:,} bytes), so it was rewritten raw"
    )
    return updated


def finish(target: pathlib.Path, choice: CodecChoice, fields: dict[str, Any], what: str) -> CodecChoice:
    """The last step of every converted store (committed at ``target``):
    the raw check of an ``auto`` choice, then the ``features.json`` sidecar
    with ``fields`` (the source's description) and the codec choice."""
    choice = ensure_not_bigger_than_raw(target, choice, what)
    _sidecar.write(target, {**fields, "codec": dict(choice)})
    return choice
