"""Building a store set from independent tasks (Spark, Dask, Beam, Ray, or
plain processes): each task writes its own shard with :func:`write_shard`,
then one process publishes the set with :func:`commit`.

A shard is an ordinary store written under the set's root (a local path or
an object-storage URL) and committed before ``write_shard`` returns; the set
does not exist for readers until ``commit`` writes its manifest, listing the
shards in the order given. A retried or failed task therefore leaves at most
an unlisted folder: give each attempt its own shard name (a task id plus an
attempt number or a random suffix), and pass ``commit`` only the entries of
the attempts that succeeded.

Example with Dask (any engine that maps a function over partitions works the
same way)::

    import dask
    from loaderx import sets

    @dask.delayed
    def part(k):
        return sets.write_shard("s3://bucket/train/x", f"part-{k:05d}-{uuid.uuid4().hex[:8]}",
                                batches_of_partition(k), dtype="uint8", item_shape=(3, 224, 224))

    entries = dask.compute(*[part(k) for k in range(64)])
    sets.commit("s3://bucket/train/x", entries, dtype="uint8", item_shape=(3, 224, 224))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, TypedDict

from loaderx import _native
from loaderx.zrecord import (
    Dense,
    Ragged,
    StorageOptions,
    _check_codec,
    _check_dtype,
    _check_item_shape,
    _storage_options,
    _stored_dtype,
)

__all__ = ["ShardInfo", "commit", "write_shard"]


class ShardInfo(TypedDict):
    """One committed shard: its folder relative to the set's root, its
    record count and its payload bytes (what the manifest lists)."""

    path: str
    records: int
    data_bytes: int


def _check_name(name: str) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a shard name is a non-empty str, got {name!r}")
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts) or any(c in name for c in "\\:?#%"):
        raise ValueError(
            f"shard name {name!r} must be a relative path of plain names "
            "(no empty, '.' or '..' parts, no '\\', ':', '?', '#' or '%')"
        )
    return name


def write_shard(
    root: str,
    name: str,
    batches: Iterable[Any],
    *,
    dtype: Any,
    item_shape: Sequence[int] | None = None,
    codec: str = "zstd",
    dict_bytes: bytes | None = None,
    storage_options: StorageOptions | None = None,
    level: int | None = None,
) -> ShardInfo:
    """Writes one shard of a set at ``root/name`` and commits it.

    ``batches`` yields what ``append`` takes: ``(n, *item_shape)`` arrays for
    a Dense set (``item_shape`` given), lists of arrays for a Ragged one
    (``item_shape`` None). ``level`` is the zstd level of the shard's
    frames (see :meth:`loaderx.zrecord.Dense.create`); shards of one set
    may differ in it. Returns the entry :func:`commit` needs.
    """
    _check_name(name)
    url = f"{str(root).rstrip('/')}/{name}"
    writer: Dense | Ragged
    if item_shape is None:
        writer = Ragged.create(
            url, dtype, codec=codec, dict_bytes=dict_bytes, storage_options=storage_options, level=level
        )
    else:
        writer = Dense.create(
            url,
            dtype,
            item_shape,
            codec=codec,
            dict_bytes=dict_bytes,
            storage_options=storage_options,
            level=level,
        )
    try:
        for batch in batches:
            writer.append(batch)
    except BaseException:
        writer._abandon()  # never committed, never listed
        raise
    ((_, records, data_bytes),) = writer._commit()
    return {"path": name, "records": int(records), "data_bytes": int(data_bytes)}


def commit(
    root: str,
    shards: Iterable[ShardInfo],
    *,
    dtype: Any,
    item_shape: Sequence[int] | None = None,
    codec: str = "zstd",
    storage_options: StorageOptions | None = None,
) -> dict[str, Any]:
    """Publishes the set at ``root`` made of ``shards`` (entries from
    :func:`write_shard`, in the record order wanted) and returns its
    manifest. Right after the manifest is written the set is opened as a
    reader would open it, and the manifest is removed again if a shard is
    missing or disagrees with its entry: a set that would not open is never
    left published."""
    dt = _check_dtype(dtype)
    shape = None if item_shape is None else list(_check_item_shape(item_shape, dt))
    _check_codec(codec, b"x" if codec == "zstd_dict" else None)
    entries = []
    for s in shards:
        entries.append((_check_name(s["path"]), int(s["records"]), int(s["data_bytes"])))
    if not entries:
        raise ValueError("a set needs at least one shard")
    text = _native.commit_set(
        str(root),
        "ragged" if shape is None else "dense",
        _stored_dtype(dt),
        shape,
        codec,
        entries,
        _storage_options(storage_options),
    )
    manifest: dict[str, Any] = json.loads(text)
    return manifest
