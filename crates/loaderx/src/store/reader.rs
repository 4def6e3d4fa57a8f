//! The read-only store handle and its batched gathers.
//!
//! A reader is made of one or more [segments](super::segment): a plain store
//! is one, a store set (see [`manifest`](super::manifest)) one per shard, and
//! record `i` of the reader is record `i - start(s)` of the segment `s` whose
//! range holds it. Every gather resolves its indices to (segment, entry)
//! first, so one call spans shards.
//!
//! `open` validates everything that can be checked without touching every
//! record (header, schema, file sizes, dictionary presence; for sets, every
//! shard against the manifest). Local segments map the record table
//! read-only, so a gather reads its table entries without a system call
//! each; each entry is checked against the committed tail, then its frame is
//! read from `data.zr` (mapped, or by positional read: see [`DataAccess`])
//! and decoded straight into the destination. Remote segments fetch the
//! table chunks a gather needs in bulk, then its records in merged byte
//! ranges (see `fetch`), decoding each range as it arrives.
//!
//! The shared lock held for a local reader's whole life keeps cooperating
//! writers (ours and loaderx 2.0.0's) away, so the files do not change
//! underneath it; remote objects are checked against the size and ETag seen
//! at open. Readers are `Sync`: any number of threads may gather at once.

use std::path::Path;

use crate::codec::{Decoder, DecoderPool, PooledDecoder};
use crate::error::{Error, Result};
use crate::format::{Codec, Header, RecordLoc, META_FILE};
use crate::pool;
use crate::remote::{self, Remote, StorageOptions};
use crate::schema::{Kind, Schema};
use crate::store::fetch::{self, Work};
use crate::store::manifest::{Manifest, MANIFEST_FILE, MAX_MANIFEST_BYTES};
use crate::store::segment::Segment;
use crate::store::{Layout, RaggedBatch};
use rayon::prelude::*;

/// Output bytes below which a gather runs on the calling thread: waking the
/// pool costs more than copying or decoding this much.
const INLINE_BYTES: usize = 256 << 10;
/// The same for Dense gathers from raw stores, where every record is a plain
/// copy: one thread copies 1 MiB of scattered records in 70-90 µs, and
/// waking the pool's threads (on a VM whose other vCPUs sleep) cost as much
/// or more: 512 KiB token batches took 0.18 ms at the p50 through the pool
/// in a busy run, 0.075 ms on the calling thread.
const RAW_INLINE_BYTES: usize = 1 << 20;
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

    pub(crate) fn resolve(self, header: &Header) -> DataAccess {
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

/// Largest `dict.zr` a reader accepts. zstd dictionaries are kilobytes to a
/// few megabytes (loaderx's largest tier is 1 MiB); refusing anything huge
/// keeps a stray or hostile file from costing its size in memory.
pub const MAX_DICT_BYTES: u64 = 64 << 20;

/// How [`StoreReader::open_with_options`] opens.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// How local `data.zr` files are read.
    pub access: DataAccess,
    /// Check every record read against its checksum where the store has
    /// them: raw stores' `sums.zr` sidecar (zstd frames with checksums are
    /// always checked, by libzstd).
    pub verify_checksums: bool,
    /// Object-storage settings.
    pub storage: StorageOptions,
}

/// What content checks a store's records carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checksums {
    /// None: only the structure can be checked.
    None,
    /// Every zstd frame carries zstd's content checksum.
    Frames,
    /// A `sums.zr` sidecar holds an XXH3-64 of every raw record.
    Sidecar,
}

/// An open, read-only store (or store set) of either kind.
pub struct StoreReader {
    /// The path or URL it was opened at, for messages.
    location: String,
    schema: Schema,
    codec: Codec,
    segments: Vec<Segment>,
    /// `starts[s]` is the first record of segment `s`; one more entry holds the total.
    starts: Vec<u64>,
    /// One pool per distinct dictionary (one in all for raw and zstd).
    decoders: Vec<DecoderPool>,
    manifest: Option<Manifest>,
    /// The object-storage folder, for remote stores.
    remote: Option<Remote>,
}

