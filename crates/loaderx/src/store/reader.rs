//! The read-only store handle and its batched gathers.
//!
//! `open` validates everything that can be checked without touching every
//! record (header, schema, file sizes, dictionary presence) and maps the
//! record table (`meta.zr`) read-only, so a gather reads its table entries
//! without a system call each. Each entry is checked against the committed
//! tail, then its frame is read from `data.zr` (mapped, or by positional
//! read: see [`DataAccess`]) and decoded straight into the destination.
//!
//! The shared lock held for the reader's whole life keeps cooperating
//! writers (ours and loaderx 2.0.0's) away, so the files do not change
//! underneath it. Readers are `Sync`: any number of threads may gather at once.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::codec::{Decoder, DecoderPool, PooledDecoder};
use crate::error::{Error, Result};
use crate::format::{
    Codec, Header, RecordLoc, DATA_FILE, DICT_FILE, HEADER_SIZE, LOC_SIZE, META_FILE, PAGE_SIZE,
};
use crate::io::{self, LockMode};
use crate::pool;
use crate::schema::{Kind, Schema};
use crate::store::RaggedBatch;
use memmap2::Mmap;
use rayon::prelude::*;

/// Output bytes below which a gather runs on the calling thread: waking the
/// pool costs more than copying or decoding this much.
const INLINE_BYTES: usize = 256 << 10;
/// Alignment of each record's slot in a Ragged gather buffer.
const SLOT_ALIGN: usize = 16;

/// How a reader gets at `data.zr`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DataAccess {
    /// [`Map`](Self::Map) for raw stores of small records (at most
    /// [`MAP_RECORD_BYTES`] on average), where a system call per record would
    /// cost more than the copy; [`Read`](Self::Read) otherwise.
    #[default]
    Auto,
    /// Positional reads (`pread`) straight into the destination (raw) or a
    /// per-task staging buffer (compressed). The page cache serves them, so
    /// the records read never count in the process's own resident memory,
    /// and a file shortened behind the reader's back is an I/O error rather
    /// than a fault.
    Read,
    /// A read-only memory map: no system call per record, at the price of
    /// every page read counting in the process's resident memory (RSS/PSS).
    Map,
}

/// Mean record size up to which [`DataAccess::Auto`] maps raw stores.
pub const MAP_RECORD_BYTES: u64 = 64 << 10;

impl DataAccess {
    /// The access named by `LOADERX_DATA_ACCESS` (`auto`, `read` or `map`),
    /// else [`DataAccess::Auto`].
    pub fn from_env() -> DataAccess {
        match std::env::var("LOADERX_DATA_ACCESS").as_deref() {
            Ok("map") | Ok("mmap") => DataAccess::Map,
            Ok("read") | Ok("pread") => DataAccess::Read,
            _ => DataAccess::Auto,
        }
    }

    fn resolve(self, header: &Header) -> DataAccess {
        match self {
            DataAccess::Auto => {
                let mean = header.tail_offset / header.length.max(1);
                if header.codec == Codec::Raw && mean <= MAP_RECORD_BYTES {
                    DataAccess::Map
                } else {
                    DataAccess::Read
                }
            }
            chosen => chosen,
        }
    }
}

enum Payload {
    Empty,
    Mapped(Mmap),
    File(File),
}

/// An open, read-only store of either kind.
pub struct StoreReader {
    dir: PathBuf,
    schema: Schema,
    header: Header,
    // Holds the shared lock for the reader's lifetime.
    _meta_file: File,
    meta: Option<Mmap>,
    data: Payload,
    dict: Option<Vec<u8>>,
    decoders: DecoderPool,
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader")
            .field("dir", &self.dir)
            .field("schema", &self.schema)
            .field("header", &self.header)
            .finish()
    }
}

