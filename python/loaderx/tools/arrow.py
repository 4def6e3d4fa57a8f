"""Arrow sources of the converter: Parquet and Arrow IPC files, pyarrow
Tables, and Hugging Face ``datasets`` (saved with ``save_to_disk`` or passed as
objects). They need the optional extra ``pip install 'loaderx[convert]'``;
pyarrow and datasets are imported only when such a source is converted."""

from __future__ import annotations

import contextlib
import json
import math
import os
import pathlib
import shutil
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from loaderx import _sidecar
from loaderx._progress import ProgressArg, make_progress
from loaderx.tools import _codec
from loaderx.tools._common import (
    EXTRA_HINT,
    ConvertError,
    MissingExtraError,
    UnsupportedColumnError,
    _check_name,
    _decode_spec,
    _empty_record_error,
    _rows_per_chunk,
    _select,
    _set_layout,
    _store_dtype,
    _Targets,
    _train,
)
from loaderx.zrecord import DICT_TIERS, Dense, Ragged

# ---------------------------------------------------------------------------
# convert: Arrow sources (Parquet, Arrow IPC, Hugging Face datasets, tables)
# ---------------------------------------------------------------------------


def _import_pyarrow(what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs the optional dependency pyarrow, which is not installed ({e}); "
            f"install it with: {EXTRA_HINT}"
        ) from None
    return pyarrow


def _import_datasets(what: str) -> Any:
    _import_pyarrow(what)
    try:
        import datasets
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs the optional dependency datasets (Hugging Face), which is not "
            f"installed ({e}); install it with: {EXTRA_HINT}"
        ) from None
    return datasets


