"""The loaders of ``bench_loader.py``: one builder per row kind, and the peer data files.

``open_pipeline(spec)`` builds one row's pipeline inside a benchmark worker
and returns ``(iterator, to_numpy, close, info)``: the iterator yields batches
endlessly, ``to_numpy`` turns one into ``{"image", "label", ...}`` NumPy
arrays for the checks.  The worker runs under the row's interpreter (ours,
loaderx 2.0.0's venv, or the peers' venv), so this file imports only stdlib
and NumPy at module level, and each builder imports its loader.

Classes and callables that a loader sends to its worker processes (datasets,
collate functions, grain's map functions) are module-level, so they pickle
by reference under spawn as well as fork.  Every row applies its transform
(``_transforms``) once per batch of 256, where the loader does its
per-batch work: loaderx's transform workers; torch's ``collate_fn`` in each
worker process (after ``default_collate`` has stacked the samples into
shared memory); a ``map`` after grain's ``batch``.

Run as a script, it builds one peer data file from the benchmark's source
images (under the peers' venv, from ``bench_loader.py``)::

    python _pipelines.py --build arrayrecord|mds|wds|hf IMAGES.npy OUT_DIR

reusing the writers of ``benches/peers/_worker.py`` (the store benchmark's),
uncompressed, one JSON line out.  Records are the image bytes only; a row's
label is the index of the record it read (ArrayRecord's index, MDS's sample
id, the tar member's key, the Arrow row), which ``label[i] == i`` makes the
same thing as the source label.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

HERE = Path(__file__).resolve().parent
ITEM = (3, 224, 224)
PEER_FORMATS = ("arrayrecord", "mds", "wds", "hf")


def _transforms():
    import _transforms  # benches/ is on sys.path in every worker (see bench_loader.worker)

    return _transforms


def _endless(loader):
    while True:
        yield from loader


def _version(dist: str) -> str:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:
        return "?"


def base_info() -> dict:
    return {"python": f"{platform.python_implementation()} {platform.python_version()}",
            "executable": sys.executable, "numpy": np.__version__}


# =========================================================================== loaderx (ours and 2.0.0)


def _loaderx(spec: dict):
    """``loaderx.dataloader.DataLoader`` over the zstd or raw stores.

    ``transform`` None passes no transform (the loader's default identity,
    which ours runs natively); any other name passes that function.
    ``model == "process"`` adds ``workers="process", start_method=...``
    (ours only, once that option exists); a TypeError from the constructor
    then means the option is not there, reported as ``not available``."""
    import loaderx
    from loaderx.dataloader import DataLoader
    from loaderx.zrecord import Dense

    info = base_info()
    info["loaderx_version"] = getattr(loaderx, "__version__", "?")
    info["loaderx_file"] = loaderx.__file__
    streams = {"image": Dense.open(spec["stores"]["image"]), "label": Dense.open(spec["stores"]["label"])}
    kwargs = dict(batch_size=spec["batch"], transform_workers=spec["transform_workers"],
                  prefetch_size=spec["prefetch"])
    fn = _transforms().get(spec.get("transform"))
    if fn is not None:
        kwargs["transform"] = fn
    if spec.get("model") == "process":
        kwargs.update(workers="process", start_method=spec.get("start_method"))
    try:
        loader = DataLoader(streams, **kwargs)
    except TypeError as exc:
        for s in streams.values():
            s.close()
        if spec.get("model") == "process":
            raise Unavailable(f"not available: TypeError: {exc}") from None
        raise

    def close():
        loader.close()
        for s in streams.values():
            s.close()

    return iter(loader), (lambda b: b), close, info


class Unavailable(Exception):
    """The row's loader lacks the requested option: reported, not an error."""


# =========================================================================== torch DataLoader family


class NpyDataset:
    """Map-style dataset on ``np.load(mmap_mode='r')``: ``{'image': images[i], 'label': labels[i]}``.

    Opened lazily, i.e. in each worker process (a fork child or a spawned one
    alike), so the parent maps nothing; torch accepts any object with
    ``__len__``/``__getitem__``, so no torch import is needed here."""

    def __init__(self, images_path: str, labels_path: str):
        self.images_path, self.labels_path = images_path, labels_path
        self.images = self.labels = None
        self.n = len(np.load(labels_path, mmap_mode="r"))

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.images is None:
            # default_collate copies the read-only memmap slices into the shared
            # batch tensor; its per-worker "not writable" warning is noise here.
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            self.images = np.load(self.images_path, mmap_mode="r")
            self.labels = np.load(self.labels_path, mmap_mode="r")
        return {"image": self.images[i], "label": self.labels[i]}

    def __getstate__(self):  # spawn pickles the dataset: send paths, never mappings
        return {**self.__dict__, "images": None, "labels": None}


