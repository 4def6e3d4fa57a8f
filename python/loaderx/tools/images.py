"""Encoded images (JPEG, PNG, WebP, ...) decoded with Pillow: one at a time
(:func:`decode_image`), in the loader's transform workers
(:func:`decode_images`), or at conversion (``convert(..., decode_images=...)``).

Pillow is the optional extra ``pip install 'loaderx[images]'``; it is
imported only when something is decoded. It releases the GIL while it
decodes, so a DataLoader's ``transform_workers`` threads decode images in
parallel.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from loaderx.tools._common import ConvertError, MissingExtraError

#: Install hint for Pillow.
IMAGES_HINT = "pip install 'loaderx[images]'"


def _import_pil(what: str) -> Any:
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingExtraError(
            f"{what} needs the optional dependency Pillow, which is not installed ({e}); "
            f"install it with: {IMAGES_HINT}"
        ) from None
    return Image


def decode_image(data: bytes | bytearray | memoryview | np.ndarray, mode: str = "RGB") -> np.ndarray:
    """Decodes one encoded image (bytes, or a uint8 array of them as a Ragged
    store holds it) to a new uint8 array ``(H, W, C)``, converted to the
    Pillow ``mode`` first (``"RGB"``: C = 3; ``"L"``: C = 1; ``"RGBA"``...).
    A multi-frame file (GIF, TIFF) gives its first frame. Raises ValueError
    when Pillow cannot decode the bytes or the mode is not 8 bits a channel."""
    image_mod = _import_pil("decoding images")
    raw = data.tobytes() if isinstance(data, np.ndarray) else bytes(data)
    try:
        with image_mod.open(io.BytesIO(raw)) as img:
            img.load()
            converted = img if img.mode == mode else img.convert(mode)
            arr = np.asarray(converted)
    except (OSError, SyntaxError, ValueError) as e:  # Pillow's errors for bad data or modes
        raise ValueError(f"not an image Pillow can decode to mode {mode!r}: {e}") from None
    if arr.dtype != np.uint8:
        raise ValueError(
            f"mode {mode!r} decodes to {arr.dtype}, not uint8: use an 8-bit mode such as 'RGB' or 'L'"
        )
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if not arr.flags.writeable:
        arr = arr.copy()
    return arr


class DecodeImages:
    """A DataLoader transform that decodes the encoded images of Ragged
    streams: each record of the streams ``names`` (a uint8 array of an image
    file's bytes, as ``loaderx convert`` stores an image column) becomes a
    uint8 ``(H, W, C)`` array in Pillow ``mode``, so those streams arrive as
    lists of decoded images; other streams pass through unchanged. ``then``,
    if given, is applied to the decoded batch (normalise, stack, augment...).

    A plain class (not a closure), so it pickles and can be sent to worker
    processes. Build it with :func:`decode_images`.
    """

    __slots__ = ("mode", "names", "then")

    def __init__(
        self,
        names: str | Sequence[str] = ("image",),
        mode: str = "RGB",
        then: Callable[[dict[str, Any]], Any] | None = None,
    ) -> None:
        self.names: tuple[str, ...] = (names,) if isinstance(names, str) else tuple(names)
        if not self.names or not all(isinstance(n, str) for n in self.names):
            raise ValueError(f"names must be one or more stream names, got {names!r}")
        if not isinstance(mode, str):
            raise TypeError(f"mode must be a Pillow mode name such as 'RGB', got {mode!r}")
        if then is not None and not callable(then):
            raise TypeError(f"then must be callable, got {type(then).__name__}")
        _import_pil("decode_images")  # fail now, not in a worker thread
        self.mode = mode
        self.then = then

    def __call__(self, batch: dict[str, Any]) -> Any:
        out = dict(batch)
        for name in self.names:
            if name not in batch:
                raise KeyError(f"decode_images: the batch has no stream {name!r}; it has: {', '.join(batch)}")
            records = batch[name]
            if not isinstance(records, list):
                raise TypeError(
                    f"decode_images: stream {name!r} is a {type(records).__name__}, not a list of "
                    "encoded images: it must be a Ragged uint8 stream, neither packed nor padded"
                )
            decoded = []
            for i, record in enumerate(records):
                try:
                    decoded.append(decode_image(record, self.mode))
                except ValueError as e:
                    raise ValueError(
                        f"decode_images: stream {name!r}, record {i} of the batch: {e}"
                    ) from None
            out[name] = decoded
        return out if self.then is None else self.then(out)

    def __repr__(self) -> str:
        then = "" if self.then is None else f", then={self.then!r}"
        return f"DecodeImages(names={self.names!r}, mode={self.mode!r}{then})"


def decode_images(
    names: str | Sequence[str] = ("image",),
    mode: str = "RGB",
    then: Callable[[dict[str, Any]], Any] | None = None,
) -> DecodeImages:
    """A ``transform`` for :class:`~loaderx.dataloader.DataLoader` that
    decodes the encoded images of the Ragged streams ``names`` in the
    loader's transform workers (Pillow releases the GIL while decoding, so
    ``transform_workers`` threads decode in parallel)::

        from loaderx.tools import decode_images

        loader = DataLoader({"image": Ragged.open("train/image"), "label": Dense.open("train/label")},
                            transform=decode_images("image"), transform_workers=4)
        batch = next(loader)   # batch["image"]: a list of uint8 (H, W, 3) arrays

    ``mode`` is the Pillow mode every image is converted to (``"RGB"``,
    ``"L"`` (C = 1), ``"RGBA"``, ...). ``then`` is applied to each decoded
    batch. The result is picklable. Needs ``pip install 'loaderx[images]'``.
    """
    return DecodeImages(names, mode, then)


def decode_column(
    records: Iterable[np.ndarray], mode: str, what: str, row0: int, workers: int
) -> list[np.ndarray]:
    """Decodes a block of encoded images of a column being converted (row
    ``row0`` first) on ``workers`` threads; a record Pillow cannot decode is a
    :class:`ConvertError` naming its row."""
    items = list(records)

    def one(i: int) -> np.ndarray:
        try:
            return decode_image(items[i], mode)
        except ValueError as e:
            raise ConvertError(f"{what} row {row0 + i}: {e}") from None

    if workers <= 1 or len(items) < 2:
        return [one(i) for i in range(len(items))]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="loaderx-decode") as pool:
        return list(pool.map(one, range(len(items))))
