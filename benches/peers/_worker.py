"""Measurement worker for ``bench_peers.py``: one peer backend, one codec, one workload.

Run as ``python benches/peers/_worker.py SPEC.json`` under the peers
virtualenv (``.venv-peers``); prints one JSON line on stdout, progress on
stderr.  The driver starts a fresh process for every table row, so no row
inherits another's heap, imports or threads.

The timing code is NOT here: every random-access backend is measured by
``_zrecord_worker.measure_codec`` (imported from ``benches/``), the very
function that times our loaderx and loaderx 2.0.0 in ``bench_zrecord.py``.
That function writes the store (timing the ``append`` calls; ``close`` is
timed separately and the driver adds both), validates every planned batch
against the source (exact dtype, shape and values), gathers one warm-up
batch, then times each planned batch once.  A backend here only has to
provide the same small interface as ``_zrecord_worker.LoaderxBackend``:

    create(path, src, codec, dict_bytes) -> writer with append(chunk), close()
    open(path, src) -> reader;  gatherer(reader) -> f(idx) -> batch;  release(reader)

where a dense batch is one ``ndarray`` (len(idx), *item_shape) and a ragged
batch is a list of ``ndarray`` records.  Every gather returns fresh memory
(never a view of a cache or a mapping that a later call could change).

Spec keys (JSON): those of ``_zrecord_worker`` (kind, source_dir, plan, label,
codecs, chunk, store_root, keep_stores) plus ``backend`` (a name in
``BACKENDS``), ``group_rows`` (rows per row group / record batch / tile /
ArrayRecord group) and ``zrecord_dir`` (the ``benches/`` folder).
"""

from __future__ import annotations

import faulthandler
import gc
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

# --------------------------------------------------------------------------- record <-> bytes


class RecordCodec:
    """Records as self-describing byte strings, for key-value / record stores.

    Dense records are their raw bytes (the item shape is fixed per store).
    Ragged records carry their shape as ``ndim`` little-endian int32 first.
    ``batch`` turns a list of such buffers back into what a gather returns,
    copying every payload exactly once into one fresh backing buffer.
    """

    def __init__(self, src):
        self.kind = src.kind
        self.dtype = np.dtype(src.dtype)
        if src.kind == "dense":
            self.item_shape = src.item_shape
        else:
            self.ndim = int(src.shapes.shape[1])

    def encode(self, rec: np.ndarray) -> bytes:
        if self.kind == "dense":
            return rec.tobytes()
        return np.asarray(rec.shape, dtype="<i4").tobytes() + rec.tobytes()

    def encode_chunk(self, chunk) -> list[bytes]:
        return [self.encode(r) for r in chunk]

    def batch(self, bufs: list):
        if self.kind == "dense":
            out = np.empty((len(bufs), *self.item_shape), dtype=self.dtype)
            flat = out.reshape(len(bufs), -1).view(np.uint8)
            for j, b in enumerate(bufs):
                flat[j] = np.frombuffer(b, dtype=np.uint8)
            return out
        head = 4 * self.ndim
        sizes = [len(b) - head for b in bufs]
        backing = np.empty(sum(sizes), dtype=np.uint8)
        out, pos = [], 0
        for b, n in zip(bufs, sizes, strict=False):
            view = backing[pos : pos + n]
            view[...] = np.frombuffer(b, dtype=np.uint8, offset=head)
            shape = tuple(np.frombuffer(b, dtype="<i4", count=self.ndim).tolist())
            out.append(view.view(self.dtype).reshape(shape))
            pos += n
        return out


# --------------------------------------------------------------------------- Arrow tables


def arrow_schema(src, lance: bool = False):
    """``data``: the record's bytes (fixed_size_binary for dense, large_binary
    for ragged); ragged stores add ``shape``: fixed_size_list<int32>[ndim].
    Bytes rather than list<uint8>/list<int32> so that every Arrow-based
    backend stores and decodes the payload the same cheap way.  ``lance``:
    large_binary for dense too, since pylance ignores the compression
    metadata on fixed_size_binary columns (measured: ratio 1.00)."""
    import pyarrow as pa

    if src.kind == "dense" and lance:
        return pa.schema([("data", pa.large_binary())])
    if src.kind == "dense":
        return pa.schema([("data", pa.binary(src.record_nbytes))])
    ndim = int(src.shapes.shape[1])
    return pa.schema([("data", pa.large_binary()), ("shape", pa.list_(pa.int32(), ndim))])


