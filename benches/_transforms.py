"""Batch transforms of ``bench_loader.py``, and the NumPy references that check them.

Every transform is a module-level ``def`` taking and returning one batch, a
dict ``{"image": uint8 (B, 3, H, W), "label": int64 (B,), ...}`` of NumPy
arrays.  Being module-level, they pickle *by reference*, so a loader that
runs them in spawn / forkserver worker processes (torch, grain, our
``workers="process"``) only sends a name, and the worker imports this file
(the benchmark puts ``benches/`` on ``sys.path``, which multiprocessing hands
on to its children).  Only stdlib and NumPy at import time: the file runs
unchanged under our venv, loaderx 2.0.0's and the peers' one.  Numba is
imported on first use of ``numba``.

``TRANSFORMS`` (name -> function):

``identity``
    Returns its argument: ``lambda b: b`` as a picklable ``def``.  It makes a
    loader take its Python-transform path without doing any work there.
``pyloop``
    A per-sample pure-Python loop holding the GIL: for each image, for the
    first ``PYLOOP_ROWS`` (64) rows of each of the 3 channels, a ``for`` loop
    over the row's 224 pixels accumulates the sum and the sum of squares, and
    the row's ``W * sum(x^2) - sum(x)^2`` (``W^2`` times its variance, an exact
    integer) goes into a new ``int64 (B, 3, PYLOOP_ROWS)`` entry ``"feat"``.
    That is 43,008 interpreted iterations per sample, about 2 ms of one core
    per sample here (0.5 s per batch of 256): the order of a real per-sample
    augmentation (decode-free crop + flip + normalise through PIL/torchvision
    is 1-3 ms on a 224x224 image).  Threads cannot run it in parallel.
``numba``
    The same computation compiled with ``numba.njit(nogil=True)``: identical
    ``"feat"``, about 100x cheaper, and it releases the GIL, so transform
    threads do run it in parallel.  ``prepare("numba")`` compiles it before
    anything is timed (a process that did not, compiles on its first batch,
    which every row spends in its untimed verification / warm-up phases).
``numpy``
    Vectorised normalisation of the image to float32,
    ``(x.astype(float32) - MEAN[c]) / STD[c]`` with ImageNet's per-channel
    mean and std (in 0..255 units): the image becomes float32 (4x the bytes).

Checks (``check_record``, ``check_batch``) compare a delivered batch with a NumPy computation made
independently of the loader: from the source records for the fully verified
batches, from the delivered uint8 image otherwise.  Every comparison is
exact: integer arithmetic for ``feat``, and the same two correctly rounded
float32 operations for ``numpy``.
"""

from __future__ import annotations

import numpy as np

PYLOOP_ROWS = 64  # rows per channel the Python loop walks: sets its cost (~2 ms per sample here)
# ImageNet's channel statistics, scaled to 0..255 (float32, so the reference is the same arithmetic).
MEAN = np.asarray([0.485 * 255, 0.456 * 255, 0.406 * 255], dtype=np.float32).reshape(1, 3, 1, 1)
STD = np.asarray([0.229 * 255, 0.224 * 255, 0.225 * 255], dtype=np.float32).reshape(1, 3, 1, 1)


def identity(batch):
    """The batch, unchanged (``lambda b: b``, but picklable)."""
    return batch


def _row_stats_py(img: np.ndarray, out: list) -> None:
    width = img.shape[-1]
    for c in range(img.shape[0]):
        for r in range(PYLOOP_ROWS):
            s = q = 0
            for v in img[c, r].tobytes():  # iterating bytes yields Python ints: the loop is interpreted
                s += v
                q += v * v
            out.append(width * q - s * s)


def pyloop(batch):
    """Per-sample, per-pixel Python loop (GIL-bound): adds ``feat`` int64 (B, 3, PYLOOP_ROWS)."""
    img = batch["image"]
    vals: list = []
    for k in range(img.shape[0]):
        _row_stats_py(img[k], vals)
    feat = np.asarray(vals, dtype=np.int64).reshape(img.shape[0], img.shape[1], PYLOOP_ROWS)
    return {**batch, "feat": feat}


_KERNEL = None


def _numba_kernel():
    """``pyloop``'s arithmetic as a ``numba.njit(nogil=True)`` kernel, compiled once per process."""
    global _KERNEL
    if _KERNEL is None:
        import numba

        @numba.njit(nogil=True, cache=False)
        def row_stats(img, rows):  # img: uint8 (B, C, H, W)
            b, c, _, w = img.shape
            out = np.empty((b, c, rows), dtype=np.int64)
            for k in range(b):
                for ch in range(c):
                    for r in range(rows):
                        s = 0
                        q = 0
                        for x in range(w):
                            v = np.int64(img[k, ch, r, x])
                            s += v
                            q += v * v
                        out[k, ch, r] = w * q - s * s
            return out

        _KERNEL = row_stats
    return _KERNEL


