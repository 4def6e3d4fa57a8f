"""PyTorch integration (the ``loaderx[torch]`` extra): batches as tensors,
on the device, from pinned memory, a step ahead of the training loop.

* :class:`TorchLoader` wraps a :class:`~loaderx.dataloader.DataLoader` (or
  builds one) and yields dicts of tensors. With ``device="cuda"`` it gathers
  Dense streams straight into page-locked host buffers that are allocated
  once and recycled, copies them to the device on a side stream
  ``prefetch`` batches ahead, and hands each batch over already on the
  device, ordered after its copy on the consumer's stream.
* :class:`IterableStreams` is a ``torch.utils.data.IterableDataset`` for code
  that insists on ``torch.utils.data.DataLoader`` (with ``batch_size=None``).
* :class:`StoreDataset` is a map-style dataset whose ``__getitems__``
  gathers a whole batch in one native call; use it with a batch sampler and
  ``collate_fn=loaderx.torch.collate``.

Tensors share memory with the arrays loaderx returns (no copy). Importing
this module imports torch; ``import loaderx`` alone never does.
"""

from __future__ import annotations

import collections
import math
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

try:
    import torch
except ImportError as e:  # pragma: no cover - exercised without torch only
    raise ImportError("loaderx.torch needs PyTorch: pip install 'loaderx[torch]'") from e

from loaderx import _native, _validate
from loaderx.dataloader import Batch, DataLoader, distributed_shard, identity
from loaderx.zrecord import Dense, Ragged, _Store
from loaderx.zsampler import Sampler

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = [
    "IterableStreams",
    "StoreDataset",
    "TorchLoader",
    "collate",
    "to_tensor",
    "to_tensors",
]

# NumPy dtypes torch.from_numpy cannot take, with the torch dtype of the same
# bits and a NumPy integer dtype of the same width to carry them across.
_ML_TO_TORCH = {
    "bfloat16": ("bfloat16", np.int16),
    "float8_e4m3fn": ("float8_e4m3fn", np.uint8),
    "float8_e4m3fnuz": ("float8_e4m3fnuz", np.uint8),
    "float8_e5m2": ("float8_e5m2", np.uint8),
    "float8_e5m2fnuz": ("float8_e5m2fnuz", np.uint8),
    "float8_e8m0fnu": ("float8_e8m0fnu", np.uint8),
}


def to_tensor(array: np.ndarray) -> torch.Tensor:
    """A CPU tensor sharing ``array``'s memory (no copy), for every dtype
    loaderx stores that torch has: NumPy's, and bfloat16 / float8 from
    ml-dtypes (viewed bit for bit). Raises TypeError for dtypes torch lacks
    (int4/uint4, strings, void)."""
    name = array.dtype.name
    if name in _ML_TO_TORCH:
        torch_name, carrier = _ML_TO_TORCH[name]
        torch_dtype = getattr(torch, torch_name, None)
        if torch_dtype is None:
            raise TypeError(f"this torch ({torch.__version__}) has no {torch_name} dtype")
        return torch.from_numpy(array.view(carrier)).view(torch_dtype)
    try:
        return torch.from_numpy(array)
    except TypeError:
        raise TypeError(f"torch has no dtype for {array.dtype} ({name}); convert it in a transform") from None


def to_tensors(value: Any) -> Any:
    """``value`` with every ndarray in it (in dicts, lists and tuples,
    recursively) replaced by a tensor sharing its memory; anything else is
    returned as it is."""
    if isinstance(value, np.ndarray):
        return to_tensor(value)
    if isinstance(value, dict):
        return {k: to_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_tensors(v) for v in value]
    if isinstance(value, tuple):
        return (
            type(value)(*map(to_tensors, value))
            if hasattr(value, "_fields")
            else tuple(map(to_tensors, value))
        )
    return value


def _to_device(value: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=non_blocking)
    if isinstance(value, dict):
        return {k: _to_device(v, device, non_blocking) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_device(v, device, non_blocking) for v in value]
    if isinstance(value, tuple):
        moved = (_to_device(v, device, non_blocking) for v in value)
        return type(value)(*moved) if hasattr(value, "_fields") else tuple(moved)
    return value