def _hf_features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features an Arrow schema carries (``datasets`` writes
    them into the schema metadata of its tables, Parquet and Arrow files),
    as ``{column: feature as datasets serialises it}``; empty when none."""
    meta = schema.metadata or {}
    text = meta.get(b"huggingface")
    if not text:
        return {}
    try:
        features = json.loads(text)["info"]["features"]
    except (ValueError, KeyError, TypeError):
        return {}  # not what datasets writes: the columns keep their Arrow types alone
    return features if isinstance(features, dict) else {}


class _ParquetSource:
    def __init__(self, path: pathlib.Path) -> None:
        pa = _import_pyarrow(f"reading {path.name}")
        import pyarrow.parquet as pq

        try:
            self.file = pq.ParquetFile(str(path))
        except (pa.ArrowException, OSError) as e:
            raise ConvertError(f"{path} is not a readable Parquet file: {e}") from None
        self.schema = self.file.schema_arrow
        self.features = _hf_features(self.schema)
        meta = self.file.metadata
        self.num_rows: int | None = meta.num_rows
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        self.row_bytes = size / max(1, meta.num_rows)

    def batches(self, columns: list[str], rows: int) -> Iterator[Any]:
        yield from self.file.iter_batches(batch_size=rows, columns=columns)


class _TableSource:
    def __init__(self, table: Any) -> None:
        self.table = table
        self.schema = table.schema
        self.features = _hf_features(self.schema)
        self.num_rows: int | None = table.num_rows
        self.row_bytes = table.nbytes / max(1, table.num_rows)

    def batches(self, columns: list[str], rows: int) -> Iterator[Any]:
        yield from self.table.select(columns).to_batches(max_chunksize=rows)


class _IpcSource:
    """An Arrow IPC file (also Feather v2) or stream, memory-mapped."""

    def __init__(self, path: pathlib.Path) -> None:
        pa = _import_pyarrow(f"reading {path.name}")
        self.pa = pa
        self.path = path
        found = None
        for fmt in ("file", "stream"):
            try:
                reader = self._open(fmt)
            except pa.ArrowInvalid:
                continue
            found = fmt
            break
        if found is None:
            raise ConvertError(f"{path} is not a readable Arrow IPC / Feather file")
        self.fmt: str = found
        self.schema = reader.schema
        self.features = _hf_features(self.schema)
        if self.fmt == "file":
            self.num_rows: int | None = sum(
                reader.get_batch(i).num_rows for i in range(reader.num_record_batches)
            )
        else:
            self.num_rows = None
        self.row_bytes = path.stat().st_size / max(1, self.num_rows or 1)

    def _open(self, fmt: str) -> Any:
        source = self.pa.memory_map(str(self.path))
        return self.pa.ipc.open_file(source) if fmt == "file" else self.pa.ipc.open_stream(source)

    def batches(self, columns: list[str], rows: int) -> Iterator[Any]:
        reader = self._open(self.fmt)
        if self.fmt == "file":
            parts: Iterable[Any] = (reader.get_batch(i) for i in range(reader.num_record_batches))
        else:
            parts = reader
        for batch in parts:
            batch = batch.select(columns)
            for a in range(0, batch.num_rows, rows):
                yield batch.slice(a, rows)


class _DatasetSource:
    """A Hugging Face ``datasets.Dataset`` (honours its indices mapping)."""

    def __init__(self, ds: Any) -> None:
        self.ds = ds.with_format("arrow")
        self.schema = ds.data.schema
        self.features: dict[str, Any] = ds.features.to_dict()
        self.num_rows: int | None = len(ds)
        self.row_bytes = ds.data.nbytes / max(1, ds.data.num_rows)

    def batches(self, columns: list[str], rows: int) -> Iterator[Any]:
        n = self.num_rows or 0
        for a in range(0, n, rows):
            table = self.ds[a : a + rows]
            yield from table.select(columns).to_batches()


def _walk_type(t: Any) -> tuple[Any, list[int | None]]:
    """(leaf type, list sizes outermost first; None for a variable-length level)."""
    import pyarrow as pa

    sizes: list[int | None] = []
    while True:
        if isinstance(t, pa.ExtensionType):
            t = t.storage_type
        elif pa.types.is_fixed_size_list(t):
            sizes.append(t.list_size)
            t = t.value_type
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            sizes.append(None)
            t = t.value_type
        else:
            return t, sizes


def _leaf_ok(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t))


class _Layout:
    """One block of a column: flat leaf values, per-row bounds and shapes."""

    __slots__ = ("bounds", "dims", "rows", "values")

    def __init__(self, values: np.ndarray, bounds: np.ndarray, dims: np.ndarray) -> None:
        self.values = values
        self.bounds = bounds
        self.dims = dims
        self.rows = dims.shape[0]

    def dense(self, item_shape: tuple[int, ...]) -> np.ndarray:
        return self.values.reshape((self.rows, *item_shape))

    def record(self, i: int) -> np.ndarray:
        """Row ``i`` as an array of its own shape (a view)."""
        b = self.bounds
        return self.values[b[i] : b[i + 1]].reshape(tuple(int(d) for d in self.dims[i]))

    def ragged(self) -> list[np.ndarray]:
        v, b = self.values, self.bounds.tolist()
        shapes = [tuple(d) for d in self.dims.tolist()]
        return [v[b[i] : b[i + 1]].reshape(shapes[i]) for i in range(self.rows)]


def _null_error(column: str, row0: int, arr: Any, bounds: np.ndarray) -> ConvertError:
    # bounds: each row's range of elements of ``arr`` (one level of the column).
    first = int(np.flatnonzero(~np.asarray(arr.is_valid().to_numpy(zero_copy_only=False)))[0])
    row = int(np.searchsorted(bounds, first, side="right")) - 1
    return UnsupportedColumnError(
        f"unsupported column type: column {column!r} has a null value in row {row0 + row}; "
        "stores hold no nulls (fill or drop them first)"
    )


def _layout(arr: Any, column: str, row0: int, dtype: np.dtype) -> _Layout:
    """Flattens a block of a numeric (nested) list column, checking it has no
    nulls and that every row is rectangular."""
    import pyarrow as pa

    n = len(arr)
    bounds = np.arange(n + 1, dtype=np.int64)
    dims: list[np.ndarray] = []
    cur = arr
    while True:
        if isinstance(cur, pa.ExtensionArray):
            cur = cur.storage
        if cur.null_count:
            raise _null_error(column, row0, cur, bounds)
        t = cur.type
        if pa.types.is_fixed_size_list(t):
            size = t.list_size
            child = cur.flatten()
            child_off = np.arange(len(cur) + 1, dtype=np.int64) * size
            dims.append(np.full(n, size, dtype=np.int64))
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            off = cur.offsets.to_numpy().astype(np.int64)
            off -= off[0]
            child = cur.flatten()
            lens = np.diff(off)
            dim = np.zeros(n, dtype=np.int64)
            starts = bounds[:-1]
            nonempty = bounds[1:] > starts
            if nonempty.any():
                s = starts[nonempty]
                lo = np.minimum.reduceat(lens, s)
                hi = np.maximum.reduceat(lens, s)
                if (lo != hi).any():
                    bad = int(np.flatnonzero(nonempty)[int(np.flatnonzero(lo != hi)[0])])
                    raise UnsupportedColumnError(
                        f"unsupported column type: column {column!r} row {row0 + bad} is a nested "
                        "list whose inner lists differ in length, so it is not an array"
                    )
                dim[nonempty] = lo
            dims.append(dim)
            child_off = off
        else:
            break
        bounds = child_off[bounds]
        cur = child
    values = cur.to_numpy(zero_copy_only=False)
    if values.dtype != dtype:
        values = values.astype(dtype)
    shape = np.stack(dims, axis=1) if dims else np.zeros((n, 0), dtype=np.int64)
    return _Layout(values, bounds, shape)


#: What a record of a byte column holds, by the column's Hugging Face
#: feature (struct<bytes, path> storage).
_MEDIA = {
    "Image": "encoded image",
    "Audio": "encoded audio",
    "Video": "encoded video",
    "Pdf": "encoded document",
}


def _storage(t: Any) -> Any:
    import pyarrow as pa

    while isinstance(t, pa.ExtensionType):
        t = t.storage_type
    return t


def _is_bytes_type(t: Any) -> bool:
    import pyarrow as pa

    types = pa.types
    return bool(
        types.is_binary(t)
        or types.is_large_binary(t)
        or types.is_fixed_size_binary(t)
        or types.is_binary_view(t)
        or _is_text_type(t)
    )


def _is_text_type(t: Any) -> bool:
    import pyarrow as pa

    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _media_fields(t: Any) -> tuple[int, int | None] | None:
    """For a struct holding a file's bytes (Hugging Face's ``Image()``,
    ``Audio()``...: ``struct<bytes: binary, path: string>``), the positions
    of its ``bytes`` and ``path`` fields; None for any other type."""
    import pyarrow as pa

    if not pa.types.is_struct(t):
        return None
    names = [t.field(i).name for i in range(t.num_fields)]
    if "bytes" not in names or not set(names) <= {"bytes", "path"}:
        return None
    b = names.index("bytes")
    if not _is_bytes_type(t.field(b).type) or _is_text_type(t.field(b).type):
        return None
    return b, names.index("path") if "path" in names else None


class _ColumnPlan:
    def __init__(self, name: str, arrow_type: Any, feature: Any, codec: str) -> None:
        self.name = name
        self.what = f"column {name!r}"
        self.arrow_type = arrow_type
        self.feature = feature
        self.codec = codec
        self.choice: _codec.CodecChoice | None = None
        self.dict_bytes: bytes | None = None
        self.decode: str | None = None  # the Pillow mode byte records are decoded to
        storage = _storage(arrow_type)
        self.media = _media_fields(storage)
        self.bytes_like = self.media is not None or _is_bytes_type(storage)
        # scan results
        self.first_shape: tuple[int, ...] | None = None
        self.uniform = True
        self.first_empty: int | None = None
        self.rows = 0
        self.value_bytes = 0
        if self.bytes_like:
            # Each row's bytes (UTF-8 for text), untouched: one Ragged uint8 record.
            self.dtype = np.dtype(np.uint8)
            self.variable = False
            self.kind: str | None = "ragged"
            self.item_shape: tuple[int, ...] | None = None
            if self.media is not None:
                kind = feature.get("_type") if isinstance(feature, dict) else None
                self.content = _MEDIA.get(str(kind), "bytes")
            else:
                self.content = "text" if _is_text_type(storage) else "bytes"
            return
        leaf, sizes = _walk_type(arrow_type)
        if not _leaf_ok(leaf) or (sizes and not _list_values_ok(arrow_type)):
            raise UnsupportedColumnError(
                f"unsupported column type: column {name!r} has type {arrow_type}; only numbers "
                "(integers, floats, bools), fixed- or variable-length lists of them, and "
                "binary, string or encoded-media (Image(), Audio()) columns convert "
                "(leave it out with columns=/--columns)"
            )
        self.content = "values"
        self.dtype = _store_dtype(leaf.to_pandas_dtype(), f"column {name!r}")
        self.variable = any(s is None for s in sizes)
        # Known now for fixed shapes; decided by a scan for variable lists.
        self.kind = None if self.variable else "dense"
        self.item_shape = None if self.variable else tuple(sizes)  # type: ignore[arg-type]

    def scan(self, lay: _Layout) -> None:
        if lay.rows:
            if self.first_shape is None:
                self.first_shape = tuple(int(d) for d in lay.dims[0])
            if self.uniform and not (lay.dims == np.asarray(self.first_shape, dtype=np.int64)).all():
                self.uniform = False
            empty = np.flatnonzero(np.diff(lay.bounds) == 0)
            if empty.size and self.first_empty is None:
                self.first_empty = self.rows + int(empty[0])
        self.rows += lay.rows
        self.value_bytes += lay.values.nbytes

    def decide(self) -> None:
        if self.kind is not None:
            return
        if self.uniform and self.first_shape is not None:
            self.kind, self.item_shape = "dense", self.first_shape
            return
        self.kind = "ragged"
        if self.first_empty is not None:
            raise UnsupportedColumnError(
                f"unsupported column type: column {self.name!r} row {self.first_empty} is empty; "
                "a Ragged store cannot hold zero-byte records"
            )

    def records(self, arr: Any, row0: int) -> tuple[int, Any]:
        """A block of this column as ``(rows, records)``: for a byte column
        a list of uint8 arrays (not decoded), else its :class:`_Layout`."""
        if self.bytes_like:
            recs = _bytes_records(arr, self, row0)
            return len(recs), recs
        lay = _layout(arr, self.name, row0, self.dtype)
        return lay.rows, lay

    def sidecar(self) -> dict[str, Any]:
        """The sidecar fields of this column's store."""
        fields: dict[str, Any] = {
            "column": self.name,
            "source_type": str(self.arrow_type),
            "feature": self.feature,
            "names": _sidecar.class_names(self.feature),
            "content": "decoded image" if self.decode else self.content,
        }
        if self.decode:
            fields["image_mode"] = self.decode
        return fields


