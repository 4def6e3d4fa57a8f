"""Seekable index sampler.

:class:`Sampler` turns an index space ``0..length`` into an endless stream of
``uint64`` index batches. The batch drawn at a given step is a pure function
of ``(length, batch_size, mode, seed, step)``: a run resumes exactly where it
stopped by seeking to the saved step, with no epoch or shuffle state to carry.

Example::

    from loaderx.zsampler import Sampler

    sampler = Sampler(1_000_000, 256, Sampler.Mode.CYCLIC, seed=42)
    batch = sampler.next()       # a view that the next draw overwrites
    kept = batch.copy()          # copy what must outlive the next draw
    state = sampler.state_dict() # {"step": 1}
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

import numpy as np

from loaderx import _native, _validate

__all__ = ["Sampler"]


def _integer(name: str, value: object) -> int:
    """``value`` as a Python int; bools and non-integers raise TypeError whose
    message starts with Python's own (``'float' object cannot be interpreted
    as an integer``), which is what loaderx 2.0.0 raises."""
    return _validate.integer(name, value, noun="an integer")


def _u64(name: str, value: object, low: int) -> int:
    """An integer in ``low..2**64-1``; outside that range raises ValueError."""
    return _validate.u64(name, value, low, noun="an integer")


class Sampler:
    """Endless, seekable stream of index batches over ``0..length``.

    Args:
        length: size of the index space, ``1..2**64-1``.
        batch_size: indices per draw, ``1..2**64-1`` (a draw must fit in
            memory: more than ``2**40`` indices raises MemoryError).
        mode: a :class:`Sampler.Mode` or its integer value.
        seed: ``0..2**64-1``; selects the random order of IID and CYCLIC
            (SEQUENTIAL ignores it).

    Modes:
        SEQUENTIAL: consecutive indices; the window advances by
            ``batch_size`` per step and wraps around the end of the space.
        IID: independent uniform draws with replacement (unbiased).
        CYCLIC: without replacement. A cycle of ``length // batch_size``
            steps visits a pseudo-random permutation of the space, a new one
            every cycle, and no index repeats within a cycle. The
            ``length % batch_size`` leftover positions of each cycle are
            skipped, so every batch is full; when ``length < batch_size``
            each step yields all ``length`` indices in a fresh order.

    :meth:`next` and iteration return :attr:`indices`, one reusable
    ``uint64`` buffer that every draw overwrites in place. Copy a batch to
    keep it across draws. Iteration never ends. A sampler is not meant to be
    drawn from by several threads at once.
    """

    class Mode(enum.IntEnum):
        """Sampling order of a :class:`Sampler`."""

        SEQUENTIAL = 0
        IID = 1
        CYCLIC = 2

    __slots__ = ("__weakref__", "_fill_next", "_indices", "_native")

    def __init__(
        self,
        length: int,
        batch_size: int,
        mode: Sampler.Mode | int,
        seed: int = 42,
    ) -> None:
        # Every type first, then every range, in 2.0.0's order (and words).
        length, batch_size, mode, seed = (
            _integer("length", length),
            _integer("batch_size", batch_size),
            _integer("mode", mode),
            _integer("seed", seed),
        )
        length = _u64("length", length, 1)
        batch_size = _u64("batch_size", batch_size, 1)
        if mode not in (0, 1, 2):
            raise ValueError(f"mode must be Sampler.Mode.SEQUENTIAL, IID, or CYCLIC: 0, 1 or 2, got {mode}")
        seed = _u64("seed", seed, 0)
        native = _native.Sampler(length, batch_size, mode, seed)
        self._native = native
        self._indices = np.empty(native.batch_len, dtype=np.uint64)
        self._fill_next = native.fill_next

    # -- drawing -----------------------------------------------------------

    def next(self) -> np.ndarray:
        """Draw the batch at :attr:`step` into :attr:`indices`, advance one
        step, and return :attr:`indices`."""
        self._fill_next(self._indices)
        return self._indices

    __next__ = next

    def __iter__(self) -> Sampler:
        return self

    def batch_at(self, step: int) -> np.ndarray:
        """A new array holding batch ``step``; the position is unchanged."""
        step = _u64("step", step, 0)
        out = np.empty(self._native.batch_len, dtype=np.uint64)
        self._native.fill_at(step, out)
        return out

    @property
    def indices(self) -> np.ndarray:
        """The reusable ``uint64`` batch buffer that draws write into."""
        return self._indices

    # -- position ----------------------------------------------------------

    @property
    def step(self) -> int:
        """Index of the batch the next draw produces."""
        return self._native.step

    def seek(self, step: int) -> None:
        """Make batch ``step`` the next one drawn (constant time)."""
        self._native.seek(_u64("step", step, 0))

    def state_dict(self) -> dict[str, int]:
        """The position, as ``{"step": int}``."""
        return {"step": self._native.step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a position saved by :meth:`state_dict`."""
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, not {type(state_dict).__name__}")
        if "step" not in state_dict:
            raise KeyError("state_dict has no 'step' entry")
        unknown = sorted(str(key) for key in state_dict if key != "step")
        if unknown:
            raise ValueError(f"unexpected state_dict entries: {', '.join(unknown)}")
        self.seek(state_dict["step"])

    # -- configuration -----------------------------------------------------

    @property
    def length(self) -> int:
        """Size of the index space."""
        return self._native.length

    @property
    def batch_size(self) -> int:
        """Requested indices per draw (a CYCLIC sampler over a smaller space
        yields ``length`` indices instead)."""
        return self._native.batch_size

    @property
    def mode(self) -> Sampler.Mode:
        """The sampling order."""
        return Sampler.Mode(self._native.mode)

    @property
    def seed(self) -> int:
        """The seed of the random orders."""
        return self._native.seed

    def __repr__(self) -> str:
        return (
            f"Sampler(length={self.length}, batch_size={self.batch_size}, "
            f"mode=Sampler.Mode.{self.mode.name}, seed={self.seed}, step={self.step})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Copies and pickles get their own buffer, at the same position.
        return (
            _restore,
            (self.length, self.batch_size, int(self.mode), self.seed, self.step),
        )


def _restore(length: int, batch_size: int, mode: int, seed: int, step: int) -> Sampler:
    sampler = Sampler(length, batch_size, mode, seed)
    sampler.seek(step)
    return sampler
