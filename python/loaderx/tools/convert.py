"""The converter: :func:`convert` (the dispatcher over every source),
:func:`upload`, and the NumPy (``.npy``, ``.npz``, arrays) and store sources.
The Arrow sources are in :mod:`loaderx.tools.arrow`."""

from __future__ import annotations

import functools
import math
import os
import pathlib
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from loaderx import _native, _validate
from loaderx._progress import ProgressArg, make_progress
from loaderx.tools._common import (
    _LAYOUT,
    ConvertError,
    PathLike,
    UnsupportedColumnError,
    _check_name,
    _dict_for_rows,
    _parse_columns,
    _rows_per_chunk,
    _select,
    _set_layout,
    _SetLayout,
    _store_dtype,
    _Targets,
    _train,
)
from loaderx.tools.arrow import (
    _convert_hf,
    _convert_tabular,
    _import_datasets,
    _import_pyarrow,
    _IpcSource,
    _is_hf_dir,
    _ParquetSource,
    _TableSource,
)
from loaderx.tools.inspect import _chunks_of, open_store
from loaderx.zrecord import CODECS, DICT_TIERS, Dense, Ragged, StorageOptions, _check_level, _is_url

# ---------------------------------------------------------------------------
# convert: NumPy sources (.npy, .npz, arrays) and stores
# ---------------------------------------------------------------------------


def _write_array_chunks(
    target: pathlib.Path,
    dtype: np.dtype,
    item_shape: tuple[int, ...],
    total: int,
    chunks: Callable[[], Iterator[np.ndarray]],
    codec: str,
    tier: str,
    what: str,
    progress: ProgressArg,
    dict_source: Any = None,
) -> None:
    """Writes ``total`` fixed-shape records, produced in blocks by ``chunks()``,
    to a new Dense store. For zstd_dict the dictionary trains first, on
    ``dict_source`` (an array train_dict samples itself) or a pass over ``chunks()``."""
    width = math.prod(item_shape) * dtype.itemsize
    blob = None
    if codec == "zstd_dict":
        if total == 0:
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        if dict_source is not None:
            blob = _train(dict_source, tier, what)
        else:
            blob = _dict_for_rows(chunks(), total, width, tier, what)
    try:
        writer = Dense.create(target, dtype, item_shape, codec=codec, dict_bytes=blob, **_set_layout())
    except ValueError as e:
        raise UnsupportedColumnError(f"unsupported column type: {what}: {e}") from None
    meter = make_progress(progress, total, f"convert {what}")
    try:
        with writer:
            for block in chunks():
                if len(block):
                    writer.append(block)
                    meter.update(len(block))
    finally:
        meter.close()


def _array_chunks(arr: np.ndarray, rows: int) -> Callable[[], Iterator[np.ndarray]]:
    def gen() -> Iterator[np.ndarray]:
        if arr.ndim == 0:
            yield np.asarray(arr).reshape(1)
            return
        for a in range(0, arr.shape[0], rows):
            yield arr[a : a + rows]

    return gen


def _convert_ndarray(
    arr: np.ndarray,
    target: pathlib.Path,
    codec: str,
    tier: str,
    chunk_records: int | None,
    what: str,
    progress: ProgressArg,
) -> None:
    dtype = _store_dtype(arr.dtype, what)
    item_shape = tuple(arr.shape[1:])
    total = 1 if arr.ndim == 0 else arr.shape[0]
    rows = _rows_per_chunk(chunk_records, math.prod(item_shape) * dtype.itemsize)
    dict_source = (arr.reshape(1) if arr.ndim == 0 else arr) if codec == "zstd_dict" else None
    _write_array_chunks(
        target, dtype, item_shape, total, _array_chunks(arr, rows), codec, tier, what, progress, dict_source
    )