def numba_loop(batch):
    """``pyloop`` compiled with Numba (nogil): the same ``feat``."""
    return {**batch, "feat": _numba_kernel()(batch["image"], PYLOOP_ROWS)}


def normalize(batch):
    """Vectorised NumPy: image -> float32 ``(x - MEAN[c]) / STD[c]``."""
    return {**batch, "image": (batch["image"].astype(np.float32) - MEAN) / STD}


TRANSFORMS = {"identity": identity, "pyloop": pyloop, "numba": numba_loop, "numpy": normalize}


def get(name: str | None):
    """The transform called ``name``; None for ``"none"`` (the loader's own default)."""
    if name in (None, "none"):
        return None
    return TRANSFORMS[name]


def prepare(name: str | None) -> None:
    """Make a transform ready before timing: compiles the Numba kernel (on a tiny input)."""
    if name == "numba":
        _numba_kernel()(np.zeros((1, 3, PYLOOP_ROWS, 8), dtype=np.uint8), PYLOOP_ROWS)


# --------------------------------------------------------------------------- references and checks


def ref_feat(images: np.ndarray) -> np.ndarray:
    """NumPy reference of ``feat`` for uint8 images (..., C, H, W): int64 (..., C, PYLOOP_ROWS)."""
    x = images[..., :PYLOOP_ROWS, :].astype(np.int64)
    w = images.shape[-1]
    return w * (x * x).sum(-1) - x.sum(-1) ** 2


def ref_normalize(images: np.ndarray) -> np.ndarray:
    """NumPy reference of ``numpy``'s image for uint8 images (B, C, H, W)."""
    return (images.astype(np.float32) - MEAN) / STD


def image_dtype(name: str | None):
    """dtype of the delivered image after transform ``name``."""
    return np.float32 if name == "numpy" else np.uint8


def stamp_image(name: str | None, img: np.ndarray) -> np.ndarray:
    """The 4 stamp bytes (channel 0, row 0, x 0..3) of each image, as uint8 (B, 4).

    For ``numpy`` the bytes are recovered from the float32 values, after
    checking that those are exactly the normalised values of some bytes."""
    head = np.ascontiguousarray(img[:, 0, 0, :4])
    if name != "numpy":
        return head
    guess = np.rint(head * STD[0, 0, 0, 0] + MEAN[0, 0, 0, 0]).clip(0, 255).astype(np.uint8)
    if not np.array_equal(ref_normalize(guess[:, None, None, :])[:, 0, 0, :], head):
        raise AssertionError("numpy transform: stamp pixels are not normalised uint8 values")
    return guess


def _feat_of(name: str, batch: dict) -> np.ndarray:
    feat = batch.get("feat")
    b, c = batch["image"].shape[:2]
    if not isinstance(feat, np.ndarray) or feat.dtype != np.int64 or feat.shape != (b, c, PYLOOP_ROWS):
        got = f"{feat.dtype}{feat.shape}" if isinstance(feat, np.ndarray) else type(feat).__name__
        raise AssertionError(f"{name} transform: feat is {got}, want int64{(b, c, PYLOOP_ROWS)}")
    return feat


def check_record(name: str | None, batch: dict, k: int, source: np.ndarray) -> None:
    """Raise AssertionError unless sample ``k`` of ``batch`` is transform ``name``
    applied to ``source``, the uint8 (C, H, W) source record of its label.

    One record at a time, so the check allocates no batch-sized temporaries
    (they would show in the row's peak memory)."""
    img = batch["image"][k]
    if name == "numpy":
        if not np.array_equal(img, ref_normalize(source[None])[0]):
            raise AssertionError("numpy transform: image differs from the NumPy reference on the source")
        return
    if not np.array_equal(img, source):
        raise AssertionError("image differs from the source record")
    if name in ("pyloop", "numba") and not np.array_equal(_feat_of(name, batch)[k], ref_feat(source)):
        raise AssertionError(f"{name} transform: feat differs from the NumPy reference on the source")


def check_batch(name: str | None, batch: dict) -> None:
    """The cheap check of every warm-up / last batch: ``feat`` against the NumPy
    reference on the delivered image (the image itself is checked by its stamp)."""
    if name in ("pyloop", "numba"):
        feat = _feat_of(name, batch)
        img = batch["image"]
        for k in range(img.shape[0]):
            if not np.array_equal(feat[k], ref_feat(img[k])):
                raise AssertionError(f"{name} transform: feat of sample {k} differs from the NumPy reference")
