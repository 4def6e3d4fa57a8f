"""Utilities: dictionary training for ``zstd_dict`` stores."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import numpy as np

from loaderx import _native
from loaderx._errors import ZrecordError
from loaderx.zrecord import DICT_TIERS, Dense, Ragged, _Store

__all__ = ["train_dict"]

_GATHER_CHUNK = 1024


def _as_bytes_array(record: Any, position: int) -> np.ndarray:
    """The bytes a store would hold for ``record``: an ndarray's, a bytes-like
    object's, or those of what NumPy makes of anything else (a str, a number,
    a list of numbers), as loaderx 2.0.0 takes them."""
    if isinstance(record, (bytes, bytearray, memoryview)):
        return np.frombuffer(record, dtype=np.uint8)
    array = record if isinstance(record, np.ndarray) else np.asarray(record)
    if array.dtype.hasobject:
        # 2.0.0 trains on the object pointers; those are not the data.
        raise TypeError(
            f"train_dict records must be numpy arrays, bytes or values NumPy stores without "
            f"Python objects; record {position} is {type(record).__name__}"
        )
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def _evenly_spaced(n: int, k: int) -> np.ndarray:
    k = max(1, min(n, k))
    return np.unique(np.linspace(0, n - 1, k).round().astype(np.int64))


def train_dict(
    source: np.ndarray | Iterable[Any] | Dense | Ragged,
    tier: str | None = None,
    path: str | os.PathLike[str] | None = None,
) -> bytes:
    """Trains a zstd dictionary for ``codec="zstd_dict"`` stores.

    ``source`` is an ndarray (one record per slice along axis 0), an iterable
    of records (ndarrays or bytes, consumed once), or an opened Dense/Ragged
    reader. The training sample is an evenly spread subset of the records,
    bounded by the tier's sample budget; the dictionary is at most the tier's
    size (``DICT_TIERS``; default ``"balanced"``). ``path`` also writes the
    bytes to that file. Raises ValueError for empty input or an unknown tier,
    and ZrecordError(-9) when zstd's trainer fails.
    """
    name = "balanced" if tier is None else tier
    if name not in DICT_TIERS:
        raise ValueError(f"unknown dict tier {tier!r}, expected one of {sorted(DICT_TIERS)}")
    size = DICT_TIERS[name]["size"]
    budget = DICT_TIERS[name]["samples"]
    sampler = _native.DictSampler(budget)

    if isinstance(source, _Store):
        if source.writable:
            raise ValueError(
                "train_dict requires an opened read-only container: close the writer, then "
                f"pass {type(source).__name__}.open(path)"
            )
        n = len(source)  # raises RuntimeError when closed
        if n == 0:
            raise ValueError("cannot train a zstd dictionary on an empty store")
        mean = source._require_reader().mean_record_bytes(64)
        idx = _evenly_spaced(n, int(budget // max(mean, 1.0)))
        for start in range(0, len(idx), _GATHER_CHUNK):
            chunk = source[idx[start : start + _GATHER_CHUNK]]
            if isinstance(source, Dense):
                flat = chunk.reshape(-1).view(np.uint8)
                sampler.push_rows(flat, flat.shape[0] // chunk.shape[0])
            else:
                for record in chunk:
                    sampler.push(_as_bytes_array(record, start))
    elif isinstance(source, np.ndarray):
        if source.ndim == 0:
            raise TypeError(
                "len() of unsized object: train_dict takes records along axis 0, and a 0-d array has none"
            )
        if source.shape[0] == 0 or source.size == 0:
            raise ValueError("cannot train a zstd dictionary on an empty array")
        n = source.shape[0]
        row_bytes = source[0].nbytes
        idx = _evenly_spaced(n, budget // max(row_bytes, 1))
        rows = np.ascontiguousarray(source[idx])
        sampler.push_rows(rows.reshape(-1).view(np.uint8), row_bytes)
    elif isinstance(source, (str, bytes, bytearray, memoryview)):
        # 2.0.0 trains on the characters (or byte values) one by one: a path
        # or a blob passed by mistake would make a useless dictionary.
        raise TypeError(
            "train_dict takes an ndarray, an iterable of records or an opened store, "
            f"not {type(source).__name__}"
        )
    else:
        try:
            iterator = iter(source)
        except TypeError as e:
            raise TypeError(
                f"{e}: train_dict takes an ndarray, an iterable of records or an opened store"
            ) from None
        for position, record in enumerate(iterator):
            sampler.push(_as_bytes_array(record, position))

    if sampler.seen == 0:
        raise ValueError("train_dict needs at least one record")
    if sampler.kept == 0:  # records, but all of them empty: nothing to learn from
        raise ZrecordError(
            "zstd dictionary training failed (too few or too small samples): every record is empty",
            ZrecordError.DICT_TRAINING,
        )
    dictionary = sampler.train(size)
    if path is not None:
        with open(path, "wb") as f:
            f.write(dictionary)
    return dictionary