class BatchCollate:
    """``collate_fn`` of every torch-based row: ``default_collate`` (which, in a
    worker, stacks the samples straight into a shared-memory tensor), then
    the transform on NumPy views of that batch, in the worker.

    Arrays the transform returns unchanged go back as the original shared
    tensors (no copy); new arrays become tensors that torch moves into shared
    memory when it queues the batch (one copy, as any new output costs a
    process-based loader).  ``decode`` turns samples holding record bytes
    (``{'rec': bytes, 'label': int}``) into image arrays first."""

    def __init__(self, transform: str | None, decode: bool = False):
        self.transform, self.decode = transform, decode

    def __call__(self, samples):
        from torch.utils.data import default_collate

        if self.decode:
            warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
            samples = [{"image": np.frombuffer(s["rec"], dtype=np.uint8).reshape(ITEM),
                        "label": np.int64(s["label"])} for s in samples]
        batch = default_collate(samples)
        fn = _transforms().get(self.transform)
        if fn is None:
            return batch
        import torch

        views = {k: v.numpy() for k, v in batch.items()}
        back = {id(a): batch[k] for k, a in views.items()}
        out = fn(views)
        return {k: back[id(v)] if id(v) in back else torch.from_numpy(np.ascontiguousarray(v))
                for k, v in out.items()}


def _torch_numpy(b):
    return {k: v.numpy() for k, v in b.items()}


def _torch_info(loader) -> dict:
    import torch

    info = base_info()
    info["torch"] = torch.__version__
    ctx = loader.multiprocessing_context
    method = ctx.get_start_method() if ctx is not None else torch.multiprocessing.get_start_method()
    info["model"] = f"{loader.num_workers} worker processes, start method {method}"
    return info


def _torch_npy(spec: dict):
    """torch.utils.data.DataLoader over ``NpyDataset``: shuffle, drop_last,
    persistent workers, the transform in ``collate_fn``."""
    import torch
    from torch.utils.data import DataLoader

    torch.manual_seed(spec["seed"])
    w = spec["workers"]
    loader = DataLoader(NpyDataset(spec["images"], spec["labels"]), batch_size=spec["batch"], shuffle=True,
                        num_workers=w, persistent_workers=w > 0, drop_last=True,
                        collate_fn=BatchCollate(spec.get("transform")),
                        multiprocessing_context=spec.get("start_method") if w > 0 else None)
    info = _torch_info(loader)

    def close():
        nonlocal loader
        del loader

    return _endless(loader), _torch_numpy, close, info


# --------------------------------------------------------------------------- MosaicML Streaming


_STREAMING_CLASS = None


def _labelled_streaming_dataset():
    """A ``StreamingDataset`` whose samples also carry their global sample id as
    ``label`` (``get_item`` is where it maps an id to a shard and reads it).
    Built on first use, since only the peers' venv has ``streaming``; the rows
    that use it fork their workers, which inherit the class."""
    global _STREAMING_CLASS
    if _STREAMING_CLASS is None:
        from streaming import StreamingDataset

        class LabelledStreamingDataset(StreamingDataset):
            def get_item(self, sample_id: int, retry: int = 7):
                return {"rec": super().get_item(sample_id, retry)["rec"], "label": int(sample_id)}

        _STREAMING_CLASS = LabelledStreamingDataset
    return _STREAMING_CLASS


def _streaming(spec: dict):
    """MosaicML ``StreamingDataset`` on the local (uncompressed) MDS shards,
    its own shuffle (``shuffle=True``, default algorithm, seeded), under a torch
    DataLoader with ``workers`` fork processes."""
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    cls = _labelled_streaming_dataset()
    ds = cls(local=spec["peer_data"], shuffle=True, shuffle_seed=spec["seed"], batch_size=spec["batch"])
    w = spec["workers"]
    loader = DataLoader(ds, batch_size=spec["batch"], num_workers=w, persistent_workers=w > 0, drop_last=True,
                        collate_fn=BatchCollate(spec.get("transform"), decode=True),
                        multiprocessing_context="fork" if w > 0 else None)
    info = _torch_info(loader)
    info["mosaicml-streaming"] = _version("mosaicml-streaming")

    def close():
        nonlocal loader
        del loader

    return _endless(loader), _torch_numpy, close, info


