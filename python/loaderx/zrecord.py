"""Zrecord: typed, append-only-then-immutable record stores.

``Dense`` holds fixed-shape records of one dtype; a gather returns one stacked
``(n, *item_shape)`` array. ``Ragged`` holds records of one dtype and any
shapes; a gather returns a list of arrays that share one buffer.

A store is built once with ``create`` (an append-only writer; ``close()``
publishes it) and then read with ``open`` (a read-only reader, safe to share
between threads and processes). The on-disk format is loaderx 2.0.0's.
"""

from __future__ import annotations

import functools
import operator
import os
import pathlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from loaderx import _native, _sidecar, _validate
from loaderx._errors import SchemaError, ZrecordError

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = ["CODECS", "DICT_TIERS", "ML_DTYPES", "Dense", "Ragged", "SchemaError", "ZrecordError"]

#: Dictionary tiers for ``zstd_dict``: dictionary size and training sample
#: budget, both in bytes.
DICT_TIERS: dict[str, dict[str, int]] = {
    "fast": {"size": 32 * 1024, "samples": 4 * 1024 * 1024},
    "balanced": {"size": 128 * 1024, "samples": 16 * 1024 * 1024},
    "max": {"size": 1024 * 1024, "samples": 64 * 1024 * 1024},
}

#: The codec names a store can be created with.
CODECS = ("raw", "zstd", "zstd_dict")

_MAX_RECORD_BYTES = 1 << 31

PathLike = str | os.PathLike[str]
StorageOptions = Mapping[str, str | int | float | bool]
Index = int | slice | Sequence[int] | np.ndarray
_T = TypeVar("_T")


#: Types of the optional ``ml-dtypes`` package a store can hold, stored by
#: name (NumPy would print most as opaque ``V`` types). Reading or writing
#: them imports ``ml_dtypes``, which registers the names with NumPy.
ML_DTYPES = frozenset(
    {
        "bfloat16",
        "float8_e3m4",
        "float8_e4m3",
        "float8_e4m3b11fnuz",
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float6_e2m3fn",
        "float6_e3m2fn",
        "float4_e2m1fn",
        "int2",
        "int4",
        "uint2",
        "uint4",
    }
)


def _is_ml_dtype(dt: np.dtype) -> bool:
    return getattr(dt.type, "__module__", "") == "ml_dtypes" and dt.name in ML_DTYPES


def _ml_dtype(name: str) -> np.dtype:
    """The ml-dtypes type ``name``, importing the package (a clear error
    naming it when it is missing)."""
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            f"{name} records need the ml-dtypes package: pip install ml-dtypes "
            "(or pip install 'loaderx[ml-dtypes]')"
        ) from None
    dt: np.dtype = np.dtype(getattr(ml_dtypes, name))
    return dt


def _stored_dtype(dt: np.dtype) -> str:
    """The dtype string a store records for ``dt``: the name of an
    ml-dtypes type, else NumPy's ``dtype.str`` (loaderx 2.0.0's form),
    provided it reads back as the same dtype."""
    if _is_ml_dtype(dt):
        return str(dt.name)
    stored: str = dt.str
    try:
        back = np.dtype(stored)
    except TypeError:
        back = None
    if back != dt:
        raise ValueError(
            f"dtype {dt!r} cannot be stored: it would be recorded as {stored!r}, which "
            f"reads back as {'nothing NumPy knows' if back is None else repr(back)}"
        )
    return stored


# Argument errors start with loaderx 2.0.0's message, word for word, so code
# (and tests) matching on it keep working; our detail follows it. The checks
# of ``create`` run in 2.0.0's order too: path, dtype, dictionary presence,
# item_shape, codec name, dictionary type (tests/test_errors_parity.py).


def _check_dtype(dtype: Any) -> np.dtype:
    dt = _ml_dtype(dtype) if isinstance(dtype, str) and dtype in ML_DTYPES else np.dtype(dtype)
    if dt.fields is not None:
        raise ValueError(f"structured dtypes are not supported: got {dt}")
    if dt.subdtype is not None:
        raise ValueError(f"subarray dtypes are not supported; put dimensions in the shape (got {dt})")
    if dt.metadata is not None:  # even an empty metadata dict, as in 2.0.0
        raise ValueError(f"dtype metadata is not supported: got {dt!r} with {dict(dt.metadata)!r}")
    if dt.hasobject:
        raise ValueError(f"object dtypes cannot be persisted: records are stored as raw bytes, got {dt}")
    _stored_dtype(dt)  # refused now, before anything is written, if it would not read back
    return dt


