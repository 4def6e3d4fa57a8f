"""JAX integration (``pip install 'loaderx[jax]'``): a DataLoader whose
batches arrive as global ``jax.Array`` s, sharded along the batch axis and
transferred to the devices ahead of use.

Example::

    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    from loaderx.jax import JaxLoader

    mesh = Mesh(jax.devices(), ("data",))
    with JaxLoader(streams, NamedSharding(mesh, P("data")), batch_size=1024) as loader:
        for batch in loader:            # {name: jax.Array of shape (1024, ...)}
            state = train_step(state, batch)

Every process runs the same code. Each one gathers only the rows of the
global batch that its own devices hold (``shard_index``/``shard_count`` of
the DataLoader, derived from the sharding) and
``jax.make_array_from_process_local_data`` assembles the global array.

JAX itself is imported only when a :class:`JaxLoader` is built, so importing
this module is free and works without JAX installed.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from loaderx import _validate
from loaderx.dataloader import DataLoader
from loaderx.zrecord import Dense, Ragged

if TYPE_CHECKING:
    from types import TracebackType

    from jax import Array
    from jax.sharding import Sharding
    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = ["JaxLoader", "batch_shard"]


def _import_jax() -> Any:
    """The ``jax`` module, or an ImportError that says how to install it."""
    try:
        import jax
    except ImportError as exc:
        raise ImportError(
            f"loaderx.jax needs JAX ({exc}); install it with: pip install 'loaderx[jax]'"
        ) from exc
    return jax


def batch_shard(sharding: Sharding) -> tuple[int, int, int]:
    """``(shard_index, shard_count, partitions)`` of this process under
    ``sharding``, for arrays whose axis 0 is the batch.

    ``partitions`` is how many distinct slices ``sharding`` cuts axis 0 into
    (the global batch must be divisible by it). Processes whose devices hold
    the same slices form a group (they replicate each other's data); there
    are ``shard_count`` groups, each holding ``1/shard_count`` of the batch,
    and this process belongs to group ``shard_index``: pass these two to
    :class:`~loaderx.dataloader.DataLoader`. With a mesh over
    ``jax.devices()`` sharded over every device along the batch axis, they
    are ``(jax.process_index(), jax.process_count())``.

    When every group's slices are contiguous (a mesh whose devices are
    grouped by process along the batch axis, as ``Mesh(jax.devices(), ...)``
    on CPU and GPU hosts), the global array holds the DataLoader's global
    batch in order. Otherwise (a mesh ordered by physical topology, as
    ``jax.make_mesh`` can build on TPU) it holds the same rows, each exactly
    once, in another order, which a mean over the batch does not see.

    Raises ValueError when this process has no device in ``sharding``, or
    processes hold overlapping but different slices (no DataLoader
    sharding fits such a layout).
    """
    jax = _import_jax()
    # Probe with every dimension the size of the device count: every tiling
    # factor divides it, so the map is valid whatever the real batch size,
    # and axis 0 is partitioned the same way whatever the rank, as long as
    # the rank covers the spec (only a NamedSharding has one).
    devices = len(sharding.device_set)
    rank = max(1, len(getattr(sharding, "spec", ()) or ()))
    index_map = sharding.devices_indices_map((devices,) * rank)
    starts: dict[Any, int] = {device: index[0].indices(devices)[0] for device, index in index_map.items()}
    ordered = sorted(set(starts.values()))
    partitions = len(ordered)
    held: dict[int, set[int]] = {}  # process -> the partitions its devices hold
    for device, start in starts.items():
        held.setdefault(device.process_index, set()).add(ordered.index(start))
    me = jax.process_index()
    if me not in held:
        raise ValueError(
            f"the sharding {sharding} places no data on process {me} of {jax.process_count()}: "
            "it has none of its devices"
        )
    groups = sorted({tuple(sorted(parts)) for parts in held.values()})
    if sum(map(len, groups)) != partitions or len({len(g) for g in groups}) != 1:
        raise ValueError(
            f"the sharding {sharding} gives processes overlapping but different slices of the "
            f"batch axis (partitions per group of processes: {groups}); one DataLoader slice per "
            "process cannot fill it: shard the batch axis over whole processes"
        )
    return groups.index(tuple(sorted(held[me]))), len(groups), partitions


class _Failure:
    """An exception raised while preparing a batch, delivered in its turn."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class JaxLoader:
    """Iterator of ``{name: jax.Array}`` batches: global arrays of shape
    ``(global_batch, *item_shape)`` sharded over ``sharding`` along axis 0,
    put on the devices ``prefetch`` batches ahead of the one you hold.

    ``loader``: a :class:`~loaderx.dataloader.DataLoader`, or a dict
    ``{name: opened Dense/Ragged}`` from which one is built with
    ``dataloader_kwargs`` (``batch_size`` is the global batch). Unless given,
    ``shard_index``/``shard_count`` come from the sharding (see
    :func:`batch_shard`; normally ``jax.process_index()`` of
    ``jax.process_count()``); given ones, or those of a given DataLoader, must
    match it, since any other slice would silently put wrong rows in the
    global array. The JaxLoader owns the DataLoader: ``close()`` closes it.

    ``sharding``: a ``jax.sharding.Sharding`` (e.g. ``NamedSharding(mesh,
    P("data"))``) for every stream, or a dict ``{name: Sharding}`` naming
    one per value of the batch. All of them must give this process the same
    slice of the batch.

    Every value of a batch (after the DataLoader's ``transform``) must be a
    NumPy array with a batch axis; it is passed to JAX as is (no host copy
    here), so bfloat16, float8 and int4 stores (ml-dtypes) arrive as the same
    JAX dtype. 64-bit values become 32-bit unless ``jax_enable_x64`` is on,
    as for any NumPy input to JAX. Ragged streams (lists of arrays) and
    packed ones are refused with a TypeError: pad them to a fixed shape in a
    ``transform``.

    ``prefetch``: batches whose host-to-device transfer is issued before the
    current one is handed out (JAX transfers asynchronously, so they overlap
    your step); 0 transfers each batch when it is asked for.

    ``step``, ``state_dict()`` and ``load_state_dict()`` count the batches
    *you* received, not those prefetched: saving ``state_dict()`` with a
    checkpoint and passing it to a new JaxLoader resumes at the very next
    batch.
    """

    def __init__(
        self,
        loader: DataLoader | Mapping[str, Dense | Ragged],
        sharding: Sharding | Mapping[str, Sharding],
        *,
        prefetch: int = 2,
        **dataloader_kwargs: Any,
    ) -> None:
        self._closed = True  # until fully built, so close() is safe
        self._jax = jax = _import_jax()
        message = "{name} must be an int >= 0, got {value!r}"
        prefetch = _validate.bounded(
            "prefetch", prefetch, 0, type_message=message, range_message=message, type_error=ValueError
        )
        self._prefetch = prefetch
        if isinstance(sharding, jax.sharding.Sharding):
            self._sharding: Sharding | None = sharding
            self._shardings: dict[str, Sharding] = {}
        elif isinstance(sharding, Mapping) and sharding:
            for name, s in sharding.items():
                if not isinstance(s, jax.sharding.Sharding):
                    raise TypeError(
                        f"sharding[{name!r}] is a {type(s).__name__}, not a jax.sharding.Sharding"
                    )
            self._sharding = None
            self._shardings = dict(sharding)
        else:
            raise TypeError(
                "sharding must be a jax.sharding.Sharding or a non-empty dict {name: Sharding}, "
                f"got {type(sharding).__name__}"
            )
        shard_index, shard_count, self._partitions = self._shard_of_process()
        if isinstance(loader, DataLoader):
            if dataloader_kwargs:
                raise TypeError(
                    f"DataLoader arguments {sorted(dataloader_kwargs)} apply only when "
                    "JaxLoader builds the DataLoader from a dict of streams"
                )
            given = (loader._shard_index, loader._shard_count)
            what = "the DataLoader has"
        elif isinstance(loader, Mapping):
            given = (
                dataloader_kwargs.setdefault("shard_index", shard_index),
                dataloader_kwargs.setdefault("shard_count", shard_count),
            )
            what = "you gave"
        else:
            raise TypeError(
                "loader must be a DataLoader or a dict of opened Dense/Ragged stores, "
                f"got {type(loader).__name__}"
            )
        if tuple(given) != (shard_index, shard_count):
            raise ValueError(
                f"{what} shard_index={given[0]}, shard_count={given[1]}, but the sharding puts "
                f"slice {shard_index} of {shard_count} of the global batch on this process "
                f"(process {jax.process_index()} of jax.process_count()={jax.process_count()}): "
                f"use shard_index={shard_index}, shard_count={shard_count}, or leave them out "
                "and let JaxLoader derive them"
            )
        if not isinstance(loader, DataLoader):
            loader = DataLoader(loader, **dataloader_kwargs)
            try:
                self._check_layout(loader)
            except BaseException:
                loader.close()  # ours: nobody else can close it
                raise
        else:
            self._check_layout(loader)
        self._loader = loader
        self._shard_index, self._shard_count = shard_index, shard_count
        # Batches put on the devices (or a _Failure), in step order.
        self._queue: collections.deque[dict[str, Array] | _Failure] = collections.deque()
        self._ended = False  # the DataLoader stopped or failed: queue nothing more
        self._step = loader.step  # the next batch the *user* receives
        self._closed = False

    # -- setup --------------------------------------------------------------
    def _shard_of_process(self) -> tuple[int, int, dict[str | None, int]]:
        shardings = {None: self._sharding} if self._sharding is not None else self._shardings
        found = {name: batch_shard(s) for name, s in shardings.items()}
        slices = {name: (index, count) for name, (index, count, _) in found.items()}
        if len(set(slices.values())) > 1:
            raise ValueError(
                "the shardings give this process different slices of the batch "
                f"(name: (shard_index, shard_count)): {slices}; one DataLoader gathers one slice"
            )
        index, count = next(iter(slices.values()))
        return index, count, {name: parts for name, (_, _, parts) in found.items()}

    def _check_layout(self, loader: DataLoader) -> None:
        # Without a transform the batch's names and sizes are known now, so
        # report a bad fit here rather than at the first batch.
        if loader._transform is not None:
            return
        if self._shardings:
            missing = [name for name in loader._names if name not in self._shardings]
            if missing:
                raise ValueError(f"sharding has no entry for the streams {missing}")
        for name in loader._names:
            if isinstance(loader._streams[name], Ragged):
                raise TypeError(self._ragged_message(name))
            self._check_rows(name, loader.batch_size)

    def _check_rows(self, name: str, rows: int) -> None:
        parts = self._partitions[None if self._sharding is not None else name]
        if rows % parts:
            raise ValueError(
                f"stream {name!r}: the global batch of {rows} rows cannot be split evenly over the "
                f"{parts} devices (or device groups) its sharding divides the batch axis into; "
                f"use a batch_size that is a multiple of {parts}"
            )

    @staticmethod
    def _ragged_message(name: str) -> str:
        return (
            f"stream {name!r} gives variable-shape records (a Ragged stream: a list of arrays, "
            "or a packed tuple), which cannot be a jax.Array: pad or crop its records to a fixed "
            "shape in the DataLoader's transform (e.g. to a (batch, max_len) array plus a length or mask "
            "array), or store it as a Dense stream"
        )

    # -- batches ------------------------------------------------------------
    def _sharding_for(self, name: str) -> Sharding:
        if self._sharding is not None:
            return self._sharding
        try:
            return self._shardings[name]
        except KeyError:
            raise ValueError(
                f"sharding has no entry for the batch value {name!r} (it names {sorted(self._shardings)})"
            ) from None

    def _put(self, batch: Any) -> dict[str, Array]:
        """The global arrays of one batch; their transfers start now, and
        ``make_array_from_process_local_data`` returns without waiting."""
        if not isinstance(batch, Mapping):
            raise TypeError(
                "the DataLoader's transform must return a dict of arrays for JaxLoader, "
                f"got {type(batch).__name__}"
            )
        out: dict[str, Array] = {}
        for name, value in batch.items():
            if not isinstance(value, np.ndarray):
                if isinstance(value, (list, tuple)):
                    raise TypeError(self._ragged_message(name))
                raise TypeError(
                    f"stream {name!r} has type {type(value).__name__}; JaxLoader takes NumPy arrays "
                    "with a batch axis"
                )
            if value.ndim == 0:
                raise TypeError(f"stream {name!r} is a 0-d array; JaxLoader needs a batch axis")
            sharding = self._sharding_for(name)
            global_rows = value.shape[0] * self._shard_count
            self._check_rows(name, global_rows)
            try:
                # The DataLoader's arrays are C-contiguous and owned by us:
                # passed as they are, JAX slices them per device with no
                # copy on our side.
                out[name] = self._jax.make_array_from_process_local_data(
                    sharding, value, (global_rows, *value.shape[1:])
                )
            except Exception as exc:
                if hasattr(exc, "add_note"):  # Python 3.11+
                    exc.add_note(f"(loaderx.jax: stream {name!r}, local shape {value.shape}, {value.dtype})")
                raise
        return out

    def _fill(self, target: int) -> None:
        # Any failure becomes a queue entry, so batches before it are still
        # handed out in order and the error surfaces at its own step.
        while len(self._queue) < target and not self._ended:
            try:
                batch = next(self._loader)
            except StopIteration:
                self._ended = True
                return
            except Exception as exc:
                self._queue.append(_Failure(exc))
                self._ended = True
                return
            try:
                self._queue.append(self._put(batch))
            except Exception as exc:
                self._queue.append(_Failure(exc))
                self._ended = True
            del batch  # release the host arrays once JAX holds them

    def __iter__(self) -> JaxLoader:
        return self

    def __next__(self) -> dict[str, Array]:
        if self._closed:
            raise StopIteration
        # Queue the next `prefetch` batches before handing this one out, so
        # their transfers run while the caller computes on it. Filling before
        # popping keeps the queue intact if an interrupt lands in the fill.
        self._fill(self._prefetch + 1)
        if not self._queue:
            self.close()
            raise StopIteration
        item = self._queue.popleft()
        if isinstance(item, _Failure):
            self.close()
            raise item.error
        self._step += 1
        return item

    def __len__(self) -> int:
        """Steps of a finite pass (``DataLoader(..., epochs=N)``); an endless
        loader has no len(): TypeError, as the DataLoader's."""
        return len(self._loader)

    # -- state --------------------------------------------------------------
    @property
    def step(self) -> int:
        """Number of the next batch you will receive (batches already put
        on the devices ahead of time do not count)."""
        return self._step

    @property
    def loader(self) -> DataLoader:
        """The DataLoader underneath (it runs ahead by the prefetched batches)."""
        return self._loader

    @property
    def shard_index(self) -> int:
        """Which slice of the global batch this process gathers."""
        return self._shard_index

    @property
    def shard_count(self) -> int:
        """How many slices the global batch is cut into across processes."""
        return self._shard_count

    def state_dict(self) -> dict[str, int]:
        """``{"step": ...}``, the next batch you will receive: resuming from
        it (``load_state_dict``, or a new JaxLoader over a DataLoader with
        ``start_step``) yields exactly that batch next."""
        return {"step": self._step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Drops the prefetched batches and repositions the loader so the
        next batch is ``state["step"]`` (also restarts a closed loader)."""
        self._queue.clear()
        self._loader.load_state_dict(state)
        self._step = self._loader.step
        self._ended = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------
    def close(self) -> None:
        """Stops the DataLoader and drops the prefetched batches. Safe to
        call twice; the streams stay open (they are yours)."""
        self._closed = True
        queue = getattr(self, "_queue", None)
        if queue is not None:
            queue.clear()
        loader = getattr(self, "_loader", None)
        if loader is not None:
            loader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        sharding = self._sharding if self._sharding is not None else self._shardings
        return (
            f"JaxLoader(step={self._step}, prefetch={self._prefetch}, "
            f"shard={self._shard_index}/{self._shard_count}, sharding={sharding}"
            f"{', closed' if self._closed else ''})"
        )