def _load_npy(p: pathlib.Path) -> np.ndarray:
    with open(p, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ConvertError(f"{p} is not a .npy file (no NumPy header)")
    try:
        arr: np.ndarray = np.load(p, mmap_mode="r", allow_pickle=False)
        return arr
    except ValueError as e:
        if "object" in str(e).lower():
            raise UnsupportedColumnError(
                f"unsupported column type: {p} holds Python objects (dtype object)"
            ) from None
        raise ConvertError(f"{p} is not a readable .npy file: {e}") from None


class _NpzMember:
    """One array of an .npz archive, read in row blocks without loading it whole."""

    def __init__(self, archive: pathlib.Path, zf: zipfile.ZipFile, entry: str) -> None:
        self.archive = archive
        self.zf = zf
        self.entry = entry
        self.key = entry[:-4]
        with zf.open(entry) as f:
            self.shape, self.fortran, self.dtype = self._header(f)

    @staticmethod
    def _header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
        fmt = np.lib.format
        version = fmt.read_magic(f)
        reader = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
        shape, fortran, dtype = reader(f)
        return tuple(shape), bool(fortran), np.dtype(dtype)

    def chunks(self, rows: int) -> Iterator[np.ndarray]:
        if self.fortran or len(self.shape) == 0:
            # Column-major data cannot be read by rows: load this one array.
            with np.load(self.archive, allow_pickle=False) as npz:
                arr = npz[self.key]
            yield from _array_chunks(arr, rows)()
            return
        item = self.shape[1:]
        row_bytes = math.prod(item) * self.dtype.itemsize
        left = self.shape[0]
        with self.zf.open(self.entry) as f:
            self._header(f)
            while left > 0:
                k = min(rows, left)
                want = k * row_bytes
                buf = bytearray()
                while len(buf) < want:
                    part = f.read(want - len(buf))
                    if not part:
                        raise ConvertError(f"{self.archive}: array {self.key!r} is truncated")
                    buf += part
                yield np.frombuffer(bytes(buf), dtype=self.dtype).reshape((k, *item))
                left -= k


def _convert_npz(
    p: pathlib.Path,
    dst: pathlib.Path,
    codec: str,
    tier: str,
    key: str | None,
    columns: list[str] | None,
    chunk_records: int | None,
    progress: ProgressArg,
) -> dict[str, pathlib.Path]:
    try:
        zf = zipfile.ZipFile(p)
    except (zipfile.BadZipFile, OSError) as e:
        raise ConvertError(f"{p} is not a readable .npz file: {e}") from None
    with zf:
        members = {m[:-4]: m for m in zf.namelist() if m.endswith(".npy")}
        if not members:
            raise ConvertError(f"{p} holds no arrays")
        names = _select(list(members), key, columns, f"{p} has no array")
        arrays = {}
        for name in names:
            m = _NpzMember(p, zf, members[name])
            if m.dtype.hasobject:
                raise UnsupportedColumnError(
                    f"unsupported column type: array {name!r} of {p} holds Python objects (dtype object)"
                )
            _store_dtype(m.dtype, f"array {name!r}")
            if key is None:
                _check_name(name, "array")
            arrays[name] = m
        targets = _Targets(dst, None if key is not None else names)
        out = {}
        try:
            for name, m in arrays.items():
                target = targets.prepare(targets.paths[None if key is not None else name])
                item = m.shape[1:]
                total = 1 if len(m.shape) == 0 else m.shape[0]
                rows = _rows_per_chunk(chunk_records, math.prod(item) * m.dtype.itemsize)
                dtype = _store_dtype(m.dtype, f"array {name!r}")
                _write_array_chunks(
                    target,
                    dtype,
                    tuple(item),
                    total,
                    functools.partial(m.chunks, rows),
                    codec,
                    tier,
                    f"array {name!r}",
                    progress,
                )
                out[name] = target
        except BaseException:
            targets.discard()
            raise
        return out


def _convert_store(
    src: Dense | Ragged,
    target: pathlib.Path,
    codec: str,
    tier: str,
    chunk_records: int | None,
    what: str,
    progress: ProgressArg,
) -> None:
    n = len(src)
    blob = None
    if codec == "zstd_dict":
        if n == 0:
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        blob = _train(src, tier, what)
    if isinstance(src, Dense):
        writer: Dense | Ragged = Dense.create(
            target, src.dtype, src.item_shape, codec=codec, dict_bytes=blob, **_set_layout()
        )
    else:
        writer = Ragged.create(target, src.dtype, codec=codec, dict_bytes=blob, **_set_layout())
    meter = make_progress(progress, n, f"convert {what}")
    try:
        with writer:
            if chunk_records is not None:
                ranges: Iterable[tuple[int, int]] = (
                    (a, min(n, a + chunk_records)) for a in range(0, n, chunk_records)
                )
            else:
                ranges = _chunks_of(src, 0, n)
            for a, b in ranges:
                writer.append(src[a:b])
                meter.update(b - a)
    finally:
        meter.close()


def _module_root(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


def convert(
    src: Any,
    dst: PathLike,
    codec: str = "zstd",
    tier: str = "balanced",
    key: str | None = None,
    columns: str | Sequence[str] | None = None,
    chunk_records: int | None = None,
    progress: ProgressArg = None,
    *,
    shard_records: int | None = None,
    shard_bytes: int | None = None,
    storage_options: StorageOptions | None = None,
    level: int | None = None,
) -> dict[str, Any]:
    """Builds stores from ``src`` and returns ``{name: store path}``.

    ``src`` is a path or an object:

    * ``.npy``: one Dense store at ``dst`` (memory-mapped, written in chunks,
      so files larger than memory convert).
    * ``.npz``: one Dense store per array at ``dst/<array name>``; ``key``
      picks one array and writes it to ``dst`` itself.
    * ``.parquet``, ``.arrow``/``.feather``/``.ipc`` (Arrow IPC), a directory
      saved by ``datasets`` ``save_to_disk``, a ``datasets.Dataset``, or a
      ``pyarrow.Table``: one store per column at ``dst/<column>``, all with
      the same number of records (``key`` writes one column to ``dst``). A
      ``DatasetDict`` gives ``dst/<split>/<column>`` (``key`` picks a split).
      Numeric scalar columns and lists whose rows all have one shape become
      Dense stores; variable-length (nested) lists become Ragged stores, each
      record an array of its row's exact shape. Strings, binaries, structs,
      nulls and other types raise :class:`UnsupportedColumnError` naming the
      column, unless ``columns`` leaves them out.
    * a NumPy array: one Dense store at ``dst``.
    * a store directory (or an opened store): a copy at ``dst`` re-encoded
      with ``codec``.

    ``codec`` is ``"raw"``, ``"zstd"`` or ``"zstd_dict"``; for ``zstd_dict``
    each store trains its own dictionary (``tier``, see ``DICT_TIERS``) on an
    evenly spread sample of its data first. ``columns`` (a list or a
    comma-separated string) selects columns or arrays. ``chunk_records`` bounds
    the records written per append (default: about 32 MiB of data).
    ``progress``: True draws a progress line on stderr when it is a terminal;
    a callable is called as ``progress(done, total)``. ``shard_records`` /
    ``shard_bytes`` make every output a store set of shards of that many
    records / payload bytes (see :meth:`loaderx.zrecord.Dense.create`); a
    store set is accepted as ``src`` like a store. ``level`` is the zstd
    level of every store's frames (default: the codec's, 3 for ``zstd``
    and 19 for ``zstd_dict``; see :meth:`loaderx.zrecord.Dense.create`).
    ``dst`` may be an
    object-storage URL (``storage_options`` configures access): the stores are
    built in a local staging folder (``$LOADERX_STAGING_DIR``, else the
    temporary directory) and uploaded when all of them are complete; the
    values returned are then URLs.

    Record order and values are kept exactly. Parquet/Arrow/datasets need the
    optional extra: ``pip install 'loaderx[convert]'`` (else
    :class:`MissingExtraError`). On failure, the directories this call
    created are removed.
    """
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}: expected one of {', '.join(CODECS)}")
    if tier not in DICT_TIERS:
        raise ValueError(f"unknown dictionary tier {tier!r}: expected one of {', '.join(DICT_TIERS)}")
    if chunk_records is not None:
        chunk_records = _validate.bounded("chunk_records", chunk_records, 1)
    cols = _parse_columns(columns)
    args = (codec, tier)
    layout: _SetLayout = {}
    zstd_level = _check_level(codec, level)
    if zstd_level is not None:
        layout["level"] = zstd_level
    if shard_records is not None:
        layout["shard_records"] = shard_records
    if shard_bytes is not None:
        layout["shard_bytes"] = shard_bytes
    token = _LAYOUT.set(layout)
    try:
        target = os.fspath(dst)
        if not _is_url(target):
            return _convert(src, pathlib.Path(target), args, key, cols, chunk_records, progress)
        # Object storage: build everything in a local staging folder, then
        # publish each store in commit order (a failed build uploads nothing).
        staging_root = os.environ.get("LOADERX_STAGING_DIR") or None
        with tempfile.TemporaryDirectory(prefix="loaderx-convert-", dir=staging_root) as tmp:
            local = pathlib.Path(tmp) / "out"
            built = _convert(src, local, args, key, cols, chunk_records, progress)
            published: dict[str, Any] = {}
            for name, path in built.items():
                rel = pathlib.Path(path).relative_to(local).as_posix()
                url = target.rstrip("/") + ("" if rel == "." else f"/{rel}")
                upload(path, url, storage_options)
                published[name] = url
            return published
    finally:
        _LAYOUT.reset(token)


def upload(src: PathLike, url: str, storage_options: StorageOptions | None = None) -> None:
    """Copies the local store or store set ``src`` to the empty object-storage
    prefix ``url``, in commit order (each store's ``meta.zr`` last, a set's
    manifest after all its shards), after checking that ``src`` opens."""
    _native.upload(os.fspath(src), url, dict(storage_options) if storage_options else None)


def _convert(
    src: Any,
    dst: pathlib.Path,
    args: tuple[str, str],
    key: str | None,
    cols: list[str] | None,
    chunk_records: int | None,
    progress: ProgressArg,
) -> dict[str, pathlib.Path]:
    if isinstance(src, (Dense, Ragged)):
        if src.writable or src.closed:
            raise ValueError("convert reads an opened store; close the writer and open it first")
        targets = _Targets(dst, None)
        try:
            _convert_store(src, targets.prepare(dst), *args, chunk_records, str(src.path), progress)
        except BaseException:
            targets.discard()
            raise
        return {pathlib.PurePosixPath(str(src.path)).name: dst}
    if isinstance(src, np.ndarray):
        targets = _Targets(dst, None)
        try:
            _convert_ndarray(src, targets.prepare(dst), *args, chunk_records, "array", progress)
        except BaseException:
            targets.discard()
            raise
        return {dst.name: dst}
    root = _module_root(src)
    if root == "datasets":
        return _convert_hf(src, dst, *args, key, cols, chunk_records, progress, "the dataset")
    if root == "pyarrow":
        pa = _import_pyarrow("converting a pyarrow object")
        if isinstance(src, pa.RecordBatch):
            src = pa.Table.from_batches([src])
        if not isinstance(src, pa.Table):
            raise TypeError(f"convert takes a pyarrow Table or RecordBatch, not {type(src).__name__}")
        return _convert_tabular(
            _TableSource(src), dst, *args, key, cols, chunk_records, progress, "the table"
        )
    if not isinstance(src, (str, os.PathLike)):
        raise TypeError(
            "convert takes a path, a NumPy array, a datasets.Dataset, a pyarrow Table or an "
            f"opened store, not {type(src).__name__}"
        )

    p = pathlib.Path(src)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file or directory")
    if p.is_dir():
        if (p / "meta.zr").is_file() or (p / "manifest.json").is_file():
            with open_store(p) as store:
                return _convert(store, dst, args, None, None, chunk_records, progress)
        if _is_hf_dir(p):
            datasets = _import_datasets(f"reading {p} (a Hugging Face dataset)")
            try:
                ds = datasets.load_from_disk(str(p))
            except (FileNotFoundError, ValueError) as e:
                raise ConvertError(f"{p} is not a readable Hugging Face dataset: {e}") from None
            return _convert_hf(ds, dst, *args, key, cols, chunk_records, progress, str(p))
        raise ConvertError(
            f"{p} is a directory but neither a store nor a Hugging Face dataset saved with "
            "save_to_disk (no dataset_info.json / state.json)"
        )
    suffix = p.suffix.lower()
    if suffix == ".npy":
        if key is not None:
            raise ValueError("key selects an array of an .npz file or a column; a .npy file holds one array")
        arr = _load_npy(p)
        targets = _Targets(dst, None)
        try:
            _convert_ndarray(arr, targets.prepare(dst), *args, chunk_records, p.name, progress)
        except BaseException:
            targets.discard()
            raise
        finally:
            del arr
        return {p.stem: dst}
    if suffix == ".npz":
        return _convert_npz(p, dst, *args, key, cols, chunk_records, progress)
    if suffix in (".parquet", ".pq"):
        return _convert_tabular(_ParquetSource(p), dst, *args, key, cols, chunk_records, progress, str(p))
    if suffix in (".arrow", ".feather", ".ipc"):
        return _convert_tabular(_IpcSource(p), dst, *args, key, cols, chunk_records, progress, str(p))
    raise ConvertError(
        f"cannot convert {p.name}: expected a .npy, .npz, .parquet, .arrow or .feather file, a "
        "directory saved by datasets' save_to_disk, or a store"
    )