impl std::fmt::Debug for StoreReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreReader")
            .field("location", &self.location)
            .field("schema", &self.schema)
            .field("codec", &self.codec)
            .field("shards", &self.segments.len())
            .field("len", &self.len())
            .finish()
    }
}

/// Reads a local manifest, `Ok(None)` when there is none.
fn read_local_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST_FILE);
    let size = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("inspecting {}", path.display()), e)),
    };
    if size > MAX_MANIFEST_BYTES {
        return Err(Error::InvalidFormat(format!(
            "{} is {size} bytes, more than a manifest may be ({MAX_MANIFEST_BYTES})",
            path.display()
        )));
    }
    let bytes =
        std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    Manifest::parse(&bytes, &dir.display().to_string()).map(Some)
}

/// A directory with stores inside but neither a store nor a manifest of its
/// own is most likely a set whose writer stopped before `close()`.
fn unfinished_set_hint(dir: &Path) -> Option<Error> {
    let has_shards = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .any(|e| e.path().join(META_FILE).is_file());
    has_shards.then(|| {
        Error::InvalidFormat(format!(
            "{} holds stores but no {MANIFEST_FILE}: a store set whose writer never closed \
             (the manifest is written last); rebuild it",
            dir.display()
        ))
    })
}

fn kind_of_manifest(m: &Manifest, kind: Kind, where_: &str) -> Result<()> {
    if m.kind() != kind {
        return Err(Error::Schema(format!(
            "{}: {where_} is a {} store set",
            crate::schema::schema_fields_prefix(kind),
            m.kind
        )));
    }
    Ok(())
}

/// Checks shard `entry` as opened against what the manifest says of it.
fn check_shard(
    seg: &Segment,
    entry: &crate::store::manifest::ShardEntry,
    m: &Manifest,
    schema: &Schema,
) -> Result<()> {
    let set_says = |what: &str| {
        Error::InvalidFormat(format!(
            "shard {:?} of the set disagrees with its {MANIFEST_FILE}: {what}",
            entry.path
        ))
    };
    if &seg.schema != schema {
        return Err(set_says(&format!(
            "it stores {:?}, the set {schema:?}",
            seg.schema
        )));
    }
    if seg.header.codec != m.codec() {
        return Err(set_says(&format!(
            "its codec is {}, the set's {}",
            seg.header.codec.name(),
            m.codec
        )));
    }
    if seg.header.length != entry.records {
        return Err(set_says(&format!(
            "it holds {} records, the manifest says {}",
            seg.header.length, entry.records
        )));
    }
    if seg.header.tail_offset != entry.data_bytes {
        return Err(set_says(&format!(
            "it holds {} payload bytes, the manifest says {}",
            seg.header.tail_offset, entry.data_bytes
        )));
    }
    Ok(())
}

/// The shard named in a manifest could not be opened: say which.
fn shard_error(entry_path: &str, e: Error) -> Error {
    match e {
        Error::NotFound { path, reason } => Error::InvalidFormat(format!(
            "shard {entry_path:?} listed in the {MANIFEST_FILE} is missing ({}: {reason})",
            path.display()
        )),
        Error::InvalidFormat(msg) => {
            Error::InvalidFormat(format!("shard {entry_path:?} of the set: {msg}"))
        }
        other => other,
    }
}

impl StoreReader {
    /// Opens the committed store (or store set) at `dir` as `kind`, reading
    /// `data.zr` as [`DataAccess::from_env`] says.
    pub fn open(dir: impl AsRef<Path>, kind: Kind) -> Result<Self> {
        Self::open_with(dir, kind, DataAccess::from_env())
    }

    /// Opens the committed local store (or store set) at `dir` as `kind`,
    /// reading `data.zr` with `access`.
    pub fn open_with(dir: impl AsRef<Path>, kind: Kind, access: DataAccess) -> Result<Self> {
        Self::open_local(dir.as_ref(), kind, access, false)
    }