# --------------------------------------------------------------------------- WebDataset


class WdsSample:
    """A tar sample ``{'__key__': '000000042', 'bin': bytes}`` -> ``{'rec', 'label'}``."""

    def __call__(self, s):
        return {"rec": s["bin"], "label": int(s["__key__"])}


def _wds(spec: dict):
    """``webdataset.WebDataset`` over the tar shards: shards split between the
    ``workers`` fork processes, read in order (tar has no index), then a
    shuffle buffer of ``wds_shuffle`` samples per worker: SEQUENTIAL access."""
    import webdataset as wds
    from torch.utils.data import DataLoader

    urls = sorted(str(p) for p in Path(spec["peer_data"]).glob("shard-*.tar"))
    ds = wds.WebDataset(urls, shardshuffle=False, empty_check=False, workersplitter=wds.split_by_worker)
    if spec.get("wds_shuffle"):
        ds = ds.shuffle(spec["wds_shuffle"], initial=spec["wds_shuffle"], seed=spec["seed"])
    ds = ds.map(WdsSample())
    w = spec["workers"]
    loader = DataLoader(ds, batch_size=spec["batch"], num_workers=w, persistent_workers=w > 0, drop_last=True,
                        collate_fn=BatchCollate(spec.get("transform"), decode=True),
                        multiprocessing_context="fork" if w > 0 else None)
    info = _torch_info(loader)
    info["webdataset"] = _version("webdataset")
    info["shards"] = len(urls)

    def close():
        nonlocal loader
        del loader

    return _endless(loader), _torch_numpy, close, info


# --------------------------------------------------------------------------- Hugging Face datasets


class HfBatchDataset:
    """Map-style view of a ``datasets.Dataset`` saved with ``save_to_disk``,
    opened with ``load_from_disk(...).with_format('numpy')`` in each worker.

    ``__getitems__`` (which torch's fetcher calls with a whole batch of
    indices) does one batched ``ds[indices]`` and returns per-sample views of
    its result for ``default_collate``."""

    def __init__(self, path: str, n: int):
        self.path, self.n, self.ds = path, n, None

    def __len__(self):
        return self.n

    def _open(self):
        if self.ds is None:
            import datasets

            self.ds = datasets.load_from_disk(self.path).with_format("numpy")
        return self.ds

    def __getitems__(self, indices):
        data = self._open()[list(indices)]["data"]  # fixed-size binary column -> (B,) bytes array
        images = hf_images(data, len(indices))
        return [{"image": images[k], "label": np.int64(i)} for k, i in enumerate(indices)]

    def __getitem__(self, i):
        return self.__getitems__([i])[0]

    def __getstate__(self):
        return {**self.__dict__, "ds": None}


def hf_images(data, n: int) -> np.ndarray:
    """The ``data`` column of ``n`` rows as uint8 (n, 3, 224, 224), copying only when it is not one buffer."""
    arr = np.asarray(data)
    if arr.dtype.kind == "S" and arr.dtype.itemsize == int(np.prod(ITEM)):
        return arr.view(np.uint8).reshape(n, *ITEM)
    return np.stack([np.frombuffer(x, dtype=np.uint8) for x in arr]).reshape(n, *ITEM)


def _hf(spec: dict):
    """``HfBatchDataset`` under a torch DataLoader: a shuffled batch sampler,
    ``workers`` fork processes, the transform in ``collate_fn``."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    torch.manual_seed(spec["seed"])
    ds = HfBatchDataset(spec["peer_data"], spec["records"])
    w = spec["workers"]
    loader = DataLoader(ds, batch_sampler=BatchSampler(RandomSampler(ds), spec["batch"], drop_last=True),
                        num_workers=w, persistent_workers=w > 0,
                        collate_fn=BatchCollate(spec.get("transform")),
                        multiprocessing_context="fork" if w > 0 else None)
    info = _torch_info(loader)
    info["datasets"] = _version("datasets")

    def close():
        nonlocal loader
        del loader

    return _endless(loader), _torch_numpy, close, info


# --------------------------------------------------------------------------- grain


class GrainRecord:
    """``map_with_index`` on the unshuffled source: ArrayRecord bytes -> image,
    with the source index as label.  A repeated dataset passes indices past
    the end (epoch * n + i) down to its parents, which read record ``i``: so
    the label is the index modulo ``n``."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, index, rec):
        return {"image": np.frombuffer(rec, dtype=np.uint8).reshape(ITEM), "label": np.int64(index % self.n)}