def _check_itemsize(dt: np.dtype) -> None:
    """Refuses a zero-size dtype (``S0``, ``U0``, ``V0``) for a Ragged store,
    which could never hold a record; checked after every check 2.0.0 makes
    (Dense stores report it as a zero record width instead)."""
    if dt.itemsize == 0:
        raise ValueError(f"dtype {dt} has no size; give one, e.g. 'S8' or 'U4'")


def _check_item_shape(item_shape: Any, dtype: np.dtype) -> tuple[int, ...]:
    # Every item_shape problem is a ValueError, as in loaderx 2.0.0.
    try:
        dims = tuple(item_shape)
    except TypeError:
        raise ValueError(f"item_shape must be an iterable of integers, got {item_shape!r}") from None
    if isinstance(item_shape, (bytes, bytearray)):
        # 2.0.0 reads b"ab" as the shape (97, 98); a bytes object is never a shape.
        raise ValueError(f"item_shape dimensions must be integers, got the bytes object {item_shape!r}")
    shape = []
    for d in dims:  # each dimension in turn, type before sign, as 2.0.0 reports them
        try:
            if isinstance(d, (bool, np.bool_)):
                raise TypeError
            size = operator.index(d)
        except TypeError:
            raise ValueError(f"item_shape dimensions must be integers, got {d!r} in {dims}") from None
        if size < 0:
            raise ValueError(f"item_shape dimensions must be non-negative, got {dims}")
        shape.append(size)
    width = dtype.itemsize
    for d in shape:
        width *= d
    if not 1 <= width <= _MAX_RECORD_BYTES:
        raise ValueError(
            f"dense record width {width} is outside the native limit: a record of shape "
            f"{tuple(shape)} and dtype {dtype} is {width} bytes; records must be 1..2^31 bytes"
        )
    return tuple(shape)


def _no_dict(dict_bytes: Any) -> bool:
    """Whether ``dict_bytes`` gives no dictionary: None, an empty bytes-like
    object, or (not bytes-like at all) a false value, as 2.0.0 reads it."""
    if dict_bytes is None:
        return True
    try:
        return memoryview(dict_bytes).nbytes == 0
    except TypeError:
        return not dict_bytes  # wrong types are refused later, by _check_codec


def _check_dict_use(codec: Any, dict_bytes: Any) -> None:
    """The dictionary checks 2.0.0 makes before item_shape: ``zstd_dict``
    needs one, every other codec (known or not) refuses one."""
    if codec == "zstd_dict":
        if _no_dict(dict_bytes):
            raise ValueError(
                "creating a zstd_dict store requires non-empty dict_bytes from train_dict "
                "(loaderx.utils.train_dict)"
            )
    elif dict_bytes is not None:
        raise ValueError(f"dict_bytes requires codec='zstd_dict', got codec={codec!r}")


def _check_codec(codec: Any, dict_bytes: Any) -> bytes | None:
    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}, expected one of {list(CODECS)}")
    _check_dict_use(codec, dict_bytes)
    if dict_bytes is None:
        return None
    try:
        return bytes(memoryview(dict_bytes))
    except TypeError:
        raise TypeError(
            f"a bytes-like object is required, not {type(dict_bytes).__name__!r}: dict_bytes "
            "takes the bytes train_dict returns"
        ) from None


