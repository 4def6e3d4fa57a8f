"""DataLoader: a step-based batch loader over a dict of stores, or over a
weighted ``Mixture`` of several such dicts; endless, or a finite pass of
``epochs`` (evaluation).

Index sampling and the gather of every stream run on native threads with the
GIL released. A ``transform``, when given, runs on Python worker threads.
Batches are delivered strictly in step order, so the sequence a loader yields
is a pure function of (streams, batch_size, mode, seed, start_step, and the
mixture and epochs when given): a run resumes exactly from one integer,
``loader.step``. See docs/sampling.md for mixtures and finite passes.
"""

from __future__ import annotations

import math
import numbers
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from loaderx import _native, _procs, _validate
from loaderx._distributed import distributed_shard
from loaderx._errors import ArgumentTypeError
from loaderx._shapes import Pack, Pad
from loaderx._shapes import resolve as _resolve_shapes
from loaderx.zrecord import Dense, Ragged, _Store

if TYPE_CHECKING:
    from types import TracebackType

    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = [
    "DataLoader",
    "Mixture",
    "Pack",
    "Pad",
    "TransformWorkerError",
    "distributed_shard",
    "identity",
]

TransformWorkerError = _procs.TransformWorkerError

# The name of the finite-pass padding mask in every batch of a finite pass.
MASK = "mask"

Batch = dict[str, Any]

# How long close() lets running transform calls (and native gathers) finish
# before it leaves them behind; see DataLoader.close.
_CLOSE_GRACE = 0.25
# How long the consumer waits on the reorder buffer at a time, so a signal
# handler (Ctrl-C, a SIGTERM handler raising SystemExit) runs promptly on
# every platform, even where a blocked lock acquire is not interruptible.
_WAIT_SLICE = 0.05
# Batch size (bytes) from which a local loader gathers with one producer
# thread instead of two; see DataLoader._local_producers.
_LARGE_BATCH = 4 << 20


def identity(batch: Batch) -> Batch:
    """The default transform: returns the batch unchanged (and costs nothing:
    the loader skips the transform stage when it is given)."""
    return batch


def _positive_int(name: str, value: Any) -> int:
    return _validate.bounded(
        name,
        value,
        1,
        type_message="{name} must be an integer, got {type}",
        range_message="{name} must be positive, got {value}",
    )


def _check_streams(streams: Any, what: str, allow_empty: bool = False) -> dict[str, Any]:
    """Validates a dict of opened stores of equal length, in loaderx 2.0.0's
    order and with its messages first (#14); returns a copy. Empty stores
    pass only with ``allow_empty`` (the plain form checks that later, where
    2.0.0 does)."""
    if not isinstance(streams, Mapping):
        try:  # like 2.0.0, which takes whatever dict() takes
            streams = dict(streams)
        except (TypeError, ValueError) as e:
            # 2.0.0 raises TypeError for a non-iterable, the contract ValueError: both.
            cls = ArgumentTypeError if isinstance(e, TypeError) else ValueError
            raise cls(f"{e}: {what} must be a dict of opened Dense/Ragged stores") from None
    if len(streams) == 0:
        raise ValueError(f"need at least one stream: {what} must be a non-empty dict of opened stores")
    refused = {}
    for name, store in streams.items():
        if not isinstance(store, _Store):
            refused[name] = f"{name!r} is of type {type(store).__name__}, not a store"
        elif store.writable:
            refused[name] = f"{name!r} is a writer; close it and pass Dense/Ragged.open(path)"
        elif store.closed:
            refused[name] = f"{name!r} is closed"
    if refused:
        raise ValueError(
            f"DataLoader streams must be opened for reading: {list(refused)} "
            f"({'; '.join(refused.values())}{_of(what)})"
        )
    lengths = {name: len(store) for name, store in streams.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"all streams{_of(what)} must hold the same number of records, got {lengths}")
    if not allow_empty and next(iter(lengths.values())) == 0:
        raise ValueError(f"length must be in 1..2^64-1: the streams{_of(what)} hold no records")
    return dict(streams)


def _of(what: str) -> str:
    return "" if what == "streams" else f" of {what}"