def arrow_chunk(src, chunk, schema):
    """One pyarrow Table holding ``chunk`` (an ndarray block or a list of records)."""
    import pyarrow as pa

    if src.kind == "dense" and schema.field("data").type == pa.large_binary():
        return pa.table([pa.array([r.tobytes() for r in chunk], type=pa.large_binary())], schema=schema)
    if src.kind == "dense":
        n = len(chunk)
        flat = np.ascontiguousarray(chunk).reshape(-1).view(np.uint8)
        arr = pa.Array.from_buffers(schema.field("data").type, n, [None, pa.py_buffer(flat)])
        return pa.table([arr], schema=schema)
    data = pa.array([r.tobytes() for r in chunk], type=pa.large_binary())
    ndim = schema.field("shape").type.list_size
    shapes = np.asarray([r.shape for r in chunk], dtype=np.int32).reshape(-1)
    shape = pa.FixedSizeListArray.from_arrays(pa.array(shapes), ndim)
    return pa.table([data, shape], schema=schema)


def arrow_to_batch(table, src):
    """Records of a (freshly gathered) Arrow table as the gather result.

    The table's buffers were allocated by the take/read that produced it, so
    wrapping them is not a view of the store; dense becomes one ndarray,
    ragged a list of arrays over one backing buffer."""
    import pyarrow as pa

    data = table.column("data")
    data = data.combine_chunks() if isinstance(data, pa.ChunkedArray) else data
    n = len(data)
    if src.kind == "dense" and data.type == pa.large_binary():
        start = int(np.frombuffer(data.buffers()[1], dtype=np.int64)[data.offset])
        raw = np.frombuffer(data.buffers()[2], dtype=np.uint8)[start : start + n * src.record_nbytes]
        return raw.view(src.dtype).reshape(n, *src.item_shape)
    if src.kind == "dense":
        buf = data.buffers()[1]
        size = src.record_nbytes
        raw = np.frombuffer(buf, dtype=np.uint8)[data.offset * size : (data.offset + n) * size]
        return raw.view(src.dtype).reshape(n, *src.item_shape)
    offsets = np.frombuffer(data.buffers()[1], dtype=np.int64)[data.offset : data.offset + n + 1]
    raw = np.frombuffer(data.buffers()[2], dtype=np.uint8)
    shape_col = table.column("shape")
    shape_col = shape_col.combine_chunks() if isinstance(shape_col, pa.ChunkedArray) else shape_col
    ndim = shape_col.type.list_size
    shapes = shape_col.flatten().to_numpy().reshape(n, ndim).tolist()
    dt = src.dtype
    return [
        raw[s:e].view(dt).reshape(shp)
        for s, e, shp in zip(offsets[:-1].tolist(), offsets[1:].tolist(), shapes, strict=False)
    ]


class Regrouper:
    """Re-cuts appended Arrow chunks into groups of exactly ``rows`` rows
    (the last may be short), so that group ``g`` holds rows g*rows.. of the
    store whatever the append chunk size; ``emit(table)`` gets each run of
    whole groups."""

    def __init__(self, rows: int, emit):
        self.rows, self.emit, self.pending = rows, emit, []

    def add(self, table) -> None:
        self.pending.append(table)
        self._flush(final=False)

    def close(self) -> None:
        self._flush(final=True)

    def _flush(self, final: bool) -> None:
        import pyarrow as pa

        if not self.pending:
            return
        t = pa.concat_tables(self.pending).combine_chunks()  # one chunk: IPC writes a batch per chunk
        cut = len(t) if final else (len(t) // self.rows) * self.rows
        if cut:
            self.emit(t.slice(0, cut))
        self.pending = [t.slice(cut)] if cut < len(t) else []


def group_take(idx: np.ndarray, group_rows: int, read_groups):
    """Gather rows ``idx`` from a store of fixed-size row groups.

    ``read_groups(sorted unique group ids)`` returns one table holding those
    groups' rows in that order; each needed group is read (and decoded) once
    per batch, then the rows are taken in plan order."""
    groups = idx // group_rows
    uniq, inv = np.unique(groups, return_inverse=True)
    table = read_groups(uniq.tolist())
    pos = inv * group_rows + (idx - groups * group_rows)
    return table.take(pos)


# --------------------------------------------------------------------------- backends


class Backend:
    """Defaults shared by every backend: writer.append / writer.close.

    Single-file formats live in a folder (``file(path)``) so that the store
    path is always a directory that ``measure_codec`` can remove."""

    uses_group_rows = False
    suffix = ""

    def file(self, path: Path, create: bool = False) -> str:
        if create:
            path.mkdir(parents=True)
        return str(path / f"store{self.suffix}")

    def __init__(self, spec):
        self.spec = spec
        self.group_rows = int(spec.get("group_rows", 1))

    @staticmethod
    def appender(writer):
        return writer.append

    @staticmethod
    def finish(writer) -> None:
        writer.close()

    @staticmethod
    def gatherer(reader):
        return reader.gather

    @staticmethod
    def release(reader) -> None:
        close = getattr(reader, "close", None)
        if close:
            close()

    def info(self) -> dict:
        return {}


class _Gather:
    """A reader object: ``gather(idx)`` plus an optional ``close``."""

    def __init__(self, gather, close=None):
        self.gather = gather
        self._close = close

    def close(self):
        if self._close:
            self._close()


class _Writer:
    def __init__(self, append, close):
        self.append = append
        self.close = close


def _version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod)
    except Exception:
        return getattr(importlib.import_module(mod), "__version__", "?")


