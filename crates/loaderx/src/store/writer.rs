//! The append-only writer.
//!
//! Commit protocol (what makes an interrupted build detectable):
//! 1. `create` writes a static page whose header has `schema_length == 0`,
//!    which every reader refuses, then the schema bytes and the dictionary.
//! 2. Each `append` writes its payload past the committed tail, then its
//!    table entries, and only then advances the in-memory length and tail. A
//!    failed append leaves both unchanged, so it logically writes nothing.
//! 3. `close` (optionally after flushing payload and table to stable storage)
//!    writes the real header last, then releases the exclusive lock.
//!
//! A writer dropped without `close` leaves the uncommitted header on disk.

use std::fs::{File, OpenOptions};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use rayon::prelude::*;
use zstd::dict::EncoderDictionary;

use crate::codec::{self, Encoder};
use crate::error::{Error, Result};
use crate::format::{
    Codec, Header, RecordLoc, DATA_FILE, DICT_FILE, LOC_SIZE, META_FILE, PAGE_SIZE, SUMS_FILE,
    SUMS_HEADER, SUMS_MAGIC,
};
use crate::io::{self, LockMode};
use crate::pool;
use crate::schema::Schema;
use crate::store::geometry::RaggedRecord;
use xxhash_rust::xxh3::xxh3_64;

/// Input bytes compressed per window of an append, bounding the memory the
/// compressed frames of one window can take.
const WINDOW_BYTES: usize = 64 << 20;
/// Most input bytes per compression task (at fast levels; see [`task_bytes`]).
const TASK_BYTES: usize = 256 << 10;
/// Fewest input bytes per compression task (below this, a task costs more
/// to schedule than to run).
const MIN_TASK_BYTES: usize = 32 << 10;
/// Staging size for raw Ragged appends (shape prefixes interleave with payloads).
const STAGING_BYTES: usize = 8 << 20;

/// What [`StoreWriter::create`] needs besides the path.
#[derive(Clone, Debug)]
pub struct CreateOptions {
    /// The store's codec.
    pub codec: Codec,
    /// The dictionary, required (non-empty) for [`Codec::ZstdDict`] and refused otherwise.
    pub dict: Option<Vec<u8>>,
    /// Content checksums: zstd frames carry zstd's own (checked by libzstd,
    /// ours and loaderx 2.0.0's, on every decode); raw stores get a
    /// `sums.zr` sidecar of one XXH3-64 per record, which loaderx 2.0.0
    /// ignores.
    pub checksums: bool,
    /// zstd compression level of the frames: `None` for the codec's default
    /// (loaderx 2.0.0's, see [`crate::default_level`]), else any level in
    /// [`crate::level_range`] (negative levels included). Refused with
    /// [`Codec::Raw`]. The level is not stored: it only shapes the frames,
    /// which any reader decodes.
    pub level: Option<i32>,
}

impl CreateOptions {
    /// `codec` and `dict`, with checksums and the codec's default level.
    pub fn new(codec: Codec, dict: Option<Vec<u8>>) -> CreateOptions {
        CreateOptions {
            codec,
            dict,
            checksums: true,
            level: None,
        }
    }

    /// The same options with compression `level` (see [`CreateOptions::level`]).
    pub fn with_level(self, level: Option<i32>) -> CreateOptions {
        CreateOptions { level, ..self }
    }
}

/// The records of one append, as the writer sees them.
pub(crate) trait RecordSource: Sync {
    fn count(&self) -> usize;
    /// Logical (encoded) length of record `i`.
    fn len_of(&self, i: usize) -> usize;
    /// Record `i`'s bytes: borrowed when stored contiguously, else encoded into `scratch`.
    fn bytes<'s>(&'s self, i: usize, scratch: &'s mut Vec<u8>) -> &'s [u8];
}

pub(crate) struct DenseSource<'a> {
    pub data: &'a [u8],
    pub width: usize,
}

impl RecordSource for DenseSource<'_> {
    fn count(&self) -> usize {
        self.data.len() / self.width
    }
    fn len_of(&self, _: usize) -> usize {
        self.width
    }
    fn bytes<'s>(&'s self, i: usize, _: &'s mut Vec<u8>) -> &'s [u8] {
        &self.data[i * self.width..(i + 1) * self.width]
    }
}