def _list_values_ok(t: Any) -> bool:
    # Lists must nest lists or numbers only (no structs inside, for instance).
    leaf, _ = _walk_type(t)
    return _leaf_ok(leaf)


def _column(batch: Any, name: str) -> Any:
    return batch.column(batch.schema.get_field_index(name))


def _bytes_records(arr: Any, plan: _ColumnPlan, row0: int) -> list[np.ndarray]:
    """The rows of a block of a byte column, each its bytes as a uint8 array
    viewing the block's buffer (text: its UTF-8 bytes; an encoded-media
    struct: its ``bytes`` field, or the file its ``path`` names when the
    bytes are not embedded)."""
    import pyarrow as pa

    while isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    n = len(arr)
    rows = np.arange(n + 1, dtype=np.int64)
    if arr.null_count:
        raise _null_error(plan.name, row0, arr, rows)
    paths = None
    if plan.media is not None:
        children = arr.flatten()  # the struct's fields, its offset applied
        data = children[plan.media[0]]
        if plan.media[1] is not None:
            paths = children[plan.media[1]]
    else:
        data = arr
    if not pa.types.is_large_binary(data.type):
        data = data.cast(pa.large_binary())  # one layout: int64 offsets and one value buffer
    missing = None
    if data.null_count:
        missing = np.flatnonzero(~np.asarray(data.is_valid().to_numpy(zero_copy_only=False)))
        if paths is None:
            raise _null_error(plan.name, row0, data, rows)
    buffers = data.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=n + 1, offset=8 * data.offset)
    values = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    bounds = offsets.tolist()
    recs = [values[bounds[i] : bounds[i + 1]] for i in range(n)]
    if missing is not None:
        assert paths is not None
        for i in missing.tolist():
            recs[i] = _read_media_path(paths[i].as_py(), plan.name, row0 + i)
    for i, r in enumerate(recs):
        if r.size == 0:
            raise _empty_record_error(f"column {plan.name!r}", row0 + i)
    return recs