class Mixture:
    """A weighted mixture of sources for ``DataLoader``.

    ``sources`` maps a source name to ``(streams, weight)``: ``streams`` a
    dict ``{name: opened Dense or Ragged}`` of equal length, as a plain
    DataLoader takes, and ``weight`` a positive finite number (weights are
    normalised, so ``0.7, 0.3`` and ``7, 3`` are the same mixture). Every
    source must have the same stream names, each stream of the same kind
    (Dense or Ragged) and dtype in every source, and Dense streams of the
    same item shape. Sources are numbered 0, 1, ... in the order of
    ``sources``.

    ``proportions``:

    * ``"exact"`` (default): every global batch holds each source's
      largest-remainder share of ``batch_size`` slots (``0.7, 0.3`` of 10 is
      7 and 3), at random slots; each source is walked through in its own
      order (with mode 2, every record of a source once per its own epoch).
      A source whose share rounds to no slot is refused.
    * ``"iid"``: every slot picks its source independently by weight, so the
      counts vary from batch to batch around the weights.

    ``source_stream``: a name, to add to every batch an int32 array of the
    source number of each record (this shard's slice, in batch order).

    Example::

        mix = Mixture({"web": (web_streams, 0.7), "code": (code_streams, 0.3)},
                      source_stream="source")
        loader = DataLoader(mix, batch_size=256)
    """

    def __init__(
        self,
        sources: Mapping[str, tuple[Mapping[str, Dense | Ragged], float]],
        *,
        proportions: str = "exact",
        source_stream: str | None = None,
    ) -> None:
        if not isinstance(sources, Mapping) or len(sources) == 0:
            raise ValueError("a Mixture needs a non-empty dict {source name: (streams, weight)}")
        if proportions not in ("exact", "iid"):
            raise ValueError(f"proportions must be 'exact' or 'iid', got {proportions!r}")
        self.names: list[str] = []
        self.weights: list[float] = []
        self.sources: list[dict[str, Any]] = []
        for name, entry in sources.items():
            if not isinstance(entry, tuple) or len(entry) != 2:
                raise ValueError(
                    f"source {name!r} must be a (streams, weight) pair, got {type(entry).__name__}"
                )
            streams, weight = entry
            if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
                raise ValueError(
                    f"the weight of source {name!r} must be a number, got {type(weight).__name__}"
                )
            weight = float(weight)
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(
                    f"the weight of source {name!r} must be a positive finite number, got {weight}"
                )
            self.names.append(name)
            self.weights.append(weight)
            self.sources.append(_check_streams(streams, f"source {name!r}"))
        if not math.isfinite(math.fsum(self.weights)):
            raise ValueError("the weights of a Mixture add up to more than a float holds")
        first_name, first = self.names[0], self.sources[0]
        for name, streams in zip(self.names[1:], self.sources[1:], strict=True):
            if list(streams) != list(first):
                raise ValueError(
                    f"source {name!r} has streams {sorted(streams)}, but source {first_name!r} has "
                    f"{sorted(first)}: every source needs the same stream names"
                )
            for stream, store in streams.items():
                ref = first[stream]
                if type(store) is not type(ref):
                    raise ValueError(
                        f"stream {stream!r} of source {name!r} is {type(store).__name__}, but "
                        f"{type(ref).__name__} in source {first_name!r}"
                    )
                if store.dtype != ref.dtype:
                    raise ValueError(
                        f"stream {stream!r} of source {name!r} has dtype {store.dtype}, but "
                        f"{ref.dtype} in source {first_name!r}"
                    )
                if isinstance(store, Dense) and store.item_shape != ref.item_shape:
                    raise ValueError(
                        f"stream {stream!r} of source {name!r} has item shape {store.item_shape}, but "
                        f"{ref.item_shape} in source {first_name!r}"
                    )
        if source_stream is not None:
            if not isinstance(source_stream, str):
                raise TypeError(f"source_stream must be a str or None, got {type(source_stream).__name__}")
            if source_stream in first:
                raise ValueError(f"source_stream {source_stream!r} is already the name of a stream")
        self.proportions = proportions
        self.source_stream = source_stream

    @property
    def shares(self) -> list[float]:
        """The normalised weights, in source order."""
        total = math.fsum(self.weights)
        return [w / total for w in self.weights]

    def __repr__(self) -> str:
        parts = ", ".join(f"{n!r}: {w:g}" for n, w in zip(self.names, self.weights, strict=True))
        return f"Mixture({{{parts}}}, proportions={self.proportions!r}, source_stream={self.source_stream!r})"


