"""Tools for working with Zrecord stores: inspect, check, convert, demo.

The ``loaderx`` command line (``python -m loaderx``) is a thin layer over
these functions:

* :func:`info` describes a store: kind, dtype, shape, codec, record count,
  logical and on-disk size, compression ratio, dictionary size.
* :func:`verify` decodes every record of a store and reports the first bad one.
* :func:`convert` builds stores from ``.npy``/``.npz`` files, Parquet and Arrow
  IPC files, Hugging Face ``datasets`` (saved with ``save_to_disk`` or passed
  as objects), pyarrow Tables, NumPy arrays, or another store (to re-encode it
  with a different codec). Parquet, Arrow and ``datasets`` need the optional
  extra ``pip install 'loaderx[convert]'``.
* :func:`demo` builds three stores from generated data and streams them
  through a :class:`~loaderx.dataloader.DataLoader`, checking every batch.

Example::

    from loaderx import tools

    stores = tools.convert("train.parquet", "train", codec="zstd")
    # {'image': PosixPath('train/image'), 'label': PosixPath('train/label')}
    print(tools.info(stores["image"]))
    assert tools.verify(stores["image"]).ok
"""

from __future__ import annotations

import contextvars
import dataclasses
import math
import os
import pathlib
import shutil
import sys
import tempfile
import time
import zipfile
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO, Union

import numpy as np

from loaderx import _native
from loaderx._progress import Progress, ProgressArg, make_progress
from loaderx.utils import train_dict
from loaderx.zrecord import (
    CODECS,
    DICT_TIERS,
    Dense,
    Ragged,
    StorageOptions,
    ZrecordError,
    _check_dtype,
    _is_url,
    _open_any,
)

__all__ = [
    "info",
    "verify",
    "VerifyResult",
    "convert",
    "demo",
    "open_store",
    "Progress",
    "NotAStoreError",
    "ConvertError",
    "UnsupportedColumnError",
    "MissingExtraError",
]

PathLike = Union[str, "os.PathLike[str]"]

#: Install hint for the optional dependencies of :func:`convert`.
EXTRA_HINT = "pip install 'loaderx[convert]'"

_MiB = 1 << 20
_CHUNK_BYTES = 32 * _MiB  # a conversion or verification chunk holds about this much data
_MAX_CHUNK_RECORDS = 65536


#: Keyword arguments every store a conversion creates gets (the set layout):
#: a context variable, so each converter builds its stores alike without the
#: layout threaded through every helper's signature.
_LAYOUT: contextvars.ContextVar[dict[str, int]] = contextvars.ContextVar("_LAYOUT", default={})


class NotAStoreError(ValueError):
    """A path exists but is not a Zrecord store directory."""


class ConvertError(ValueError):
    """The conversion source cannot be turned into stores as asked."""


class UnsupportedColumnError(ConvertError):
    """A selected column (or array) has a type no store can hold."""


class MissingExtraError(ImportError):
    """An optional dependency (the ``convert`` extra) is not installed."""


# ---------------------------------------------------------------------------
# stores: open, size, info
# ---------------------------------------------------------------------------


def _store_dirs_below(p: pathlib.Path) -> list[str]:
    try:
        return sorted(c.name for c in p.iterdir() if (c / "meta.zr").is_file())
    except OSError:
        return []


def open_store(
    path: PathLike, storage_options: StorageOptions | None = None, verify_checksums: bool = False
) -> Dense | Ragged:
    """Opens the store or store set at ``path`` (a local path or an
    object-storage URL) read-only as whichever of Dense or Ragged it is.

    Raises FileNotFoundError for a missing path, :class:`NotAStoreError` for a
    file or a directory that is not a store, and ZrecordError for a damaged one.
    """
    text = os.fspath(path)
    if not _is_url(text):
        p = pathlib.Path(text[len("file://"):] if text.startswith("file://") else text)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if not p.is_dir():
            raise NotAStoreError(f"{p} is a file, not a store directory")
        if not (p / "meta.zr").is_file() and not (p / "manifest.json").is_file():
            inner = _store_dirs_below(p)
            hint = ""
            if inner:
                shown = ", ".join(inner[:5]) + (", ..." if len(inner) > 5 else "")
                hint = (f"; it holds stores ({shown}) but no manifest.json: pass those paths "
                        "instead, or it is a store set whose writer never closed")
            raise NotAStoreError(f"{p} is not a Zrecord store (it has no meta.zr){hint}")
    try:
        return _open_any(text, storage_options=storage_options, verify_checksums=verify_checksums)
    except ZrecordError:
        raise
    except ValueError as e:  # the engine's schema errors: neither kind
        raise NotAStoreError(str(e)) from None


