"""Fixed-shape batches from Ragged streams: the ``pad=`` and ``pack=``
options of ``DataLoader`` (the work itself is native, ``loaderx::shape``).

See docs/shapes.md for the layouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from loaderx import _validate

__all__ = ["Pack", "Pad"]

_SIDES = ("right", "left")
_POLICIES = ("first_fit", "best_fit")
_I32_MAX = 2**31 - 1


def _count(name: str, value: Any, upper: int = _I32_MAX) -> int:
    return _validate.bounded(name, value, 1, upper, range_message="{name} must be in 1..{high}, got {value}")


@dataclass(frozen=True)
class Pad:
    """Pads (or truncates) every record of a Ragged stream to ``length``
    items along its first axis: the stream becomes one array
    ``[records, length, *rest]`` of the store's dtype.

    * ``value``: the pad item (converted to the store's dtype; it must be
      representable in it).
    * ``side``: ``"right"`` puts the padding after the items, ``"left"``
      before them.
    * ``truncate``: which items a record longer than ``length`` keeps:
      ``"right"`` (the default) drops its tail, keeping the first
      ``length``; ``"left"`` drops its head, keeping the last ``length``.
    * ``mask``: also give ``{name}_mask``, bool ``[records, length]``, True
      on the record's items.
    * ``lengths``: also give ``{name}_lengths``, int32 ``[records]``, the
      items kept (after truncation).
    """

    length: int
    value: Any = 0
    side: str = "right"
    truncate: str = "right"
    mask: bool = True
    lengths: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "length", _count("Pad length", self.length))
        for what in ("side", "truncate"):
            if getattr(self, what) not in _SIDES:
                raise ValueError(f"Pad {what} must be 'right' or 'left', got {getattr(self, what)!r}")
        for what in ("mask", "lengths"):
            if not isinstance(getattr(self, what), (bool, np.bool_)):
                raise TypeError(f"Pad {what} must be a bool, got {type(getattr(self, what)).__name__}")

    def outputs(self, name: str) -> list[str]:
        """The batch entries this padding gives stream ``name``, in order."""
        return [name] + [f"{name}_mask"] * bool(self.mask) + [f"{name}_lengths"] * bool(self.lengths)


@dataclass(frozen=True)
class Pack:
    """Packs the records of a Ragged stream whole into ``rows`` rows of
    ``max_tokens`` slots (along their first axis), for variable-length
    attention without recompiling: every batch has the same shapes.

    The stream becomes ``{name}`` ``[rows, max_tokens, *rest]`` (empty slots
    hold ``value``), plus int32 ``{name}_segment_ids`` ``[rows, max_tokens]``
    (1, 2, ... for the records of a row in slot order, 0 on padding),
    int32 ``{name}_positions`` ``[rows, max_tokens]`` (index of the item in
    its record, 0 on padding), int32 ``{name}_placement`` ``[records, 3]``
    (row, first slot, items placed of each record of the batch, in batch
    order; ``-1, -1, 0`` when dropped) and int32 ``{name}_dropped`` (0-d:
    records that found no room).

    * ``max_tokens``: slots per row; a longer record keeps its first
      ``max_tokens`` items.
    * ``rows``: rows per batch. ``None`` (the default) gives one row per
      record of this process's batch, which never drops a record but is
      mostly padding; choose about ``tokens per batch / max_tokens`` plus a
      margin for dense rows, and watch ``{name}_dropped``.
    * ``policy``: ``"first_fit"`` places records in batch order, each into
      the lowest row with room; ``"best_fit"`` places them longest first,
      each into the row with the least room that fits (fewer rows, records
      reordered within rows). Both are deterministic functions of the batch.
    * ``value``: the item empty slots hold.
    """

    max_tokens: int
    rows: int | None = None
    policy: str = "first_fit"
    value: Any = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "max_tokens", _count("Pack max_tokens", self.max_tokens))
        if self.rows is not None:
            object.__setattr__(self, "rows", _count("Pack rows", self.rows, 2**63 - 1))
        if self.policy not in _POLICIES:
            raise ValueError(f"Pack policy must be 'first_fit' or 'best_fit', got {self.policy!r}")

    def outputs(self, name: str) -> list[str]:
        """The batch entries this packing gives stream ``name``, in order."""
        return [name] + [f"{name}_{s}" for s in ("segment_ids", "positions", "placement", "dropped")]


def _item_bytes(name: str, value: Any, dtype: np.dtype) -> bytes:
    """One item of ``dtype`` holding ``value``, refusing values the dtype
    cannot represent (rather than letting them wrap)."""
    try:
        item = np.asarray(value)
        if item.ndim != 0:
            raise ValueError("it must be a scalar")
        cast = item.astype(dtype)
        if (
            dtype.kind in "biuf"
            and item.dtype.kind in "biuf"
            and cast.astype(item.dtype) != item
            and not (dtype.kind == "f" and np.isnan(item))
        ):
            raise ValueError(f"{dtype} cannot represent it")
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"stream {name!r}: pad value {value!r} does not fit dtype {dtype}: {e}") from None
    return cast.tobytes()


def _as_pad(name: str, spec: Any) -> Pad:
    if isinstance(spec, Pad):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return Pad(spec[0], spec[1])
    if hasattr(spec, "__index__") and not isinstance(spec, bool):
        return Pad(spec)
    raise TypeError(f"pad[{name!r}] must be a length, a (length, value) tuple or a Pad, got {spec!r}")


def _as_pack(name: str, spec: Any) -> Pack:
    if isinstance(spec, Pack):
        return spec
    if hasattr(spec, "__index__") and not isinstance(spec, bool):
        return Pack(spec)
    raise TypeError(f"pack[{name!r}] must be a max_tokens int or a Pack, got {spec!r}")


def resolve(
    streams: Mapping[str, Any],
    ragged: set[str],
    packed: set[str],
    pad: Mapping[str, Any] | None,
    pack: Mapping[str, Any] | None,
) -> tuple[list[Any] | None, list[Any] | None, list[str]]:
    """Checks ``pad=`` and ``pack=`` against the loader's streams; returns the
    per-stream native arguments (None when neither is used) and the names
    of the batch's entries, in the order the native loader gives them."""
    pads: dict[str, Pad] = {}
    packs: dict[str, Pack] = {}
    for arg, table in (("pad", pad), ("pack", pack)):
        if table is None:
            continue
        if not isinstance(table, Mapping):
            raise TypeError(f"{arg} must be a dict {{stream name: spec}}, got {type(table).__name__}")
        for name, spec in table.items():
            if name not in streams:
                raise ValueError(
                    f"{arg} names {name!r}, which is not a stream of this loader: {list(streams)}"
                )
            if name not in ragged:
                raise ValueError(
                    f"{arg} names {name!r}, a Dense stream: its records have a fixed shape already"
                )
            if name in packed:
                raise ValueError(
                    f"stream {name!r} is in both packed= and {arg}= (packed=True covers every Ragged "
                    "stream); choose one layout"
                )
            if arg == "pad":
                pads[name] = _as_pad(name, spec)
            else:
                packs[name] = _as_pack(name, spec)
    both = sorted(set(pads) & set(packs))
    if both:
        raise ValueError(f"streams {both} are in both pad= and pack=; choose one layout")
    names: list[str] = []
    owner: dict[str, str] = {}
    for name in streams:
        shaped = pads.get(name) or packs.get(name)
        outs = shaped.outputs(name) if shaped is not None else [name]
        for out in outs:
            clash = owner.get(out) or (out if out in streams and out != name else None)
            if clash is not None:
                raise ValueError(
                    f"the batch entry {out!r} would come from both stream {clash!r} and stream "
                    f"{name!r} (pad= and pack= add entries named after their stream); rename a stream"
                )
            owner[out] = name
        names.extend(outs)
    if not pads and not packs:
        return None, None, names
    native_pad = []
    native_pack = []
    for name, store in streams.items():
        dtype = np.dtype(store.dtype)
        p = pads.get(name)
        native_pad.append(
            None
            if p is None
            else (
                p.length,
                _item_bytes(name, p.value, dtype),
                p.side,
                p.truncate,
                bool(p.mask),
                bool(p.lengths),
            )
        )
        q = packs.get(name)
        native_pack.append(
            None if q is None else (q.max_tokens, q.rows, q.policy, _item_bytes(name, q.value, dtype))
        )
    return native_pad, native_pack, names