pub(crate) struct RaggedSource<'a, 'r> {
    pub records: &'a [RaggedRecord<'r>],
}

impl RecordSource for RaggedSource<'_, '_> {
    fn count(&self) -> usize {
        self.records.len()
    }
    fn len_of(&self, i: usize) -> usize {
        self.records[i].encoded_len() as usize
    }
    fn bytes<'s>(&'s self, i: usize, scratch: &'s mut Vec<u8>) -> &'s [u8] {
        scratch.clear();
        self.records[i].encode_into(scratch);
        scratch
    }
}

/// An open, append-only store. Holds the exclusive lock until closed or dropped.
pub struct StoreWriter {
    dir: PathBuf,
    schema: Schema,
    codec: Codec,
    meta: File,
    data: File,
    dict: Option<EncoderDictionary<'static>>,
    has_dict: bool,
    /// The frames' compression level (`None` for raw stores).
    level: Option<i32>,
    /// zstd frames carry content checksums.
    frame_checksums: bool,
    /// The checksum sidecar of a raw store.
    sums: Option<File>,
    length: u64,
    tail: u64,
    closed: bool,
}

impl std::fmt::Debug for StoreWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreWriter")
            .field("dir", &self.dir)
            .field("schema", &self.schema)
            .field("codec", &self.codec)
            .field("length", &self.length)
            .field("tail", &self.tail)
            .field("closed", &self.closed)
            .finish()
    }
}