    fn open_local(dir: &Path, kind: Kind, access: DataAccess, verify: bool) -> Result<Self> {
        let location = dir.display().to_string();
        match read_local_manifest(dir)? {
            None => {
                let seg = Segment::open_local(dir, kind, access, verify).map_err(|e| match e {
                    Error::NotFound { .. } => unfinished_set_hint(dir).unwrap_or(e),
                    other => other,
                })?;
                Self::assemble(
                    location,
                    seg.schema.clone(),
                    seg.header.codec,
                    vec![seg],
                    None,
                    None,
                )
            }
            Some(m) => {
                kind_of_manifest(&m, kind, &location)?;
                let schema = m.schema()?;
                crate::io::ensure_file_room(m.shards.len().saturating_mul(2))?;
                let mut segments = Vec::with_capacity(m.shards.len());
                for entry in &m.shards {
                    let seg = Segment::open_local(&dir.join(&entry.path), kind, access, verify)
                        .map_err(|e| shard_error(&entry.path, e))?;
                    check_shard(&seg, entry, &m, &schema)?;
                    if !seg.layout.is_native() {
                        return Err(Error::InvalidFormat(format!(
                            "shard {:?} of the set is a store of the {} layout ({}): a store \
                             set holds only loaderx 2.0.0-layout shards; convert it first",
                            entry.path,
                            seg.layout.id(),
                            seg.layout.releases(kind)
                        )));
                    }
                    segments.push(seg);
                }
                let codec = m.codec();
                Self::assemble(location, schema, codec, segments, Some(m), None)
            }
        }
    }

    /// Opens the store or store set at `location`: a local path, a
    /// `file://` URL, or an object-storage URL (`s3://`, `gs://`, `az://`,
    /// `http(s)://`) configured by the environment and `options`. `access`
    /// applies to local stores.
    pub fn open_location(
        location: &str,
        kind: Kind,
        access: DataAccess,
        options: &StorageOptions,
    ) -> Result<Self> {
        Self::open_with_options(
            location,
            kind,
            &ReadOptions {
                access,
                verify_checksums: false,
                storage: options.clone(),
            },
        )
    }

    /// Opens the store or store set at `location` (a path or URL, as for
    /// [`open_location`](Self::open_location)) with every read option.
    pub fn open_with_options(location: &str, kind: Kind, options: &ReadOptions) -> Result<Self> {
        let verify = options.verify_checksums;
        if !remote::is_url(location) {
            return Self::open_local(&remote::local_path(location)?, kind, options.access, verify);
        }
        let root = Remote::parse(location, &options.storage)?;
        let shown = root.url().to_string();
        remote::block_on(async {
            let manifest = match root.get_all(MANIFEST_FILE).await? {
                None => None,
                Some((bytes, _)) if bytes.len() as u64 > MAX_MANIFEST_BYTES => {
                    return Err(Error::InvalidFormat(format!(
                        "{shown}/{MANIFEST_FILE} is {} bytes, more than a manifest may be",
                        bytes.len()
                    )))
                }
                Some((bytes, _)) => Some(Manifest::parse(&bytes, &shown)?),
            };
            match manifest {
                None => {
                    let seg = Segment::open_remote(&root, kind, verify).await?;
                    Self::assemble(
                        shown.clone(),
                        seg.schema.clone(),
                        seg.header.codec,
                        vec![seg],
                        None,
                        Some(root.clone()),
                    )
                }
                Some(m) => {
                    use futures::{StreamExt, TryStreamExt};
                    kind_of_manifest(&m, kind, &shown)?;
                    let schema = m.schema()?;
                    let root_ref = &root;
                    let segments: Vec<Segment> = futures::stream::iter(&m.shards)
                        .map(|entry| async move {
                            Segment::open_remote(&root_ref.child(&entry.path), kind, verify)
                                .await
                                .map_err(|e| shard_error(&entry.path, e))
                        })
                        .buffered(root.tuning().max_in_flight.min(16))
                        .try_collect()
                        .await?;
                    for (seg, entry) in segments.iter().zip(&m.shards) {
                        check_shard(seg, entry, &m, &schema)?;
                    }
                    let codec = m.codec();
                    Self::assemble(
                        shown.clone(),
                        schema,
                        codec,
                        segments,
                        Some(m),
                        Some(root.clone()),
                    )
                }
            }
        })?
    }

