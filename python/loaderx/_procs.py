"""Transform worker processes for ``DataLoader(..., workers="process")``.

A Python transform on threads shares one GIL, so two cores do the work of
one. Here each transform worker is a process; what crosses to it is the step
number and a small description of the batch, never the arrays' bytes:

* The native loader gathers Dense columns straight into an *arena*: one
  shared-memory file, cut into regions and lent to the loader
  (``_native.LentPool``), which every worker maps once. A batch's Dense
  arrays travel as (offset, dtype, shape, strides) references into it.
* Anything else (Ragged lists, packed tuples, masks, arrays a transform
  made) travels as pickle protocol 5 with its large buffers out of band:
  they are copied once into a fresh shared-memory file whose descriptor is
  passed over the worker's socket (``SCM_RIGHTS``), and the receiver builds
  arrays on its mapping without another copy. Small ones ride in the
  message itself.
* A transform that returns (views of) the arrays it was given, renamed or
  reshaped, sends references back, and the consumer gets views of the very
  memory the loader gathered into: no copy anywhere.

Every shared-memory file is anonymous (``memfd_create``; elsewhere a
temporary file unlinked on creation): it has no name that could outlive the
processes, and the kernel frees it when the last mapping or descriptor goes,
whichever way the processes end (``SIGKILL`` included).

A worker exits when its socket closes, when it is told to, or when it sees
the loader's process gone (it checks every ``_WATCH`` seconds), so it never
outlives the loader.
"""

from __future__ import annotations

import collections
import contextlib
import io
import mmap
import multiprocessing
import os
import pickle
import signal
import tempfile
import threading
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing import reduction
from typing import Any

import numpy as np

from loaderx import _native

__all__ = [
    "START_METHODS",
    "ProcessWorkers",
    "TransformWorkerError",
    "available_start_methods",
    "check_picklable",
    "default_start_method",
]

START_METHODS = ("forkserver", "spawn", "fork")

# Arena regions (and out-of-band buffers) start on this boundary, the one the
# engine's own batch buffers keep (XLA imports through DLPack only from it).
_ALIGN = 64
# Out-of-band buffers smaller than this in all travel inside the message: a
# shared-memory file costs a few system calls and a page fault per page.
_INLINE = 256 << 10
# Free shared-memory files each direction of a worker's socket keeps for reuse.
_KEEP = 1
# How often an idle or busy worker checks that the loader's process lives.
_WATCH = 0.2
# Message tags (the first element of every message).
_BATCH, _RESULT, _ERROR, _READY = "batch", "result", "error", "ready"


class TransformWorkerError(RuntimeError):
    """A transform worker process could not run a step: it died (killed by
    a signal, out of memory, ``os._exit``), or could not load the transform."""


def available_start_methods() -> list[str]:
    """The start methods this platform offers."""
    return list(multiprocessing.get_all_start_methods())


def default_start_method() -> str:
    """``forkserver`` where the platform has it, else ``spawn``: both start
    workers from a clean process, never a copy of one running native threads."""
    return "forkserver" if "forkserver" in available_start_methods() else "spawn"


def _shared_file(size: int) -> int:
    """A descriptor of an anonymous shared-memory file of ``size`` bytes."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("loaderx", os.MFD_CLOEXEC)
    else:  # pragma: no cover - platforms without memfd (macOS)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        # Unlinked on creation: nothing is left behind when the process ends.
        with tempfile.TemporaryFile(dir=shm) as f:
            fd = os.dup(f.fileno())
    try:
        os.ftruncate(fd, max(size, 1))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _map(fd: int, size: int, populate: bool = False) -> mmap.mmap:
    flags = mmap.MAP_SHARED
    if populate:
        # Map every page now, in one call, rather than fault them in one by
        # one as arrays on the mapping are read.
        flags |= getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, max(size, 1), flags=flags)


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _split(whole: memoryview, sizes: list[int], aligned: bool) -> list[memoryview]:
    """Views of consecutive buffers of ``sizes`` bytes in ``whole``, each
    starting on an ``_ALIGN`` boundary when ``aligned`` (as ``_Outbox``
    lays them out), back to back otherwise (inline)."""
    out, at = [], 0
    for n in sizes:
        out.append(whole[at : at + n])
        at += _aligned(n) if aligned else n
    return out


def _byte_bounds(a: np.ndarray) -> tuple[int, int, int]:
    """(data pointer, lowest byte, one past the highest byte) of ``a``."""
    ptr = a.__array_interface__["data"][0]
    lo = hi = ptr
    for dim, stride in zip(a.shape, a.strides, strict=True):
        span = (dim - 1) * stride
        if span < 0:
            lo += span
        else:
            hi += span
    return ptr, lo, hi + a.itemsize


class _Arena:
    """Shared memory mapped at the same offsets by the loader and every
    worker; ``ptr``, ``end`` bound the local mapping's addresses."""

    def __init__(self, fd: int, size: int) -> None:
        self.size = size
        self.map = _map(fd, size)
        self.array = np.frombuffer(self.map, dtype=np.uint8)
        self.ptr = self.array.__array_interface__["data"][0]
        self.end = self.ptr + size

    def reference(self, a: np.ndarray) -> tuple[Any, ...] | None:
        """A reference to ``a`` if it lies in the arena, else None."""
        if a.size == 0:
            return None
        ptr, lo, hi = _byte_bounds(a)
        if lo < self.ptr or hi > self.end:
            return None
        return ("arena", ptr - self.ptr, lo - self.ptr, hi - self.ptr, a.dtype, a.shape, a.strides)