impl StoreWriter {
    /// Creates a new store at `dir`, which must not exist or be an empty
    /// directory (missing parents are created).
    pub fn create(dir: impl AsRef<Path>, schema: Schema, options: CreateOptions) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let CreateOptions {
            codec,
            dict,
            checksums,
            level,
        } = options;
        match (codec, &dict) {
            (Codec::ZstdDict, None) => {
                return Err(Error::InvalidArgument(
                    "codec \"zstd_dict\" needs dict_bytes: train one with train_dict".into(),
                ))
            }
            (Codec::ZstdDict, Some(d)) if d.is_empty() => {
                return Err(Error::InvalidArgument(
                    "codec \"zstd_dict\" needs non-empty dict_bytes".into(),
                ))
            }
            (Codec::Raw | Codec::Zstd, Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "dict_bytes is only used by codec \"zstd_dict\", not {:?}",
                    codec.name()
                )))
            }
            _ => {}
        }
        let level = codec::resolve_level(codec, level)?;
        let schema_bytes = schema.encode_checked()?;
        let encoder_dict = dict
            .as_deref()
            .map(|d| codec::encoder_dictionary(d, level.unwrap_or(codec::ZSTD_DICT_LEVEL)))
            .transpose()?;

        if dir.exists() {
            let mut entries = std::fs::read_dir(&dir).map_err(|e| {
                if dir.is_dir() {
                    Error::io(format!("listing {}", dir.display()), e)
                } else {
                    Error::AlreadyExists(format!("{} exists and is not a directory", dir.display()))
                }
            })?;
            if entries.next().is_some() {
                // A store in use is reported as busy, as loaderx 2.0.0 does.
                let meta_path = dir.join(META_FILE);
                if let Ok(existing) = File::open(&meta_path) {
                    io::try_lock(&existing, LockMode::Exclusive, &meta_path)?;
                }
                return Err(Error::AlreadyExists(format!(
                    "{} is not empty; build the new store at a new path",
                    dir.display()
                )));
            }
        }
        // All or nothing: what this call makes is removed again if it fails,
        // so a retry at the same path starts clean.
        let made_dirs: Vec<PathBuf> = dir
            .ancestors()
            .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
            .map(Path::to_path_buf)
            .collect();
        let mut made_files: Vec<PathBuf> = Vec::new();
        let built = std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating directory {}", dir.display()), e))
            .and_then(|()| {
                Self::create_files(
                    &dir,
                    schema,
                    CreateOptions {
                        codec,
                        dict,
                        checksums,
                        level,
                    },
                    encoder_dict,
                    &schema_bytes,
                    &mut made_files,
                )
            });
        if built.is_err() {
            for f in &made_files {
                let _ = std::fs::remove_file(f);
            }
            // Deepest first; remove_dir leaves anything someone else put there.
            for d in &made_dirs {
                let _ = std::fs::remove_dir(d);
            }
        }
        built
    }

    /// The files of a new store in the claimed, empty `dir`; each one made
    /// is recorded in `made` (for clean-up by the caller on failure).
    fn create_files(
        dir: &Path,
        schema: Schema,
        options: CreateOptions,
        encoder_dict: Option<EncoderDictionary<'static>>,
        schema_bytes: &[u8],
        made: &mut Vec<PathBuf>,
    ) -> Result<Self> {
        let CreateOptions {
            codec,
            dict,
            checksums,
            level,
        } = options;
        let mut create_new = |name: &str| {
            let path = dir.join(name);
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::AlreadyExists => Error::AlreadyExists(format!(
                        "{} appeared while the store was being created",
                        path.display()
                    )),
                    _ => Error::io(format!("creating {}", path.display()), e),
                })?;
            made.push(path);
            Ok::<File, Error>(file)
        };
        let meta_path = dir.join(META_FILE);
        let meta = create_new(META_FILE)?;
        io::try_lock(&meta, LockMode::Exclusive, &meta_path)?;

        // The uncommitted page: a header every reader refuses (schema_length
        // 0), followed by the schema that close() will make valid.
        let mut page = vec![0u8; PAGE_SIZE as usize];
        let uncommitted = Header {
            length: 0,
            tail_offset: 0,
            schema_length: 0,
            codec,
        };
        page[..32].copy_from_slice(&uncommitted.encode());
        page[32..32 + schema_bytes.len()].copy_from_slice(schema_bytes);
        io::write_all_at(&meta, &page, 0)
            .map_err(|e| Error::io(format!("writing {}", meta_path.display()), e))?;

        let data = create_new(DATA_FILE)?;
        if let Some(d) = &dict {
            let dict_file = create_new(DICT_FILE)?;
            io::write_all_at(&dict_file, d, 0)
                .map_err(|e| Error::io(format!("writing {}", dir.join(DICT_FILE).display()), e))?;
            dict_file
                .sync_all()
                .map_err(|e| Error::io("syncing dict.zr", e))?;
        }
        let sums = if checksums && codec == Codec::Raw {
            let file = create_new(SUMS_FILE)?;
            // The count stays 0 until close(): an unclosed sidecar covers nothing.
            let mut head = [0u8; SUMS_HEADER as usize];
            head[..8].copy_from_slice(&SUMS_MAGIC);
            io::write_all_at(&file, &head, 0)
                .map_err(|e| Error::io(format!("writing {}", dir.join(SUMS_FILE).display()), e))?;
            Some(file)
        } else {
            None
        };

        Ok(StoreWriter {
            dir: dir.to_path_buf(),
            schema,
            codec,
            meta,
            data,
            has_dict: encoder_dict.is_some(),
            dict: encoder_dict,
            level,
            frame_checksums: checksums && codec.is_compressed(),
            sums,
            length: 0,
            tail: 0,
            closed: false,
        })
    }

    /// The store directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The schema the store was created with.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The store's codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Whether the store carries a dictionary.
    pub fn has_dict(&self) -> bool {
        self.has_dict
    }

    /// The zstd level the frames are written at (`None` for raw stores).
    pub fn level(&self) -> Option<i32> {
        self.level
    }

    /// Records appended so far.
    pub fn len(&self) -> u64 {
        self.length
    }

    /// Whether nothing has been appended yet.
    pub fn is_empty(&self) -> bool {
        self.length == 0
    }

    /// Payload bytes written so far (the committed end of `data.zr`).
    pub fn payload_bytes(&self) -> u64 {
        self.tail
    }

    /// Whether [`close`](Self::close) has run.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    fn check_open(&self) -> Result<()> {
        if self.closed {
            return Err(Error::State("the writer is closed".into()));
        }
        Ok(())
    }

    /// Appends Dense records: `data` holds whole records of the schema's width, back to back.
    pub fn append_dense(&mut self, data: &[u8]) -> Result<()> {
        self.check_open()?;
        let width = match self.schema.record_width() {
            Some(w) => w as usize,
            None => return Err(Error::State("append_dense on a Ragged store".into())),
        };
        if data.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot append an empty batch".into(),
            ));
        }
        if !data.len().is_multiple_of(width) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes are not a whole number of {width}-byte records",
                data.len()
            )));
        }
        if self.codec == Codec::Raw {
            self.append_raw_contiguous(data, width)
        } else {
            self.append_compressed(&DenseSource { data, width })
        }
    }

    /// Appends Ragged records. Every record is validated before anything is written.
    pub fn append_ragged(&mut self, records: &[RaggedRecord<'_>]) -> Result<()> {
        self.check_open()?;
        let itemsize = match &self.schema {
            Schema::Ragged { dtype } => dtype.itemsize(),
            Schema::Dense { .. } => {
                return Err(Error::State("append_ragged on a Dense store".into()))
            }
        };
        if records.is_empty() {
            return Err(Error::InvalidArgument(
                "cannot append an empty batch".into(),
            ));
        }
        for (i, r) in records.iter().enumerate() {
            r.validate(i, itemsize)?;
        }
        let source = RaggedSource { records };
        if self.codec == Codec::Raw {
            self.append_raw_staged(&source)
        } else {
            self.append_compressed(&source)
        }
    }

    fn reserve(&self, records: usize, bytes: u64) -> Result<()> {
        let count_ok = self.length.checked_add(records as u64).is_some();
        let tail_ok = self
            .tail
            .checked_add(bytes)
            .is_some_and(|t| t <= i64::MAX as u64);
        if !count_ok || !tail_ok {
            return Err(Error::StoreFull(format!(
                "{} records and {} payload bytes cannot grow by {records} records and {bytes} bytes",
                self.length, self.tail
            )));
        }
        Ok(())
    }

    /// Raw Dense: the batch is already the payload, written in one call.
    ///
    /// The records' checksums are computed on the pool while this thread
    /// writes (a copy into the page cache), so hashing adds no time after
    /// the write. (Hashing a 512 KiB batch here instead, to spare waking a
    /// pool thread, made 51 such appends 1.5 ms slower in all.)
    fn append_raw_contiguous(&mut self, data: &[u8], width: usize) -> Result<()> {
        let n = data.len() / width;
        self.reserve(n, data.len() as u64)?;
        let mut hashes: Vec<u64> = Vec::new();
        let (file, at) = (&self.data, self.tail);
        let written = if self.sums.is_some() {
            pool::pool().in_place_scope(|scope| {
                let hashes = &mut hashes;
                scope.spawn(move |_| {
                    *hashes = data
                        .par_chunks(width)
                        .with_min_len(1024)
                        .map(xxh3_64)
                        .collect();
                });
                io::write_all_at(file, data, at)
            })
        } else {
            io::write_all_at(file, data, at)
        };
        written.map_err(|e| self.data_err(e))?;
        self.write_sums(&hashes)?;
        let base = self.tail;
        let locs: Vec<RecordLoc> = (0..n)
            .map(|i| RecordLoc {
                offset: base + (i * width) as u64,
                phys_length: width as u32,
                logic_length: width as u32,
            })
            .collect();
        self.publish(&locs, data.len() as u64)
    }

    /// Raw Ragged: shape prefixes interleave with payloads, so records are
    /// staged into bounded buffers and written in large calls.
    fn append_raw_staged(&mut self, source: &dyn RecordSource) -> Result<()> {
        let n = source.count();
        let total: u64 = (0..n).map(|i| source.len_of(i) as u64).sum();
        self.reserve(n, total)?;
        let mut locs = Vec::with_capacity(n);
        let mut hashes = Vec::with_capacity(if self.sums.is_some() { n } else { 0 });
        let mut staging = Vec::with_capacity(STAGING_BYTES.min(total as usize));
        let mut scratch = Vec::new();
        let mut staged_at = self.tail;
        for i in 0..n {
            let bytes = source.bytes(i, &mut scratch);
            if self.sums.is_some() {
                hashes.push(xxh3_64(bytes));
            }
            locs.push(RecordLoc {
                offset: staged_at + staging.len() as u64,
                phys_length: bytes.len() as u32,
                logic_length: bytes.len() as u32,
            });
            staging.extend_from_slice(bytes);
            if staging.len() >= STAGING_BYTES || i + 1 == n {
                io::write_all_at(&self.data, &staging, staged_at).map_err(|e| self.data_err(e))?;
                staged_at += staging.len() as u64;
                staging.clear();
            }
        }
        self.write_sums(&hashes)?;
        self.publish(&locs, total)
    }

    /// zstd / zstd_dict: records are compressed in parallel, one context per
    /// task; each task reserves its range of data.zr and writes its frames
    /// in one call. Frames land in task completion order; the table keeps
    /// record order.
    fn append_compressed(&mut self, source: &dyn RecordSource) -> Result<()> {
        let n = source.count();
        self.reserve(n, 0)?;
        let mut locs = vec![RecordLoc::default(); n];
        let frontier = AtomicU64::new(self.tail);
        let codec = self.codec;
        let frame_checksums = self.frame_checksums;
        let level = self.level.unwrap_or(codec::ZSTD_LEVEL);
        let dict = self.dict.as_ref();
        let data = &self.data;
        // One encoder (and scratch) per pool thread for the whole append:
        // compression contexts are costly to set up, tasks are many.
        let slots: Vec<Mutex<TaskState<'_>>> = (0..pool::threads())
            .map(|_| Mutex::new(TaskState::default()))
            .collect();
        let mut start = 0usize;
        while start < n {
            // One window: records up to WINDOW_BYTES of input.
            let mut end = start;
            let mut window_bytes = 0usize;
            while end < n && (end == start || window_bytes < WINDOW_BYTES) {
                window_bytes += source.len_of(end);
                end += 1;
            }
            // About eight tasks per thread, so a small append still uses every
            // core and the last task, which one thread finishes while the
            // others wait, is a small part of the append (four tasks of up to
            // 1 MiB kept 64-image appends at 1.82 cores of 2; now 1.89);
            // smaller ones at slow levels.
            let target =
                (window_bytes / (pool::threads() * 8)).clamp(MIN_TASK_BYTES, task_bytes(level));
            let tasks = split_by_bytes(source, start..end, target);
            let mut slices = Vec::with_capacity(tasks.len());
            let mut rest = &mut locs[start..end];
            for t in &tasks {
                let (head, tail) = rest.split_at_mut(t.len());
                slices.push(head);
                rest = tail;
            }
            pool::pool().install(|| {
                tasks
                    .into_par_iter()
                    .zip(slices.into_par_iter())
                    .try_for_each(|(range, out)| -> Result<()> {
                        let slot = rayon::current_thread_index().unwrap_or(0) % slots.len();
                        let mut state = slots[slot].lock().unwrap_or_else(|p| p.into_inner());
                        let TaskState {
                            encoder,
                            block,
                            scratch,
                        } = &mut *state;
                        // Made lazily so a failure is reported as itself.
                        let encoder = match encoder {
                            Some(e) => e,
                            None => {
                                encoder.insert(Encoder::new(codec, level, dict, frame_checksums)?)
                            }
                        };
                        block.clear();
                        for (slot, i) in out.iter_mut().zip(range) {
                            let record = source.bytes(i, scratch);
                            let before = block.len();
                            let phys = encoder.encode_into(record, block)?;
                            if phys as u64 > u32::MAX as u64 {
                                return Err(Error::RecordTooLarge(format!(
                                    "record {i}: a {phys}-byte frame does not fit the table"
                                )));
                            }
                            slot.offset = before as u64;
                            slot.phys_length = phys as u32;
                            slot.logic_length = record.len() as u32;
                        }
                        let at = frontier.fetch_add(block.len() as u64, Ordering::Relaxed);
                        if at
                            .checked_add(block.len() as u64)
                            .is_none_or(|e| e > i64::MAX as u64)
                        {
                            return Err(Error::StoreFull(
                                "data.zr would pass the largest file offset".into(),
                            ));
                        }
                        io::write_all_at(data, block, at)
                            .map_err(|e| Error::io(format!("writing {DATA_FILE}"), e))?;
                        for slot in out.iter_mut() {
                            slot.offset += at;
                        }
                        Ok(())
                    })
            })?;
            start = end;
        }
        drop(slots);
        let written = frontier.load(Ordering::Relaxed) - self.tail;
        self.publish(&locs, written)
    }

    /// Writes the checksums of the records about to be published (raw
    /// stores with a sidecar; a no-op otherwise).
    fn write_sums(&self, hashes: &[u64]) -> Result<()> {
        let Some(file) = &self.sums else {
            return Ok(());
        };
        let bytes: Vec<u8> = hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        io::write_all_at(file, &bytes, SUMS_HEADER + self.length * 8)
            .map_err(|e| Error::io(format!("writing {}", self.dir.join(SUMS_FILE).display()), e))
    }

    /// Writes the table entries of a batch whose payload is on disk, then
    /// advances the in-memory length and tail.
    fn publish(&mut self, locs: &[RecordLoc], payload_bytes: u64) -> Result<()> {
        let mut table = Vec::with_capacity(locs.len() * LOC_SIZE);
        for loc in locs {
            table.extend_from_slice(&loc.encode());
        }
        let at = PAGE_SIZE + self.length * LOC_SIZE as u64;
        io::write_all_at(&self.meta, &table, at)
            .map_err(|e| Error::io(format!("writing the record table of {META_FILE}"), e))?;
        self.length += locs.len() as u64;
        self.tail += payload_bytes;
        Ok(())
    }

    fn data_err(&self, e: std::io::Error) -> Error {
        Error::io(format!("writing {}", self.dir.join(DATA_FILE).display()), e)
    }

    /// Commits the store: with `durable`, payload and table reach stable
    /// storage before the header is written, and the header before return.
    /// Closing twice is harmless.
    pub fn close(&mut self, durable: bool) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        if let Some(sums) = &self.sums {
            io::write_all_at(sums, &self.length.to_le_bytes(), 8)
                .map_err(|e| Error::io(format!("writing {SUMS_FILE}"), e))?;
            if durable {
                sums.sync_all()
                    .map_err(|e| Error::io(format!("syncing {SUMS_FILE}"), e))?;
            }
        }
        if durable {
            self.data
                .sync_all()
                .map_err(|e| Error::io(format!("syncing {DATA_FILE}"), e))?;
            self.meta
                .sync_all()
                .map_err(|e| Error::io(format!("syncing {META_FILE}"), e))?;
        }
        let schema_length = self.schema.encode().len() as u32;
        let header = Header {
            length: self.length,
            tail_offset: self.tail,
            schema_length,
            codec: self.codec,
        };
        io::write_all_at(&self.meta, &header.encode(), 0)
            .map_err(|e| Error::io(format!("writing the header of {META_FILE}"), e))?;
        if durable {
            self.meta
                .sync_all()
                .map_err(|e| Error::io(format!("syncing {META_FILE}"), e))?;
            io::sync_dir(&self.dir)?;
        }
        self.closed = true;
        // Release the lock now rather than when the writer is dropped.
        let _ = self.meta.unlock();
        Ok(())
    }
}