def _read_media_path(path: str | None, column: str, row: int) -> np.ndarray:
    # Hugging Face keeps an image or audio file given by path as that path
    # until save_to_disk embeds it: the bytes are the file's.
    if not path:
        raise UnsupportedColumnError(
            f"unsupported column type: column {column!r} row {row} has neither bytes nor a path"
        )
    try:
        with open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8)
    except OSError as e:
        raise ConvertError(
            f"column {column!r} row {row} holds no bytes, only the path {path!r}, which cannot be read: {e}"
        ) from None


def _decoded(plan: _ColumnPlan, recs: list[np.ndarray], row0: int) -> list[np.ndarray]:
    if plan.decode is None:
        return recs
    from loaderx.tools.images import decode_column

    return decode_column(recs, plan.decode, plan.what, row0, _decode_workers())


def _decoded_sample(plan: _ColumnPlan, sample: _codec.SpreadSample) -> list[np.ndarray]:
    if plan.decode is None:
        return sample.records
    from loaderx.tools.images import decode_column

    # One at a time, so a record that does not decode is reported at its row.
    return [decode_column([r], plan.decode, plan.what, i, 1)[0] for i, r in sample.indexed]


def _decode_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def _plan_decoding(plans: dict[str, _ColumnPlan], what: str) -> None:
    """Marks the columns the conversion's ``decode_images`` selects."""
    spec = _decode_spec()
    if spec is None:
        return
    if spec.names is not None:
        for name in sorted(spec.names):
            if name not in plans:
                raise ConvertError(f"decode_images names {name!r}, which is not a converted column of {what}")
            if not plans[name].bytes_like or plans[name].content == "text":
                raise ConvertError(
                    f"decode_images names column {name!r}, which holds {plans[name].content}, "
                    "not encoded images"
                )
    for name, plan in plans.items():
        if plan.content == "encoded image" if spec.names is None else name in spec.names:
            plan.decode = spec.mode
    if spec.names is None and not any(p.decode for p in plans.values()):
        raise ConvertError(
            f"decode_images: {what} has no Hugging Face Image() column among those converted; "
            "name the columns of encoded images to decode"
        )