class _Pickler(pickle.Pickler):
    """Protocol 5, arena arrays by reference, other arrays out of band."""

    def __init__(self, file: io.BytesIO, arena: _Arena, buffers: list[pickle.PickleBuffer]) -> None:
        super().__init__(file, protocol=5, buffer_callback=buffers.append)
        self.arena = arena

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is np.ndarray:
            return self.arena.reference(obj)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, buffers: Sequence[Any], resolve: Callable[[Any], np.ndarray]) -> None:
        super().__init__(io.BytesIO(data), buffers=buffers)
        self.resolve = resolve

    def persistent_load(self, pid: Any) -> Any:
        return self.resolve(pid)


class _Outbox:
    """Shared-memory files one side writes its messages' large buffers into.

    A file is reused once the receiver reports that every array built on it
    is gone (``release``), so after warm-up a message costs one copy into
    memory that is already allocated and mapped on both sides; allocating
    shared pages afresh costs several times the copy. Free files beyond
    ``_KEEP`` are closed, and the receiver is told to forget them.
    """

    def __init__(self) -> None:
        # id -> (size, mapping); all of them, in use or free. A file's
        # descriptor is closed once sent: the mappings keep the file.
        self.files: dict[int, tuple[int, mmap.mmap]] = {}
        self.free: set[int] = set()
        self.forgotten: list[int] = []
        self.next_id = 0

    def write(self, views: list[memoryview], sizes: list[int]) -> tuple[int, int, int | None]:
        """Copies ``views`` into a free file: (file id, bytes used, and for
        a file the receiver has not seen yet, its descriptor, which the
        caller sends and closes)."""
        total = sum(_aligned(n) for n in sizes)
        fits = [i for i in self.free if self.files[i][0] >= total]
        fd = None
        if fits:
            key = min(fits, key=lambda i: self.files[i][0])
            self.free.discard(key)
        else:
            fd = _shared_file(total)
            try:
                mapping = _map(fd, total)
            except BaseException:
                os.close(fd)
                raise
            key, self.next_id = self.next_id, self.next_id + 1
            self.files[key] = (total, mapping)
        mapping = self.files[key][1]
        try:
            at = 0
            for v, n in zip(views, sizes, strict=True):
                mapping[at : at + n] = v
                at += _aligned(n)
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        return key, total, fd

    def release(self, keys: list[int]) -> None:
        """The receiver let go of files ``keys``."""
        for key in keys:
            if key in self.files:
                self.free.add(key)
        while len(self.free) > _KEEP:
            key = max(self.free)  # the newest: older ones are already warm elsewhere
            self.free.discard(key)
            _, mapping = self.files.pop(key)
            mapping.close()
            self.forgotten.append(key)

    def take_forgotten(self) -> list[int]:
        out, self.forgotten = self.forgotten, []
        return out


class _Inbox:
    """The receiving side of an ``_Outbox``: its files, mapped once each,
    and the files whose arrays are all gone, to report back."""

    def __init__(self) -> None:
        self.maps: dict[int, mmap.mmap] = {}
        # Appended to by finalizers, from whatever thread drops the last
        # array: deque appends and pops are atomic.
        self.released: collections.deque[int] = collections.deque()

    def buffers(self, key: int, total: int, sizes: list[int], fd: int | None) -> list[memoryview]:
        if fd is not None:
            try:
                self.maps[key] = _map(fd, total, populate=True)
            finally:
                os.close(fd)
        # A new array object per message, on which every array of the
        # message is built: once it is collected, nothing reads the file.
        base = np.frombuffer(self.maps[key], dtype=np.uint8, count=total)
        weakref.finalize(base, self.released.append, key)
        return _split(base.data, sizes, aligned=True)  # views that keep ``base`` alive

    def forget(self, keys: list[int]) -> None:
        for key in keys:
            self.maps.pop(key, None)  # arrays still built on it keep it mapped

    def take_released(self) -> list[int]:
        out = []
        while self.released:
            out.append(self.released.popleft())
        return out