/// What a compression task reuses from one task to the next on its thread.
#[derive(Default)]
struct TaskState<'d> {
    encoder: Option<Encoder<'d>>,
    block: Vec<u8>,
    scratch: Vec<u8>,
}

/// Most input bytes per compression task at `level`: a few hundred
/// microseconds or more of one core's work, so scheduling stays cheap, but
/// not so much that one thread is still on a long task while the others
/// wait at the end of an append. zstd compresses about 0.5-1 GB/s per core
/// up to level 4, 50-150 MB/s at levels 5-12 and 1-40 MB/s from 13 on
/// (where records larger than [`MIN_TASK_BYTES`] become a task each:
/// before, a level-19 append of 147 KiB images went out in 7-record tasks
/// of about 0.3 s).
fn task_bytes(level: i32) -> usize {
    match level {
        ..=4 => TASK_BYTES,
        5..=12 => TASK_BYTES / 4,
        _ => MIN_TASK_BYTES,
    }
}

/// Splits `range` into contiguous tasks of about `target` input bytes each.
fn split_by_bytes(
    source: &dyn RecordSource,
    range: Range<usize>,
    target: usize,
) -> Vec<Range<usize>> {
    let mut tasks = Vec::new();
    let mut start = range.start;
    let mut bytes = 0usize;
    for i in range.clone() {
        bytes += source.len_of(i);
        if bytes >= target {
            tasks.push(start..i + 1);
            start = i + 1;
            bytes = 0;
        }
    }
    if start < range.end {
        tasks.push(start..range.end);
    }
    tasks
}
