"""What the converters share: the errors, chunk sizes, the output layout and
the checks and helpers every source uses."""

from __future__ import annotations

import contextvars
import dataclasses
import os
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from loaderx.utils import train_dict
from loaderx.zrecord import ZrecordError, _check_dtype

PathLike = str | os.PathLike[str]

#: Install hint for the optional dependencies of :func:`convert`.
EXTRA_HINT = "pip install 'loaderx[convert]'"

_MiB = 1 << 20
_CHUNK_BYTES = 32 * _MiB  # a conversion or verification chunk holds about this much data
_MAX_CHUNK_RECORDS = 65536


class _SetLayout(TypedDict, total=False):
    """The store-set keywords of ``Dense.create`` / ``Ragged.create``, and
    the compression level."""

    shard_records: int
    shard_bytes: int
    level: int


#: Keyword arguments every store a conversion creates gets (the set layout):
#: a context variable, so each converter builds its stores alike without the
#: layout threaded through every helper's signature.
_LAYOUT: contextvars.ContextVar[_SetLayout] = contextvars.ContextVar("_LAYOUT")


def _set_layout(codec: str) -> _SetLayout:
    """The create keywords of the conversion under way for a store of
    ``codec`` (none outside one): a raw store takes no level."""
    layout = _LAYOUT.get({})
    if codec == "raw" and "level" in layout:
        layout = {k: v for k, v in layout.items() if k != "level"}  # type: ignore[assignment]
    return layout


@dataclasses.dataclass(frozen=True)
class _DecodeSpec:
    """Which columns of encoded images a conversion decodes, and to what mode."""

    names: frozenset[str] | None  # None: every Hugging Face Image() column
    mode: str


#: The image decoding of the conversion under way (None: none), a context
#: variable like ``_LAYOUT``.
_DECODE: contextvars.ContextVar[_DecodeSpec | None] = contextvars.ContextVar("_DECODE")


def _decode_spec() -> _DecodeSpec | None:
    return _DECODE.get(None)


class NotAStoreError(ValueError):
    """A path exists but is not a Zrecord store directory."""


class ConvertError(ValueError):
    """The conversion source cannot be turned into stores as asked."""


class UnsupportedColumnError(ConvertError):
    """A selected column (or array) has a type no store can hold."""


class MissingExtraError(ImportError):
    """An optional dependency (the ``convert`` extra) is not installed."""


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
    names = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else [str(c) for c in columns]
    names = [c for c in names if c]
    if not names:
        raise ValueError("columns selects nothing")
    if len(set(names)) != len(names):
        raise ValueError(f"columns lists a name twice: {names}")
    return names


def _empty_record_error(what: str, row: int) -> UnsupportedColumnError:
    return UnsupportedColumnError(
        f"unsupported column type: {what} row {row} is empty (0 bytes); a Ragged store cannot "
        "hold zero-byte records: drop or fill such rows first"
    )


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
            self.paths: dict[str | None, pathlib.Path] = {None: dst}
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