class H5Backend(Backend):
    """h5py.  Dense: one (N, *item) dataset; raw is HDF5's contiguous layout,
    gzip needs chunking, one record per chunk (random access decodes only the
    records asked for).  Ragged: flat 1-D payload + offsets + shapes datasets
    (HDF5 variable-length types bypass the filter pipeline, so gzip could not
    apply to them); gzip chunks hold ``group_rows`` mean records.  Ragged reads
    are one hyperslab per record;
    dense reads are one ``read_direct`` per record into the batch."""

    suffix = ".h5"
    uses_group_rows = True

    def info(self):
        import h5py

        return {"h5py": h5py.__version__, "hdf5": h5py.version.hdf5_version}

    def create(self, path, src, codec, dict_bytes):
        import h5py

        f = h5py.File(self.file(path, create=True), "w")
        comp = {"compression": "gzip", "compression_opts": 4} if codec == "gzip" else {}
        if src.kind == "dense":
            chunks = (1, *src.item_shape) if comp else None
            ds = f.create_dataset(
                "data", shape=(src.n, *src.item_shape), dtype=src.dtype, chunks=chunks, **comp
            )
            pos = [0]

            def append(block):
                ds[pos[0] : pos[0] + len(block)] = block
                pos[0] += len(block)

            return _Writer(append, f.close)
        total = int(src.offsets[-1])
        mean = max(1, total // src.n)
        chunk = (min(total, mean * self.group_rows),) if comp else None
        flat = f.create_dataset("flat", shape=(total,), dtype=src.dtype, chunks=chunk, **comp)
        state = {"pos": 0, "off": [0], "shapes": []}

        def append_ragged(records):
            buf = np.concatenate([r.reshape(-1) for r in records])
            flat[state["pos"] : state["pos"] + buf.size] = buf
            state["pos"] += buf.size
            for r in records:
                state["off"].append(state["off"][-1] + r.size)
                state["shapes"].append(r.shape)

        def close():
            f.create_dataset("offsets", data=np.asarray(state["off"], dtype=np.int64))
            f.create_dataset("shapes", data=np.asarray(state["shapes"], dtype=np.int64))
            f.close()

        return _Writer(append_ragged, close)

    def open(self, path, src):
        import h5py

        f = h5py.File(self.file(path), "r")
        if src.kind == "dense":
            ds = f["data"]

            def gather(idx):
                # One read_direct per record, straight into the batch.  (h5py's
                # fancy point selection, ds[sorted idx], was ~50x slower on the
                # chunked gzip layout here.)
                out = np.empty((len(idx), *src.item_shape), dtype=src.dtype)
                for j, i in enumerate(idx.tolist()):
                    ds.read_direct(out, source_sel=np.s_[i], dest_sel=np.s_[j])
                return out

            return _Gather(gather, f.close)
        flat, offsets = f["flat"], f["offsets"][...]
        shapes = [tuple(s) for s in f["shapes"][...].tolist()]

        def gather_ragged(idx):
            out = []
            for i in idx.tolist():  # one hyperslab read per record
                out.append(flat[offsets[i] : offsets[i + 1]].reshape(shapes[i]))
            return out

        return _Gather(gather_ragged, f.close)


class LmdbBackend(Backend):
    """LMDB: key = record index (8-byte big-endian), value = RecordCodec bytes;
    one write transaction per appended chunk; reads in one read transaction
    per batch with zero-copy buffers, copied once into the batch."""

    def info(self):
        import lmdb

        return {"lmdb": lmdb.__version__, "liblmdb": ".".join(map(str, lmdb.version()))}

    def create(self, path, src, codec, dict_bytes):
        import lmdb

        rc = RecordCodec(src)
        env = lmdb.open(
            str(path),
            map_size=2 * src.logical_bytes + 2**30,
            subdir=True,
            sync=True,
            metasync=True,
            writemap=False,
            lock=True,
        )
        pos = [0]

        def append(chunk):
            with env.begin(write=True) as txn:
                for rec in chunk:
                    txn.put(pos[0].to_bytes(8, "big"), rc.encode(rec), append=True)
                    pos[0] += 1

        def close():
            env.sync(True)
            env.close()

        return _Writer(append, close)

    def open(self, path, src):
        import lmdb

        rc = RecordCodec(src)
        env = lmdb.open(str(path), readonly=True, lock=False, readahead=False, subdir=True)

        def gather(idx):
            with env.begin(buffers=True) as txn:
                return rc.batch([txn.get(int(i).to_bytes(8, "big")) for i in idx.tolist()])

        return _Gather(gather, env.close)


class ArrowIpcBackend(Backend):
    """Arrow IPC file (Feather v2), record batches of ``group_rows`` rows,
    raw or zstd buffer compression; read through a memory map.  A gather
    reads each needed record batch once (decompressing it when zstd) and
    takes the rows."""

    suffix = ".arrow"
    uses_group_rows = True

    def info(self):
        import pyarrow as pa

        return {"pyarrow": pa.__version__}

    def create(self, path, src, codec, dict_bytes):
        import pyarrow as pa

        schema = arrow_schema(src)
        opts = pa.ipc.IpcWriteOptions(compression="zstd" if codec == "zstd" else None)
        sink = pa.OSFile(self.file(path, create=True), "wb")
        w = pa.ipc.new_file(sink, schema, options=opts)
        groups = Regrouper(self.group_rows, lambda t: w.write_table(t, max_chunksize=self.group_rows))

        def append(chunk):
            groups.add(arrow_chunk(src, chunk, schema))

        def close():
            groups.close()
            w.close()
            sink.close()

        return _Writer(append, close)

    def open(self, path, src):
        import pyarrow as pa

        mm = pa.memory_map(self.file(path), "r")
        rd = pa.ipc.open_file(mm)
        g = self.group_rows

        def read_groups(ids):
            return pa.Table.from_batches([rd.get_batch(i) for i in ids])

        def gather(idx):
            return arrow_to_batch(group_take(idx, g, read_groups), src)

        return _Gather(gather, mm.close)


class ParquetBackend(Backend):
    """Parquet, row groups of ``group_rows`` rows, no dictionary encoding, no
    statistics, compression none or zstd (level 3, pyarrow's default).  A
    gather reads all needed row groups in one ``read_row_groups`` call."""

    suffix = ".parquet"
    uses_group_rows = True

    def info(self):
        import pyarrow as pa

        return {"pyarrow": pa.__version__}

    def create(self, path, src, codec, dict_bytes):
        import pyarrow.parquet as pq

        schema = arrow_schema(src)
        w = pq.ParquetWriter(
            self.file(path, create=True),
            schema,
            compression="zstd" if codec == "zstd" else "none",
            use_dictionary=False,
            write_statistics=False,
        )
        # Row groups must not straddle append calls, so appends are re-cut to group_rows.
        groups = Regrouper(self.group_rows, lambda t: w.write_table(t, row_group_size=self.group_rows))

        def append(chunk):
            groups.add(arrow_chunk(src, chunk, schema))

        def close():
            groups.close()
            w.close()

        return _Writer(append, close)

    def open(self, path, src):
        import pyarrow.parquet as pq

        pf = pq.ParquetFile(self.file(path), memory_map=True)
        g = self.group_rows

        def gather(idx):
            return arrow_to_batch(
                group_take(idx, g, lambda ids: pf.read_row_groups(ids, use_threads=True)), src
            )

        return _Gather(gather, pf.close)


class LanceBackend(Backend):
    """Lance (pylance), default data-storage version and encodings; writes
    the whole table with ``lance.write_dataset`` at close (appends only build
    the Arrow chunks: write time = append + close).  Gather: ``dataset.take``."""

    def info(self):
        import lance

        return {"pylance": lance.__version__}

    def create(self, path, src, codec, dict_bytes):
        import lance
        import pyarrow as pa

        schema = arrow_schema(src, lance=True)
        if codec == "zstd":
            # Lance picks encodings per field; this metadata asks for zstd on the payload.
            schema = pa.schema(
                [
                    f.with_metadata({"lance-encoding:compression": "zstd"}) if f.name == "data" else f
                    for f in schema
                ]
            )
        parts = []

        def append(chunk):
            parts.append(arrow_chunk(src, chunk, schema))

        def close():
            lance.write_dataset(pa.concat_tables(parts), str(path), schema=schema)
            parts.clear()

        return _Writer(append, close)

    def open(self, path, src):
        import lance

        ds = lance.dataset(str(path))

        def gather(idx):
            return arrow_to_batch(ds.take(idx.tolist()), src)

        return _Gather(gather)


class ArrayRecordBackend(Backend):
    """ArrayRecord (Riegeli chunks), ``group_size`` = ``group_rows``,
    uncompressed or zstd:3; values are RecordCodec bytes.  Gather:
    ``ArrayRecordReader.read(indices)`` (its parallel random-read path),
    readahead off."""

    suffix = ".array_record"
    uses_group_rows = True

    def info(self):
        return {"array-record": _version("array-record")}

    def create(self, path, src, codec, dict_bytes):
        from array_record.python.array_record_module import ArrayRecordWriter

        rc = RecordCodec(src)
        comp = "zstd:3" if codec == "zstd" else "uncompressed"
        w = ArrayRecordWriter(self.file(path, create=True), f"group_size:{self.group_rows},{comp}")

        def append(chunk):
            for b in rc.encode_chunk(chunk):
                w.write(b)

        return _Writer(append, w.close)

    def open(self, path, src):
        from array_record.python.array_record_module import ArrayRecordReader

        rc = RecordCodec(src)
        rd = ArrayRecordReader(self.file(path), "readahead_buffer_size:0")

        def gather(idx):
            return rc.batch(rd.read(idx.tolist()))

        return _Gather(gather, rd.close)


class MdsBackend(Backend):
    """MosaicML Streaming MDS shards (one ``bytes`` column of RecordCodec
    values), zstd, 64 MiB shards.  Read through ``StreamingDataset`` on the
    local directory, ``ds[i]`` per record.  MDS decompresses a whole shard to
    an uncompressed ``.mds`` file on its first access, which here happens in
    the (untimed) validation pass: the timed gathers read decompressed shards.
    The disk column counts the compressed shards as written."""

    def info(self):
        return {"mosaicml-streaming": _version("mosaicml-streaming")}

    def create(self, path, src, codec, dict_bytes):
        from streaming import MDSWriter

        rc = RecordCodec(src)
        w = MDSWriter(
            out=str(path),
            columns={"rec": "bytes"},
            compression="zstd" if codec == "zstd" else None,
            size_limit=1 << 26,
            progress_bar=False,
        )

        def append(chunk):
            for b in rc.encode_chunk(chunk):
                w.write({"rec": b})

        return _Writer(append, w.finish)

    def open(self, path, src):
        from streaming import StreamingDataset

        rc = RecordCodec(src)
        ds = StreamingDataset(local=str(path), shuffle=False, batch_size=256)

        def gather(idx):
            return rc.batch([ds[i]["rec"] for i in idx.tolist()])

        return _Gather(gather)


class WebDatasetBackend(Backend):
    """WebDataset tar shards (``webdataset.ShardWriter``, 64 MiB shards), one
    ``.bin`` member per record holding RecordCodec bytes.  Tar shards have no
    index: reading is SEQUENTIAL ONLY.  The driver gives this backend a plan of
    consecutive indices (0, 1, 2, ... wrapping at N), and gather pulls the
    next records from a ``webdataset.WebDataset`` stream, reopening it at the
    start of each pass; each key is checked against the planned index."""

    sequential = True

    def info(self):
        return {"webdataset": _version("webdataset")}

    def create(self, path, src, codec, dict_bytes):
        import webdataset as wds

        rc = RecordCodec(src)
        path.mkdir(parents=True)
        w = wds.ShardWriter(str(path / "shard-%06d.tar"), maxsize=1 << 26, verbose=0)
        pos = [0]

        def append(chunk):
            for b in rc.encode_chunk(chunk):
                w.write({"__key__": f"{pos[0]:09d}", "bin": b})
                pos[0] += 1

        return _Writer(append, w.close)

    def open(self, path, src):
        import webdataset as wds

        rc = RecordCodec(src)
        urls = [str(p) for p in sorted(path.glob("shard-*.tar"))]
        state = {"it": None, "next": None}

        def restart():
            state["it"] = iter(wds.WebDataset(urls, shardshuffle=False, empty_check=False))
            state["next"] = 0

        def gather(idx):
            bufs = []
            for i in idx.tolist():
                if i == 0:  # every pass over the shards starts with a fresh stream
                    restart()
                elif state["next"] != i:
                    raise AssertionError(f"sequential reader asked for record {i} after {state['next']}")
                sample = next(state["it"])
                if int(sample["__key__"]) != i:
                    raise AssertionError(f"stream yielded key {sample['__key__']}, want {i}")
                bufs.append(sample["bin"])
                state["next"] = i + 1
            return rc.batch(bufs)

        return _Gather(gather)


class HfDatasetsBackend(Backend):
    """Hugging Face ``datasets``: a ``Dataset`` over the Arrow chunks, saved
    with ``save_to_disk`` (Arrow IPC stream files) at close; read with
    ``load_from_disk`` (memory-mapped) in the ``arrow`` format, gather =
    ``ds[list_of_indices]`` (a take on the mapped table)."""

    def info(self):
        import datasets

        return {"datasets": datasets.__version__}

    def create(self, path, src, codec, dict_bytes):
        import datasets
        import pyarrow as pa

        schema = arrow_schema(src)
        parts = []

        def append(chunk):
            parts.append(arrow_chunk(src, chunk, schema))

        def close():
            table = datasets.table.InMemoryTable(pa.concat_tables(parts))
            datasets.Dataset(table).save_to_disk(str(path))
            parts.clear()

        return _Writer(append, close)

    def open(self, path, src):
        import datasets

        ds = datasets.load_from_disk(str(path)).with_format("arrow")

        def gather(idx):
            return arrow_to_batch(ds[idx.tolist()], src)

        return _Gather(gather)


class TileDbBackend(Backend):
    """TileDB: a 1-D dense array over record ids with one variable-length
    uint8 attribute holding RecordCodec bytes; tile extent ``group_rows``;
    filters none or zstd (level 3).  Gather: one ``multi_index`` read of the
    sorted unique ids, reordered to plan order."""

    uses_group_rows = True

    def info(self):
        import tiledb

        return {"tiledb-py": tiledb.__version__, "libtiledb": ".".join(map(str, tiledb.libtiledb.version()))}

    def create(self, path, src, codec, dict_bytes):
        import tiledb

        rc = RecordCodec(src)
        filters = tiledb.FilterList([tiledb.ZstdFilter(level=3)] if codec == "zstd" else [])
        dom = tiledb.Domain(
            tiledb.Dim(name="i", domain=(0, src.n - 1), tile=min(self.group_rows, src.n), dtype=np.int64)
        )
        schema = tiledb.ArraySchema(
            domain=dom,
            sparse=False,
            attrs=[tiledb.Attr(name="rec", dtype=np.uint8, var=True, filters=filters)],
        )
        tiledb.Array.create(str(path), schema)
        arr = tiledb.open(str(path), "w")
        pos = [0]

        def append(chunk):
            vals = np.empty(len(chunk), dtype=object)
            for j, b in enumerate(rc.encode_chunk(chunk)):
                vals[j] = np.frombuffer(b, dtype=np.uint8)
            arr[pos[0] : pos[0] + len(chunk)] = {"rec": vals}
            pos[0] += len(chunk)

        return _Writer(append, arr.close)

    def open(self, path, src):
        import tiledb

        rc = RecordCodec(src)
        arr = tiledb.open(str(path), "r")

        def gather(idx):
            uniq, inv = np.unique(idx, return_inverse=True)
            got = arr.multi_index[[int(i) for i in uniq.tolist()]]["rec"]
            return rc.batch([got[k] for k in inv.tolist()])

        return _Gather(gather, arr.close)


BACKENDS = {
    "hdf5": H5Backend,
    "lmdb": LmdbBackend,
    "arrow-ipc": ArrowIpcBackend,
    "parquet": ParquetBackend,
    "lance": LanceBackend,
    "arrayrecord": ArrayRecordBackend,
    "mds": MdsBackend,
    "webdataset": WebDatasetBackend,
    "hf-datasets": HfDatasetsBackend,
    "tiledb": TileDbBackend,
}


# --------------------------------------------------------------------------- memcpy limit


def measure_memcpy(src, plan: np.ndarray) -> dict:
    """The copy ceiling: per planned batch, one contiguous memcpy of the
    batch's logical byte count from a RAM buffer into a fresh ``np.empty``
    (the page faults of fresh memory included, as every gather pays them).
    No per-record work, no store: any gather that returns new memory does at
    least this.  Checked: the copied bytes equal the source bytes."""
    ram = (src.array if src.kind == "dense" else src.flat).reshape(-1).view(np.uint8)
    sizes = [src.batch_nbytes(plan[b]) for b in range(plan.shape[0])]

    def copy(n):
        out = np.empty(n, dtype=np.uint8)
        out[...] = ram[:n]
        return out

    for n in sizes:  # validation, untimed
        if not np.array_equal(copy(n), ram[:n]):
            raise AssertionError("memcpy mismatch")
    copy(sizes[0])
    times = []
    gc.collect()
    gc.disable()
    try:
        for n in sizes:
            t0 = time.perf_counter()
            out = copy(n)
            times.append(time.perf_counter() - t0)
            del out
    finally:
        gc.enable()
    return {
        "codec": "raw",
        "logical_bytes": src.logical_bytes,
        "records_stored": src.n,
        "write_s": None,
        "close_s": None,
        "disk_bytes": 0,
        "disk_files": {},
        "gather_s": times,
        "gather_bytes": sizes,
        "gather_records": [int(plan.shape[1])] * plan.shape[0],
        "validated_batches": int(plan.shape[0]),
    }


# --------------------------------------------------------------------------- main


def sequential_plan(n: int, batches: int, batch: int) -> np.ndarray:
    """Consecutive record ids 0, 1, ... wrapping at ``n``: the only order a tar stream serves."""
    return (np.arange(batches * batch, dtype=np.int64) % n).reshape(batches, batch)


def run(spec: dict) -> dict:
    sys.path.insert(0, spec["zrecord_dir"])
    zw = importlib.import_module("_zrecord_worker")
    info = {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "executable": sys.executable,
        "pid": os.getpid(),
    }
    name = spec["backend"]
    src = zw.Source(spec["kind"], Path(spec["source_dir"]))
    plan = np.load(spec["plan"]).astype(np.int64)
    codec = spec["codecs"][0]
    if name == "memcpy":
        return {"info": info, "results": [measure_memcpy(src, plan)]}
    try:
        backend = BACKENDS[name](spec)
        info.update(backend.info())
    except Exception as exc:
        return {"info": info, "results": [], "error": f"{type(exc).__name__}: {exc}"}
    if getattr(backend, "sequential", False):
        plan = sequential_plan(src.n, *plan.shape)
    try:
        res = zw.measure_codec(backend, src, plan, codec, spec)
    except Exception as exc:
        import traceback

        traceback.print_exc()
        return {"info": info, "results": [{"codec": codec, "error": f"{type(exc).__name__}: {exc}"}]}
    res["sequential"] = bool(getattr(backend, "sequential", False))
    return {"info": info, "results": [res]}


def probe(name: str) -> dict:
    try:
        return BACKENDS[name]({}).info()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def main(argv: list[str]) -> int:
    faulthandler.enable()
    if len(argv) == 3 and argv[1] == "--probe":
        out = probe(argv[2])
    elif len(argv) == 2:
        out = run(json.loads(Path(argv[1]).read_text()))
    else:
        print(f"usage: {argv[0]} SPEC.json | --probe BACKEND", file=sys.stderr)
        return 2
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