class _Channel:
    """One end of a worker's socket, with the shared-memory files each
    direction's large buffers travel in."""

    def __init__(self, conn: Any, arena: _Arena) -> None:
        self.conn = conn
        self.arena = arena
        self.outbox = _Outbox()
        self.inbox = _Inbox()

    def send(self, tag: str, step: int, obj: Any) -> None:
        """Pickles ``obj`` (arena arrays by reference, large buffers through
        the outbox) and sends it, with the files this side let go of."""
        f = io.BytesIO()
        buffers: list[pickle.PickleBuffer] = []
        _Pickler(f, self.arena, buffers).dump(obj)
        views = [b.raw() for b in buffers]
        sizes = [v.nbytes for v in views]
        file: tuple[int, int] | None = None
        fd = None
        inline = b""
        if sum(sizes) < _INLINE:
            inline = b"".join(v.tobytes() for v in views)
        else:
            key, total, fd = self.outbox.write(views, sizes)
            file = (key, total)
        del views, buffers
        header = (
            tag,
            step,
            f.getvalue(),
            sizes,
            file,
            fd is not None,
            inline,
            self.inbox.take_released(),
            self.outbox.take_forgotten(),
        )
        try:
            self.conn.send(header)
            if fd is not None:
                reduction.send_handle(self.conn, fd, 0)
        finally:
            if fd is not None:
                os.close(fd)

    def send_error(self, step: int, error: bytes) -> None:
        self.conn.send((_ERROR, step, error, [], None, False, b"", [], []))

    def receive(self, resolve: Callable[[Any], np.ndarray]) -> tuple[str, int, Any]:
        """The next message: (tag, step, object); an error's object is the
        pickled exception."""
        tag, step, data, sizes, file, has_fd, inline, released, forgotten = self.conn.recv()
        fd = reduction.recv_handle(self.conn) if has_fd else None
        self.outbox.release(released)
        self.inbox.forget(forgotten)
        if tag in (_ERROR, _READY):
            return tag, step, data
        if file is not None:
            buffers = self.inbox.buffers(file[0], file[1], sizes, fd)
        else:
            # A bytearray, not the bytes received: arrays the loader hands
            # out are writable, whichever way they travelled.
            buffers = _split(memoryview(bytearray(inline)), sizes, aligned=False)
        try:
            return tag, step, _Unpickler(data, buffers, resolve).load()
        except _GONE as e:
            # Not the connection's end: keep it apart from a worker's death.
            raise RuntimeError(f"a transform worker message could not be read: {e!r}") from e


# -- the worker process -------------------------------------------------------


def _watch(loader_pid: int) -> None:
    """Ends this worker once the loader's process is gone (a SIGKILL leaves
    no one to tell it)."""
    import time

    while True:
        time.sleep(_WATCH)
        try:
            os.kill(loader_pid, 0)
        except ProcessLookupError:
            os._exit(0)
        except PermissionError:  # pragma: no cover - the pid was reused
            os._exit(0)


# A message that carries nothing but its tag: READY, or an ERROR's frame.
def _bare(tag: str, step: int, error: bytes = b"") -> tuple[Any, ...]:
    return (tag, step, error, [], None, False, b"", [], [])


# The connection is gone: the other side ended or was killed.
_GONE = (EOFError, ConnectionError)


def _worker_main(conn: Any, transform: Any, pickled: bool, loader_pid: int) -> None:
    """A worker's life: map the arena, load the transform, then transform
    batches until told to stop or the socket closes."""
    # Ctrl-C reaches the whole process group; the loader decides what to do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch, args=(loader_pid,), name="loaderx-watch", daemon=True).start()
    try:
        size = conn.recv()
        fd = reduction.recv_handle(conn)
        try:
            arena = _Arena(fd, size)
        finally:
            os.close(fd)
        channel = _Channel(conn, arena)
        if pickled:
            transform = pickle.loads(transform)
    except _GONE:
        return
    except BaseException as e:
        conn.send(_bare(_ERROR, -1, _describe(e, "loading the transform")))
        return
    conn.send(_bare(_READY, -1))

    def resolve(pid: Any) -> np.ndarray:
        _, ptr, _lo, _hi, dtype, shape, strides = pid
        view: np.ndarray = np.ndarray(shape, dtype, buffer=arena.map, offset=ptr, strides=strides)
        return view

    while True:
        try:
            tag, step, batch = channel.receive(resolve)
        except _GONE:
            return
        if tag != _BATCH:
            return
        doing = f"transforming step {step}"
        try:
            result = transform(batch)
            del batch
            doing = f"sending the result of step {step}"
            # Pickling (and copying into shared memory) happens before
            # anything is written to the socket, so a result that cannot be
            # sent is reported like an exception of the transform.
            channel.send(_RESULT, step, result)
            del result
        except _GONE:
            return
        except BaseException as e:
            try:
                channel.send_error(step, _describe(e, doing))
            except _GONE:
                return