class GrainTransform:
    """The transform, by name, as a grain map over whole batches."""

    def __init__(self, name: str):
        self.name = name

    def __call__(self, batch):
        return _transforms().get(self.name)(batch)


def _grain(spec: dict):
    """grain's dataset API over ArrayRecord (``group_size:1``):
    ``MapDataset.source(ArrayRecordDataSource).map_with_index(decode)
    .shuffle(seed).batch(256, drop_remainder=True).repeat()`` [``.map(transform)``]
    ``.to_iter_dataset(ReadOptions(num_threads=0))``
    ``.mp_prefetch(MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=2))``.

    Grain's worker processes each produce whole batches (every ``workers``-th
    one); 2 buffered per worker, like torch's ``prefetch_factor=2``, and no
    extra read threads inside a worker (its default of 16 threads with a
    500-element buffer would hold hundreds of 37 MiB batches)."""
    import grain

    src = grain.sources.ArrayRecordDataSource(spec["peer_data"])
    ds = (grain.MapDataset.source(src).map_with_index(GrainRecord(len(src))).shuffle(seed=spec["seed"])
          .batch(spec["batch"], drop_remainder=True).repeat(None))
    if spec.get("transform") not in (None, "none"):
        ds = ds.map(GrainTransform(spec["transform"]))
    it_ds = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if spec["workers"] > 0:
        it_ds = it_ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=spec["workers"],
                                                               per_worker_buffer_size=2))
    it = iter(it_ds)
    info = base_info()
    info["grain"] = _version("grain")
    info["array-record"] = _version("array-record")
    info["model"] = f"{spec['workers']} grain worker processes (mp_prefetch)"

    def close():
        c = getattr(it, "close", None)
        if c:
            c()

    return it, (lambda b: b), close, info


BUILDERS = {"loaderx": _loaderx, "torch": _torch_npy, "streaming": _streaming, "wds": _wds, "hf": _hf,
            "grain": _grain}


def open_pipeline(spec: dict):
    """Build the row's pipeline: ``(iterator, to_numpy, close, info)``."""
    return BUILDERS[spec["loader"]](spec)


# =========================================================================== peer data files


def _peer_worker():
    """``benches/peers/_worker.py`` (the store benchmark's writers), loaded by path."""
    spec = importlib.util.spec_from_file_location("_peers_worker_for_loader", HERE / "peers" / "_worker.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# our format name -> the peers worker's backend name
_PEER_BACKEND = {"arrayrecord": "arrayrecord", "mds": "mds", "wds": "webdataset", "hf": "hf-datasets"}


def build_peer_data(fmt: str, images_path: str, out: str) -> dict:
    """Write the source images as one uncompressed peer data set at ``out``.

    ArrayRecord with ``group_size:1`` (grain's recommendation for random
    access: one record per chunk); MDS and WebDataset in 64 MiB shards;
    Hugging Face ``save_to_disk``.  ``out`` must not exist yet."""
    pw = _peer_worker()
    images = np.load(images_path, mmap_mode="r")
    src = SimpleNamespace(kind="dense", dtype=images.dtype, item_shape=tuple(images.shape[1:]),
                          n=int(images.shape[0]), record_nbytes=int(np.prod(images.shape[1:])),
                          logical_bytes=int(images.nbytes))
    backend = pw.BACKENDS[_PEER_BACKEND[fmt]]({"group_rows": 1})
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    writer = backend.create(path, src, "raw", None)
    append = backend.appender(writer)
    for i in range(0, src.n, 256):
        append(np.ascontiguousarray(images[i:i + 256]))
    backend.finish(writer)
    size = sum(f.stat().st_blocks * 512 for f in path.rglob("*") if f.is_file())
    return {"format": fmt, "seconds": time.perf_counter() - t0, "disk_bytes": size, "records": src.n,
            "versions": backend.info()}


def main(argv: list[str]) -> int:
    if len(argv) == 5 and argv[1] == "--build":
        out = build_peer_data(argv[2], argv[3], argv[4])
        print(json.dumps(out, default=str), flush=True)
        return 0
    print(f"usage: {argv[0]} --build {'|'.join(PEER_FORMATS)} IMAGES.npy OUT_DIR", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    sys.exit(main(sys.argv))