def _is_url(path: str) -> bool:
    """Whether ``path`` names object storage (``s3://``, ``gs://``, ...); ``file://`` is local."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.replace("+", "").replace("-", "").isalnum() and scheme != "file"


def _location(path: PathLike) -> tuple[str, pathlib.Path | str]:
    """The string handed to the engine and the ``path`` attribute: a
    ``pathlib.Path`` for local stores, the URL itself for object storage."""
    text: str | bytes = os.fspath(path)
    if not isinstance(text, str):
        # pathlib refuses a bytes path with 2.0.0's words.
        pathlib.PurePath(text)  # type: ignore[arg-type]
        raise TypeError(f"a store path must be a str or os.PathLike[str], got {type(path).__name__}")
    if _is_url(text):
        return text, text
    return text, pathlib.Path(text[len("file://") :] if text.startswith("file://") else text)


def _open_any(
    path: PathLike,
    *,
    data_access: str | None = None,
    storage_options: StorageOptions | None = None,
    verify_checksums: bool = False,
) -> Dense | Ragged:
    """Opens the store or store set at ``path`` read-only as whichever of
    :class:`Dense` or :class:`Ragged` it is (the engine reads its schema)."""
    if data_access not in (None, "auto", "read", "map"):
        raise ValueError(f"data_access must be 'auto', 'read' or 'map', got {data_access!r}")
    text, shown = _location(path)
    options = _storage_options(storage_options)
    kind, handle = _native.ReaderHandle.open_any(text, data_access, options, verify_checksums)
    cls: type[Dense | Ragged] = Dense if kind == "dense" else Ragged
    return cls._adopt(handle, shown, options)


def _storage_options(options: StorageOptions | None) -> dict[str, Any] | None:
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a dict of str to str, got {type(options).__name__}")
    for key in options:
        if not isinstance(key, str):
            raise TypeError(f"storage_options keys must be str, got {key!r}")
    return dict(options)


def _shard_limit(name: str, value: Any) -> int | None:
    if value is None:
        return None
    return _validate.bounded(
        name,
        value,
        1,
        type_message="{name} must be a positive int, got {value!r}",
        range_message="{name} must be positive, got {value}",
    )


def _check_level(codec: str, level: Any) -> int | None:
    """``level`` as the engine takes it: None (the codec's default) or an int
    in zstd's range; a level with ``codec="raw"`` is refused."""
    if level is None:
        return None
    number = _validate.integer("level", level, noun="an int or None")
    if codec == "raw":
        raise ValueError(
            "level applies only to codec='zstd' and codec='zstd_dict': raw stores are not "
            f"compressed (got level={number})"
        )
    low, high = _native.level_range()
    if not low <= number <= high:
        raise ValueError(f"level must be in zstd's range {low}..{high}, got {number}")
    return number


def _slice_indices(key: slice, n: int) -> np.ndarray:
    bounds = []
    try:
        for b in (key.start, key.stop):
            if b is not None:
                b = operator.index(b)
                if b < 0:
                    raise IndexError(f"negative record indices are not supported: got {key}")
            bounds.append(b)
        step = 1 if key.step is None else operator.index(key.step)
    except TypeError:
        raise TypeError(
            f"slice indices must be integers or None or have an __index__ method, got {key}"
        ) from None
    if step == 0:
        raise ValueError("slice step cannot be zero")
    return np.arange(*slice(bounds[0], bounds[1], step).indices(n), dtype=np.int64)


def _index_array(key: Any, n: int) -> np.ndarray:
    """Normalises a record-set key to a 1-D int64 array (range checks are native).

    Takes what loaderx 2.0.0 takes: slices, ranges, lists and tuples, NumPy
    arrays and array-likes (pandas ``Series``/``Index``, anything with
    ``__array__``); an int is a set of one (``__getitems__``), a 0-d array a
    batch of one, an empty key selects nothing (an empty boolean array is a
    mask, so only for an empty store), and a
    multi-dimensional index array selects its entries in C order.
    """
    if isinstance(key, slice):
        return _slice_indices(key, n)
    if isinstance(key, range):
        return np.arange(key.start, key.stop, key.step, dtype=np.int64)
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(_BOOL_KEY)
    if isinstance(key, (int, np.integer)):
        if not _INT64_MIN <= key <= _INT64_MAX:
            raise _out_of_range(n, int(key))
        return np.array([int(key)], dtype=np.int64)
    if isinstance(key, (list, tuple)):
        if len(key) == 0:
            return np.empty(0, dtype=np.int64)
        for k in key:
            if isinstance(k, (float, str, bytes, slice)) or k is None:
                raise TypeError(f"{_NOT_INTEGERS}: got {k!r}")
        arr = np.asarray(key)
    elif isinstance(key, np.ndarray):
        arr = key
    elif hasattr(key, "__array__") and not isinstance(key, (str, bytes)):
        arr = np.asarray(key)
    else:
        raise TypeError(
            f"{_NOT_INTEGERS}: records are selected by an int, a slice, a range, a list or "
            "tuple of ints, an integer array or array-like, or a boolean mask, not "
            f"{type(key).__name__}"
        )
    # A boolean array is a mask even when empty: it must have the store's length.
    if arr.dtype == np.bool_:
        if arr.ndim != 1 or arr.shape[0] != n:
            raise IndexError(f"boolean mask must be one-dimensional with length {n}, got shape {arr.shape}")
        return np.flatnonzero(arr)
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{_NOT_INTEGERS}: got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.dtype.kind == "u" and int(arr.max()) >= n:
        raise _out_of_range(n, int(arr.max()))
    return np.ascontiguousarray(arr, dtype=np.int64)


def _scalar_index(key: Any) -> int | None:
    """The record index of an int-like key, None for record-set keys."""
    if isinstance(key, (bool, np.bool_)):
        raise TypeError(_BOOL_KEY)
    if isinstance(key, (int, np.integer)):
        return int(key)
    # A 0-d array is a record-set key, as in loaderx 2.0.0: an integer one
    # selects a batch of one, a boolean one is a mask of the wrong shape.
    if isinstance(key, (float, str, bytes)) or key is None:
        raise TypeError(f"{_NOT_INTEGERS}: got {key!r}")
    return None


# loaderx 2.0.0's index error messages (ours add the offending key after them).
_NOT_INTEGERS = "indices must be integers or a bool mask"
_BOOL_KEY = "a boolean scalar is not a record index or mask"
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


def _out_of_range(n: int, index: int) -> IndexError:
    return IndexError(f"record index out of range for container of length {n}: index {index}")


def _gathering(n: int, idx: np.ndarray, gather: Callable[..., _T], *args: Any) -> _T:
    """``gather(idx, *args)``, with the engine's range error (it checks every
    index before reading any) restated in 2.0.0's words."""
    try:
        return gather(idx, *args)
    except IndexError:
        bad = idx[(idx < 0) | (idx >= n)]
        if bad.size == 0:  # not a range error after all
            raise
        raise _out_of_range(n, int(bad[0])) from None


class _Store:
    """Shared lifecycle of Dense and Ragged: writer/reader roles, close, with."""

    _kind: str = ""
    __slots__ = (
        "_codec",
        "_dtype",
        "_has_dict",
        "_path",
        "_reader",
        "_storage_options",
        "_verify",
        "_writer",
    )
    # The slots' types (annotations only: no class attributes beside the slots).
    _path: pathlib.Path | str
    _dtype: np.dtype
    _codec: str
    _writer: _native.WriterHandle | None
    _reader: _native.ReaderHandle | None
    _has_dict: bool
    _storage_options: dict[str, Any] | None
    _verify: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        name = type(self).__name__
        raise TypeError(
            f"use {name}.open(...) or {name}.create(...): {name}.open(path) reads a store, "
            f"{name}.create(path, ...) builds one"
        )

    @classmethod
    def _writer_of(
        cls,
        path: PathLike,
        dtype: np.dtype,
        item_shape: list[int] | None,
        codec: str,
        dict_bytes: bytes | None,
        shard_records: Any = None,
        shard_bytes: Any = None,
        storage_options: StorageOptions | None = None,
        checksums: bool = True,
        level: Any = None,
    ) -> Self:
        text, shown = _location(path)
        if isinstance(shown, pathlib.Path) and shown.exists() and not shown.is_dir():
            # 2.0.0 reports this as the I/O failure (-2) of making the directory.
            raise ZrecordError(
                f"file I/O failed: {str(shown)!r} exists and is not a directory", ZrecordError.IO
            )
        if not isinstance(checksums, bool):
            raise TypeError(f"checksums must be a bool, got {checksums!r}")
        zstd_level = _check_level(codec, level)
        records = _shard_limit("shard_records", shard_records)
        nbytes = _shard_limit("shard_bytes", shard_bytes)
        options = _storage_options(storage_options)
        self = object.__new__(cls)
        self._path = shown
        self._dtype = dtype
        self._codec = codec
        self._reader = None
        self._storage_options = options
        self._writer = _native.WriterHandle.create(
            text,
            cls._kind,
            _stored_dtype(dtype),
            item_shape,
            codec,
            dict_bytes,
            records,
            nbytes,
            options,
            checksums,
            zstd_level,
        )
        self._has_dict = dict_bytes is not None
        return self

    @classmethod
    def _reader_of(
        cls,
        path: PathLike,
        data_access: str | None,
        storage_options: StorageOptions | None = None,
        verify_checksums: bool = False,
    ) -> Self:
        if data_access not in (None, "auto", "read", "map"):
            raise ValueError(f"data_access must be 'auto', 'read' or 'map', got {data_access!r}")
        text, shown = _location(path)
        if data_access is not None and _is_url(text):
            raise ValueError(
                f"data_access={data_access!r} applies to local stores; {text} is read with "
                "range requests (tune them with storage_options)"
            )
        options = _storage_options(storage_options)
        handle = _native.ReaderHandle.open(text, cls._kind, data_access, options, bool(verify_checksums))
        self = cls._adopt(handle, shown, options)
        self._verify = bool(verify_checksums)
        return self

    @classmethod
    def _adopt(cls, handle: Any, shown: pathlib.Path | str, options: dict[str, Any] | None) -> Self:
        """Wraps an open native reader of this kind."""
        self = object.__new__(cls)
        self._path = shown
        self._storage_options = options
        self._verify = False
        try:
            self._dtype = _check_dtype(handle.dtype)
        except (TypeError, ValueError) as e:
            handle.close()
            raise ZrecordError(f"{shown}: stored dtype {handle.dtype!r} is not usable: {e}", -8) from None
        except ImportError:
            handle.close()
            raise
        self._codec = handle.codec
        self._has_dict = handle.has_dict()
        self._writer = None
        self._reader = handle
        if handle.item_shape is not None:
            cast("Dense", self)._item_shape = tuple(int(d) for d in handle.item_shape)
        return self

    # -- attributes ---------------------------------------------------------
    @property
    def path(self) -> pathlib.Path | str:
        """The store directory (a ``pathlib.Path``), or its URL for a store
        in object storage."""
        return self._path

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The shards of a store set, in record order, each as
        ``{"path", "records", "data_bytes"}`` (``path`` relative to the set);
        an empty list for a plain store. Writers list the shards committed
        so far."""
        handle = self._writer if self._writer is not None else self._reader
        if handle is None or handle.closed:
            raise self._closed_error()
        return [{"path": p, "records": n, "data_bytes": b} for p, n, b in handle.shards()]

    @property
    def dtype(self) -> np.dtype:
        """The element dtype of every record."""
        return self._dtype

    @property
    def features(self) -> dict[str, Any] | None:
        """What the records mean, from the ``features.json`` sidecar that
        ``loaderx convert`` writes beside a store: ``column`` (the source
        column or array), ``source_type`` (its Arrow or NumPy type),
        ``feature`` (its Hugging Face feature as ``datasets`` serialises it),
        ``names`` (a ``ClassLabel``'s class names, so record value ``i`` means
        ``names[i]``), ``content`` (what a record holds: ``"values"``,
        ``"bytes"``, ``"text"`` (UTF-8), ``"encoded image"``, ``"decoded
        image"``...) and ``codec`` (how the codec was chosen). None for a
        store without one, or in object storage (sidecars are not uploaded).
        Read from disk at each access; see docs/format.md."""
        return _sidecar.read(self._path)

    @property
    def codec(self) -> str:
        """``"raw"``, ``"zstd"`` or ``"zstd_dict"``."""
        return self._codec

    @property
    def closed(self) -> bool:
        """Whether ``close()`` has run."""
        handle = self._writer if self._writer is not None else self._reader
        return handle is None or handle.closed

    @property
    def data_access(self) -> str:
        """How a reader gets at its records: ``"map"`` (a read-only memory map),
        ``"read"`` (positional reads) or ``"remote"`` (object storage)."""
        return self._require_reader().data_access

    @property
    def writable(self) -> bool:
        """True for a writer from ``create``, False for a reader from ``open``."""
        return self._writer is not None

    @property
    def checksums(self) -> str | None:
        """What checks a reader's records carry: ``"frames"`` (every zstd frame
        holds zstd's content checksum, verified on every decode),
        ``"sidecar"`` (a raw store's ``sums.zr``: an XXH3-64 per record,
        verified when opened with ``verify_checksums=True``) or None (stores
        written without checksums, e.g. by loaderx 2.0.0)."""
        return self._require_reader().checksums()

    @property
    def layout(self) -> str:
        """The on-disk layout of an opened store, named after the first
        loaderx release that wrote it: ``"2.0.0"`` (the layout this package
        writes), ``"2.0.1"``, ``"2.2"``, ``"2.3.3"``, ``"2.8.12"``,
        ``"2.8.18"`` or ``"2.8.19"``. Stores of the later layouts open
        read-only; ``loaderx convert`` rewrites them in the 2.0.0 layout.
        See :attr:`layout_releases` and docs/format.md."""
        return self._require_reader().layout()[0]

    @property
    def layout_releases(self) -> str:
        """The loaderx releases that write stores in this store's layout,
        e.g. ``"loaderx 2.3.3–2.8.6"``."""
        return self._require_reader().layout()[1]

    def has_dict(self) -> bool:
        """Whether the store carries a zstd dictionary (``dict.zr``)."""
        return self._has_dict

    def dict_bytes(self) -> bytes | None:
        """The store's dictionary, or None (readers only)."""
        return self._require_reader().dict_bytes()

    def __len__(self) -> int:
        handle = self._writer if self._writer is not None else self._reader
        if handle is None or handle.closed:
            raise self._closed_error()
        return len(handle)

    # -- lifecycle ----------------------------------------------------------
    def close(self, durable: bool = False) -> None:
        """Writer: publish the store (write its header last). Reader: release it.

        ``durable=True`` (writers) flushes records and table to stable storage
        before the header is written, and the header before returning, so a
        power cut never leaves a store that opens with missing records.
        Closing twice is harmless.
        """
        if self._writer is not None:
            self._writer.close(durable)
        elif self._reader is not None:
            self._reader.close()

    def _commit(self) -> list[tuple[str, int, int]]:
        """Closes a writer and returns what it committed, as
        ``(shard path, records, data_bytes)`` (a plain store: one entry, path "")."""
        return self._require_writer().close(False)

    def _abandon(self) -> None:
        """Drops a writer without committing: its store stays unpublished
        (refused by readers; nothing reaches object storage)."""
        self._writer = None

    def __del__(self) -> None:
        # Like an unclosed file: a writer dropped without close() leaves an
        # uncommitted store that open() refuses. Say so where Python shows
        # ResourceWarning (python -X dev, -W default, pytest).
        writer = getattr(self, "_writer", None)
        if writer is not None and not writer.closed:
            try:  # noqa: SIM105 - contextlib may be gone at interpreter shutdown
                warnings.warn(
                    f"unclosed {self._describe()}: the store stays uncommitted and will not "
                    f"open; call close() or create it in a `with` block",
                    ResourceWarning,
                    stacklevel=1,
                    source=self,
                )
            except Exception:  # interpreter shutdown: nothing left to warn with
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self) -> tuple[Any, tuple[pathlib.Path | str]]:
        # A reader travels to other processes (e.g. data-parallel workers) by
        # path and is reopened there; a writer is tied to its process.
        if self._reader is None or self._reader.closed:
            raise TypeError(f"only open readers can be pickled, not {self._describe()}")
        access = self._reader.data_access
        reopen = functools.partial(
            cast(Any, type(self)).open,  # Dense.open or Ragged.open
            data_access=None if access == "remote" else access,
            storage_options=self._storage_options,
            verify_checksums=self._verify,
        )
        return (reopen, (self._path,))

    def _describe(self) -> str:
        role = "writer" if self._writer is not None else "reader"
        return f"{type(self).__name__} {role} of {str(self._path)!r}"

    def __repr__(self) -> str:
        extra = self._repr_extra()
        state = "closed" if self.closed else ("writer" if self._writer is not None else "reader")
        n = "" if self.closed else f", len={len(self)}"
        return (
            f"{type(self).__name__}({str(self._path)!r}, dtype={self._dtype}{extra}, "
            f"codec={self._codec!r}{n}, {state})"
        )

    def _repr_extra(self) -> str:
        return ""

    def _closed_error(self) -> RuntimeError:
        return RuntimeError(f"Container is closed ({self._describe()})")

    def _require_reader(self) -> _native.ReaderHandle:
        """The native reader handle: the one way other modules (the loaders,
        ``utils``, ``tools``) reach it. A closed store raises the closed-store
        RuntimeError, a writer the read-requires-open() one; a closed store
        reports being closed before its role, as in 2.0.0."""
        if self.closed:
            raise self._closed_error()
        if self._writer is not None:
            raise RuntimeError(
                f"read requires a container returned by open(): {self._describe()} was "
                f"made by .create(); close it, then read it with {type(self).__name__}.open(path)"
            )
        return cast("_native.ReaderHandle", self._reader)

    def _require_writer(self) -> _native.WriterHandle:
        if self.closed:
            raise self._closed_error()
        if self._reader is not None:
            raise RuntimeError(
                f"append requires a container returned by create(): {self._describe()} came "
                f"from .open() and is read-only; build a new store with "
                f"{type(self).__name__}.create(path, ...) to add records"
            )
        return cast("_native.WriterHandle", self._writer)

    # -- reads --------------------------------------------------------------
    @staticmethod
    def _resolve(reader: _native.ReaderHandle, key: Index) -> tuple[int | None, np.ndarray | None]:
        """``(i, None)`` for a single record ``i`` (range-checked), else
        ``(None, indices)`` for a record set."""
        i = _scalar_index(key)
        n = len(reader)
        if i is None:
            return None, _index_array(key, n)
        if not 0 <= i < n:
            raise _out_of_range(n, i)
        return i, None

    def __getitem__(self, key: Index) -> Any:
        reader = self._require_reader()
        i, idx = self._resolve(reader, key)
        if idx is None:
            assert i is not None  # _resolve gives one of the two
            return self._gather_one(reader, i)
        return self._gather(reader, idx)

    def __getitems__(self, indices: Index) -> Any:
        """Gathers a record set (the batched-fetch protocol of map-style datasets)."""
        reader = self._require_reader()
        return self._gather(reader, _index_array(indices, len(reader)))

    def __iter__(self) -> Iterator[np.ndarray]:
        """Iterates over the records in order, decoding them in chunks."""
        reader = self._require_reader()
        n = len(reader)
        for start in range(0, n, 1024):
            yield from self._gather(reader, np.arange(start, min(start + 1024, n), dtype=np.int64))

    def _gather(self, reader: _native.ReaderHandle, idx: np.ndarray) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _gather_one(self, reader: _native.ReaderHandle, i: int) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


class Dense(_Store):
    """A store of fixed-shape records: every record is one ``item_shape`` array of ``dtype``.

    Build with :meth:`create`, read with :meth:`open`. Reading an int gives one
    record; reading a slice, list, tuple, integer array or boolean mask gives one
    new ``(n, *item_shape)`` array.
    """

    _kind = "dense"
    __slots__ = ("_item_shape",)
    _item_shape: tuple[int, ...]

    @classmethod
    def create(
        cls,
        path: PathLike,
        dtype: Any,
        item_shape: Iterable[int],
        codec: str = "zstd",
        dict_bytes: bytes | None = None,
        *,
        shard_records: int | None = None,
        shard_bytes: int | None = None,
        storage_options: StorageOptions | None = None,
        checksums: bool = True,
        level: int | None = None,
    ) -> Dense:
        """Creates a new Dense store at ``path`` (a new or empty directory, or
        an empty object-storage prefix such as ``s3://bucket/train``) and
        returns its append-only writer. ``codec`` is ``"raw"``, ``"zstd"``
        (default) or ``"zstd_dict"`` (which needs ``dict_bytes``).

        With ``shard_records`` and/or ``shard_bytes`` the writer builds a
        store set: it starts a new shard (a plain store) whenever the current
        one holds that many records or payload bytes, and ``close()`` writes
        the set's manifest last. ``storage_options`` configures object
        storage (see docs/scale.md); the standard environment variables
        apply otherwise.

        ``checksums`` (default True) gives every record a content checksum:
        zstd frames carry zstd's own, which every reader (loaderx 2.0.0's
        too) verifies when it decodes; raw stores get a ``sums.zr`` sidecar
        that loaderx 2.0.0 ignores. See :attr:`checksums`.

        ``level`` is the zstd compression level of the records' frames: None
        (default) keeps loaderx 2.0.0's, 3 for ``"zstd"`` and 19 for
        ``"zstd_dict"``; any int in zstd's range (``-131072..22``; 0 is
        zstd's default, 3) may be given. Negative levels write fastest and
        compress least; high levels compress most and write slowest (19 with
        a dictionary: a few MiB/s per core). Reading speed hardly depends on
        it. The level is not stored: a store written at any level reads as
        any other (loaderx 2.0.0 too). ``level`` with ``codec="raw"`` is a
        ValueError. docs/benchmarks.md measures the choices."""
        os.fspath(path)  # a path of the wrong type is reported first, as in 2.0.0
        dt = _check_dtype(dtype)
        _check_dict_use(codec, dict_bytes)
        shape = _check_item_shape(item_shape, dt)
        blob = _check_codec(codec, dict_bytes)
        self = cls._writer_of(
            path,
            dt,
            list(shape),
            codec,
            blob,
            shard_records,
            shard_bytes,
            storage_options,
            checksums,
            level,
        )
        self._item_shape = shape
        return self

    @classmethod
    def open(
        cls,
        path: PathLike,
        *,
        data_access: str | None = None,
        storage_options: StorageOptions | None = None,
        verify_checksums: bool = False,
    ) -> Dense:
        """Opens the committed Dense store, or store set, at ``path`` (a local
        path or an object-storage URL) read-only.

        ``data_access`` picks how records are read: ``"map"`` memory-maps the
        payload (no system call per record; the pages read count in the
        process's RSS), ``"read"`` uses positional reads (the page cache serves
        them), ``"auto"`` maps raw stores of small records and reads the rest.
        Default: the ``LOADERX_DATA_ACCESS`` environment variable, else auto.
        Object storage is read with concurrent, merged range requests;
        ``storage_options`` configures it. ``verify_checksums=True`` checks
        every raw record read against the store's ``sums.zr`` (a corrupt one
        raises ZrecordError); zstd frames with checksums are always checked.
        """
        return cls._reader_of(path, data_access, storage_options, verify_checksums)

    @property
    def item_shape(self) -> tuple[int, ...]:
        """The shape of one record."""
        return self._item_shape

    def _repr_extra(self) -> str:
        return f", item_shape={self._item_shape}"

    def append(self, batch: np.ndarray) -> None:
        """Appends ``batch``, an ndarray of shape ``(n, *item_shape)`` and the
        store's dtype (a 0-d array is one scalar record). Synchronous; any
        memory layout is accepted."""
        writer = self._require_writer()
        if not isinstance(batch, np.ndarray):
            raise TypeError(
                f"dense append requires a numpy array, got {type(batch).__name__} "
                "(convert it with numpy.asarray first)"
            )
        if batch.dtype != self._dtype:
            raise ValueError(f"dense append dtype {batch.dtype} != store dtype {self._dtype}")
        if batch.ndim == 0:
            # One scalar record: 2.0.0 reports its shape as (1,).
            batch = batch.reshape(1)
        if batch.shape[1:] != self._item_shape:
            raise ValueError(
                f"dense append shape {batch.shape} != (batch, *{self._item_shape}): records "
                f"have shape {self._item_shape} (add a leading axis for a single record)"
            )
        if batch.shape[0] == 0:
            raise ValueError("append needs at least one record, got an empty batch")
        flat = np.ascontiguousarray(batch).reshape(-1).view(np.uint8)
        writer.append_dense(flat)

    def _gather(self, reader: _native.ReaderHandle, idx: np.ndarray) -> np.ndarray:
        return _gathering(len(reader), idx, reader.gather_dense_array, self._dtype)

    def _gather_one(self, reader: _native.ReaderHandle, i: int) -> Any:
        # Like NumPy indexing (and loaderx 2.0.0): a record of a scalar store
        # comes back as a NumPy scalar, any other record as an array.
        return self._gather(reader, np.array([i], dtype=np.int64))[0]


class Ragged(_Store):
    """A store of records of one dtype and any shapes (0-d included).

    Build with :meth:`create`, read with :meth:`open`. Reading an int gives one
    array; reading a record set gives a list of arrays, exactly as written,
    viewing one shared buffer.
    """

    _kind = "ragged"
    __slots__ = ()

    @classmethod
    def create(
        cls,
        path: PathLike,
        dtype: Any,
        codec: str = "zstd",
        dict_bytes: bytes | None = None,
        *,
        shard_records: int | None = None,
        shard_bytes: int | None = None,
        storage_options: StorageOptions | None = None,
        checksums: bool = True,
        level: int | None = None,
    ) -> Ragged:
        """Creates a new Ragged store at ``path`` (a new or empty directory, or
        an empty object-storage prefix) and returns its append-only writer
        (``shard_records``, ``shard_bytes``, ``storage_options``,
        ``checksums`` and ``level`` as for :meth:`Dense.create`)."""
        os.fspath(path)  # a path of the wrong type is reported first, as in 2.0.0
        dt = _check_dtype(dtype)
        _check_dict_use(codec, dict_bytes)
        blob = _check_codec(codec, dict_bytes)
        _check_itemsize(dt)
        return cls._writer_of(
            path, dt, None, codec, blob, shard_records, shard_bytes, storage_options, checksums, level
        )

    @classmethod
    def open(
        cls,
        path: PathLike,
        *,
        data_access: str | None = None,
        storage_options: StorageOptions | None = None,
        verify_checksums: bool = False,
    ) -> Ragged:
        """Opens the committed Ragged store, or store set, at ``path`` read-only
        (``data_access``, ``storage_options`` and ``verify_checksums`` as for
        :meth:`Dense.open`)."""
        return cls._reader_of(path, data_access, storage_options, verify_checksums)

    def append(self, records: Iterable[np.ndarray]) -> None:
        """Appends every array of ``records`` (any iterable, consumed once), each
        of the store's dtype and any shape. Nothing is written unless every
        record is valid."""
        writer = self._require_writer()
        if isinstance(records, np.ndarray) and records.ndim == 0:
            raise TypeError(
                "iteration over a 0-d array: Ragged.append takes an iterable of arrays; "
                "wrap a single record in a list"
            )
        try:
            items = list(records)
        except TypeError as e:
            # Python's own words first ("'int' object is not iterable"), as in 2.0.0.
            raise TypeError(f"{e}: Ragged.append takes an iterable of numpy.ndarray") from None
        if not items:
            raise ValueError("append needs at least one record, got an empty iterable")
        writer.append_ragged(items, self._dtype)

    def gather_packed(self, key: Index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gathers a record set packed back to back, the layout variable-length
        attention kernels take: ``(values, cu_seqlens, shapes)``.

        ``values`` is one contiguous 1-D array of every record's elements in
        order; ``cu_seqlens`` is int32 of length n + 1, starting at 0, so record
        ``i`` is ``values[cu_seqlens[i]:cu_seqlens[i + 1]]``; ``shapes`` is an
        int64 ``(n, ndim)`` array. The records must share one rank.
        """
        reader = self._require_reader()
        i, idx = self._resolve(reader, key)
        if idx is None:
            idx = np.array([i], dtype=np.int64)
        return _gathering(len(reader), idx, reader.gather_packed, self._dtype)

    def _gather(self, reader: _native.ReaderHandle, idx: np.ndarray) -> list[np.ndarray]:
        if idx.shape[0] == 0:
            return []
        return _gathering(len(reader), idx, reader.gather_ragged, self._dtype)

    def _gather_one(self, reader: _native.ReaderHandle, i: int) -> np.ndarray:
        return reader.gather_ragged(np.array([i], dtype=np.int64), self._dtype)[0]