def _tensors_in(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors_in(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors_in(v)


def _accelerator_available() -> bool:
    return bool(torch.cuda.is_available())


def _warn_no_accelerator() -> None:
    # What torch.utils.data.DataLoader does in the same situation.
    warnings.warn(
        "pin_memory=True but no accelerator is available: batches are not pinned",
        UserWarning,
        stacklevel=3,
    )


class TorchLoader:
    """Batches of a :class:`~loaderx.dataloader.DataLoader` as dicts of
    tensors, optionally on ``device`` and from pinned memory.

    ``loader`` is a DataLoader or a dict of opened stores (then the
    remaining keyword arguments build the DataLoader; without
    ``shard_index``/``shard_count`` it reads this process's slice of each
    global batch, from :func:`~loaderx.dataloader.distributed_shard`). Dense streams become
    ``(batch, *item_shape)`` tensors, Ragged streams lists of tensors, packed
    streams ``(values, cu_seqlens, shapes)`` tuples of tensors; a
    ``transform``'s output is converted wherever it holds ndarrays.

    ``device``: where batches are delivered (default: CPU). For a CUDA
    device, ``pin_memory`` defaults to True: Dense streams are gathered
    straight into page-locked buffers, allocated once for every batch that
    can be alive at a time and recycled, then copied with
    ``non_blocking=True`` on a side CUDA stream ``prefetch`` batches ahead
    of the consumer. Each batch is handed over with the consumer's current
    stream made to wait for its copy, its tensors marked as used on that
    stream, and its host buffer kept out of the pool until the copy is
    done. Ragged and packed streams (their sizes vary) are copied from
    ordinary memory.

    ``pin_memory=True`` with a CPU device gives CPU tensors in pinned memory
    (for copies you issue yourself) when CUDA is available; with no
    accelerator it warns and does nothing, as torch's own DataLoader does.

    ``state_dict()`` / ``load_state_dict()`` follow torchdata's ``Stateful``
    protocol and count only batches handed to you, not those prefetched.
    """

    def __init__(
        self,
        loader: DataLoader | Mapping[str, Dense | Ragged],
        *,
        device: str | torch.device | None = None,
        pin_memory: bool | None = None,
        prefetch: int = 2,
        **loader_kwargs: Any,
    ) -> None:
        if isinstance(loader, DataLoader):
            if loader_kwargs:
                raise TypeError(
                    "DataLoader options "
                    f"({', '.join(sorted(loader_kwargs))}) only apply when TorchLoader builds the loader "
                    "from a dict of stores"
                )
            self._loader = loader
        elif isinstance(loader, Mapping):
            if "shard_index" not in loader_kwargs and "shard_count" not in loader_kwargs:
                # A DDP job that forgets to shard would feed every rank the
                # same records: take this process's slice unless told.
                rank, world = distributed_shard()
                loader_kwargs = {**loader_kwargs, "shard_index": rank, "shard_count": world}
            self._loader = DataLoader(loader, **loader_kwargs)
        else:
            raise TypeError(
                f"TorchLoader takes a DataLoader or a dict of opened stores, not {type(loader).__name__}"
            )
        message = "{name} must be an int of at least 1, got {value!r}"
        prefetch = _validate.bounded(
            "prefetch", prefetch, 1, type_message=message, range_message=message, type_error=ValueError
        )
        self._device = torch.device("cpu" if device is None else device)
        self._cuda = self._device.type == "cuda"
        if self._cuda and not _accelerator_available():
            raise RuntimeError(f"device {self._device} was asked for, but CUDA is not available")
        if pin_memory is None:
            pin_memory = self._cuda
        self._pinned = False
        if pin_memory:
            if _accelerator_available():
                self._lend_pinned(prefetch)
            else:
                _warn_no_accelerator()
        self._prefetch = prefetch
        # Batches already taken from the DataLoader and (on CUDA) being
        # copied: (device batch, copy-done event, host batch).
        self._ahead: collections.deque[tuple[Any, Any, Any]] = collections.deque()
        # Host batches whose device copy may still be running, with its event.
        self._copying: collections.deque[tuple[Any, Any]] = collections.deque()
        self._stream = torch.cuda.Stream(self._device) if self._cuda else None

    # -- pinned memory ------------------------------------------------------
    def _lend_pinned(self, prefetch: int) -> None:
        streams = self._loader._streams
        rows = self._loader.batch_size // self._loader._shard_count
        dense = [s for s in streams.values() if isinstance(s, Dense)]
        if not dense:
            return
        # Every Dense batch that can be alive at once gets a region: the
        # DataLoader's own bound, plus the batches prefetched to the device
        # and those whose copy may still run, plus one being converted.
        batches = self._loader._batches_alive() + 2 * prefetch + 1
        pool = _native.LentPool()
        for store in dense:
            nbytes = rows * math.prod(store.item_shape) * store.dtype.itemsize
            if nbytes == 0:
                continue
            for _ in range(batches):
                region = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                pool.lend(region.numpy())
        self._pool = pool
        self._pinned = True
        self._loader._lend(pool)

    def pinned_stats(self) -> dict[str, int] | None:
        """With pinned memory: ``{"lent": batches gathered into pinned
        buffers, "fallback": those that found none free (a consumer keeping
        more batches alive than the loader's bound), "free": buffers free
        now}``; else None."""
        if not self._pinned:
            return None
        lent, fallback, free = self._pool.stats()
        return {"lent": lent, "fallback": fallback, "free": free}

    # -- iteration ------------------------------------------------------------
    def __iter__(self) -> TorchLoader:
        return self

    def __next__(self) -> Any:
        if not self._cuda:
            batch = next(self._loader)
            return to_tensors(batch)
        self._fill()
        if not self._ahead:
            raise StopIteration
        on_device, copied, host = self._ahead.popleft()
        current = torch.cuda.current_stream(self._device)
        current.wait_event(copied)
        for t in _tensors_in(on_device):
            # Made on the side stream, used on this one: the caching
            # allocator must not hand the memory out again before this
            # stream is done with it.
            t.record_stream(current)
        self._copying.append((copied, host))
        self._release_copied()
        self._fill()
        return on_device

    def _fill(self) -> None:
        stream = self._stream
        assert stream is not None
        while len(self._ahead) < self._prefetch:
            try:
                host = to_tensors(next(self._loader))
            except StopIteration:
                return
            with torch.cuda.stream(stream):
                on_device = _to_device(host, self._device, non_blocking=True)
                copied = torch.cuda.Event()
                copied.record(stream)
            self._ahead.append((on_device, copied, host))

    def _release_copied(self) -> None:
        # A host batch (and the pinned buffer under it) may be recycled only
        # once its copy has finished; events complete in order.
        while self._copying and self._copying[0][0].query():
            self._copying.popleft()

    # -- state ----------------------------------------------------------------
    @property
    def step(self) -> int:
        """Number of the next batch you will receive."""
        return self._loader.step - len(self._ahead)

    @property
    def loader(self) -> DataLoader:
        """The DataLoader underneath."""
        return self._loader

    def state_dict(self) -> dict[str, int]:
        """``{"step": ...}``: the next batch you would receive."""
        return {"step": self.step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continues from ``state`` (from :meth:`state_dict`, or a
        DataLoader's): prefetched batches are dropped."""
        self._drain()
        self._loader.load_state_dict(state)

    def _drain(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        self._ahead.clear()
        self._copying.clear()

    def close(self) -> None:
        """Stops the DataLoader underneath (its streams stay open)."""
        self._drain()
        self._loader.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self._loader)

    def __repr__(self) -> str:
        return (
            f"TorchLoader(device={self._device}, pinned={self._pinned}, prefetch={self._prefetch}, "
            f"loader={self._loader!r})"
        )


# -- torch.utils.data.DataLoader --------------------------------------------------


def collate(batch: Any) -> Any:
    """``collate_fn`` for :class:`StoreDataset` under a batch sampler: a
    batch that ``__getitems__`` already gathered passes through; a list of
    single-record dicts (datasets used without ``__getitems__``) is stacked
    per stream where the records share a shape, else kept as a list."""
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, list) and batch and isinstance(batch[0], dict):
        out: dict[str, Any] = {}
        for name in batch[0]:
            values = [record[name] for record in batch]
            shapes = {tuple(v.shape) for v in values}
            out[name] = torch.stack(values) if len(shapes) == 1 else values
        return out
    return torch.utils.data.default_collate(batch)


def _check_streams(streams: Mapping[str, Any]) -> dict[str, Dense | Ragged]:
    if not isinstance(streams, Mapping) or not streams:
        raise ValueError("streams must be a non-empty dict of opened Dense/Ragged stores")
    for name, store in streams.items():
        if not isinstance(store, _Store) or store.writable or store.closed:
            raise ValueError(f"stream {name!r} must be an opened Dense or Ragged store")
    lengths = {len(s) for s in streams.values()}
    if len(lengths) != 1:
        raise ValueError(f"all streams must have the same length, got {sorted(lengths)}")
    return dict(streams)


class StoreDataset(torch.utils.data.Dataset[Any]):
    """A map-style dataset over equal-length stores, for
    ``torch.utils.data.DataLoader``.

    ``dataset[i]`` is ``{name: tensor}`` for record ``i``;
    ``dataset.__getitems__(indices)``, which torch's DataLoader calls with a
    whole batch of indices, gathers every stream in one native call (GIL
    released) and returns ``{name: batch tensor}`` (a list of tensors for
    Ragged streams). Pass ``collate_fn=loaderx.torch.collate`` so the batch is
    not collated again. Workers may be forked or spawned: stores are reopened
    by path in a spawned worker, and a forked one opens fresh handles.
    """

    def __init__(
        self, streams: Mapping[str, Dense | Ragged], transform: Callable[[Batch], Any] | None = None
    ) -> None:
        self.streams = _check_streams(streams)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self.transform = None if transform is identity else transform
        self._length = len(next(iter(self.streams.values())))

    def __len__(self) -> int:
        return self._length

    def _batch(self, key: Any) -> Any:
        batch = {name: store[key] for name, store in self.streams.items()}
        if self.transform is not None:
            batch = self.transform(batch)
        return to_tensors(batch)

    def __getitem__(self, index: int) -> Any:
        return self._batch(int(index))

    def __getitems__(self, indices: Sequence[int]) -> Any:
        return self._batch(np.asarray(indices, dtype=np.int64))


class IterableStreams(torch.utils.data.IterableDataset[Any]):
    """The batches of a loaderx DataLoader as an ``IterableDataset``, for
    ``torch.utils.data.DataLoader(IterableStreams(...), batch_size=None)``.

    Each item is one batch (a dict of tensors), in step order from
    ``start_step``; ``steps`` bounds the iteration (default: endless). With
    ``num_workers=0`` the batches come from a DataLoader (native prefetch);
    with ``W`` workers, worker ``w`` gathers steps ``w, w + W, ...`` so that
    torch's round-robin over workers delivers exactly the same sequence as a
    single process would. Takes DataLoader's arguments otherwise
    (``batch_size``, ``mode``, ``seed``, ``shard_index``/``shard_count``,
    ``transform``, ``packed``).
    """

    def __init__(
        self,
        streams: Mapping[str, Dense | Ragged],
        *,
        steps: int | None = None,
        start_step: int = 0,
        batch_size: int = 256,
        mode: int = 2,
        seed: int = 42,
        transform: Callable[[Batch], Any] | None = None,
        shard_index: int = 0,
        shard_count: int = 1,
        packed: bool | Sequence[str] = False,
        prefetch_size: int = 4,
    ) -> None:
        self.streams = _check_streams(streams)
        if steps is not None:
            message = "{name} must be a non-negative int or None, got {value!r}"
            steps = _validate.bounded(
                "steps", steps, 0, type_message=message, range_message=message, type_error=ValueError
            )
        self.steps = steps
        self.start_step = start_step
        self.options: dict[str, Any] = {
            "batch_size": batch_size,
            "mode": mode,
            "seed": seed,
            "transform": transform,
            "shard_index": shard_index,
            "shard_count": shard_count,
            "packed": packed,
            "prefetch_size": prefetch_size,
        }
        # Validates every option now rather than in a worker.
        DataLoader(self.streams, **self.options, start_step=start_step).close()

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        end = None if self.steps is None else self.start_step + self.steps
        if info is None or info.num_workers == 1:
            with DataLoader(self.streams, **self.options, start_step=self.start_step) as loader:
                while end is None or loader.step < end:
                    yield to_tensors(next(loader))
            return
        yield from self._strided(info.id, info.num_workers, end)

    def _strided(self, worker: int, workers: int, end: int | None) -> Iterator[Any]:
        o = self.options
        length = len(next(iter(self.streams.values())))
        sampler = Sampler(length, o["batch_size"], mode=o["mode"], seed=o["seed"])
        drawn = len(sampler.batch_at(0))
        per_shard = drawn // o["shard_count"]
        lo = o["shard_index"] * per_shard
        hi = drawn if o["shard_index"] + 1 == o["shard_count"] else lo + per_shard
        packed = o["packed"]
        ragged = {n for n, s in self.streams.items() if isinstance(s, Ragged)}
        packed_names = (
            ragged
            if packed is True
            else set()
            if not packed
            else ({packed} if isinstance(packed, str) else set(packed))
        )
        transform = o["transform"]
        step = self.start_step + worker
        while end is None or step < end:
            idx = sampler.batch_at(step)[lo:hi]
            batch = {
                name: cast(Ragged, store).gather_packed(idx) if name in packed_names else store[idx]
                for name, store in self.streams.items()
            }
            if transform is not None and transform is not identity:
                batch = transform(batch)
            yield to_tensors(batch)
            step += workers
