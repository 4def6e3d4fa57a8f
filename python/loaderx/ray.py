"""Ray Data integration (``pip install 'loaderx[ray]'``): write a Ray Dataset
as loaderx store sets, one set per column, and read sets back as a Dataset.

Example::

    import ray
    from loaderx.ray import read_zrecord, write_zrecord

    ds = ray.data.read_parquet("s3://bucket/raw").map_batches(decode)
    write_zrecord(ds, "s3://bucket/train", storage_options=opts)
    # -> s3://bucket/train/<column>, a store set per column, ready for
    #    DataLoader({c: Dense.open(f"s3://bucket/train/{c}") ...})
    back = read_zrecord("s3://bucket/train", columns=["image", "label"],
                        storage_options=opts)

Writing (:class:`ZrecordDatasink`): every write task writes, for each
column, its own shards straight to ``path/<column>/part-<task>-<attempt>-<k>``
with :func:`loaderx.sets.write_shard`; when every task has succeeded, the
driver publishes ``path/<column>`` with :func:`loaderx.sets.commit`. Readers
see a set only once its manifest exists, and the manifest lists only shards of
attempts that succeeded, so a failed or retried task leaves at most unlisted
folders (safe to delete), never a missing, duplicate or half-written shard.

Row order: the manifest lists the shards by write-task index, then in write
order within a task. Ray hands task indices out in the order input blocks
reach the write step, which is the dataset's order only when the dataset runs
with ``execution_options.preserve_order = True``: without it, blocks coming
out of an earlier, unfused stage travel on in completion order.
:func:`write_zrecord` turns it on for the write; with ``ds.write_datasink``
set it yourself (``ds.context.execution_options.preserve_order = True``).
Row ``i`` of every column's set is always the same dataset row, ordered or
not: a task writes all columns from the same blocks.

Column types: a column whose rows (over the whole dataset) are numeric
(bool, int, uint, float) arrays of one shape and dtype becomes a Dense set of
that ``item_shape`` (scalars: ``()``); numeric rows of varying shapes become
a Ragged set. Strings, Python objects, dates and null rows of list columns
are refused with an error naming the column (Ray itself turns nulls of
numeric scalar columns into NaN). Tasks see only their own rows, so a Dense
shard written by a task whose rows happened to share one shape is re-encoded
as Ragged at commit when the column turns out ragged elsewhere;
``ragged=[...]`` writes a column Ragged from the start. A dataset with no
rows publishes nothing and raises ValueError (a store's dtype and shape
cannot be known without rows).

Reading (:class:`ZrecordDatasource`, :func:`read_zrecord`): each shard (a
plain store counts as one) becomes one or more read tasks, yielding blocks of
``{column: values}`` in record order: Dense columns as fixed-shape tensor
columns, Ragged columns as variable-shaped tensor columns. Iterate with
``preserve_order`` on to see the rows in store order.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import os
import pathlib
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

try:
    import pyarrow as pa
    import ray.data
    from ray.data.block import BlockAccessor, BlockMetadata
    from ray.data.datasource import Datasink, Datasource, ReadTask
    from ray.data.extensions import ArrowTensorArray, ArrowVariableShapedTensorArray
except ImportError as exc:  # pragma: no cover - exercised in a subprocess
    raise ImportError(
        f"loaderx.ray needs Ray Data ({exc}); install it with: pip install 'loaderx[ray]'"
    ) from exc

from loaderx import sets
from loaderx.zrecord import (
    Dense,
    Ragged,
    StorageOptions,
    _check_codec,
    _is_url,
    _location,
    _open_any,
)

if TYPE_CHECKING:
    from ray.data.datasource.datasink import WriteResult

__all__ = ["ZrecordDatasink", "ZrecordDatasource", "read_zrecord", "write_zrecord"]

logger = logging.getLogger(__name__)

PathLike = str | os.PathLike[str]
Values = np.ndarray | list[np.ndarray]  # a Dense batch, or Ragged rows

#: Decoded bytes a write task buffers before it writes a shard per column.
SHARD_BYTES = 64 << 20
#: Decoded bytes a read task puts in one block.
BLOCK_BYTES = 64 << 20
_NUMERIC = "biuf"  # numpy kinds a column may hold: bool, int, uint, float


def _join(root: str, name: str) -> str:
    """``root/name`` for local paths and URLs alike."""
    return f"{root.rstrip('/')}/{name}"


def _check_column(name: Any) -> str:
    """A column becomes a folder ``path/<name>``: one plain path part."""
    if not isinstance(name, str) or "/" in name:
        raise ValueError(f"column name {name!r} must be a str without '/' (it names a folder)")
    return sets._check_name(name)


# --------------------------------------------------------------------------
# writing
# --------------------------------------------------------------------------


def _column_values(name: str, values: np.ndarray) -> Values:
    """One block's column as a store takes it: the ``(n, *shape)`` array Ray
    gives for fixed-shape columns, else the list of per-row arrays (tensor
    columns of varying shapes, Arrow lists, pandas object columns)."""
    rows = None if values.dtype.kind != "O" else [np.asarray(v) for v in values]
    for dtype in [values.dtype] if rows is None else {r.dtype for r in rows}:
        if dtype.kind not in _NUMERIC:
            what = "nulls or Python objects" if dtype.kind == "O" else f"dtype {dtype}"
            raise ValueError(
                f"column {name!r} holds {what}: loaderx.ray writes numeric "
                "(bool, int, uint, float) columns only; drop it or select others with columns="
            )
    return values if rows is None else rows


def _dense_form(pieces: list[Values]) -> list[np.ndarray] | None:
    """``pieces`` as ``(n, *shape)`` arrays when all their rows share one
    shape and dtype, else None (the rows are ragged)."""
    kinds = set()
    for p in pieces:
        if isinstance(p, np.ndarray):
            kinds.add((p.dtype, p.shape[1:]))
        else:
            kinds.update((r.dtype, r.shape) for r in p)
    if len(kinds) != 1:
        return None
    return [p if isinstance(p, np.ndarray) else np.stack(p) for p in pieces]


def _ragged_form(name: str, pieces: list[Values]) -> tuple[np.dtype, list[list[np.ndarray]]]:
    """``pieces`` as lists of rows, and the one dtype they share."""
    batches = [_rows(p) if isinstance(p, np.ndarray) else p for p in pieces]
    dtypes = {r.dtype for b in batches for r in b}
    if len(dtypes) != 1:
        raise ValueError(
            f"column {name!r} has rows of dtypes {sorted(map(str, dtypes))}: "
            "cast it to one dtype before writing"
        )
    return dtypes.pop(), batches


def _rows(batch: np.ndarray) -> list[np.ndarray]:
    """A Dense batch as Ragged rows (0-d arrays for scalars, not numpy scalars)."""
    return [np.asarray(r) for r in batch]


def _nbytes(values: Values) -> int:
    """Decoded bytes of a Dense batch or of Ragged rows."""
    return values.nbytes if isinstance(values, np.ndarray) else sum(r.nbytes for r in values)


class ZrecordDatasink(Datasink[dict[str, Any]]):
    """Writes a Ray Dataset as one loaderx store set per column, at
    ``path/<column>`` (a local path every node can reach, or an
    object-storage URL): ``ds.write_datasink(ZrecordDatasink(path))``, or
    :func:`write_zrecord`, which also keeps the dataset's row order.

    ``columns`` selects and orders the columns to write (default: all).
    ``codec`` and ``dict_bytes`` apply to every column, ``storage_options``
    configures object storage. ``ragged`` names columns to write as Ragged
    whatever their shapes. A write task starts a new shard per column each
    time it has buffered ``shard_bytes`` of decoded rows; ``min_rows_per_write``
    makes Ray hand each write task at least that many rows (fewer, larger
    shards). After a successful write, ``manifests`` maps each column to its
    published manifest. See the module docstring for order and typing rules.
    """

    def __init__(
        self,
        path: PathLike,
        columns: Sequence[str] | None = None,
        codec: str = "zstd",
        dict_bytes: bytes | None = None,
        storage_options: StorageOptions | None = None,
        *,
        ragged: Iterable[str] = (),
        shard_bytes: int = SHARD_BYTES,
        min_rows_per_write: int | None = None,
    ) -> None:
        # Check everything here, on the driver, not in the first write task.
        self._path = os.fspath(path)
        self._columns = None if columns is None else [_check_column(c) for c in columns]
        self._dict_bytes = _check_codec(codec, dict_bytes)
        self._codec = codec
        self._options = None if storage_options is None else dict(storage_options)
        self._ragged = frozenset(_check_column(c) for c in ragged)
        if int(shard_bytes) < 1:
            raise ValueError(f"shard_bytes must be positive, got {shard_bytes}")
        self._shard_bytes = int(shard_bytes)
        self._min_rows = min_rows_per_write
        self.manifests: dict[str, dict[str, Any]] = {}

    @property
    def min_rows_per_write(self) -> int | None:
        """Rows Ray bundles into one write task at least (None: its choice)."""
        return self._min_rows

    # -- in each write task --------------------------------------------------
    def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
        """Writes this task's rows (``ctx`` is Ray's TaskContext), a shard per
        column each time ``shard_bytes`` are buffered, and returns what
        :meth:`on_write_complete` needs:
        ``{"task": index, "rows": n, "columns": {name: [shard entry, ...]}}``.
        A task without rows writes nothing."""
        # A fresh suffix per attempt: a retry never reuses a failed attempt's names.
        tag = f"part-{ctx.task_idx:06d}-{uuid.uuid4().hex[:8]}"
        written: dict[str, list[dict[str, Any]]] = {}
        pending: dict[str, list[Values]] = {}
        names: list[str] | None = None
        rows = buffered = shards = 0
        for block in blocks:
            acc = BlockAccessor.for_block(block)
            if acc.num_rows() == 0:
                continue  # an empty block says nothing about types, and adds no rows
            have = list(acc.column_names())  # type: ignore[attr-defined]  # Arrow and pandas blocks
            if names is None:
                names = self._pick(have)
            elif not set(names) <= set(have):
                raise ValueError(f"a block lacks columns {sorted(set(names) - set(have))}")
            arrays = acc.to_numpy(names)
            for name in names:
                values = _column_values(name, arrays[name])
                pending.setdefault(name, []).append(values)
                buffered += _nbytes(values)
            rows += acc.num_rows()
            if buffered >= self._shard_bytes:
                self._flush(f"{tag}-{shards:04d}", pending, written)
                buffered, shards = 0, shards + 1
        if pending:
            self._flush(f"{tag}-{shards:04d}", pending, written)
        return {"task": ctx.task_idx, "rows": rows, "columns": written}

    def _pick(self, have: list[str]) -> list[str]:
        """The columns to write, given the first block's columns."""
        if self._columns is None:
            return [_check_column(c) for c in have]
        missing = [c for c in self._columns if c not in have]
        if missing:
            raise ValueError(f"columns {missing} are not in the dataset (it has {have})")
        return self._columns

    def _flush(
        self, shard: str, pending: dict[str, list[Values]], written: dict[str, list[dict[str, Any]]]
    ) -> None:
        """Writes one shard per column from the buffered blocks, and empties the buffer."""
        for name, pieces in pending.items():
            batches: list[Any] | None = None if name in self._ragged else _dense_form(pieces)
            if batches is not None:
                dtype, shape = batches[0].dtype, batches[0].shape[1:]
            else:
                (dtype, batches), shape = _ragged_form(name, pieces), None
            info = sets.write_shard(
                _join(self._path, name),
                shard,
                batches,
                dtype=dtype,
                item_shape=shape,
                codec=self._codec,
                dict_bytes=self._dict_bytes,
                storage_options=self._options,
            )
            written.setdefault(name, []).append(
                {**info, "dtype": dtype.str, "item_shape": None if shape is None else list(shape)}
            )
        pending.clear()

    # -- on the driver, once -------------------------------------------------
    def on_write_complete(self, write_result: WriteResult[dict[str, Any]]) -> None:
        """Publishes one set per column from the successful tasks' shards,
        ordered by task index. Every column is checked (and re-encoded where
        needed) before the first manifest is written."""
        returns = sorted((r for r in write_result.write_returns if r is not None), key=lambda r: r["task"])
        tasks = [r["task"] for r in returns]
        if len(set(tasks)) != len(tasks):
            raise RuntimeError(f"write tasks reported twice: {tasks}")
        missing = sorted(set(range(max(tasks, default=-1) + 1)) - set(tasks))
        if missing:  # only with DataContext.max_errored_blocks > 0: Ray chose to drop them
            logger.warning("write tasks %s failed and were skipped; their rows are not in the sets", missing)
        columns: dict[str, list[dict[str, Any]]] = {}
        for r in returns:
            if r["rows"]:
                if columns and set(r["columns"]) != set(columns):
                    raise ValueError(
                        f"write tasks disagree on the columns: {sorted(r['columns'])} vs {sorted(columns)}"
                    )
                for name, entries in r["columns"].items():
                    columns.setdefault(name, []).extend(entries)
        if not columns:
            raise ValueError(f"the dataset has no rows: no store set was published at {self._path}")
        plans = {name: self._reconcile(name, entries) for name, entries in columns.items()}
        lengths = {name: sum(e["records"] for e in plan[2]) for name, plan in plans.items()}
        if len(set(lengths.values())) != 1:
            raise RuntimeError(f"columns wrote different row counts: {lengths}")
        for name, (dtype, shape, entries) in plans.items():
            self.manifests[name] = sets.commit(
                _join(self._path, name),
                [
                    {"path": e["path"], "records": e["records"], "data_bytes": e["data_bytes"]}
                    for e in entries
                ],
                dtype=dtype,
                item_shape=shape,
                codec=self._codec,
                storage_options=self._options,
            )

    def on_write_failed(self, error: Exception) -> None:
        """Says what a failed write left behind (Ray raises ``error`` itself)."""
        published = sorted(self.manifests)
        logger.warning(
            "writing %s failed (%s); %s; shards written so far are not listed in any "
            "manifest and may be deleted",
            self._path,
            error,
            f"columns {published} were already published" if published else "nothing was published",
        )

    def _reconcile(
        self, name: str, entries: list[dict[str, Any]]
    ) -> tuple[str, tuple[int, ...] | None, list[dict[str, Any]]]:
        """The column's dtype, item_shape (None: Ragged) and shard entries.
        Dense when every shard is Dense of one shape; otherwise Ragged, and the
        Dense shards (tasks whose rows happened to share a shape) are
        re-encoded as Ragged shards beside them."""
        dtypes = {e["dtype"] for e in entries}
        if len(dtypes) != 1:
            raise ValueError(
                f"column {name!r} has rows of dtypes {sorted(dtypes)}: cast it to one dtype before writing"
            )
        dtype = dtypes.pop()
        shapes = {None if e["item_shape"] is None else tuple(e["item_shape"]) for e in entries}
        if len(shapes) == 1 and None not in shapes:
            return dtype, shapes.pop(), entries
        dense = [e for e in entries if e["item_shape"] is not None]
        if dense:
            logger.info(
                "column %r is ragged: re-encoding %d fixed-shape shard(s) (%d rows) as "
                "Ragged; ragged=[%r] avoids this",
                name,
                len(dense),
                sum(e["records"] for e in dense),
                name,
            )
        root = _join(self._path, name)
        return dtype, None, [e if e["item_shape"] is None else self._as_ragged(root, e) for e in entries]

    def _as_ragged(self, root: str, entry: dict[str, Any]) -> dict[str, Any]:
        """Copies one committed Dense shard into a new Ragged shard."""
        src = Dense.open(_join(root, entry["path"]), storage_options=self._options)
        try:
            step = max(1, SHARD_BYTES // max(1, src.dtype.itemsize * int(np.prod(src.item_shape))))
            batches = (_rows(src[i : i + step]) for i in range(0, len(src), step))
            info = sets.write_shard(
                root,
                f"{entry['path']}-ragged",
                batches,
                dtype=src.dtype,
                codec=self._codec,
                dict_bytes=self._dict_bytes,
                storage_options=self._options,
            )
        finally:
            src.close()
        return {**info, "dtype": entry["dtype"], "item_shape": None}


def write_zrecord(
    ds: ray.data.Dataset,
    path: PathLike,
    columns: Sequence[str] | None = None,
    *,
    ray_remote_args: dict[str, Any] | None = None,
    concurrency: int | None = None,
    **sink_args: Any,
) -> dict[str, dict[str, Any]]:
    """Writes ``ds`` with a :class:`ZrecordDatasink` (``sink_args``: its
    keyword arguments) and returns the published manifests by column.

    ``preserve_order`` is on for the write (and restored after), so row ``i``
    of each set is row ``i`` of ``ds`` as ``ds.take_all()`` orders it with
    ``preserve_order`` on."""
    sink = ZrecordDatasink(path, columns, **sink_args)
    options = ds.context.execution_options
    before = options.preserve_order
    options.preserve_order = True
    try:
        ds.write_datasink(sink, ray_remote_args=ray_remote_args, concurrency=concurrency)
    finally:
        options.preserve_order = before
    return sink.manifests


# --------------------------------------------------------------------------
# reading
# --------------------------------------------------------------------------


def _is_store(path: pathlib.Path) -> bool:
    """Whether a local folder holds a store set (manifest) or a plain store."""
    return (path / "manifest.json").is_file() or (path / "meta.zr").is_file()


def _column_paths(path: PathLike | Mapping[str, PathLike], columns: Sequence[str] | None) -> dict[str, str]:
    """``{column: store location}`` for what :class:`ZrecordDatasource` reads."""
    if isinstance(path, Mapping):
        paths = {str(k): os.fspath(v) for k, v in path.items()}
        if columns is None:
            return paths
        unknown = [c for c in columns if c not in paths]
        if unknown:
            raise ValueError(f"columns {unknown} are not among {sorted(paths)}")
        return {c: paths[c] for c in columns}
    text = os.fspath(path).rstrip("/")
    if columns is not None:
        return {c: _join(text, _check_column(c)) for c in columns}
    if not _is_url(text):
        local = pathlib.Path(_location(text)[1])
        if local.is_dir() and not _is_store(local):
            # A ZrecordDatasink root: every sub-folder holding a store or set.
            found = sorted(p.name for p in local.iterdir() if p.is_dir() and _is_store(p))
            if not found:
                raise FileNotFoundError(f"{text}: neither a store nor a folder of stores")
            return {name: _join(text, name) for name in found}
    # One store or set, a column named after its last path part. Object storage
    # is not listed: read a ZrecordDatasink root there with columns=[...].
    return {text.rsplit("/", 1)[-1]: text}


def _to_arrow(values: Values) -> pa.Array:
    """A column of a block: Ragged rows as a variable-shaped tensor column
    (even when this block's rows share a shape, so every block has one type),
    Dense batches as scalar or fixed-shape tensor columns."""
    if isinstance(values, list):
        rows = np.empty(len(values), dtype=object)
        for i, v in enumerate(values):  # not rows[:] = values: numpy would broadcast equal shapes
            rows[i] = v
        return ArrowVariableShapedTensorArray.from_numpy(rows)
    return pa.array(values) if values.ndim == 1 else ArrowTensorArray.from_numpy(values)


def _read_rows(
    parts: list[tuple[str, str, str, int]],
    count: int,
    block_rows: int,
    storage_options: dict[str, Any] | None,
) -> Iterator[pa.Table]:
    """A read task: ``count`` rows from ``(column, kind, shard, first row)``
    parts, as blocks of at most ``block_rows`` rows, in order."""
    stores = []
    for name, kind, loc, start in parts:
        cls = Dense if kind == "dense" else Ragged
        stores.append((name, cls.open(loc, storage_options=storage_options), start))
    try:
        for off in range(0, count, block_rows):
            n = min(block_rows, count - off)
            yield pa.table(
                {name: _to_arrow(store[start + off : start + off + n]) for name, store, start in stores}
            )
    finally:
        for _, store, _ in stores:
            store.close()


class ZrecordDatasource(Datasource):
    """Reads equal-length loaderx stores or store sets as the columns of a
    Ray Dataset (use :func:`read_zrecord`, or ``ray.data.read_datasource``).

    ``path`` is a :class:`ZrecordDatasink` root (local: its sub-folders are
    found; object storage: name them with ``columns``), one store or set (a
    single column named after its last path part), or a mapping
    ``{column: store path}``. ``columns`` selects and orders columns.
    ``block_rows`` caps the rows of a block (default: about 64 MiB of them).
    """

    def __init__(
        self,
        path: PathLike | Mapping[str, PathLike],
        columns: Sequence[str] | None = None,
        storage_options: StorageOptions | None = None,
        *,
        block_rows: int | None = None,
    ) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        self._options = None if storage_options is None else dict(storage_options)
        # Per column: kind, shard locations and their first rows; plus row bytes.
        self._columns: dict[str, tuple[str, list[str], list[int]]] = {}
        bounds: set[int] = set()
        lengths: dict[str, int] = {}
        self._row_bytes = 0
        for name, loc in _column_paths(path, columns).items():
            with _open_any(loc, storage_options=self._options) as store:
                kind = "dense" if isinstance(store, Dense) else "ragged"
                lengths[name] = n = len(store)
                locs, firsts, first = [], [], 0
                for s in store.shards or [{"path": None, "records": n}]:  # a plain store: itself
                    locs.append(loc if s["path"] is None else _join(loc, s["path"]))
                    firsts.append(first)
                    first += s["records"]
                bounds.update([*firsts, first])
                if isinstance(store, Dense):
                    self._row_bytes += store.dtype.itemsize * int(np.prod(store.item_shape))
                elif n:  # decoded size is not recorded: sample the first rows
                    sample = store[: min(n, 64)]
                    self._row_bytes += sum(r.nbytes for r in sample) // len(sample)
            self._columns[name] = (kind, locs, firsts)
        if not self._columns:
            raise ValueError("no columns to read")
        if len(set(lengths.values())) != 1:
            raise ValueError(f"the columns have different lengths: {lengths}")
        self._rows = lengths[name]
        # Every shard boundary of any column: a range between two never spans shards.
        edges = sorted(bounds)
        self._ranges = [(a, b) for a, b in itertools.pairwise(edges) if b > a]
        self._block_rows = int(block_rows or max(1, BLOCK_BYTES // max(1, self._row_bytes)))

    def estimate_inmemory_data_size(self) -> int | None:
        """Decoded bytes of all rows (Ragged columns: from a sample)."""
        return self._rows * self._row_bytes

    def get_read_tasks(
        self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None
    ) -> list[ReadTask]:
        """One read task per shard range, split further (by rows) when Ray
        asks for more parallelism than there are shards."""
        tasks = []
        # Passed only when set: Ray versions without limit pushdown lack the argument.
        extra = {} if per_task_row_limit is None else {"per_task_row_limit": per_task_row_limit}
        for a, b in self._ranges:
            pieces = max(1, min(b - a, max(1, parallelism) * (b - a) // max(1, self._rows)))
            cuts = [a + (b - a) * k // pieces for k in range(pieces + 1)]
            for start, stop in itertools.pairwise(cuts):
                parts = []
                for name, (kind, locs, firsts) in self._columns.items():
                    i = bisect.bisect_right(firsts, start) - 1  # the shard holding row `start`
                    parts.append((name, kind, locs[i], start - firsts[i]))
                rows = stop - start
                meta = BlockMetadata(
                    num_rows=rows, size_bytes=rows * self._row_bytes, input_files=None, exec_stats=None
                )
                read = functools.partial(_read_rows, parts, rows, self._block_rows, self._options)
                tasks.append(ReadTask(read, meta, **extra))
        return tasks


def read_zrecord(
    path: PathLike | Mapping[str, PathLike],
    columns: Sequence[str] | None = None,
    storage_options: StorageOptions | None = None,
    *,
    block_rows: int | None = None,
    **read_args: Any,
) -> ray.data.Dataset:
    """Reads stores or store sets as a Ray Dataset (arguments as for
    :class:`ZrecordDatasource`; ``read_args`` go to
    ``ray.data.read_datasource``, e.g. ``override_num_blocks``)."""
    source = ZrecordDatasource(path, columns, storage_options, block_rows=block_rows)
    dataset: ray.data.Dataset = ray.data.read_datasource(source, **read_args)
    return dataset