def _convert_tabular(
    source: Any,
    dst: pathlib.Path,
    codec: str,
    tier: str,
    key: str | None,
    columns: list[str] | None,
    chunk_records: int | None,
    progress: ProgressArg,
    what: str,
) -> dict[str, pathlib.Path]:
    names_all = list(source.schema.names)
    if len(set(names_all)) != len(names_all):
        raise ConvertError(f"{what} has duplicate column names: {names_all}")
    names = _select(names_all, key, columns, f"{what} has no column")
    if not names:
        raise ConvertError(f"{what} has no columns")
    plans = {}
    for name in names:
        if key is None:
            _check_name(name, "column")
        plans[name] = _ColumnPlan(name, source.schema.field(name).type, source.features.get(name), codec)
    _plan_decoding(plans, what)
    targets = _Targets(dst, None if key is not None else names)
    rows = _rows_per_chunk(chunk_records, source.row_bytes)
    _prepass(source, plans, codec, tier, rows, progress)
    return _write_tabular(source, plans, targets, key, rows, progress, what)


def _prepass(
    source: Any, plans: dict[str, _ColumnPlan], codec: str, tier: str, rows: int, progress: ProgressArg
) -> None:
    # Pre-passes, one column at a time (Parquet reads only that column), for
    # the columns that need one: a variable-length list is scanned to choose
    # Dense or Ragged; codec "auto" keeps an evenly spread sample to measure
    # the codecs on, and zstd_dict (asked for, or possibly chosen) a larger
    # one, within the tier's budget, to train the dictionary on.
    budget = DICT_TIERS[tier]["samples"]
    for name, plan in plans.items():
        sample = _codec.SpreadSample() if codec == "auto" else None
        for_dict = (
            _codec.SpreadSample(_codec.DICT_SAMPLE_RECORDS, budget)
            if codec in ("auto", "zstd_dict")
            else None
        )
        if plan.variable or sample is not None or for_dict is not None:
            meter = make_progress(progress, source.num_rows, f"scan {name}")
            try:
                row0 = 0
                for batch in source.batches([name], rows):
                    n, block = plan.records(_column(batch, name), row0)
                    if isinstance(block, _Layout):
                        plan.scan(block)
                        get = block.record
                    else:
                        get = block.__getitem__
                    for s in (sample, for_dict):
                        if s is not None:
                            s.offer(n, get)
                    row0 += n
                    meter.update(batch.num_rows)
            finally:
                meter.close()
            plan.rows = row0
        plan.decide()
        total = source.num_rows if source.num_rows is not None else plan.rows

        def train(plan: _ColumnPlan = plan, for_dict: _codec.SpreadSample | None = for_dict) -> bytes:
            assert for_dict is not None
            if not for_dict.records:
                raise ConvertError(f"{plan.what} has no records to train a zstd dictionary on")
            return _train(_decoded_sample(plan, for_dict), tier, plan.what)

        plan.choice = _codec.given(codec)
        if sample is not None:
            recs = _decoded_sample(plan, sample)
            shape = plan.item_shape if plan.kind == "dense" else None
            plan.choice, plan.dict_bytes = _codec.choose(recs, total, plan.dtype, shape, tier, train)
            plan.codec = plan.choice["chosen"]
        if plan.codec == "zstd_dict" and plan.dict_bytes is None:
            plan.dict_bytes = train()