def _kind(store: Dense | Ragged) -> str:
    return "Dense" if isinstance(store, Dense) else "Ragged"


def _logic_lengths(store: Dense | Ragged, start: int, stop: int) -> np.ndarray:
    """The stored (uncompressed) sizes of records ``start..stop``, from the record table."""
    return store._reader.logical_sizes(start, stop)


def _logical_bytes(store: Dense | Ragged) -> int:
    n = len(store)
    if isinstance(store, Dense):
        return n * math.prod(store.item_shape) * store.dtype.itemsize
    total = 0
    step = 1 << 20
    for start in range(0, n, step):
        total += int(_logic_lengths(store, start, min(n, start + step)).sum())
    return total


def _describe(store: Dense | Ragged) -> dict[str, Any]:
    logical = _logical_bytes(store)
    disk = store._reader.disk_bytes
    blob = store.dict_bytes() if store.has_dict() else None
    return {
        "path": str(store.path),
        "kind": _kind(store),
        "shards": len(store.shards),
        "dtype": str(store.dtype),
        "item_shape": list(store.item_shape) if isinstance(store, Dense) else None,
        "codec": store.codec,
        "layout": store.layout,
        "layout_releases": store.layout_releases,
        "records": len(store),
        "logical_bytes": logical,
        "disk_bytes": disk,
        "ratio": (logical / disk) if disk else None,
        "dict_bytes": len(blob) if blob else 0,
    }


def info(path: PathLike, storage_options: StorageOptions | None = None) -> dict[str, Any]:
    """Describes the store or store set at ``path`` (local, or an object-storage URL).

    Returns a JSON-ready dict: ``path``, ``kind`` (``"Dense"``/``"Ragged"``),
    ``shards`` (the shard count of a store set, 0 for a plain store),
    ``dtype``, ``item_shape`` (a list; None for Ragged), ``codec``,
    ``records``, ``logical_bytes`` (the records' uncompressed sizes as
    stored; a Ragged record counts its shape prefix too), ``disk_bytes``
    (every file of every shard: meta.zr, data.zr, dict.zr, sums.zr), ``ratio`` (logical / on
    disk) and ``dict_bytes`` (dictionary size, 0 without one).
    """
    with open_store(path, storage_options) as store:
        return _describe(store)


# ---------------------------------------------------------------------------
# verify
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class VerifyResult:
    """The outcome of :func:`verify` for one store."""

    path: str
    ok: bool
    records: int | None  # None when the store could not be opened
    first_bad_index: int | None
    error: str | None
    kind: str | None = None
    #: What was checked beyond structure: "frames" (zstd content checksums),
    #: "sidecar" (a raw store's sums.zr), or None (structure only: the store
    #: has no checksums, e.g. one written by loaderx 2.0.0).
    content: str | None = None

    def __bool__(self) -> bool:
        return self.ok


