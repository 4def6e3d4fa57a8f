"""The converter: :func:`convert` (the dispatcher over every source),
:func:`upload`, and the NumPy (``.npy``, ``.npz``, arrays) and store sources.
The Arrow sources are in :mod:`loaderx.tools.arrow`."""

from __future__ import annotations

import functools
import math
import os
import pathlib
import tempfile
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from loaderx import _native, _sidecar, _validate
from loaderx._progress import ProgressArg, make_progress
from loaderx.tools import _codec
from loaderx.tools._common import (
    _DECODE,
    _LAYOUT,
    ConvertError,
    PathLike,
    UnsupportedColumnError,
    _check_name,
    _decode_spec,
    _DecodeSpec,
    _empty_record_error,
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

#: The codecs ``convert`` takes: a store's, or ``"auto"`` (chosen per store by measuring).
CONVERT_CODECS = ("auto", *CODECS)

# ---------------------------------------------------------------------------
# convert: NumPy sources (.npy, .npz, arrays) and stores
# ---------------------------------------------------------------------------

#: A block of records: rows of an ndarray (Dense) or a list of arrays (Ragged).
_Block = np.ndarray | list[np.ndarray]


def _write_blocks(
    target: pathlib.Path,
    dtype: np.dtype,
    item_shape: tuple[int, ...] | None,
    total: int,
    blocks: Callable[[], Iterator[_Block]],
    codec: str,
    tier: str,
    what: str,
    progress: ProgressArg,
    fields: dict[str, Any],
    source: np.ndarray | None = None,
) -> None:
    """Writes ``total`` records, produced in blocks by ``blocks()``, to a new
    store at ``target``: Dense of ``item_shape`` (blocks are ndarrays of rows),
    or Ragged when ``item_shape`` is None (blocks are lists of arrays). Codec
    ``auto`` measures the codecs on an evenly spread sample first; zstd_dict
    trains its dictionary first. Both sample ``source`` (all the records as one
    array) when given, else a pass over ``blocks()``. Then the sidecar,
    with ``fields``, is written."""
    choice = _codec.given(codec)
    blob = None
    if codec in ("auto", "zstd_dict"):
        if total == 0 and codec == "zstd_dict":
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        budget = DICT_TIERS[tier]["samples"]
        dict_source: Any
        if source is not None:
            sample = list(source[_codec.spread_indices(total)]) if total else []
            dict_source = source  # train_dict samples an array itself, within the tier's budget
        else:
            spread = _codec.SpreadSample()
            for_dict = _codec.SpreadSample(_codec.DICT_SAMPLE_RECORDS, budget)
            meter = make_progress(progress, total, f"sample {what}")
            try:
                for block in blocks():
                    spread.push(block)
                    for_dict.push(block)
                    meter.update(len(block))
            finally:
                meter.close()
            sample = spread.records
            kept = for_dict.records
            dict_source = np.stack(kept) if item_shape is not None and kept else kept
        if codec == "auto":
            choice, blob = _codec.choose(
                sample, total, dtype, item_shape, tier, lambda: _train(dict_source, tier, what)
            )
            codec = choice["chosen"]
        if codec == "zstd_dict" and blob is None:
            blob = _train(dict_source, tier, what)
    try:
        if item_shape is not None:
            writer: Dense | Ragged = Dense.create(
                target, dtype, item_shape, codec=codec, dict_bytes=blob, **_set_layout(codec)
            )
        else:
            writer = Ragged.create(target, dtype, codec=codec, dict_bytes=blob, **_set_layout(codec))
    except ValueError as e:
        raise UnsupportedColumnError(f"unsupported column type: {what}: {e}") from None
    meter = make_progress(progress, total, f"convert {what}")
    try:
        with writer:
            for block in blocks():
                if len(block):
                    writer.append(block)  # type: ignore[arg-type]
                    meter.update(len(block))
    finally:
        meter.close()
    _codec.finish(target, choice, fields, what)


def _array_chunks(arr: np.ndarray, rows: int) -> Callable[[], Iterator[np.ndarray]]:
    def gen() -> Iterator[np.ndarray]:
        if arr.ndim == 0:
            yield np.asarray(arr).reshape(1)
            return
        for a in range(0, arr.shape[0], rows):
            yield arr[a : a + rows]

    return gen


def _is_text_dtype(dt: np.dtype, ndim: int) -> bool:
    """Whether an array of ``dt`` holds one byte string or text per row:
    ``S``/``U`` (one string a row, or a single one) and object arrays."""
    return dt.hasobject or (dt.kind in "SU" and ndim <= 1)


def _text_records(block: np.ndarray, what: str, row0: int) -> list[np.ndarray]:
    """The rows of a 1-D ``S``, ``U`` or object array as uint8 arrays of their
    bytes (``S``: as NumPy gives them, without trailing NULs; ``U`` and
    ``str`` objects: UTF-8; ``bytes`` objects: untouched)."""
    out = []
    for i, x in enumerate(block.tolist()):
        if isinstance(x, str):
            data = x.encode("utf-8")
        elif isinstance(x, (bytes, bytearray, memoryview)):
            data = bytes(x)
        else:
            raise UnsupportedColumnError(
                f"unsupported column type: {what} row {row0 + i} is a {type(x).__name__}; an object "
                "array converts when every row is bytes or str"
            )
        if not data:
            raise _empty_record_error(what, row0 + i)
        out.append(np.frombuffer(data, dtype=np.uint8))
    return out


def _text_fields(dt: np.dtype, content: str, column: str | None) -> dict[str, Any]:
    return {"column": column, "source_type": dt.str, "feature": None, "names": None, "content": content}


def _object_content(arr: np.ndarray) -> str:
    kinds = {type(x) for x in arr.reshape(-1).tolist()}
    return "text" if kinds and kinds <= {str} else "bytes"


def _write_text(
    dtype: np.dtype,
    blocks: Callable[[int], Iterator[np.ndarray]],
    total: int,
    target: pathlib.Path,
    codec: str,
    tier: str,
    chunk_records: int | None,
    what: str,
    progress: ProgressArg,
    column: str | None,
    content: str,
) -> None:
    rows = _rows_per_chunk(chunk_records, max(1, dtype.itemsize))

    def gen() -> Iterator[list[np.ndarray]]:
        row0 = 0
        for block in blocks(rows):
            yield _text_records(block.reshape(-1), what, row0)
            row0 += block.size

    fields = _text_fields(dtype, content, column)
    _write_blocks(target, np.dtype(np.uint8), None, total, gen, codec, tier, what, progress, fields)


def _numeric_fields(dt: np.dtype, column: str | None) -> dict[str, Any]:
    return {"column": column, "source_type": dt.str, "feature": None, "names": None, "content": "values"}


def _convert_ndarray(
    arr: np.ndarray,
    target: pathlib.Path,
    codec: str,
    tier: str,
    chunk_records: int | None,
    what: str,
    progress: ProgressArg,
) -> None:
    if _is_text_dtype(arr.dtype, arr.ndim):
        if arr.ndim > 1:
            raise UnsupportedColumnError(
                f"unsupported column type: {what} is an object array of {arr.ndim} dimensions; "
                "one of bytes or str objects a row (1-D) converts"
            )
        flat = arr.reshape(-1)
        content = (
            _object_content(flat) if arr.dtype.hasobject else ("text" if arr.dtype.kind == "U" else "bytes")
        )
        _write_text(
            arr.dtype,
            lambda rows: (flat[a : a + rows] for a in range(0, flat.shape[0], rows)),
            flat.shape[0],
            target,
            codec,
            tier,
            chunk_records,
            what,
            progress,
            None,
            content,
        )
        return
    dtype = _store_dtype(arr.dtype, what)
    item_shape = tuple(arr.shape[1:])
    total = 1 if arr.ndim == 0 else arr.shape[0]
    rows = _rows_per_chunk(chunk_records, math.prod(item_shape) * dtype.itemsize)
    whole = arr.reshape(1) if arr.ndim == 0 else arr
    _write_blocks(
        target,
        dtype,
        item_shape,
        total,
        _array_chunks(arr, rows),
        codec,
        tier,
        what,
        progress,
        _numeric_fields(arr.dtype, None),
        whole,
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
            if not _is_text_dtype(m.dtype, len(m.shape)):
                _store_dtype(m.dtype, f"array {name!r}")
            if key is None:
                _check_name(name, "array")
            arrays[name] = m
        targets = _Targets(dst, None if key is not None else names)
        out = {}
        try:
            for name, m in arrays.items():
                target = targets.prepare(targets.paths[None if key is not None else name])
                what = f"array {name!r}"
                total = 1 if len(m.shape) == 0 else m.shape[0]
                if _is_text_dtype(m.dtype, len(m.shape)):
                    content = "text" if m.dtype.kind == "U" else "bytes"
                    _write_text(
                        m.dtype,
                        m.chunks,
                        total,
                        target,
                        codec,
                        tier,
                        chunk_records,
                        what,
                        progress,
                        name,
                        content,
                    )
                    out[name] = target
                    continue
                item = m.shape[1:]
                rows = _rows_per_chunk(chunk_records, math.prod(item) * m.dtype.itemsize)
                dtype = _store_dtype(m.dtype, what)
                _write_blocks(
                    target,
                    dtype,
                    tuple(item),
                    total,
                    functools.partial(m.chunks, rows),
                    codec,
                    tier,
                    what,
                    progress,
                    _numeric_fields(m.dtype, name),
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
    choice = _codec.given(codec)
    if codec == "auto":
        picked = src[_codec.spread_indices(n)] if n else []
        item_shape = src.item_shape if isinstance(src, Dense) else None
        choice, blob = _codec.choose(
            list(picked), n, src.dtype, item_shape, tier, lambda: _train(src, tier, what)
        )
        codec = choice["chosen"]
    if codec == "zstd_dict" and blob is None:
        if n == 0:
            raise ConvertError(f"{what} has no records to train a zstd dictionary on")
        blob = _train(src, tier, what)
    if isinstance(src, Dense):
        writer: Dense | Ragged = Dense.create(
            target, src.dtype, src.item_shape, codec=codec, dict_bytes=blob, **_set_layout(codec)
        )
    else:
        writer = Ragged.create(target, src.dtype, codec=codec, dict_bytes=blob, **_set_layout(codec))
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
    # The source's own sidecar travels with its records (its class names
    # still name them); a store without one is described as values.
    fields = {k: v for k, v in (src.features or {}).items() if k != "codec"}
    if not fields:
        fields = {"column": None, "source_type": None, "feature": None, "names": None, "content": "values"}
    _codec.finish(target, choice, fields, what)


def _module_root(obj: Any) -> str:
    return type(obj).__module__.split(".", 1)[0]


def convert(
    src: Any,
    dst: PathLike,
    codec: str = "auto",
    tier: str = "balanced",
    key: str | None = None,
    columns: str | Sequence[str] | None = None,
    chunk_records: int | None = None,
    progress: ProgressArg = None,
    *,
    shard_records: int | None = None,
    shard_bytes: int | None = None,
    storage_options: StorageOptions | None = None,
    decode_images: bool | str | Sequence[str] = False,
    image_mode: str = "RGB",
    level: int | None = None,
) -> dict[str, Any]:
    """Builds stores from ``src`` and returns ``{name: store path}``.

    ``src`` is a path or an object:

    * ``.npy``: one store at ``dst`` (memory-mapped, written in chunks, so
      files larger than memory convert): Dense, except a 1-D ``S``/``U``
      array (one string a row), which becomes a Ragged uint8 store of each
      row's bytes (UTF-8 for ``U``).
    * ``.npz``: one store per array at ``dst/<array name>``, as for ``.npy``;
      ``key`` picks one array and writes it to ``dst`` itself.
    * ``.parquet``, ``.arrow``/``.feather``/``.ipc`` (Arrow IPC), a directory
      saved by ``datasets`` ``save_to_disk``, a ``datasets.Dataset``, or a
      ``pyarrow.Table``: one store per column at ``dst/<column>``, all with
      the same number of records (``key`` writes one column to ``dst``). A
      ``DatasetDict`` gives ``dst/<split>/<column>`` (``key`` picks a split).
      Numeric scalar columns and lists whose rows all have one shape become
      Dense stores; variable-length (nested) lists become Ragged stores, each
      record an array of its row's exact shape. Binary and string columns,
      and Hugging Face ``Image()``/``Audio()`` columns, become Ragged uint8
      stores holding each row's bytes untouched (the encoded file; UTF-8 for
      text). Structs, nulls, empty byte rows and other types raise
      :class:`UnsupportedColumnError` naming the column, unless ``columns``
      leaves them out.
    * a NumPy array: one Dense store at ``dst`` (a 1-D ``S``/``U`` array, or
      an object array of ``bytes``/``str``, a Ragged uint8 store of the bytes).
    * a store directory (or an opened store): a copy at ``dst`` re-encoded
      with ``codec`` (its ``features.json`` is carried over).

    ``codec`` is ``"auto"`` (default), ``"raw"``, ``"zstd"`` or
    ``"zstd_dict"``. ``auto`` measures each store's codecs on an evenly
    spread sample of its records (see :mod:`loaderx.tools._codec`): raw
    unless compression makes the store at least 10% smaller, zstd_dict only
    where its dictionary beats zstd by 10%, and never a store bigger than raw
    would be. For ``zstd_dict`` each store trains its own dictionary (``tier``,
    see ``DICT_TIERS``) on an evenly spread sample of its data first.
    ``columns`` (a list or a comma-separated string) selects columns or
    arrays. ``chunk_records`` bounds the records written per append (default:
    about 32 MiB of data). ``progress``: True draws a progress line on stderr
    when it is a terminal; a callable is called as ``progress(done, total)``.
    ``shard_records`` / ``shard_bytes`` make every output a store set of
    shards of that many records / payload bytes (see
    :meth:`loaderx.zrecord.Dense.create`); a store set is accepted as ``src``
    like a store. ``level`` is the zstd level of every compressed store's
    frames (default: the codec's, 3 for ``zstd`` and 19 for ``zstd_dict``;
    see :meth:`loaderx.zrecord.Dense.create`); ``auto`` measures at it, and
    a store it leaves raw ignores it.

    ``decode_images`` (Parquet, Arrow and ``datasets`` sources): True decodes
    every Hugging Face ``Image()`` column, a list (or comma-separated string)
    names the columns of encoded images to decode; each record is then the
    image decoded by Pillow as a uint8 ``(H, W, C)`` array in ``image_mode``
    (``"RGB"``, ``"L"``, ``"RGBA"``...). Needs ``pip install
    'loaderx[images]'``. Without it images stay encoded; decode them in the
    loader with :func:`loaderx.tools.decode_images`.

    Every store gets a ``features.json`` sidecar (docs/format.md): the source
    column's type, its Hugging Face feature with a ``ClassLabel``'s names,
    what a record holds, and how the codec was chosen; read it with
    ``store.features`` or :func:`loaderx.tools.class_names`, see it in
    ``info``. loaderx 2.0.0 opens the stores as usual.

    ``dst`` may be an object-storage URL (``storage_options`` configures
    access): the stores are built in a local staging folder
    (``$LOADERX_STAGING_DIR``, else the temporary directory) and uploaded
    when all of them are complete; the values returned are then URLs. The
    sidecars are not uploaded (a warning says so when they hold a Hugging
    Face feature or class names).

    Record order and values are kept exactly. Parquet/Arrow/datasets need the
    optional extra: ``pip install 'loaderx[convert]'`` (else
    :class:`MissingExtraError`). On failure, the directories this call
    created are removed.
    """
    if codec not in CONVERT_CODECS:
        raise ValueError(f"unknown codec {codec!r}: expected one of {', '.join(CONVERT_CODECS)}")
    if tier not in DICT_TIERS:
        raise ValueError(f"unknown dictionary tier {tier!r}: expected one of {', '.join(DICT_TIERS)}")
    if chunk_records is not None:
        chunk_records = _validate.bounded("chunk_records", chunk_records, 1)
    cols = _parse_columns(columns)
    args = (codec, tier)
    decode = _decode_arg(decode_images, image_mode)
    layout: _SetLayout = {}
    # auto may pick raw for some stores: those ignore the level (_set_layout).
    zstd_level = _check_level("zstd" if codec == "auto" else codec, level)
    if zstd_level is not None:
        layout["level"] = zstd_level
    if shard_records is not None:
        layout["shard_records"] = shard_records
    if shard_bytes is not None:
        layout["shard_bytes"] = shard_bytes
    token = _LAYOUT.set(layout)
    decode_token = _DECODE.set(decode)
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
            _warn_unpublished_sidecars(built)
            published: dict[str, Any] = {}
            for name, path in built.items():
                rel = pathlib.Path(path).relative_to(local).as_posix()
                url = target.rstrip("/") + ("" if rel == "." else f"/{rel}")
                upload(path, url, storage_options)
                published[name] = url
            return published
    finally:
        _DECODE.reset(decode_token)
        _LAYOUT.reset(token)


def _decode_arg(decode_images: bool | str | Sequence[str], image_mode: str) -> _DecodeSpec | None:
    if not isinstance(image_mode, str) or not image_mode:
        raise TypeError(f"image_mode must be a Pillow mode name such as 'RGB', got {image_mode!r}")
    if decode_images is False or decode_images is None:
        return None
    from loaderx.tools.images import _import_pil

    _import_pil("convert with decode_images")  # before anything is written
    if decode_images is True:
        return _DecodeSpec(None, image_mode)
    if not isinstance(decode_images, (str, list, tuple)):
        raise TypeError(f"decode_images must be True or column names, got {type(decode_images).__name__}")
    names = _parse_columns(decode_images)
    assert names is not None
    return _DecodeSpec(frozenset(names), image_mode)


def _warn_unpublished_sidecars(built: dict[str, pathlib.Path]) -> None:
    kept = []
    for name, path in built.items():
        fields = _sidecar.read(path) or {}
        if fields.get("feature") is not None or fields.get("names"):
            kept.append(name)
    if kept:
        warnings.warn(
            f"features.json (Hugging Face feature, class names) of {', '.join(kept)} is not uploaded "
            "to object storage: stores there carry no sidecar; convert to a local path to keep it",
            UserWarning,
            stacklevel=3,
        )


def upload(src: PathLike, url: str, storage_options: StorageOptions | None = None) -> None:
    """Copies the local store or store set ``src`` to the empty object-storage
    prefix ``url``, in commit order (each store's ``meta.zr`` last, a set's
    manifest after all its shards), after checking that ``src`` opens."""
    _native.upload(os.fspath(src), url, dict(storage_options) if storage_options else None)


def _is_numpy_path(src: Any) -> bool:
    if not isinstance(src, (str, os.PathLike)):
        return False
    p = pathlib.Path(src)
    return (
        p.suffix.lower() in (".npy", ".npz") or (p / "meta.zr").is_file() or (p / "manifest.json").is_file()
    )


def _convert(
    src: Any,
    dst: pathlib.Path,
    args: tuple[str, str],
    key: str | None,
    cols: list[str] | None,
    chunk_records: int | None,
    progress: ProgressArg,
) -> dict[str, pathlib.Path]:
    if _decode_spec() is not None and (isinstance(src, (Dense, Ragged, np.ndarray)) or _is_numpy_path(src)):
        raise ConvertError(
            "decode_images applies to columns of Parquet, Arrow and Hugging Face sources; "
            "decode NumPy or store records with loaderx.tools.decode_images in the loader"
        )
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
