"""A small progress line ("records done, rate, ETA") for long tool runs.

It draws on a stream (stderr by default) only when that stream is a terminal,
so pipes, logs and captured output stay clean, and it redraws at most every
``interval`` seconds, so counting work costs one clock read per update.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from typing_extensions import Self  # typing.Self is Python 3.11+

__all__ = ["Progress", "make_progress"]


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _count(n: float) -> str:
    return f"{int(n):,}"


def _rate(r: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.1f}{unit}"
    return f"{r:.0f}" if r >= 10 else f"{r:.1f}"


def _duration(seconds: float) -> str:
    s = int(seconds + 0.5)
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class Progress:
    """Counts records and draws ``label: done/total records, rate/s, ETA`` in place.

    ``enabled=False`` (e.g. ``--quiet``) or a non-terminal ``stream`` turns
    drawing off; counting still works, so callers never branch on it.
    Use as a context manager or call :meth:`close`, which erases the line.
    """

    def __init__(
        self,
        total: int | None = None,
        label: str = "",
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        interval: float = 0.1,
    ) -> None:
        self.total = total
        self.label = label
        self.done = 0
        self.stream = sys.stderr if stream is None else stream
        self.enabled = bool(enabled) and _isatty(self.stream)
        self.interval = interval
        self._start = time.monotonic()
        self._next_draw = self._start + interval
        self._width = 0

    def update(self, n: int = 1) -> None:
        """Adds ``n`` finished records; redraws when the interval has passed."""
        self.done += n
        if self.enabled:
            now = time.monotonic()
            if now >= self._next_draw:
                self._next_draw = now + self.interval
                self._draw(now)

    def line(self, now: float | None = None) -> str:
        """The text of the progress line at time ``now``."""
        elapsed = (time.monotonic() if now is None else now) - self._start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        head = f"{self.label}: " if self.label else ""
        if self.total is not None:
            text = f"{head}{_count(self.done)}/{_count(self.total)} records"
            if self.total > 0:
                text += f" ({100.0 * self.done / self.total:.0f}%)"
        else:
            text = f"{head}{_count(self.done)} records"
        text += f", {_rate(rate)} records/s"
        if self.total is not None and rate > 0 and self.done < self.total:
            text += f", ETA {_duration((self.total - self.done) / rate)}"
        else:
            text += f", {_duration(elapsed)} elapsed"
        return text

    def _draw(self, now: float) -> None:
        text = self.line(now)
        pad = max(0, self._width - len(text))
        self._width = len(text)
        try:
            self.stream.write("\r" + text + " " * pad)
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        """Erases the line (if one was drawn) so later output starts clean."""
        if self.enabled and self._width:
            try:
                self.stream.write("\r" + " " * self._width + "\r")
                self.stream.flush()
            except (OSError, ValueError):
                pass
        self.enabled = False
        self._width = 0

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Callback:
    """Adapts a ``progress(done, total)`` callable to the Progress interface."""

    def __init__(self, fn: Callable[[int, Any], Any], total: int | None) -> None:
        self.fn = fn
        self.total = total
        self.done = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        self.fn(self.done, self.total)

    def close(self) -> None:
        pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


ProgressArg = None | bool | Progress | Callable[[int, Any], Any]


def make_progress(progress: ProgressArg, total: int | None, label: str) -> Any:
    """The tools' ``progress=`` argument as an object with update/close.

    None or False: count silently. True: a :class:`Progress` on stderr (drawn
    only on a terminal). A callable: called as ``progress(done, total)`` after
    every chunk.
    """
    if progress is None or progress is False:
        return Progress(total, label, enabled=False)
    if progress is True:
        return Progress(total, label)
    if isinstance(progress, Progress):  # a caller-made line: reuse its settings
        return Progress(
            total, label, enabled=progress.enabled, stream=progress.stream, interval=progress.interval
        )
    if callable(progress):
        return _Callback(progress, total)
    raise TypeError(
        f"progress must be None, a bool or a callable(done, total), got {type(progress).__name__}"
    )