def _describe(e: BaseException, doing: str) -> bytes:
    """The exception pickled for the loader, with this process's traceback
    as a note; a RuntimeError carrying its text when it cannot be pickled."""
    where = f"in transform worker process {os.getpid()}, {doing}:\n" + "".join(
        traceback.format_exception(type(e), e, e.__traceback__)
    )
    notes = [*getattr(e, "__notes__", []), where]
    e.__traceback__ = None
    with contextlib.suppress(AttributeError):  # an exception without a __dict__
        e.__notes__ = notes  # type: ignore[attr-defined]  # what add_note (3.11+) sets
    try:
        blob = pickle.dumps(e, protocol=5)
        pickle.loads(blob)  # some pickle but cannot be rebuilt (a custom __init__)
        return blob
    except BaseException:
        stand_in = RuntimeError(f"{type(e).__name__}: {e}")
        stand_in.__notes__ = notes  # type: ignore[attr-defined]
        return pickle.dumps(stand_in, protocol=5)


# -- the loader's side ----------------------------------------------------------


class _Worker:
    """One worker process and the socket to it; used by one pipeline thread
    at a time (``call``), and stopped from any thread (``stop``)."""

    def __init__(
        self, index: int, count: int, context: Any, transform: Any, pickled: bool, arena: _Arena
    ) -> None:
        self.index, self.count = index, count
        self.conn, child = context.Pipe(duplex=True)
        self.channel = _Channel(self.conn, arena)
        self.process = context.Process(
            target=_worker_main,
            args=(child, transform, pickled, os.getpid()),
            name=f"loaderx-transform-{index}",
            daemon=True,
        )
        try:
            self.process.start()
        finally:
            child.close()  # so the worker's death reads as end-of-file here
        self.ready = False

    def describe(self) -> str:
        return f"transform worker {self.index} of {self.count} (process {self.process.pid})"

    def handshake(self, arena_fd: int, size: int) -> None:
        self.conn.send(size)
        reduction.send_handle(self.conn, arena_fd, self.process.pid or 0)

    def call(self, step: int, batch: Any, resolve: Callable[[Any], np.ndarray]) -> Any:
        """Transforms ``batch`` (step ``step``) in the worker and returns the result."""
        try:
            if not self.ready:
                tag, _, error = self.channel.receive(resolve)
                if tag == _ERROR:
                    raise _loaded_error(error, f"{self.describe()} could not load the transform")
                self.ready = True
            self.channel.send(_BATCH, step, batch)
            del batch
            tag, got, obj = self.channel.receive(resolve)
        except _GONE as e:
            raise TransformWorkerError(self._death(step)) from e
        if tag == _ERROR:
            raise _loaded_error(obj, None)
        if got != step:  # pragma: no cover - a protocol bug, never a user error
            raise TransformWorkerError(f"{self.describe()} answered step {got} for step {step}")
        return obj

    def _death(self, step: int) -> str:
        self.process.join(1.0)
        code = self.process.exitcode
        if code is None:
            how = "closed its connection"
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = " (the kernel's out-of-memory killer sends SIGKILL)" if code == -signal.SIGKILL else ""
            how = f"was killed by {name}{hint}"
        else:
            how = f"exited with status {code}"
        if not self.ready:
            # Typically a script without `if __name__ == "__main__":` that
            # spawn or forkserver re-ran in the worker, which then failed.
            return (
                f"{self.describe()} {how} while starting, before it could load the transform "
                "(with start_method 'spawn' or 'forkserver' a worker imports the main script: "
                'start the loader under `if __name__ == "__main__":`)'
            )
        return f"{self.describe()} {how} while transforming step {step}"

    def stop(self) -> None:
        """Ends the process now (SIGTERM): it holds nothing worth a clean exit."""
        if self.process.exitcode is None:
            with contextlib.suppress(OSError, AttributeError):  # already reaped
                self.process.terminate()

    def reap(self, timeout: float | None) -> bool:
        """Waits up to ``timeout`` for the process to end, then kills it;
        True once it is gone."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join(1.0)
        if self.process.exitcode is not None:
            self.conn.close()
            return True
        return False  # pragma: no cover - a process that survives SIGKILL


def _loaded_error(data: bytes, context: str | None) -> BaseException:
    try:
        error: BaseException = pickle.loads(data)
    except BaseException as e:  # pragma: no cover - _describe checked it
        error = RuntimeError(f"an unreadable error from a transform worker: {e}")
    if context is None:
        return error
    wrapped = TransformWorkerError(f"{context}: {type(error).__name__}: {error}")
    wrapped.__cause__ = error
    return wrapped


class ProcessWorkers:
    """The arena, the pool lent to the native loader, and ``count`` worker
    processes running ``transform``.

    ``regions``: the byte size of each Dense stream's batch (this shard's
    rows); ``slots``: how many batches of each can be alive at once. When
    more are alive (a consumer keeping old batches), the loader gathers
    into its own memory and those batches travel out of band instead.
    """

    def __init__(
        self,
        transform: Callable[[Any], Any],
        count: int,
        start_method: str,
        regions: list[int],
        slots: int,
    ) -> None:
        context = multiprocessing.get_context(start_method)
        if start_method == "fork":
            payload: Any = transform
            pickled = False
        else:
            payload = check_picklable(transform, start_method)
            pickled = True
        sizes = [_aligned(n) for n in regions if n > 0]
        size = sum(sizes) * slots
        fd = _shared_file(size)
        try:
            self.arena = _Arena(fd, size)
            self.pool = _native.LentPool()
            at = 0
            for _ in range(slots):
                for n in sizes:
                    self.pool.lend(self.arena.array[at : at + n])
                    at += n
            self.workers: list[_Worker] = []
            try:
                for i in range(count):
                    worker = _Worker(i, count, context, payload, pickled, self.arena)
                    self.workers.append(worker)
                    worker.handshake(fd, size)
            except BaseException:
                self.stop()
                self.reap(1.0)
                raise
        finally:
            # The workers got their own descriptors (SCM_RIGHTS duplicates
            # them); the arena lives on in the mappings.
            os.close(fd)

    def call(self, index: int, step: int, batch: Any) -> Any:
        """Runs the transform on ``batch`` in worker ``index``; raises what
        the transform raised, or TransformWorkerError."""
        arena = self.arena
        sent: list[tuple[int, int, np.ndarray]] = []
        for value in batch.values():
            ref = arena.reference(value) if type(value) is np.ndarray else None
            if ref is not None:
                sent.append((ref[2], ref[3], value))  # its lowest byte and one past its highest

        def resolve(pid: Any) -> np.ndarray:
            # A view of the batch's own memory: built on the array the
            # loader gave, so its region stays lent while the view lives.
            _, ptr, lo, hi, dtype, shape, strides = pid
            for start, end, original in sent:
                if start <= lo and hi <= end:
                    base = original.__array_interface__["data"][0] - arena.ptr
                    flat = original.reshape(-1).view(np.uint8)
                    view: np.ndarray = np.ndarray(
                        shape, dtype, buffer=flat, offset=ptr - base, strides=strides
                    )
                    return view
            raise TransformWorkerError(
                f"the transform of step {step} returned a view of shared memory that is not part of "
                "that step's batch: the arrays a process worker's transform receives are valid only "
                "during the call (return them, or copies, but do not keep them)"
            )

        return self.workers[index].call(step, batch, resolve)

    def stop(self) -> None:
        """Signals every worker to end; never blocks."""
        for w in self.workers:
            w.stop()

    def reap(self, timeout: float | None) -> None:
        """Waits up to ``timeout`` seconds in all for the workers to end,
        killing those still running then."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        for w in self.workers:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            w.reap(left)

    def pids(self) -> list[int]:
        """Process ids of the workers (for tests and monitoring)."""
        return [w.process.pid for w in self.workers if w.process.pid is not None]


def check_picklable(transform: Callable[[Any], Any], start_method: str) -> bytes:
    """``transform`` pickled, or a TypeError saying how to make it picklable."""
    if start_method == "fork":
        return b""  # a forked worker inherits it
    try:
        return pickle.dumps(transform, protocol=5)
    except Exception as e:
        raise TypeError(
            f"workers='process' with start_method={start_method!r} sends the transform to its "
            f"worker processes by pickling it, and {transform!r} cannot be pickled "
            f"({type(e).__name__}: {e}): define it at module level (not a lambda or a nested "
            "function) or make it a picklable object, or use start_method='fork'"
        ) from None