def _write_tabular(
    source: Any,
    plans: dict[str, _ColumnPlan],
    targets: _Targets,
    key: str | None,
    rows: int,
    progress: ProgressArg,
    what: str,
) -> dict[str, pathlib.Path]:
    names = list(plans)
    out: dict[str, pathlib.Path] = {}
    writers: dict[str, Dense | Ragged] = {}
    meter = make_progress(progress, source.num_rows, f"convert {what}")
    try:
        for name, plan in plans.items():
            target = targets.prepare(targets.paths[None if key is not None else name])
            try:
                if plan.kind == "dense":
                    writers[name] = Dense.create(
                        target,
                        plan.dtype,
                        plan.item_shape or (),
                        codec=plan.codec,
                        dict_bytes=plan.dict_bytes,
                        **_set_layout(plan.codec),
                    )
                else:
                    writers[name] = Ragged.create(
                        target,
                        plan.dtype,
                        codec=plan.codec,
                        dict_bytes=plan.dict_bytes,
                        **_set_layout(plan.codec),
                    )
            except ValueError as e:
                raise UnsupportedColumnError(f"unsupported column type: column {name!r}: {e}") from None
            out[name] = target
        row0 = 0
        for batch in source.batches(names, rows):
            if batch.num_rows == 0:
                continue
            for name, plan in plans.items():
                _, block = plan.records(_column(batch, name), row0)
                writer = writers[name]
                if not isinstance(block, _Layout):
                    assert isinstance(writer, Ragged)  # byte columns are Ragged
                    writer.append(_decoded(plan, block, row0))
                elif isinstance(writer, Dense):  # plan.kind == "dense"
                    shape = plan.item_shape or ()
                    if block.values.size != block.rows * math.prod(shape):
                        raise ConvertError(f"column {name!r} changed shape near row {row0}")
                    writer.append(block.dense(shape))
                else:
                    writer.append(block.ragged())
            row0 += batch.num_rows
            meter.update(batch.num_rows)
        for w in writers.values():
            w.close()
        for name, plan in plans.items():
            assert plan.choice is not None
            plan.choice = _codec.finish(out[name], plan.choice, plan.sidecar(), plan.what)
    except BaseException:
        for w in writers.values():
            with contextlib.suppress(Exception):
                w.close()
        targets.discard()
        raise
    finally:
        meter.close()
    return out


def _is_hf_dir(p: pathlib.Path) -> bool:
    return any((p / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json"))


def _convert_hf(
    ds: Any,
    dst: pathlib.Path,
    codec: str,
    tier: str,
    key: str | None,
    columns: list[str] | None,
    chunk_records: int | None,
    progress: ProgressArg,
    what: str,
) -> dict[str, pathlib.Path]:
    datasets = _import_datasets(f"converting {what}")
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if key is not None:
            if key not in ds:
                raise ConvertError(f"{what} has no split {key!r}; it has: {', '.join(splits)}")
            return _convert_hf(
                ds[key], dst, codec, tier, None, columns, chunk_records, progress, f"{what} split {key!r}"
            )
        for split in splits:
            _check_name(split, "split")
        out = {}
        made = [] if dst.exists() else [dst]
        try:
            for split in splits:
                if not (dst / split).exists():
                    made.append(dst / split)
                got = _convert_hf(
                    ds[split],
                    dst / split,
                    codec,
                    tier,
                    None,
                    columns,
                    chunk_records,
                    progress,
                    f"{what} split {split!r}",
                )
                out.update({f"{split}/{k}": v for k, v in got.items()})
        except BaseException:
            for p in made:
                shutil.rmtree(p, ignore_errors=True)
            raise
        return out
    if not isinstance(ds, datasets.Dataset):
        raise TypeError(
            f"convert takes a datasets.Dataset or DatasetDict, not {type(ds).__name__} "
            "(materialise an IterableDataset first)"
        )
    return _convert_tabular(_DatasetSource(ds), dst, codec, tier, key, columns, chunk_records, progress, what)