    /// Which kind of store (or set) is at `location`, found by opening it.
    pub fn probe_kind(location: &str, options: &ReadOptions) -> Result<(Kind, StoreReader)> {
        match Self::open_with_options(location, Kind::Dense, options) {
            Ok(r) => Ok((Kind::Dense, r)),
            Err(Error::Schema(dense_why)) => {
                match Self::open_with_options(location, Kind::Ragged, options) {
                    Ok(r) => Ok((Kind::Ragged, r)),
                    Err(Error::Schema(_)) => Err(Error::Schema(format!(
                        "{location}: the schema is neither a Dense nor a Ragged one ({dense_why})"
                    ))),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    fn assemble(
        location: String,
        schema: Schema,
        codec: Codec,
        mut segments: Vec<Segment>,
        manifest: Option<Manifest>,
        remote: Option<Remote>,
    ) -> Result<Self> {
        let mut starts = Vec::with_capacity(segments.len() + 1);
        let mut total: u64 = 0;
        starts.push(0);
        for seg in &segments {
            total = total.checked_add(seg.len()).ok_or_else(|| {
                Error::InvalidFormat(format!(
                    "{location}: the shards hold more than 2^64 records"
                ))
            })?;
            starts.push(total);
        }
        // Shards written together share one dictionary, and so one pool.
        let mut dicts: Vec<Option<Vec<u8>>> = Vec::new();
        let mut decoders = Vec::new();
        for seg in &mut segments {
            seg.pool = match dicts.iter().position(|d| *d == seg.dict) {
                Some(p) => p,
                None => {
                    decoders.push(DecoderPool::new(codec, seg.dict.as_deref())?);
                    dicts.push(seg.dict.clone());
                    dicts.len() - 1
                }
            };
        }
        Ok(StoreReader {
            location,
            schema,
            codec,
            segments,
            starts,
            decoders,
            manifest,
            remote,
        })
    }

    /// The store directory (or URL) it was opened at.
    pub fn path(&self) -> &Path {
        Path::new(&self.location)
    }

    /// The path or URL it was opened at (URLs without credentials).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Whether the store lives in object storage.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// How this reader reads `data.zr` ([`DataAccess::Map`] or
    /// [`DataAccess::Read`]; remote stores read).
    pub fn data_access(&self) -> DataAccess {
        self.segments[0].data_access()
    }

    /// The stored schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The store's codec.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Number of records.
    pub fn len(&self) -> u64 {
        *self.starts.last().expect("at least one entry")
    }

    /// Whether the store holds no records.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Committed payload bytes (the sum over shards for a set).
    pub fn tail_offset(&self) -> u64 {
        self.segments.iter().map(|s| s.header.tail_offset).sum()
    }

    /// The dictionary bytes (`dict.zr`), for zstd_dict stores (the first
    /// shard's, for a set).
    pub fn dict_bytes(&self) -> Option<&[u8]> {
        self.segments[0].dict.as_deref()
    }

    /// The manifest, when this is a store set.
    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// Bytes the store takes in storage: every shard's three files.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.disk_bytes).sum()
    }

    /// The logical (decoded) sizes of records `range`, from the record
    /// table alone (nothing is decoded).
    pub fn logical_sizes(&self, range: std::ops::Range<u64>) -> Result<Vec<u32>> {
        if range.start > range.end || range.end > self.len() {
            return Err(Error::IndexOutOfRange(format!(
                "records {}..{} are not within a store of {} records",
                range.start,
                range.end,
                self.len()
            )));
        }
        let picks: Vec<u64> = range.collect();
        self.fetch_table(&picks)?;
        picks
            .iter()
            .map(|&i| self.loc(i).map(|l| l.logic_length))
            .collect()
    }

    /// The content checksums every shard carries ([`Checksums::None`] if
    /// any shard lacks them). For zstd stores this reads the first frame
    /// header of each shard.
    pub fn checksums(&self) -> Result<Checksums> {
        if self.codec == Codec::Raw {
            let all = self.segments.iter().all(|s| s.has_sums);
            return Ok(if all {
                Checksums::Sidecar
            } else {
                Checksums::None
            });
        }
        let flags = remote::block_on(futures::future::try_join_all(
            self.segments.iter().map(|s| s.frames_checksummed()),
        ))??;
        let all = flags.iter().all(|f| *f != Some(false)) && flags.iter().any(Option::is_some);
        Ok(if all {
            Checksums::Frames
        } else {
            Checksums::None
        })
    }

    /// Number of physical stores: 1, or the shards of a set.
    pub fn shard_count(&self) -> usize {
        self.segments.len()
    }

    /// The segment holding record `index` (which must be in range) and the
    /// record's index within it.
    #[inline]
    fn locate(&self, index: u64) -> (usize, u64) {
        if self.segments.len() == 1 {
            return (0, index);
        }
        let s = self.starts.partition_point(|&start| start <= index) - 1;
        (s, index - self.starts[s])
    }

    /// Mean logical bytes per record over up to `probe` evenly spread
    /// records (0.0 for an empty store).
    pub fn mean_record_bytes(&self, probe: u64) -> Result<f64> {
        let n = self.len();
        if n == 0 {
            return Ok(0.0);
        }
        let k = probe.clamp(1, n);
        // j < k <= n, so j * n / k < n; u128 keeps the product exact.
        let picks: Vec<u64> = (0..k)
            .map(|j| (j as u128 * n as u128 / k as u128) as u64)
            .collect();
        self.fetch_table(&picks)?;
        let mut total = 0u64;
        for &i in &picks {
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

    /// The validated table entry of record `index` (its offset is within
    /// the shard holding it).
    #[inline]
    pub fn loc(&self, index: u64) -> Result<RecordLoc> {
        if index >= self.len() {
            return Err(Error::IndexOutOfRange(format!(
                "index {index} is out of range for a store of {} records",
                self.len()
            )));
        }
        let (s, local) = self.locate(index);
        self.segments[s].loc(local, index)
    }

    /// Remote stores: fetches, in bulk, the table chunks holding the entries
    /// of `indices` (all in range) that are not here yet.
    fn fetch_table(&self, indices: &[u64]) -> Result<()> {
        if self.remote.is_none() {
            return Ok(());
        }
        let mut per_segment: Vec<Vec<u64>> = vec![Vec::new(); self.segments.len()];
        for &i in indices {
            let (s, local) = self.locate(i);
            per_segment[s].push(local);
        }
        remote::block_on(futures::future::try_join_all(
            self.segments
                .iter()
                .zip(per_segment)
                .filter(|(_, locals)| !locals.is_empty())
                .map(|(seg, locals)| async move { seg.fetch_table(locals.into_iter()).await }),
        ))?
        .map(|_| ())
    }

    /// Checks that the mapped `data.zr` of every segment `indices` touch
    /// still holds its payload (see `Segment::check_payload`): one `fstat`
    /// per segment per gather.
    fn check_mapped(&self, indices: &[u64]) -> Result<()> {
        if self.segments.len() == 1 {
            return self.segments[0].check_payload();
        }
        if self.data_access() != DataAccess::Map {
            return Ok(());
        }
        let mut seen = vec![false; self.segments.len()];
        for &i in indices {
            let (s, _) = self.locate(i);
            if !std::mem::replace(&mut seen[s], true) {
                self.segments[s].check_payload()?;
            }
        }
        Ok(())
    }

    /// Checks every index before any work starts, so an out-of-range index
    /// fails the whole request up front.
    fn check_indices(&self, indices: &[u64]) -> Result<()> {
        let n = self.len();
        if let Some(&bad) = indices.iter().find(|&&i| i >= n) {
            return Err(Error::IndexOutOfRange(format!(
                "index {bad} is out of range for a store of {n} records"
            )));
        }
        Ok(())
    }

    /// Remote gathers: the table entries of `indices` and their slots,
    /// then one merged, concurrent fetch that decodes as ranges arrive.
    fn gather_remote<'a>(
        &self,
        indices: &[u64],
        slots: impl Iterator<Item = &'a mut [u8]>,
        width: Option<usize>,
    ) -> Result<()> {
        self.fetch_table(indices)?;
        let mut work = Vec::with_capacity(indices.len());
        for (&i, slot) in indices.iter().zip(slots) {
            let (seg, local) = self.locate(i);
            let loc = self.segments[seg].loc(local, i)?;
            if let Some(width) = width {
                check_width(i, &loc, width)?;
            }
            work.push(Work {
                label: i,
                seg,
                local,
                loc,
                slot,
            });
        }
        let tuning = self.remote.as_ref().expect("remote").tuning();
        fetch::fetch_into(&self.segments, &self.decoders, tuning, work)
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
        if self.remote.is_some() {
            return self.gather_remote(indices, out.chunks_exact_mut(width), Some(width));
        }
        self.check_mapped(indices)?;
        let run = |idx: &[u64], dst: &mut [u8], decs: &mut TaskDecoders<'_>| -> Result<()> {
            for (&i, slot) in idx.iter().zip(dst.chunks_exact_mut(width)) {
                let (s, local) = self.locate(i);
                let seg = &self.segments[s];
                let loc = seg.loc(local, i)?;
                check_width(i, &loc, width)?;
                seg.read_record(i, &loc, slot, decs.get(seg.pool)?)?;
                seg.check_sum(local, i, slot)?;
            }
            Ok(())
        };
        let inline = if self.codec == Codec::Raw {
            RAW_INLINE_BYTES
        } else {
            INLINE_BYTES
        };
        if out.len() <= inline || indices.len() == 1 {
            return run(indices, out, &mut TaskDecoders::new(&self.decoders));
        }
        let per_task = pool::task_len(indices.len(), (INLINE_BYTES / 4 / width).max(1));
        pool::pool().install(|| {
            indices
                .par_chunks(per_task)
                .zip(out.par_chunks_mut(per_task * width))
                .try_for_each_init(
                    || TaskDecoders::new(&self.decoders),
                    |decs, (idx, dst)| run(idx, dst, decs),
                )
        })
    }

    /// Decodes variable-size records `indices` into one new buffer, each at
    /// a 16-byte-aligned slot; returns the buffer and each record's byte
    /// range in it. The buffer is as large as the requested records' logical
    /// sizes (plus alignment), never more.
    pub fn gather_var(
        &self,
        indices: &[u64],
    ) -> Result<(crate::buffers::Buf, Vec<std::ops::Range<usize>>)> {
        self.check_indices(indices)?;
        self.fetch_table(indices)?;
        let mut locs = Vec::with_capacity(indices.len());
        let mut ranges = Vec::with_capacity(indices.len());
        let mut total = 0usize;
        for &i in indices {
            let (s, local) = self.locate(i);
            let loc = self.segments[s].loc(local, i)?;
            let start = total.next_multiple_of(SLOT_ALIGN);
            let end = start
                .checked_add(loc.logic_length as usize)
                .ok_or_else(|| Error::OutOfMemory("gather size overflows".into()))?;
            ranges.push(start..end);
            locs.push((s, local, loc));
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
        let work: Vec<Work<'_>> = indices
            .iter()
            .zip(locs)
            .zip(slots)
            .map(|((&label, (seg, local, loc)), slot)| Work {
                label,
                seg,
                local,
                loc,
                slot,
            })
            .collect();
        if let Some(remote) = &self.remote {
            fetch::fetch_into(&self.segments, &self.decoders, remote.tuning(), work)?;
            return Ok((buf, ranges));
        }
        self.check_mapped(indices)?;
        let run = |decs: &mut TaskDecoders<'_>, w: Work<'_>| {
            let seg = &self.segments[w.seg];
            seg.read_record(w.label, &w.loc, w.slot, decs.get(seg.pool)?)?;
            seg.check_sum(w.local, w.label, w.slot)
        };
        if total <= INLINE_BYTES || work.len() == 1 {
            let mut decs = TaskDecoders::new(&self.decoders);
            for item in work {
                run(&mut decs, item)?;
            }
        } else {
            let per_task = pool::task_len(work.len(), 4);
            pool::pool().install(|| {
                work.into_par_iter()
                    .with_min_len(per_task)
                    .try_for_each_init(|| TaskDecoders::new(&self.decoders), run)
            })?;
        }
        Ok((buf, ranges))
    }

    /// Gathers the records of a Dense store into a new buffer (taken from
    /// the [batch-buffer cache](crate::buffers)), `record width` bytes each.
    pub fn gather_dense(&self, indices: &[u64]) -> Result<crate::buffers::Buf> {
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
        if let [seg] = &self.segments[..] {
            let enc = &seg.ragged;
            return RaggedBatch::from_gather_with(data, ranges, indices, itemsize, |i, r, s, d| {
                enc.parse(i, r, s, d)
            });
        }
        RaggedBatch::from_gather_with(data, ranges, indices, itemsize, |i, r, s, d| {
            self.segments[self.locate(i).0].ragged.parse(i, r, s, d)
        })
    }

    /// The layout of the store: which loaderx releases write stores like it
    /// (see [`Layout`]). For a Ragged store whose layout only its records
    /// tell (2.0.0 / 2.0.1, 2.8.18 / 2.8.19), this reads its first record.
    /// A store set reports its first shard's.
    pub fn layout(&self) -> Result<Layout> {
        let Some(seg) = self.segments.first() else {
            return Ok(Layout::V2_0_0);
        };
        if let Some(layout) = seg.settled_layout() {
            return Ok(layout);
        }
        if seg.len() == 0 {
            // Both candidates read an empty store the same way.
            return Ok(seg.ragged.first_layout());
        }
        crate::buffers::recycle(self.gather_ragged(&[0])?.into_data());
        Ok(seg.settled_layout().unwrap_or(seg.layout))
    }
}

/// A Dense record must decode to exactly the schema's width.
#[inline]
fn check_width(index: u64, loc: &RecordLoc, width: usize) -> Result<()> {
    if loc.logic_length as usize != width {
        return Err(Error::Corrupt(format!(
            "record {index} holds {} bytes but the schema makes records {width} bytes",
            loc.logic_length
        )));
    }
    Ok(())
}

/// The decoders one task holds, one per dictionary it has met, taken from
/// the reader's pools lazily so a failure is reported as itself.
pub(crate) struct TaskDecoders<'r> {
    pools: &'r [DecoderPool],
    // The common case (one dictionary, or none) without an allocation.
    first: Option<PooledDecoder<'r>>,
    rest: Vec<Option<PooledDecoder<'r>>>,
}

impl<'r> TaskDecoders<'r> {
    pub(crate) fn new(pools: &'r [DecoderPool]) -> Self {
        TaskDecoders {
            pools,
            first: None,
            rest: Vec::new(),
        }
    }

    /// The decoder of pool `p`.
    #[inline]
    pub(crate) fn get(&mut self, p: usize) -> Result<&mut Decoder> {
        let slot = if p == 0 {
            &mut self.first
        } else {
            if self.rest.len() < p {
                self.rest.resize_with(p, || None);
            }
            &mut self.rest[p - 1]
        };
        let held = match slot {
            Some(d) => d,
            None => slot.insert(self.pools[p].get()?),
        };
        Ok(&mut **held)
    }
}