def _check_workers(workers: Any, start_method: Any) -> str | None:
    """The start method of process workers, or None for threads."""
    if workers not in ("thread", "process"):
        raise ValueError(f"workers must be 'thread' or 'process', got {workers!r}")
    if workers == "thread":
        if start_method is not None:
            raise ValueError("start_method applies to workers='process' only")
        return None
    if sys.platform == "win32":  # descriptors travel over Unix sockets (SCM_RIGHTS)
        raise ValueError("workers='process' needs a POSIX system (Linux, macOS)")
    if start_method is None:
        return _procs.default_start_method()
    if start_method not in _procs.START_METHODS:
        raise ValueError(
            f"start_method must be one of {list(_procs.START_METHODS)} or None, got {start_method!r}"
        )
    if start_method not in _procs.available_start_methods():
        raise ValueError(f"start_method {start_method!r} is not available on this platform")
    return str(start_method)


class _Failure:
    """An exception raised while producing a step, held until its turn."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class DataLoader:
    """Loader over ``streams``, a dict ``{name: opened Dense or Ragged}``
    of equal length, or a ``Mixture`` of such dicts. Each batch is
    ``transform({name: value})``, where a Dense value is a
    ``(batch, *item_shape)`` array and a Ragged value a list of arrays, all
    gathered at the same indices.

    ``mode``: 0 sequential, 1 IID, 2 cyclic (default), as in
    ``loaderx.zsampler.Sampler``. Beyond loaderx 2.0.0:

    * ``start_step``: begin at this step (resume); ``loader.step`` is the
      number of the next batch, and ``state_dict()`` / ``load_state_dict()``
      wrap it for checkpointing frameworks.
    * ``shard_index`` / ``shard_count``: each process draws the same global
      batch of ``batch_size`` records and gathers only its contiguous
      ``1/shard_count`` slice, so shards are disjoint and cover every global
      batch, and a run can resume on a different number of processes.
    * ``packed``: True, or names of Ragged streams, to receive those streams as
      ``(values, cu_seqlens, shapes)`` (see ``Ragged.gather_packed``) instead
      of a list of arrays.
    * ``Mixture(...)`` in place of ``streams``: each global batch mixes
      several sources by weight (see ``Mixture``).
    * ``epochs``: None (default) for an endless loader; N for a finite pass
      of N epochs, each visiting every record exactly once (every record of
      every source, for a mixture), in order (mode 0) or in a fresh shuffle
      per epoch (mode 2; mode 1 is refused). An epoch is
      ``ceil(records / batch_size)`` steps; its last batch is padded to full
      size, and every batch of a finite pass has a bool stream ``"mask"``
      (this shard's slice) that is False on padding, so all ranks take the
      same number of steps. ``len(loader)`` is the number of steps of the
      whole pass; iteration ends with StopIteration after the last one.
    * ``pad`` / ``pack``: ``{name: spec}`` of Ragged streams to receive at a
      fixed shape, so a compiled step never sees a new one: padded to a
      length (``pad={"ids": (512, 0)}`` or ``Pad(...)``: ``ids``
      ``[batch, 512]`` plus ``ids_mask`` and ``ids_lengths``), or packed whole
      into rows of ``max_tokens`` slots (``pack={"ids": 4096}`` or
      ``Pack(...)``: ``ids``, ``ids_segment_ids``, ``ids_positions``
      ``[rows, 4096]`` plus ``ids_placement`` and ``ids_dropped``). Done
      natively per batch, so resume and sharding are unchanged; a transform
      sees the shaped batch. See ``Pad``, ``Pack`` and docs/shapes.md.

    Memory: every batch alive counts, wherever it is (being gathered,
    gathered and waiting, in a transform worker, transformed and waiting for
    its turn, handed to you). A ``for`` loop over the loader sees at most
    ``max(prefetch_size, 2) + 1`` batches alive without a transform, and
    ``max(prefetch_size + 1, transform_workers + 3)`` with one: the batch you
    were handed last counts against ``prefetch_size`` until you ask for the
    next one (so ``prefetch_size=1`` still prepares one batch ahead), the
    loop's previous batch, still bound while it asks, is the ``+ 1``, and
    batches held by transform workers count toward ``prefetch_size``. (A
    transform that makes new arrays adds its results on top.)

    ``workers="process"`` runs the transform in ``transform_workers``
    processes instead of threads, for transforms that hold the GIL (Python
    loops): batches are gathered into shared memory the workers map, only
    references cross, and results come back through shared memory (see
    docs/transforms.md). The transform must be picklable
    unless ``start_method="fork"``; the default start method is
    ``forkserver`` (``spawn`` where there is none). A worker that dies raises
    ``TransformWorkerError`` naming the step.
    Without ``epochs``, iteration never ends by itself; ``close()`` (or leaving a ``with`` block)
    stops it, and a consumer waiting on it then sees StopIteration. A failure
    in a gather or the transform is raised to the consumer and stops the loader.

    Interrupts: a consumer waiting for a batch wakes for signal handlers at
    least every 50 ms, so KeyboardInterrupt (or SystemExit from a SIGTERM
    handler), like any exception raised in the consumer's thread, reaches the
    caller at once, whatever a transform or gather is doing: the loader is
    closed on the way out without waiting for them. Python cannot stop a
    running transform call, and a native gather is not cancellable either; a
    closed loader abandons both. An abandoned transform thread (a daemon, so
    it never delays interpreter exit) discards whatever its call returns or
    raises and exits as soon as the call returns; a native thread exits when
    its gather ends. Until then they keep the batch they work on, on top of
    the bounds above.
    """

    def __init__(
        self,
        streams: Mapping[str, Dense | Ragged] | Mixture,
        transform_workers: int = 4,
        batch_size: int = 256,
        prefetch_size: int = 4,
        mode: int = 2,
        seed: int = 42,
        transform: Callable[[Batch], Any] | None = identity,
        *,
        start_step: int = 0,
        shard_index: int = 0,
        shard_count: int = 1,
        packed: bool | Iterable[str] = False,
        epochs: int | None = None,
        pad: Mapping[str, Any] | None = None,
        pack: Mapping[str, Any] | None = None,
        workers: str = "thread",
        start_method: str | None = None,
    ) -> None:
        self._closed = True  # until fully started, so close() is safe
        if isinstance(streams, Mixture):
            self._mixture: Mixture | None = streams
            # Again here: a store may have been closed since the Mixture was made.
            for name, group in zip(streams.names, streams.sources, strict=True):
                _check_streams(group, f"source {name!r}")
            streams = streams.sources[0]
        else:
            self._mixture = None
            streams = _check_streams(streams, "streams", allow_empty=True)
        self._epochs = None if epochs is None else _positive_int("epochs", epochs)
        self._transform_workers = _positive_int("transform_workers", transform_workers)
        self._prefetch_size = _positive_int("prefetch_size", prefetch_size)
        # Types before values, as 2.0.0's sampler takes them.
        batch_size, mode, seed = (
            _validate.integer("batch_size", batch_size),
            _validate.integer("mode", mode),
            _validate.integer("seed", seed),
        )
        if len(next(iter(streams.values()))) == 0:
            raise ValueError("length must be in 1..2^64-1: the streams hold no records")
        self._batch_size = _validate.u64("batch_size", batch_size, 1)
        if mode not in (0, 1, 2):
            raise ValueError(f"mode must be Sampler.Mode.SEQUENTIAL, IID, or CYCLIC: 0, 1 or 2, got {mode}")
        self._mode = mode
        self._seed = _validate.u64("seed", seed)
        self._shard_count = _validate.u64("shard_count", shard_count, 1)
        self._shard_index = _validate.u64("shard_index", shard_index)
        if self._shard_index >= self._shard_count:
            raise ValueError(f"shard_index must be in 0..{self._shard_count - 1}, got {self._shard_index}")
        if self._batch_size % self._shard_count:
            raise ValueError(
                f"batch_size {self._batch_size} (the global batch) must be divisible by "
                f"shard_count {self._shard_count}"
            )
        self._extra: list[str] = []
        if self._epochs is not None:
            if mode == 1:
                raise ValueError(
                    "a finite pass (epochs=...) needs mode 0 (in order) or 2 (shuffled): "
                    "mode 1 draws with replacement and cannot visit every record exactly once"
                )
            if MASK in streams:
                raise ValueError(
                    f"a stream is named {MASK!r}, the name of a finite pass's padding mask: rename it"
                )
            self._extra.append(MASK)
        if self._mixture is not None and self._mixture.source_stream is not None:
            if self._mixture.source_stream in self._extra:
                raise ValueError(
                    f"source_stream {self._mixture.source_stream!r} clashes with the mask stream"
                )
            self._extra.append(self._mixture.source_stream)
        if transform is not None and not callable(transform):
            raise TypeError(f"transform must be callable, got {type(transform).__name__}")
        self._transform = None if transform is None or transform is identity else transform
        self._start_method = _check_workers(workers, start_method)
        if self._start_method is not None and self._transform is not None:
            # Fails here, not in a worker, when spawn cannot send the transform.
            _procs.check_picklable(self._transform, self._start_method)
        self._names = list(streams)
        self._streams = dict(streams)
        self._steps: int | None = None
        ragged = {name for name, store in streams.items() if isinstance(store, Ragged)}
        if packed is True:
            self._packed = ragged
        elif packed is False or packed is None:
            self._packed = set()
        else:
            self._packed = {packed} if isinstance(packed, str) else set(packed)
            unknown = self._packed - ragged
            if unknown:
                raise ValueError(
                    f"packed names streams that are not Ragged streams of this loader: {sorted(unknown)}"
                )
        if self._mixture is not None and (pad or pack):
            # Sources are merged per batch; a per-source pad or pack would
            # not be one batch's shape. Pad or pack in a transform instead.
            raise ValueError("pad= and pack= do not apply to a Mixture yet")
        # Padded and row-packed streams add entries to the batch: _out_names
        # are the batch's keys, in the order the native loader gives values.
        self._pad, self._pack, self._out_names = _resolve_shapes(streams, ragged, self._packed, pad, pack)
        clash = set(self._extra) & set(self._out_names)
        if clash:
            raise ValueError(
                f"{sorted(clash)} would be both a shaped stream's output and a stream the loader adds"
            )
        # Memory lent by an adapter (loaderx.torch's pinned buffers) for the
        # Dense columns; see _lend.
        self._lent: Any = None
        self._start(_validate.u64("start_step", start_step))

    # -- pipeline -------------------------------------------------------------
    def _start(self, step: int) -> None:
        prefetch = self._native_prefetch()
        # Gathers from object storage mostly wait on round trips, not on the
        # CPU: a producer per slot keeps every prefetched step's requests in
        # flight at once (memory stays bounded by the slots).
        mix = self._mixture
        groups = [self._streams] if mix is None else mix.sources
        remote = any(s._require_reader().data_access == "remote" for g in groups for s in g.values())
        producers = max(2, prefetch) if remote else self._local_producers(groups)
        # Mixtures pass every source's readers, source after source, in the
        # stream order of the first source.
        readers = [g[name]._require_reader() for g in groups for name in self._names]
        extra: dict[str, Any] = {}
        if mix is not None:
            extra.update(
                weights=mix.weights,
                exact=mix.proportions == "exact",
                source_stream=mix.source_stream is not None,
            )
        if self._epochs is not None:
            extra["epochs"] = self._epochs
        procs = self._start_workers()
        # Process workers map the batches the loader gathers into their
        # arena; memory lent by an adapter (pinned) takes precedence, and
        # its batches travel to the workers by copy instead.
        lent = self._lent if self._lent is not None or procs is None else procs.pool
        try:
            core = self._core(readers, step, prefetch, producers, lent, extra)
        except BaseException:
            if procs is not None:
                procs.stop()
                procs.reap(1.0)
            raise
        self._steps = core.steps
        self._pipe = _Pipeline(
            core,
            self._out_names + self._extra,
            self._transform,
            self._transform_workers,
            step,
            self._steps,
            procs,
        )
        self._closed = False
        # The pipeline's threads hold the pipeline, never the loader, so an
        # abandoned loader is collected and its threads told to stop.
        self._finalizer = weakref.finalize(self, self._pipe.shutdown, 0.0)

    def _core(
        self, readers: list[Any], step: int, prefetch: int, producers: int, lent: Any, extra: dict[str, Any]
    ) -> Any:
        return _native.LoaderHandle(
            readers,
            [s.dtype for s in self._streams.values()],
            [name in self._packed for name in self._names],
            self._batch_size,
            self._mode,
            self._seed,
            step,
            prefetch,
            self._shard_index,
            self._shard_count,
            producers,
            lent=lent,
            pad=self._pad,
            pack=self._pack,
            **extra,
        )

    def _start_workers(self) -> _procs.ProcessWorkers | None:
        """With ``workers="process"`` and a transform: the worker processes
        and the shared arena the Dense streams are gathered into, with a
        region per stream for every batch that can be alive."""
        if self._start_method is None or self._transform is None:
            return None
        rows = self._batch_size // self._shard_count
        regions = []
        if self._lent is None:
            regions = [
                rows * store._require_reader().record_width
                for store in self._streams.values()
                if isinstance(store, Dense)
            ]
        return _procs.ProcessWorkers(
            self._transform, self._transform_workers, self._start_method, regions, self._batches_alive() + 1
        )

    def _local_producers(self, groups: list[dict[str, Any]]) -> int:
        """Native producer threads for local stores: one for large batches, two otherwise.

        Every gather already fans out over the process-wide pool, so one
        producer keeps every core busy on a large batch; a second one would
        only hold a second batch in progress (37 MiB for 256 images of
        3x224x224) for no speed. On small batches the fixed cost of a step
        (sampling, waking the pool, the hand-over) is comparable to the
        gather, and a second producer hides it.
        """
        rows = self._batch_size // self._shard_count
        largest = 0.0
        for group in groups:
            per_record = 0.0
            for store in group.values():
                reader = store._require_reader()
                width = reader.record_width
                per_record += width if width else reader.mean_record_bytes(64)
            largest = max(largest, per_record)
        return 1 if rows * largest >= _LARGE_BATCH else 2

    def _lend(self, pool: Any) -> None:
        """Gathers Dense columns into the regions of ``pool`` (a
        ``_native.LentPool``) from the next batch on, falling back to engine
        buffers when no region is free. Restarts the pipeline at the current
        step, like ``load_state_dict``."""
        step = self.step
        self._close(None)
        self._lent = pool
        self._start(step)

    def _batches_alive(self) -> int:
        """Most batches this loader and a ``for`` loop over it hold at once
        (see the class docstring; tests/test_process_workers.py checks that
        it is exact): the native slots, the batches in the transform stage
        but for the one a native slot counts already, and the loop's
        previous batch."""
        if self._transform is None:
            return max(2, self._prefetch_size) + 1
        return self._native_prefetch() + self._transform_workers + 1

    def _native_prefetch(self) -> int:
        # Transform workers hold batches too (being transformed, or done and
        # waiting for their turn), so with a transform they count toward
        # prefetch_size: the native stage keeps the rest, at least 2 (the
        # batch a worker took last, and one being gathered for the next
        # worker to ask), and the two stages together still hold
        # prefetch_size or more batches ahead of the consumer.
        if self._transform is None:
            return self._prefetch_size
        return max(2, self._prefetch_size - self._transform_workers)

    def __iter__(self) -> DataLoader:
        return self

    def __next__(self) -> Any:
        if self._closed:
            raise StopIteration
        try:
            return self._pipe.next()
        except StopIteration:
            raise
        except BaseException:
            # A failed step, or an interrupt (KeyboardInterrupt, SystemExit
            # from a signal handler) while waiting: stop, but wait for no
            # transform or gather, so the exception reaches the caller now.
            self._close(0.0)
            raise

    def __len__(self) -> int:
        """Steps of a finite pass (``epochs * ceil(records / batch_size)``,
        counted from step 0 whatever ``start_step`` was). An endless loader
        has no len(): TypeError."""
        if self._epochs is None:
            raise TypeError(
                "Eternal loader has no length.: a DataLoader without epochs= is endless; count steps instead"
            )
        assert self._steps is not None
        return self._steps

    # -- state ----------------------------------------------------------------
    @property
    def step(self) -> int:
        """Number of the next batch to be delivered (= batches delivered so far
        when started at step 0). Restart with ``start_step=loader.step`` to resume."""
        return self._pipe.step

    @property
    def batch_size(self) -> int:
        """The global batch size."""
        return self._batch_size

    def state_dict(self) -> dict[str, int]:
        """``{"step": ...}``: everything needed to resume this loader."""
        return {"step": self.step}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Repositions the loader so the next batch is ``state["step"]``.

        Unlike ``close()``, this waits (interruptibly) for the running
        transform calls and gathers of the old position to end before the new
        one starts, so the loader's memory bounds hold across the switch."""
        step = _validate.u64("step", state["step"])
        self._close(None)
        self._start(step)

    # -- lifecycle --------------------------------------------------------------
    def close(self) -> None:
        """Stops the loader and wakes a waiting consumer. Safe to call twice
        and from inside a transform. The streams stay open (they are yours).

        Returns within about a quarter of a second: idle threads are stopped
        and joined, but a transform call or native gather still running after
        that is abandoned, not waited for; its thread exits when the call
        returns, and its result (or exception) is discarded."""
        self._close(_CLOSE_GRACE)

    def _close(self, grace: float | None) -> None:
        # grace: seconds to wait for the pipeline's threads (None: until they end).
        pipe = getattr(self, "_pipe", None)
        self._closed = True
        if pipe is not None:
            self._finalizer.detach()
            pipe.shutdown(grace)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Leaving on an exception (an error in the body, Ctrl-C): let it
        # propagate at once; running transforms and gathers are abandoned.
        self._close(_CLOSE_GRACE if exc_type is None else 0.0)

    def __repr__(self) -> str:
        mix = f", mixture={self._mixture!r}" if self._mixture is not None else ""
        epochs = f", epochs={self._epochs}" if self._epochs is not None else ""
        return (
            f"DataLoader(streams={self._names}{mix}, batch_size={self._batch_size}, mode={self._mode}, "
            f"seed={self._seed}, step={self.step}, shard={self._shard_index}/{self._shard_count}"
            f"{epochs}{', closed' if self._closed else ''})"
        )


class _Pipeline:
    """The running part of a DataLoader: the native core and, with a
    transform, the worker threads and the reorder buffer behind them.

    Workers take batches from the core in step order (so at most
    ``transform_workers`` batches are between the core and the consumer),
    transform them concurrently, and park results by step; the consumer
    takes them strictly in step order.

    Once closed, nothing is parked any more: a worker checks ``closed`` (under
    ``cond``) before it starts a transform and after the call returns, and a
    worker that finds it set exits, dropping its batch and result.
    """

    def __init__(
        self,
        core: Any,
        names: list[str],
        transform: Callable[[Batch], Any] | None,
        workers: int,
        step: int,
        end: int | None,
        procs: _procs.ProcessWorkers | None = None,
    ) -> None:
        self.core = core
        # With process workers, worker thread i hands its batches to process i.
        self.procs = procs
        # One past the last step of a finite pass (None: endless).
        self.end = end
        self.names = names
        self.transform = transform
        self.limit = workers
        self.step = step
        self.closed = False
        self.cond = threading.Condition()
        self.done: dict[int, Any] = {}
        self.held = 0
        # Workers inside a transform call (guarded by cond).
        self.busy: set[threading.Thread] = set()
        # The thread closing the native core (see shutdown).
        self.reaper: threading.Thread | None = None
        # The thread collecting the worker processes (see _reap_processes).
        self.proc_reaper: threading.Thread | None = None
        self.threads: list[threading.Thread] = []
        if transform is not None:
            for i in range(workers):
                t = threading.Thread(target=self._work, args=(i,), name=f"loaderx-transform-{i}", daemon=True)
                self.threads.append(t)
                t.start()

    def _pack(self, values: list[Any]) -> Batch:
        return dict(zip(self.names, values, strict=True))

    def _work(self, index: int) -> None:
        core, cond, transform, procs = self.core, self.cond, self.transform, self.procs
        assert transform is not None  # workers run only with a transform
        me = threading.current_thread()
        while True:
            with cond:
                while not self.closed and self.held >= self.limit:
                    cond.wait()
                if self.closed:
                    return
                self.held += 1
            step = None
            try:
                item = core.next()  # None once the core is closed
                if item is None:
                    with cond:
                        self.held -= 1
                        cond.notify_all()
                    return
                step, values = item
                del item
                with cond:
                    if self.closed:
                        return  # never start a transform for a closed loader
                    self.busy.add(me)
                try:
                    if procs is None:
                        result = transform(self._pack(values))
                    else:
                        result = procs.call(index, step, self._pack(values))
                finally:
                    del values
                    with cond:
                        self.busy.discard(me)
            except BaseException as e:  # delivered to the consumer in step order
                if self.closed:
                    return  # raised by an abandoned call: nobody to tell
                if step is None:
                    step = core.step - 1
                result = _Failure(e)
            with cond:
                if self.closed:
                    return  # abandoned by close(): the result is discarded
                self.done[step] = result
                cond.notify_all()
            if isinstance(result, _Failure):
                return
            del result

    def next(self) -> Any:
        if self.transform is None:
            # Waits in short slices with the GIL released, checking for
            # signals between them (LoaderHandle.next).
            item = self.core.next()
            if item is None:
                raise StopIteration
            step, values = item
            self.step = step + 1
            return self._pack(values)
        with self.cond:
            while self.step not in self.done and not self.closed:
                if self.end is not None and self.step >= self.end:
                    raise StopIteration  # a finite pass is over
                self.cond.wait(_WAIT_SLICE)
            if self.closed:
                raise StopIteration
            result = self.done.pop(self.step)
            self.held -= 1
            if not isinstance(result, _Failure):
                self.step += 1
            self.cond.notify_all()
        if isinstance(result, _Failure):
            raise result.error
        return result

    def shutdown(self, grace: float | None) -> None:
        """Stops the pipeline without waiting for running transform calls or
        gathers, then waits up to ``grace`` seconds (None: as long as it
        takes) for its threads to end. Safe to call more than once, from any
        thread, a transform or a finalizer included."""
        with self.cond:
            self.closed = True
            self.done.clear()
            self.cond.notify_all()
            # Idle workers first: they stop at once (none starts a transform
            # once closed is set), so a busy one cannot use up their grace.
            workers = sorted(self.threads, key=lambda t: t in self.busy)
        # Wakes workers waiting in core.next() (they get None) and stops the
        # native threads from claiming more steps; never blocks.
        self.core.request_close()
        self._reap()
        if self.procs is not None:
            # Unlike a thread, a process can be stopped mid-transform: its
            # work is abandoned anyway, and its thread here wakes at once.
            self.procs.stop()
            self._reap_processes()
        me = threading.current_thread()
        if grace == 0 or me in self.threads:
            # From inside a transform (or a finalizer, or on an interrupt):
            # signal only; the threads stop on their own, and a later
            # close() joins what is left.
            return
        deadline = None if grace is None else time.monotonic() + grace
        for t in [*workers, self.reaper, self.proc_reaper]:
            if t is None or t is me:
                continue
            if deadline is None:
                t.join()  # interruptible (unlike LoaderHandle.close())
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                break
            t.join(left)

    def _reap_processes(self) -> None:
        # Collects the stopped worker processes (no zombies) on a thread of
        # its own, which kills any still running after 2 s; shutdown joins
        # it within its grace like the others.
        procs = self.procs
        assert procs is not None
        with self.cond:
            if self.proc_reaper is not None:
                return
            reaper = threading.Thread(target=procs.reap, args=(2.0,), name="loaderx-reap", daemon=True)
            try:
                reaper.start()
            except RuntimeError:  # no new threads at interpreter shutdown
                return
            self.proc_reaper = reaper

    def _reap(self) -> None:
        # LoaderHandle.close() joins the native threads, so it waits for the
        # gathers in flight (which cannot be cancelled) and, from the calling
        # thread, cannot be interrupted. Dropping the last reference to a core
        # whose threads still run joins them too, with the GIL held. So a
        # daemon thread closes the core, holding a reference until its threads
        # are gone: whoever drops the core afterwards finds nothing to wait for.
        with self.cond:
            if self.reaper is not None:
                return
            reaper = threading.Thread(target=self.core.close, name="loaderx-close", daemon=True)
            try:
                reaper.start()
            except RuntimeError:  # no new threads at interpreter shutdown
                return
            self.reaper = reaper