fn map_file(file: &File, path: &Path) -> Result<Option<Mmap>> {
    let len = file
        .metadata()
        .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))?
        .len();
    if len == 0 {
        return Ok(None);
    }
    // SAFETY: the map is read-only and the store's shared lock keeps
    // cooperating writers out for the reader's lifetime; a committed store is
    // never modified in place. Every access is bounds-checked against the
    // lengths validated in `open`.
    let map = unsafe { Mmap::map(file) }
        .map_err(|e| Error::io(format!("mapping {}", path.display()), e))?;
    Ok(Some(map))
}

/// Largest `dict.zr` a reader accepts. zstd dictionaries are kilobytes to a
/// few megabytes (loaderx's largest tier is 1 MiB); refusing anything huge
/// keeps a stray or hostile file from costing its size in memory.
pub const MAX_DICT_BYTES: u64 = 64 << 20;

/// Reads `dict.zr` when, and only when, the codec needs one, checking that
/// it is present exactly for zstd_dict stores.
fn read_dict(path: &Path, codec: Codec) -> Result<Option<Vec<u8>>> {
    let size = match std::fs::metadata(path) {
        Ok(m) => Some(m.len()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io(format!("inspecting {}", path.display()), e)),
    };
    match (codec, size) {
        (Codec::ZstdDict, Some(n)) if (1..=MAX_DICT_BYTES).contains(&n) => std::fs::read(path)
            .map(Some)
            .map_err(|e| Error::io(format!("reading {}", path.display()), e)),
        (Codec::ZstdDict, Some(n)) if n > MAX_DICT_BYTES => Err(Error::InvalidFormat(format!(
            "{DICT_FILE} is {n} bytes, larger than any zstd dictionary ({MAX_DICT_BYTES} bytes at most)"
        ))),
        (Codec::ZstdDict, _) => Err(Error::InvalidFormat(format!(
            "a zstd_dict store needs a non-empty {DICT_FILE}"
        ))),
        (_, Some(_)) => Err(Error::InvalidFormat(format!(
            "a {} store must not have a {DICT_FILE}",
            codec.name()
        ))),
        (_, None) => Ok(None),
    }
}

impl StoreReader {
    /// Opens the committed store at `dir` as `kind`, reading `data.zr` as
    /// [`DataAccess::from_env`] says.
    pub fn open(dir: impl AsRef<Path>, kind: Kind) -> Result<Self> {
        Self::open_with(dir, kind, DataAccess::from_env())
    }

