"""Tools for working with Zrecord stores: inspect, check, convert, demo.

The ``loaderx`` command line (``python -m loaderx``) is a thin layer over
these functions:

* :func:`info` describes a store: kind, dtype, shape, codec, record count,
  logical and on-disk size, compression ratio, dictionary size.
* :func:`verify` decodes every record of a store and reports the first bad one.
* :func:`convert` builds stores from ``.npy``/``.npz`` files, Parquet and Arrow
  IPC files, Hugging Face ``datasets`` (saved with ``save_to_disk`` or passed
  as objects), pyarrow Tables, NumPy arrays, or another store (to re-encode it
  with a different codec). Parquet, Arrow and ``datasets`` need the optional
  extra ``pip install 'loaderx[convert]'``.
  Binary and string columns (encoded images, audio, text) become Ragged
  uint8 stores of their bytes; ``codec="auto"`` (the default) measures which
  codec pays per store; every store gets a ``features.json`` sidecar with the
  source's type and class names (:func:`class_names`, ``store.features``).
* :func:`decode_images` is a DataLoader transform that decodes encoded
  images with Pillow in the transform workers (``pip install 'loaderx[images]'``).
* :func:`demo` builds three stores from generated data and streams them
  through a :class:`~loaderx.dataloader.DataLoader`, checking every batch.

They live in submodules by job: :mod:`~loaderx.tools.inspect` (open, info,
verify), :mod:`~loaderx.tools.convert` (the dispatcher, NumPy and store
sources, upload), :mod:`~loaderx.tools.arrow` (Parquet, Arrow IPC, Hugging
Face), :mod:`~loaderx.tools.images` (Pillow decoding) and
:mod:`~loaderx.tools.demo`; every public name is importable from here.

Example::

    from loaderx import tools

    stores = tools.convert("train.parquet", "train")  # codec="auto"
    # {'image': PosixPath('train/image'), 'label': PosixPath('train/label')}
    print(tools.info(stores["image"]))
    print(tools.class_names(stores["label"]))        # ['cat', 'dog', ...] for a ClassLabel
    assert tools.verify(stores["image"]).ok
"""

from loaderx._progress import Progress
from loaderx.tools._common import (
    EXTRA_HINT as EXTRA_HINT,
)
from loaderx.tools._common import (
    ConvertError,
    MissingExtraError,
    NotAStoreError,
    UnsupportedColumnError,
)
from loaderx.tools._common import (
    PathLike as PathLike,
)
from loaderx.tools.convert import CONVERT_CODECS, convert, upload
from loaderx.tools.demo import DemoError, demo
from loaderx.tools.demo import _fmt_bytes as _fmt_bytes  # the command line's size format
from loaderx.tools.images import DecodeImages, decode_image, decode_images
from loaderx.tools.inspect import VerifyResult, class_names, info, open_store, verify

__all__ = [
    "CONVERT_CODECS",
    "ConvertError",
    "DecodeImages",
    "DemoError",
    "MissingExtraError",
    "NotAStoreError",
    "Progress",
    "UnsupportedColumnError",
    "VerifyResult",
    "class_names",
    "convert",
    "decode_image",
    "decode_images",
    "demo",
    "info",
    "open_store",
    "upload",
    "verify",
]
