"""Opening, describing and verifying stores: :func:`open_store`, :func:`info`
and :func:`verify`."""

from __future__ import annotations

import dataclasses
import math
import os
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from loaderx import _sidecar
from loaderx._progress import ProgressArg, make_progress
from loaderx.tools._common import _CHUNK_BYTES, _MAX_CHUNK_RECORDS, NotAStoreError, PathLike
from loaderx.zrecord import Dense, Ragged, StorageOptions, ZrecordError, _is_url, _open_any

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
        p = pathlib.Path(text[len("file://") :] if text.startswith("file://") else text)
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file or directory")
        if not p.is_dir():
            raise NotAStoreError(f"{p} is a file, not a store directory")
        if not (p / "meta.zr").is_file() and not (p / "manifest.json").is_file():
            inner = _store_dirs_below(p)
            hint = ""
            if inner:
                shown = ", ".join(inner[:5]) + (", ..." if len(inner) > 5 else "")
                hint = (
                    f"; it holds stores ({shown}) but no manifest.json: pass those paths "
                    "instead, or it is a store set whose writer never closed"
                )
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
    return store._require_reader().logical_sizes(start, stop)


def _logical_bytes(store: Dense | Ragged) -> int:
    n = len(store)
    if isinstance(store, Dense):
        return n * math.prod(store.item_shape) * store.dtype.itemsize
    total = 0
    step = 1 << 20
    for start in range(0, n, step):
        total += int(_logic_lengths(store, start, min(n, start + step)).sum())
    return total


def _features(store: Dense | Ragged) -> dict[str, Any] | None:
    try:
        return store.features
    except _sidecar.SidecarError as e:  # a damaged sidecar does not hide the store
        return {"error": str(e)}


def _describe(store: Dense | Ragged) -> dict[str, Any]:
    logical = _logical_bytes(store)
    disk = store._require_reader().disk_bytes
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
        "features": _features(store),
    }


def info(path: PathLike, storage_options: StorageOptions | None = None) -> dict[str, Any]:
    """Describes the store or store set at ``path`` (local, or an object-storage URL).

    Returns a JSON-ready dict: ``path``, ``kind`` (``"Dense"``/``"Ragged"``),
    ``shards`` (the shard count of a store set, 0 for a plain store),
    ``dtype``, ``item_shape`` (a list; None for Ragged), ``codec``,
    ``records``, ``logical_bytes`` (the records' uncompressed sizes as
    stored; a Ragged record counts its shape prefix too), ``disk_bytes``
    (every file of every shard: meta.zr, data.zr, dict.zr, sums.zr), ``ratio`` (logical / on
    disk), ``dict_bytes`` (dictionary size, 0 without one) and ``features``
    (the ``features.json`` sidecar ``convert`` writes, as ``store.features``
    gives it: the source column, its type and Hugging Face feature, class
    names, what a record holds, and the codec choice with its measured ratio;
    None without one, ``{"error": ...}`` for a damaged one).
    """
    with open_store(path, storage_options) as store:
        return _describe(store)


def class_names(path: PathLike | Dense | Ragged) -> list[str] | None:
    """The class names of a store converted from a ``ClassLabel`` column
    (record value ``i`` means ``names[i]``), from its ``features.json``;
    None when the store has no sidecar or its column has no class names.
    ``path`` is a local store path or an opened store."""
    if isinstance(path, (Dense, Ragged)):
        fields = path.features
    else:
        text = os.fspath(path)
        p = pathlib.Path(text)
        if not _is_url(text) and not p.is_dir():
            raise FileNotFoundError(f"{p}: no such store directory")
        fields = _sidecar.read(text)
    names = (fields or {}).get("names")
    return list(names) if isinstance(names, list) else None


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