    /// Opens the committed store at `dir` as `kind`, reading `data.zr` with `access`.
    pub fn open_with(dir: impl AsRef<Path>, kind: Kind, access: DataAccess) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let meta_path = dir.join(META_FILE);
        let meta_file = File::open(&meta_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound {
                path: dir.clone(),
                reason: if dir.is_dir() {
                    format!("the directory has no {META_FILE}")
                } else {
                    "no such directory".into()
                },
            },
            _ => Error::io(format!("opening {}", meta_path.display()), e),
        })?;
        io::try_lock(&meta_file, LockMode::Shared, &meta_path)?;

        let meta_len = meta_file
            .metadata()
            .map_err(|e| Error::io(format!("reading the size of {}", meta_path.display()), e))?
            .len();
        if meta_len < PAGE_SIZE {
            return Err(Error::InvalidFormat(format!(
                "{} is {meta_len} bytes, shorter than its {PAGE_SIZE}-byte static page",
                meta_path.display()
            )));
        }
        let mut page = vec![0u8; PAGE_SIZE as usize];
        io::read_exact_at(&meta_file, &mut page, 0)
            .map_err(|e| Error::io(format!("reading {}", meta_path.display()), e))?;
        let header = Header::decode(page[..HEADER_SIZE].try_into().expect("32 bytes"))?;
        let schema_end = HEADER_SIZE + header.schema_length as usize;
        let schema = Schema::decode(&page[HEADER_SIZE..schema_end], kind)?;

        let table_end = header.meta_len_required()?;
        if meta_len < table_end {
            return Err(Error::InvalidFormat(format!(
                "{} is {meta_len} bytes but its {} records need {table_end}",
                meta_path.display(),
                header.length
            )));
        }

        let data_path = dir.join(DATA_FILE);
        let data_file = File::open(&data_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::InvalidFormat(format!("{} is missing", data_path.display()))
            }
            _ => Error::io(format!("opening {}", data_path.display()), e),
        })?;
        let data_len = data_file
            .metadata()
            .map_err(|e| Error::io(format!("reading the size of {}", data_path.display()), e))?
            .len();
        if data_len < header.tail_offset {
            return Err(Error::InvalidFormat(format!(
                "{} is {data_len} bytes, shorter than its committed end {}",
                data_path.display(),
                header.tail_offset
            )));
        }

        let dict = read_dict(&dir.join(DICT_FILE), header.codec)?;
        let decoders = DecoderPool::new(header.codec, dict.as_deref())?;

        let meta = if header.length > 0 {
            map_file(&meta_file, &meta_path)?
        } else {
            None
        };
        let data = match (header.tail_offset, access.resolve(&header)) {
            (0, _) => Payload::Empty,
            (_, DataAccess::Map) => match map_file(&data_file, &data_path)? {
                Some(map) => Payload::Mapped(map),
                None => Payload::Empty,
            },
            (_, _) => Payload::File(data_file),
        };
        Ok(StoreReader {
            dir,
            schema,
            header,
            _meta_file: meta_file,
            meta,
            data,
            dict,
            decoders,
        })
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// How this reader reads `data.zr` ([`DataAccess::Map`] or [`DataAccess::Read`]).
    pub fn data_access(&self) -> DataAccess {
        match self.data {
            Payload::Mapped(_) => DataAccess::Map,
            _ => DataAccess::Read,
        }
    }

    /// The stored schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The store's codec.
    pub fn codec(&self) -> Codec {
        self.header.codec
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        self.header.length
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.header.length == 0
    }

    /// End of the committed payload in `data.zr`.
    pub fn tail_offset(&self) -> u64 {
        self.header.tail_offset
    }

    /// The dictionary bytes (`dict.zr`), for zstd_dict stores.
    pub fn dict_bytes(&self) -> Option<&[u8]> {
        self.dict.as_deref()
    }

    /// Mean logical bytes per record over up to `probe` evenly spread
    /// records (0.0 for an empty store).
    pub fn mean_record_bytes(&self, probe: u64) -> Result<f64> {
        let n = self.len();
        if n == 0 {
            return Ok(0.0);
        }
        let k = probe.clamp(1, n);
        let mut total = 0u64;
        for j in 0..k {
            // j < k <= n, so j * n / k < n; u128 keeps the product exact.
            let i = (j as u128 * n as u128 / k as u128) as u64;
            total += self.loc(i)?.logic_length as u64;
        }
        Ok(total as f64 / k as f64)
    }

    /// About how many bytes a gather of `rows` records returns: exact for
    /// Dense stores, estimated from a sample of record sizes for Ragged ones.
    pub fn batch_bytes_hint(&self, rows: usize) -> usize {
        match self.schema.record_width() {
            Some(width) => rows.saturating_mul(width as usize),
            None => {
                let mean = self.mean_record_bytes(64).unwrap_or(0.0);
                (mean.ceil() as usize)
                    .saturating_add(SLOT_ALIGN)
                    .saturating_mul(rows)
            }
        }
    }

    /// The validated table entry of record `index`.
    #[inline]
    pub fn loc(&self, index: u64) -> Result<RecordLoc> {
        if index >= self.header.length {
            return Err(Error::IndexOutOfRange(format!(
                "index {index} is out of range for a store of {} records",
                self.header.length
            )));
        }
        let table = self.meta.as_deref().expect("mapped when length > 0");
        let at = (PAGE_SIZE + index * LOC_SIZE as u64) as usize;
        let loc = RecordLoc::decode(&table[at..at + LOC_SIZE]);
        loc.validate(index, self.header.codec, self.header.tail_offset)?;
        Ok(loc)
    }

    /// Decodes the record of a validated entry into `dst` (exactly its
    /// logical size).
    #[inline]
    fn read_record(
        &self,
        index: u64,
        loc: &RecordLoc,
        dst: &mut [u8],
        dec: &mut Decoder,
    ) -> Result<()> {
        let start = loc.offset;
        let len = loc.phys_length as usize;
        match &self.data {
            Payload::Mapped(map) => {
                let start = start as usize;
                dec.decode_into(index, &map[start..start + len], dst)
            }
            Payload::File(file) => {
                let read = |buf: &mut [u8]| {
                    io::read_exact_at(file, buf, start).map_err(|e| {
                        Error::io(format!("reading record {index} from {DATA_FILE}"), e)
                    })
                };
                if self.header.codec == Codec::Raw && len == dst.len() {
                    // Raw records land in place: one read, no copy.
                    read(dst)
                } else {
                    dec.staging.resize(len, 0);
                    read(&mut dec.staging)?;
                    dec.decode_staged(index, dst)
                }
            }
            Payload::Empty => Err(Error::InvalidFormat(format!(
                "record {index}: the store has no payload"
            ))),
        }
    }

    fn decoder(&self) -> Result<PooledDecoder<'_>> {
        self.decoders.get()
    }

    /// Checks every index before any work starts, so an out-of-range index
    /// fails the whole request up front.
    fn check_indices(&self, indices: &[u64]) -> Result<()> {
        let n = self.header.length;
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            return Err(Error::IndexOutOfRange(format!(
                "index {bad} is out of range for a store of {n} records"
            )));
        }
        Ok(())
    }

    /// Decodes fixed-width records `indices` into `out`, `width` bytes each,
    /// in order. A record whose stored size is not `width` is corrupt.
    pub fn gather_fixed(&self, indices: &[u64], width: usize, out: &mut [u8]) -> Result<()> {
        let needed = indices.len().checked_mul(width);
        if needed != Some(out.len()) {
            return Err(Error::BufferTooSmall(format!(
                "{} records of {width} bytes need {:?} bytes, the buffer has {}",
                indices.len(),
                needed,
                out.len()
            )));
        }
        if width == 0 || indices.is_empty() {
            return Ok(());
        }
        self.check_indices(indices)?;
        let run = |idx: &[u64], dst: &mut [u8], dec: &mut PooledDecoder<'_>| -> Result<()> {
            for (&i, slot) in idx.iter().zip(dst.chunks_exact_mut(width)) {
                let loc = self.loc(i)?;
                if loc.logic_length as usize != width {
                    return Err(Error::Corrupt(format!(
                        "record {i} holds {} bytes but the schema makes records {width} bytes",
                        loc.logic_length
                    )));
                }
                self.read_record(i, &loc, slot, dec)?;
            }
            Ok(())
        };
        if out.len() <= INLINE_BYTES || indices.len() == 1 {
            return run(indices, out, &mut self.decoder()?);
        }
        let per_task = pool::task_len(indices.len(), (INLINE_BYTES / 4 / width).max(1));
        pool::pool().install(|| {
            indices
                .par_chunks(per_task)
                .zip(out.par_chunks_mut(per_task * width))
                .try_for_each_init(
                    || None,
                    |dec, (idx, dst)| {
                        // Taken lazily so a failure is reported as itself.
                        let dec = match dec {
                            Some(d) => d,
                            None => dec.insert(self.decoder()?),
                        };
                        run(idx, dst, dec)
                    },
                )
        })
    }

    /// Decodes variable-size records `indices` into one new buffer, each at
    /// a 16-byte-aligned slot; returns the buffer and each record's byte
    /// range in it. The buffer is as large as the requested records' logical
    /// sizes (plus alignment), never more.
    pub fn gather_var(&self, indices: &[u64]) -> Result<(Vec<u8>, Vec<std::ops::Range<usize>>)> {
        self.check_indices(indices)?;
        let mut locs = Vec::with_capacity(indices.len());
        let mut ranges = Vec::with_capacity(indices.len());
        let mut total = 0usize;
        for &i in indices {
            let loc = self.loc(i)?;
            let start = total.next_multiple_of(SLOT_ALIGN);
            let end = start
                .checked_add(loc.logic_length as usize)
                .ok_or_else(|| Error::OutOfMemory("gather size overflows".into()))?;
            ranges.push(start..end);
            locs.push(loc);
            total = end;
        }
        let mut buf = crate::buffers::take(total).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "cannot allocate {total} bytes for {} records",
                indices.len()
            ))
        })?;

        // Disjoint slots, so tasks can fill them in parallel.
        let mut slots: Vec<&mut [u8]> = Vec::with_capacity(ranges.len());
        let mut rest: &mut [u8] = &mut buf;
        let mut consumed = 0usize;
        for r in &ranges {
            // Alignment padding: a recycled buffer may hold old bytes there.
            let (gap, tail) = rest.split_at_mut(r.start - consumed);
            gap.fill(0);
            let (slot, tail) = tail.split_at_mut(r.len());
            slots.push(slot);
            rest = tail;
            consumed = r.end;
        }
        let work: Vec<(u64, &RecordLoc, &mut [u8])> = indices
            .iter()
            .copied()
            .zip(locs.iter())
            .zip(slots)
            .map(|((i, l), s)| (i, l, s))
            .collect();
        let run = |dec: &mut PooledDecoder<'_>, (i, loc, slot): (u64, &RecordLoc, &mut [u8])| {
            self.read_record(i, loc, slot, dec)
        };
        if total <= INLINE_BYTES || work.len() == 1 {
            let mut dec = self.decoder()?;
            for item in work {
                run(&mut dec, item)?;
            }
        } else {
            let per_task = pool::task_len(work.len(), 4);
            pool::pool().install(|| {
                work.into_par_iter()
                    .with_min_len(per_task)
                    .try_for_each_init(
                        || None,
                        |dec, item| {
                            let dec = match dec {
                                Some(d) => d,
                                None => dec.insert(self.decoder()?),
                            };
                            run(dec, item)
                        },
                    )
            })?;
        }
        Ok((buf, ranges))
    }

    /// Gathers the records of a Dense store into a new buffer (taken from
    /// the [batch-buffer cache](crate::buffers)), `record width` bytes each.
    pub fn gather_dense(&self, indices: &[u64]) -> Result<Vec<u8>> {
        let width = match self.schema.record_width() {
            Some(w) => w as usize,
            None => return Err(Error::State("gather_dense on a Ragged store".into())),
        };
        let bytes = indices.len().checked_mul(width).ok_or_else(|| {
            Error::OutOfMemory(format!("{} records of {width} bytes", indices.len()))
        })?;
        let mut data = crate::buffers::take(bytes).ok_or_else(|| {
            Error::OutOfMemory(format!("cannot allocate {bytes} bytes for a batch"))
        })?;
        self.gather_fixed(indices, width, &mut data)?;
        Ok(data)
    }

    /// Gathers the records of a Ragged store, with their shapes checked.
    pub fn gather_ragged(&self, indices: &[u64]) -> Result<RaggedBatch> {
        let itemsize = match &self.schema {
            Schema::Ragged { dtype } => dtype.itemsize(),
            Schema::Dense { .. } => {
                return Err(Error::State("gather_ragged on a Dense store".into()))
            }
        };
        let (data, ranges) = self.gather_var(indices)?;
        RaggedBatch::from_gather(data, ranges, indices, itemsize)
    }
}