def _chunks_of(store: Dense | Ragged, start: int, stop: int) -> Iterator[tuple[int, int]]:
    """Splits ``start..stop`` into ranges holding about ``_CHUNK_BYTES`` each."""
    if isinstance(store, Dense):
        width = max(1, math.prod(store.item_shape) * store.dtype.itemsize)
        step = max(1, min(_MAX_CHUNK_RECORDS, _CHUNK_BYTES // width))
        for a in range(start, stop, step):
            yield a, min(stop, a + step)
        return
    for block in range(start, stop, _MAX_CHUNK_RECORDS):
        end = min(stop, block + _MAX_CHUNK_RECORDS)
        ends = np.cumsum(_logic_lengths(store, block, end))
        a = block
        while a < end:
            base = int(ends[a - block - 1]) if a > block else 0
            b = block + int(np.searchsorted(ends, base + _CHUNK_BYTES, side="right"))
            b = min(end, max(b, a + 1))
            yield a, b
            a = b


def _first_bad(store: Dense | Ragged, a: int, b: int) -> tuple[int, str] | None:
    """Bisects ``a..b`` (which failed to decode as a whole) for its first bad record."""
    while b - a > 1:
        mid = (a + b) // 2
        try:
            store[a:mid]
        except Exception:
            b = mid
            continue
        a = mid
    try:
        store[a]
    except Exception as e:
        return a, _error_text(e)
    return None


def _error_text(e: BaseException) -> str:
    code = getattr(e, "code", None)
    text = str(e) or type(e).__name__
    return f"{text} (code {code})" if isinstance(code, int) else text


def verify(
    path: PathLike, progress: ProgressArg = None, storage_options: StorageOptions | None = None
) -> VerifyResult:
    """Opens the store or store set at ``path`` and decodes every record, in
    chunks, checking each against its content checksum where the store has
    them (see ``VerifyResult.content``; without them only the structure can be
    checked, and the result says so).

    Decoding checks each record against the schema natively (frame sizes,
    Ragged shape prefixes, dictionary). Returns a :class:`VerifyResult`;
    ``ok`` is False, with an ``error`` message, for a missing path, a
    directory that is not a store, a store that does not open, or a record
    that does not decode (``first_bad_index`` is then its index).
    """
    p = os.fspath(path)
    try:
        store = open_store(p, storage_options, verify_checksums=True)
        content = store.checksums
    except Exception as e:  # every failure to open is a finding, not a crash
        return VerifyResult(str(p), False, None, None, _error_text(e))
    with store:
        n = len(store)
        kind = _kind(store)
        meter = make_progress(progress, n, f"verify {p}")
        try:
            for a, b in _chunks_of(store, 0, n):
                try:
                    store[a:b]
                except Exception as e:
                    found = _first_bad(store, a, b)
                    if found is None:  # a transient failure that did not repeat
                        return VerifyResult(str(p), False, n, a, _error_text(e), kind, content)
                    return VerifyResult(str(p), False, n, found[0], found[1], kind, content)
                meter.update(b - a)
        except Exception as e:  # e.g. the record table cannot be read
            return VerifyResult(str(p), False, n, None, _error_text(e), kind, content)
        finally:
            meter.close()
        return VerifyResult(str(p), True, n, None, None, kind, content)


# ---------------------------------------------------------------------------
# convert: shared helpers
# ---------------------------------------------------------------------------


def _check_name(name: str, what: str) -> str:
    if not isinstance(name, str) or name in ("", ".", "..") or any(c in name for c in "/\\\0"):
        raise ConvertError(
            f"{what} {name!r} cannot name a store directory; select other ones with columns=/--columns"
        )
    return name


def _parse_columns(columns: str | Sequence[str] | None) -> list[str] | None:
    if columns is None:
        return None
    if isinstance(columns, str):
        names = [c.strip() for c in columns.split(",")]
    else:
        names = [str(c) for c in columns]
    names = [c for c in names if c]
    if not names:
        raise ValueError("columns selects nothing")
    if len(set(names)) != len(names):
        raise ValueError(f"columns lists a name twice: {names}")
    return names


def _store_dtype(dtype: Any, what: str) -> np.dtype:
    try:
        dt = np.dtype(dtype)
        if dt.kind not in "biufcmMSUV":
            raise ValueError(f"dtype {dt} is not a fixed-size numeric type")
        return _check_dtype(dt)
    except (TypeError, ValueError) as e:
        raise UnsupportedColumnError(f"unsupported column type: {what} has dtype {dtype} ({e})") from None


class _Targets:
    """Output directories of one conversion; removes what it made when it fails."""

    def __init__(self, dst: pathlib.Path, names: Sequence[str] | None) -> None:
        # names None: one store at dst itself; else one store per name below dst.
        self.made: list[pathlib.Path] = []
        if names is None:
            self.paths = {None: dst}
            self._check_free(dst)
        else:
            if dst.exists() and not dst.is_dir():
                raise FileExistsError(f"{dst} exists and is not a directory")
            if (dst / "meta.zr").exists():
                raise FileExistsError(f"{dst} is a store; give a new directory for the converted stores")
            self.paths = {n: dst / n for n in names}
            for p in self.paths.values():
                self._check_free(p)

    @staticmethod
    def _check_free(p: pathlib.Path) -> None:
        if p.exists() and (not p.is_dir() or any(p.iterdir())):
            raise FileExistsError(f"{p} already exists; stores are built at a new path")

    def prepare(self, p: pathlib.Path) -> pathlib.Path:
        """Creates ``p`` (and missing parents), remembering the topmost new one."""
        top = None
        q = p
        while not q.exists():
            top = q
            if q.parent == q:
                break
            q = q.parent
        if top is not None:
            p.mkdir(parents=True, exist_ok=True)
            self.made.append(top)
        return p

    def discard(self) -> None:
        for p in reversed(self.made):
            shutil.rmtree(p, ignore_errors=True)
        self.made.clear()


def _dict_for_rows(
    chunks: Iterable[np.ndarray], total_rows: int, row_bytes: int, tier: str, what: str
) -> bytes:
    """Trains a dictionary on an evenly spread sample of fixed-size rows,
    read from ``chunks`` (consecutive row blocks) within the tier's budget."""
    budget = DICT_TIERS[tier]["samples"]
    stride = max(1, -(-(total_rows * max(1, row_bytes)) // budget))
    parts = []
    row0 = 0
    for chunk in chunks:
        first = (-row0) % stride
        if first < len(chunk):
            parts.append(np.ascontiguousarray(chunk[first::stride]))
        row0 += len(chunk)
    if not parts:
        raise ConvertError(f"{what}: no records to train a zstd dictionary on")
    sample = np.concatenate(parts)
    return _train(sample, tier, what)


def _train(sample: Any, tier: str, what: str) -> bytes:
    try:
        return train_dict(sample, tier)
    except ZrecordError as e:
        raise ZrecordError(
            f"{what}: training a zstd dictionary failed ({e}); the data may be too small "
            "or too uniform for one: use codec 'zstd' instead",
            e.code,
        ) from e


def _rows_per_chunk(chunk_records: int | None, row_bytes: float) -> int:
    if chunk_records is not None:
        return chunk_records
    return int(max(1, min(_MAX_CHUNK_RECORDS, _CHUNK_BYTES // max(1.0, row_bytes))))


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
        writer = Dense.create(target, dtype, item_shape, codec=codec, dict_bytes=blob, **_LAYOUT.get())
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
    arr: np.ndarray, target: pathlib.Path, codec: str, tier: str, chunk_records: int | None,
    what: str, progress: ProgressArg,
) -> None:
    dtype = _store_dtype(arr.dtype, what)
    item_shape = tuple(arr.shape[1:])
    total = 1 if arr.ndim == 0 else arr.shape[0]
    rows = _rows_per_chunk(chunk_records, math.prod(item_shape) * dtype.itemsize)
    dict_source = (arr.reshape(1) if arr.ndim == 0 else arr) if codec == "zstd_dict" else None
    _write_array_chunks(target, dtype, item_shape, total, _array_chunks(arr, rows), codec, tier,
                        what, progress, dict_source)


def _load_npy(p: pathlib.Path) -> np.ndarray:
    with open(p, "rb") as f:
        if f.read(6) != b"\x93NUMPY":
            raise ConvertError(f"{p} is not a .npy file (no NumPy header)")
    try:
        return np.load(p, mmap_mode="r", allow_pickle=False)
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
                yield np.frombuffer(bytes(buf), dtype=self.dtype).reshape((k,) + item)
                left -= k


def _convert_npz(
    p: pathlib.Path, dst: pathlib.Path, codec: str, tier: str, key: str | None,
    columns: list[str] | None, chunk_records: int | None, progress: ProgressArg,
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
                _write_array_chunks(target, dtype, tuple(item), total, lambda m=m, r=rows: m.chunks(r),
                                    codec, tier, f"array {name!r}", progress)
                out[name] = target
        except BaseException:
            targets.discard()
            raise
        return out


def _convert_store(
    src: Dense | Ragged, target: pathlib.Path, codec: str, tier: str, chunk_records: int | None,
    what: str, progress: ProgressArg,
) -> None:
    n = len(src)
    blob = None
    if codec == "zstd_dict":
        if n == 0:
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        blob = _train(src, tier, what)
    if isinstance(src, Dense):
        writer: Dense | Ragged = Dense.create(
            target, src.dtype, src.item_shape, codec=codec, dict_bytes=blob, **_LAYOUT.get()
        )
    else:
        writer = Ragged.create(target, src.dtype, codec=codec, dict_bytes=blob, **_LAYOUT.get())
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


# ---------------------------------------------------------------------------
# convert: Arrow sources (Parquet, Arrow IPC, Hugging Face datasets, tables)
# ---------------------------------------------------------------------------


def _import_pyarrow(what: str) -> Any:
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
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


class _ParquetSource:
    def __init__(self, path: pathlib.Path) -> None:
        pa = _import_pyarrow(f"reading {path.name}")
        import pyarrow.parquet as pq

        try:
            self.file = pq.ParquetFile(str(path))
        except (pa.ArrowException, OSError) as e:
            raise ConvertError(f"{path} is not a readable Parquet file: {e}") from None
        self.schema = self.file.schema_arrow
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
        self.fmt = None
        for fmt in ("file", "stream"):
            try:
                reader = self._open(fmt)
            except pa.ArrowInvalid:
                continue
            self.fmt = fmt
            break
        if self.fmt is None:
            raise ConvertError(f"{path} is not a readable Arrow IPC / Feather file")
        self.schema = reader.schema
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

    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


class _Layout:
    """One block of a column: flat leaf values, per-row bounds and shapes."""

    __slots__ = ("values", "bounds", "dims", "rows")

    def __init__(self, values: np.ndarray, bounds: np.ndarray, dims: np.ndarray) -> None:
        self.values = values
        self.bounds = bounds
        self.dims = dims
        self.rows = dims.shape[0]

    def dense(self, item_shape: tuple[int, ...]) -> np.ndarray:
        return self.values.reshape((self.rows,) + item_shape)

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


class _ColumnPlan:
    def __init__(self, name: str, arrow_type: Any) -> None:
        self.name = name
        leaf, sizes = _walk_type(arrow_type)
        if not _leaf_ok(leaf) or (sizes and not _list_values_ok(arrow_type)):
            raise UnsupportedColumnError(
                f"unsupported column type: column {name!r} has type {arrow_type}; only numbers "
                "(integers, floats, bools) and fixed- or variable-length lists of them convert "
                "(leave it out with columns=/--columns)"
            )
        self.dtype = _store_dtype(leaf.to_pandas_dtype(), f"column {name!r}")
        self.variable = any(s is None for s in sizes)
        # Known now for fixed shapes; decided by a scan for variable lists.
        self.kind: str | None = None if self.variable else "dense"
        self.item_shape: tuple[int, ...] | None = None if self.variable else tuple(sizes)  # type: ignore[arg-type]
        self.dict_bytes: bytes | None = None
        # scan results
        self.first_shape: tuple[int, ...] | None = None
        self.uniform = True
        self.first_empty: int | None = None
        self.rows = 0
        self.value_bytes = 0

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


def _list_values_ok(t: Any) -> bool:
    # Lists must nest lists or numbers only (no structs inside, for instance).
    leaf, _ = _walk_type(t)
    return _leaf_ok(leaf)


def _column(batch: Any, name: str) -> Any:
    return batch.column(batch.schema.get_field_index(name))


def _select(available: list[str], key: str | None, columns: list[str] | None, missing: str) -> list[str]:
    """The names to convert: ``key`` alone, else ``columns``, else all of
    ``available``; a name not available is an error starting with ``missing``."""
    wanted = [key] if key is not None else columns
    if wanted is None:
        return list(available)
    for name in wanted:
        if name not in available:
            raise ConvertError(f"{missing} {name!r}; it has: {', '.join(available)}")
    return list(wanted)


def _convert_tabular(
    source: Any, dst: pathlib.Path, codec: str, tier: str, key: str | None,
    columns: list[str] | None, chunk_records: int | None, progress: ProgressArg, what: str,
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
        plans[name] = _ColumnPlan(name, source.schema.field(name).type)
    targets = _Targets(dst, None if key is not None else names)
    rows = _rows_per_chunk(chunk_records, source.row_bytes)
    _prepass(source, plans, codec, tier, rows, progress)
    return _write_tabular(source, plans, targets, key, codec, rows, progress, what)


def _prepass(source: Any, plans: dict[str, _ColumnPlan], codec: str, tier: str, rows: int,
             progress: ProgressArg) -> None:
    # Pre-passes, one column at a time (Parquet reads only that column):
    # variable-length lists are scanned to choose Dense or Ragged, and
    # zstd_dict columns train their dictionary on an evenly spread sample.
    for name, plan in plans.items():
        if plan.variable or (codec == "zstd_dict" and source.num_rows is None):
            meter = make_progress(progress, source.num_rows, f"scan {name}")
            try:
                for batch in source.batches([name], rows):
                    plan.scan(_layout(_column(batch, name), name, plan.rows, plan.dtype))
                    meter.update(batch.num_rows)
            finally:
                meter.close()
            plan.decide()
        if codec == "zstd_dict":
            plan.dict_bytes = _column_dict(source, plan, rows, tier)


def _write_tabular(source: Any, plans: dict[str, _ColumnPlan], targets: _Targets, key: str | None,
                   codec: str, rows: int, progress: ProgressArg, what: str) -> dict[str, pathlib.Path]:
    names = list(plans)
    out: dict[str, pathlib.Path] = {}
    writers: dict[str, Dense | Ragged] = {}
    meter = make_progress(progress, source.num_rows, f"convert {what}")
    try:
        for name, plan in plans.items():
            target = targets.prepare(targets.paths[None if key is not None else name])
            try:
                if plan.kind == "dense":
                    writers[name] = Dense.create(target, plan.dtype, plan.item_shape,  # type: ignore[arg-type]
                                                 codec=codec, dict_bytes=plan.dict_bytes,
                                                 **_LAYOUT.get())
                else:
                    writers[name] = Ragged.create(target, plan.dtype, codec=codec,
                                                  dict_bytes=plan.dict_bytes, **_LAYOUT.get())
            except ValueError as e:
                raise UnsupportedColumnError(f"unsupported column type: column {name!r}: {e}") from None
            out[name] = target
        row0 = 0
        for batch in source.batches(names, rows):
            if batch.num_rows == 0:
                continue
            for name, plan in plans.items():
                lay = _layout(_column(batch, name), name, row0, plan.dtype)
                if plan.kind == "dense":
                    if lay.values.size != lay.rows * math.prod(plan.item_shape):  # type: ignore[arg-type]
                        raise ConvertError(f"column {name!r} changed shape near row {row0}")
                    writers[name].append(lay.dense(plan.item_shape))  # type: ignore[arg-type]
                else:
                    writers[name].append(lay.ragged())
            row0 += batch.num_rows
            meter.update(batch.num_rows)
        for w in writers.values():
            w.close()
    except BaseException:
        for w in writers.values():
            try:
                w.close()
            except Exception:
                pass
        targets.discard()
        raise
    finally:
        meter.close()
    return out


def _column_dict(source: Any, plan: _ColumnPlan, rows: int, tier: str) -> bytes:
    name = plan.name
    what = f"column {name!r}"

    def layouts() -> Iterator[_Layout]:
        row0 = 0
        for batch in source.batches([name], rows):
            lay = _layout(_column(batch, name), name, row0, plan.dtype)
            row0 += lay.rows
            yield lay

    if plan.kind == "dense":
        shape = plan.item_shape or ()
        width = math.prod(shape) * plan.dtype.itemsize
        total = source.num_rows if source.num_rows is not None else plan.rows
        if not total:
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        return _dict_for_rows((lay.dense(shape) for lay in layouts()), total, width, tier, what)
    # Ragged: the scan measured the column, so sample rows at a fixed stride.
    budget = DICT_TIERS[tier]["samples"]
    stride = max(1, -(-plan.value_bytes // budget))
    sample: list[np.ndarray] = []
    row0 = 0
    for lay in layouts():
        first = (-row0) % stride
        b = lay.bounds
        for i in range(first, lay.rows, stride):
            sample.append(lay.values[b[i] : b[i + 1]])
        row0 += lay.rows
    if not sample:
        raise ConvertError(f"{what} has no records to train a zstd dictionary on")
    return _train(sample, tier, what)


def _is_hf_dir(p: pathlib.Path) -> bool:
    return any((p / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json"))


def _convert_hf(
    ds: Any, dst: pathlib.Path, codec: str, tier: str, key: str | None, columns: list[str] | None,
    chunk_records: int | None, progress: ProgressArg, what: str,
) -> dict[str, pathlib.Path]:
    datasets = _import_datasets(f"converting {what}")
    if isinstance(ds, datasets.DatasetDict):
        splits = list(ds)
        if key is not None:
            if key not in ds:
                raise ConvertError(f"{what} has no split {key!r}; it has: {', '.join(splits)}")
            return _convert_hf(ds[key], dst, codec, tier, None, columns, chunk_records, progress,
                               f"{what} split {key!r}")
        for split in splits:
            _check_name(split, "split")
        out = {}
        made = [] if dst.exists() else [dst]
        try:
            for split in splits:
                if not (dst / split).exists():
                    made.append(dst / split)
                got = _convert_hf(ds[split], dst / split, codec, tier, None, columns, chunk_records,
                                  progress, f"{what} split {split!r}")
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
    return _convert_tabular(_DatasetSource(ds), dst, codec, tier, key, columns, chunk_records,
                            progress, what)


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
    store set is accepted as ``src`` like a store. ``dst`` may be an
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
        if isinstance(chunk_records, bool) or not isinstance(chunk_records, (int, np.integer)):
            raise TypeError(f"chunk_records must be an int, got {type(chunk_records).__name__}")
        if chunk_records < 1:
            raise ValueError(f"chunk_records must be at least 1, got {chunk_records}")
        chunk_records = int(chunk_records)
    cols = _parse_columns(columns)
    args = (codec, tier)
    layout = {"shard_records": shard_records, "shard_bytes": shard_bytes}
    token = _LAYOUT.set({k: v for k, v in layout.items() if v is not None})
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
    codec, tier = args

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
        return _convert_tabular(_TableSource(src), dst, *args, key, cols, chunk_records, progress,
                                "the table")
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


# ---------------------------------------------------------------------------
# demo
# ---------------------------------------------------------------------------


class DemoError(RuntimeError):
    """The demo's loader delivered a batch that differs from its source."""


def _demo_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Deterministic image-like uint8 (n, 3, 64, 64), int64 labels, int32 token lists."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, size=n, dtype=np.int64)
    yy, xx = np.mgrid[0:64, 0:64].astype(np.float32)
    bases = np.empty((10, 3, 64, 64), dtype=np.uint8)
    for c in range(10):
        for ch in range(3):
            wave = np.sin((xx * (c + 1) + yy * (ch + 2)) / 23.0) * np.cos(yy * (c % 3 + 1) / 17.0)
            bases[c, ch] = (120 + 24 * np.round(wave * 4)).astype(np.uint8)  # banded shading
    images = bases[labels]
    images += rng.integers(0, 24, size=(n, 1, 1, 1), dtype=np.uint8)  # per-image brightness
    images += rng.integers(0, 3, size=images.shape, dtype=np.uint8)  # sensor noise
    phrases = [rng.integers(3, 32000, size=int(k), dtype=np.int32) for k in rng.integers(3, 13, size=256)]
    counts = rng.integers(2, 20, size=n)
    picks = rng.integers(0, len(phrases), size=int(counts.sum()))
    bos, eos = np.array([1], np.int32), np.array([2], np.int32)
    tokens = []
    at = 0
    for k in counts.tolist():
        tokens.append(np.concatenate([bos, *(phrases[j] for j in picks[at : at + k]), eos]))
        at += k
    return images, labels, tokens


def _normalise(x: np.ndarray) -> np.ndarray:
    return np.multiply(x, np.float32(1.0 / 255.0), dtype=np.float32)


def _demo_transform(batch: dict) -> dict:
    batch["image"] = _normalise(batch["image"])
    return batch


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def demo(
    dir: PathLike | None = None,
    records: int = 8192,
    steps: int = 500,
    batch_size: int = 64,
    seed: int = 0,
    out: TextIO | None = sys.stdout,
) -> dict[str, Any]:
    """Builds three stores from generated data and streams them together.

    In ``dir`` (default: a temporary directory, removed afterwards) it writes
    ``image`` (Dense uint8 (3, 64, 64), zstd), ``label`` (Dense int64, raw) and
    ``tokens`` (Ragged int32, zstd_dict with a dictionary from
    :func:`~loaderx.utils.train_dict`). Then a DataLoader whose transform
    normalises images to float32 runs ``steps`` timed batches, and the same
    stream is replayed with every batch compared to the source records
    (indices from :class:`~loaderx.zsampler.Sampler`). Prints a report to
    ``out`` (None: silent) and returns it as a dict. Raises DemoError when a
    batch differs.
    """
    from loaderx.dataloader import DataLoader
    from loaderx.zsampler import Sampler

    for name, value, low in (("records", records, 1), ("steps", steps, 1), ("batch_size", batch_size, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        if value < low:
            raise ValueError(f"{name} must be at least {low}, got {value}")
    t_start = time.perf_counter()
    temp = dir is None
    root = pathlib.Path(tempfile.mkdtemp(prefix="loaderx-demo-")) if temp else pathlib.Path(dir)
    paths = {name: root / name for name in ("image", "label", "tokens")}
    if not temp:
        for p in paths.values():
            if p.exists():
                raise FileExistsError(f"{p} already exists; give --dir a new or empty directory")
        root.mkdir(parents=True, exist_ok=True)

    def say(line: str = "") -> None:
        if out is not None:
            print(line, file=out, flush=True)

    try:
        t0 = time.perf_counter()
        images, labels, tokens = _demo_data(records, seed)
        gen_s = time.perf_counter() - t0
        token_bytes = np.array([t.nbytes for t in tokens], dtype=np.int64)
        say(f"loaderx demo: {records:,} generated records in {root}"
            f"{' (temporary, removed afterwards)' if temp else ''}")
        say(f"  generated image/label/tokens source data in {gen_s:.2f} s")

        write: dict[str, float] = {}
        t0 = time.perf_counter()
        with Dense.create(paths["image"], np.uint8, (3, 64, 64), codec="zstd") as w:
            w.append(images)
        write["image"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        with Dense.create(paths["label"], np.int64, (), codec="raw") as w:
            w.append(labels)
        write["label"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        blob = train_dict(tokens, tier="fast")
        train_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        with Ragged.create(paths["tokens"], np.int32, codec="zstd_dict", dict_bytes=blob) as w:
            w.append(tokens)
        write["tokens"] = time.perf_counter() - t0

        stores = {name: info(p) for name, p in paths.items()}
        source_bytes = {"image": images.nbytes, "label": labels.nbytes, "tokens": int(token_bytes.sum())}
        for name, d in stores.items():
            d["write_seconds"] = write[name]
            d["write_mib_per_s"] = source_bytes[name] / _MiB / max(write[name], 1e-9)
        write_total = sum(write.values())

        say()
        say("built")
        head = f"  {'store':<7} {'kind':<7} {'dtype':<6} {'item_shape':<12} {'codec':<10} " \
               f"{'records':>8} {'logical':>10} {'on disk':>10} {'ratio':>7} {'write':>12}"
        say(head)
        for name, d in stores.items():
            shape = str(tuple(d["item_shape"])) if d["item_shape"] is not None else "-"
            say(f"  {name:<7} {d['kind']:<7} {d['dtype']:<6} {shape:<12} {d['codec']:<10} "
                f"{d['records']:>8,} {_fmt_bytes(d['logical_bytes']):>10} "
                f"{_fmt_bytes(d['disk_bytes']):>10} {d['ratio']:>6.2f}x "
                f"{d['write_mib_per_s']:>7.1f} MiB/s")
        say(f"  tokens dictionary: {_fmt_bytes(len(blob))} (tier 'fast'), trained in {train_s:.2f} s; "
            f"all stores written at {sum(source_bytes.values()) / _MiB / max(write_total, 1e-9):.1f} MiB/s")

        workers = max(1, min(4, os.cpu_count() or 1))
        readers = {name: (Dense.open(p) if name != "tokens" else Ragged.open(p)) for name, p in paths.items()}
        try:
            def loader() -> DataLoader:
                return DataLoader(readers, transform_workers=workers, batch_size=batch_size,
                                  mode=2, seed=seed, transform=_demo_transform)

            # 1. timed: the consumer only takes batches.
            with loader() as dl:
                t0 = time.perf_counter()
                for _ in range(steps):
                    next(dl)
                load_s = time.perf_counter() - t0
            # 2. checked: the same stream again, every batch against the source.
            sampler = Sampler(records, batch_size, Sampler.Mode.CYCLIC, seed=seed)
            delivered = 0
            t0 = time.perf_counter()
            with loader() as dl:
                for step in range(steps):
                    idx = next(sampler).astype(np.int64)
                    batch = next(dl)
                    problems = []
                    if not (batch["image"].dtype == np.float32
                            and np.array_equal(batch["image"], _normalise(images[idx]))):
                        problems.append("image")
                    if not np.array_equal(batch["label"], labels[idx]):
                        problems.append("label")
                    got = batch["tokens"]
                    if len(got) != len(idx) or not all(
                        g.dtype == np.int32 and np.array_equal(g, tokens[i]) for g, i in zip(got, idx.tolist())
                    ):
                        problems.append("tokens")
                    if problems:
                        raise DemoError(f"step {step}: {', '.join(problems)} differ from the source records")
                    delivered += images[0].nbytes * len(idx) + labels[0].nbytes * len(idx) \
                        + int(token_bytes[idx].sum())
            check_s = time.perf_counter() - t0
        finally:
            for r in readers.values():
                r.close()

        n_rec = steps * batch_size
        loader_stats = {
            "steps": steps,
            "batch_size": batch_size,
            "transform_workers": workers,
            "seconds": load_s,
            "batches_per_s": steps / max(load_s, 1e-9),
            "records_per_s": n_rec / max(load_s, 1e-9),
            "mib_per_s": delivered / _MiB / max(load_s, 1e-9),
            "verified_batches": steps,
            "verify_seconds": check_s,
        }
        say()
        say(f"loaded (DataLoader: batch_size {batch_size}, cyclic, {workers} transform workers "
            "normalising images to float32)")
        say(f"  {steps:,} batches, {n_rec:,} records, {_fmt_bytes(delivered)} of records in {load_s:.2f} s")
        say(f"  {loader_stats['batches_per_s']:.1f} batches/s, {loader_stats['records_per_s']:,.0f} records/s, "
            f"{loader_stats['mib_per_s']:.1f} MiB/s")
        say(f"  checked: the same {steps:,} batches, replayed, all equal to their source records "
            f"({check_s:.2f} s)")
        total_s = time.perf_counter() - t_start
        say(f"done in {total_s:.1f} s")
        return {
            "dir": str(root),
            "kept": not temp,
            "records": records,
            "generate_seconds": gen_s,
            "dict_train_seconds": train_s,
            "write_seconds": write_total,
            "stores": stores,
            "loader": loader_stats,
            "total_seconds": total_s,
        }
    finally:
        if temp:
            shutil.rmtree(root, ignore_errors=True)
