//! One physical store (the three files of a directory or an object-storage
//! prefix), opened and validated: the unit a [`StoreReader`](super::StoreReader)
//! is made of. A plain store is one segment; each shard of a store set is one.
//!
//! The record table is read in chunks of entries, each the first time a
//! gather needs it, and kept for the reader's life (16 bytes a record, what a
//! memory map would hold once touched). Local chunks come by `pread`, so a
//! `meta.zr` truncated under a reader is an I/O error, never a `SIGBUS`.
//! Remote segments fetch the header page and, for small stores, the whole
//! table at open; larger tables arrive in chunks fetched in bulk.
//!
//! `data.zr` is read by `pread` or through a read-only map (see
//! [`DataAccess`]). Bytes leave a map only through a SIGBUS-safe copy, so a
//! file cut short (or a failing device) under a mapped reader is an error,
//! never a fault; its length is also checked before every gather
//! ([`Segment::check_payload`]) for a clearer message.

use std::fs::File;
use std::path::Path;
use std::sync::OnceLock;

use bytes::Bytes;
use memmap2::Mmap;

use crate::codec::Decoder;
use crate::error::{Error, Result};
use crate::format::{
    Codec, Header, RecordLoc, DATA_FILE, DICT_FILE, HEADER_SIZE, LOC_SIZE, META_FILE, PAGE_SIZE,
    SUMS_FILE, SUMS_HEADER, SUMS_MAGIC,
};
use crate::io::{self, LockMode};
use crate::remote::{self, ObjectInfo, Remote};
use crate::schema::{Kind, Schema};
use crate::store::layout::{
    self, decode_schema, Layout, RaggedEncoding, RaggedPrefix, SchemaFlavor, ShardedHeader,
};
use crate::store::reader::{DataAccess, MAX_DICT_BYTES};
use xxhash_rust::xxh3::xxh3_64;

/// Record-table entries per remotely fetched chunk (64 KiB).
pub(crate) const REMOTE_TABLE_CHUNK: u64 = 4096;
/// Record-table entries per locally read chunk (16 KiB: a few pages, about
/// what a memory map's fault-around would bring in).
pub(crate) const LOCAL_TABLE_CHUNK: u64 = 1024;
/// Tables up to this size come with the header page, in the open request.
const EAGER_TABLE_BYTES: u64 = 1 << 20;

/// Where the record table's chunks come from.
enum TableSource {
    Local {
        file: File,
        path: std::path::PathBuf,
    },
    Remote {
        remote: Remote,
        info: ObjectInfo,
    },
}

/// The record table, read a chunk at a time on first use.
pub(crate) struct Table {
    source: TableSource,
    /// Entries per chunk.
    chunk: u64,
    length: u64,
    chunks: Vec<OnceLock<Bytes>>,
}

pub(crate) enum Payload {
    Empty,
    /// The map, and the file whose length is checked before each gather.
    Mapped {
        map: Mmap,
        file: File,
    },
    File(File),
    /// The `data_{i}.zr` files of a later release's sharded layout, read as
    /// one virtual file: file `i` starts at `bases[i]` (see [`ShardMap`]).
    Shards {
        files: Vec<File>,
        bases: Vec<u64>,
    },
    Remote {
        remote: Remote,
        info: ObjectInfo,
    },
}

/// Where the records of a sharded layout (loaderx 2.3.3 and later) live.
///
/// Those releases place record `i` in `data_{i % n}.zr` at an offset within
/// that file. The reader sees the files as one concatenation (file `s`
/// starting at `bases[s]`), so each table entry is translated once, when it
/// is read, into an ordinary absolute offset and every gather path works
/// unchanged.
pub(crate) struct ShardMap {
    tails: Vec<u64>,
    bases: Vec<u64>,
}

impl ShardMap {
    #[inline]
    fn translate(
        &self,
        local: u64,
        label: u64,
        mut loc: RecordLoc,
        name: &str,
    ) -> Result<RecordLoc> {
        let s = (local % self.tails.len() as u64) as usize;
        match loc.offset.checked_add(loc.phys_length as u64) {
            Some(end) if end <= self.tails[s] => {}
            _ => {
                return Err(Error::InvalidFormat(format!(
                    "record {label}: bytes {}..{}+{} lie past the committed end {} of {name}/data_{s}.zr",
                    loc.offset, loc.offset, loc.phys_length, self.tails[s]
                )))
            }
        }
        loc.offset += self.bases[s];
        Ok(loc)
    }
}

/// An open, validated physical store.
pub(crate) struct Segment {
    /// Directory path or URL, for messages.
    pub(crate) name: String,
    pub(crate) header: Header,
    pub(crate) schema: Schema,
    table: Table,
    pub(crate) data: Payload,
    pub(crate) dict: Option<Vec<u8>>,
    /// Which of the reader's decoder pools decodes this segment's frames.
    pub(crate) pool: usize,
    /// Bytes of its files, as found at open.
    pub(crate) disk_bytes: u64,
    /// Whether a checksum sidecar (`sums.zr`) was found.
    pub(crate) has_sums: bool,
    /// The sidecar's checksums, loaded when the reader verifies content.
    sums: Option<Vec<u64>>,
    /// The layout as the files and header tell it (a Ragged store's records
    /// may still choose between two: see `ragged`).
    pub(crate) layout: Layout,
    /// How Ragged records encode their shapes.
    pub(crate) ragged: RaggedEncoding,
    /// For sharded layouts: which file holds each record.
    shard_map: Option<ShardMap>,
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

/// Checks that `dict.zr` (of `size` bytes, `None` when absent) is present
/// exactly when the codec needs it, and not absurdly large.
/// The size of a local `dict.zr`, or `None` when there is none.
fn local_dict_size(path: &Path) -> Result<Option<u64>> {
    match std::fs::metadata(path) {
        Ok(m) => Ok(Some(m.len())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io(format!("inspecting {}", path.display()), e)),
    }
}

/// A local store's dictionary, read when its codec needs one (and checked
/// against the codec either way, see [`check_dict`]).
fn read_local_dict(
    path: &Path,
    size: Option<u64>,
    codec: Codec,
    where_: &str,
) -> Result<Option<Vec<u8>>> {
    if !check_dict(size, codec, where_)? {
        return Ok(None);
    }
    std::fs::read(path)
        .map(Some)
        .map_err(|e| Error::io(format!("reading {}", path.display()), e))
}

fn check_dict(size: Option<u64>, codec: Codec, where_: &str) -> Result<bool> {
    match (codec, size) {
        (Codec::ZstdDict, Some(n)) if (1..=MAX_DICT_BYTES).contains(&n) => Ok(true),
        (Codec::ZstdDict, Some(n)) if n > MAX_DICT_BYTES => Err(Error::InvalidFormat(format!(
            "{where_}: {DICT_FILE} is {n} bytes, larger than any zstd dictionary \
             ({MAX_DICT_BYTES} bytes at most)"
        ))),
        (Codec::ZstdDict, _) => Err(Error::InvalidFormat(format!(
            "a zstd_dict store needs a non-empty {DICT_FILE}"
        ))),
        (_, Some(_)) => Err(Error::InvalidFormat(format!(
            "a {} store must not have a {DICT_FILE}",
            codec.name()
        ))),
        (_, None) => Ok(false),
    }
}

/// Parses and checks a checksum sidecar against the store's header.
fn parse_sums(bytes: &[u8], header: &Header, name: &str) -> Result<Vec<u64>> {
    let bad = |why: String| Error::InvalidFormat(format!("{name}/{SUMS_FILE}: {why}"));
    if bytes.len() < SUMS_HEADER as usize || bytes[..8] != SUMS_MAGIC {
        return Err(bad("not a loaderx checksum file".into()));
    }
    let count = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    if count != header.length {
        return Err(bad(format!(
            "it covers {count} records, the store holds {}",
            header.length
        )));
    }
    let body = &bytes[SUMS_HEADER as usize..];
    if (body.len() as u64) < count * 8 {
        return Err(bad(format!(
            "{} bytes cannot hold {count} checksums",
            body.len()
        )));
    }
    Ok(body[..count as usize * 8]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Parses the static page; checks the sizes of `meta.zr` and `data.zr`.
fn parse_page(
    page: &[u8],
    kind: Kind,
    meta_len: u64,
    data_len: u64,
    name: &str,
) -> Result<(Header, Schema, Layout, RaggedEncoding)> {
    let header =
        Header::decode(page[..HEADER_SIZE].try_into().expect("32 bytes")).map_err(|e| match e {
            Error::InvalidFormat(msg) => Error::InvalidFormat(format!(
                "{msg}: not a header of any loaderx layout this version knows \
                 (written by a release it does not know, or damaged)"
            )),
            other => other,
        })?;
    let schema_end = HEADER_SIZE + header.schema_length as usize;
    let schema_bytes = &page[HEADER_SIZE..schema_end];
    // The 2.0.x header; the schema tells 2.2.1 (it added `ndim`) apart.
    let (schema, layout, ragged) = match Schema::decode(schema_bytes, kind) {
        Ok(schema) => (
            schema,
            Layout::V2_0_0,
            RaggedEncoding::either(
                (Layout::V2_0_0, RaggedPrefix::RankU64),
                (Layout::V2_0_1, RaggedPrefix::RankU8),
            ),
        ),
        Err(e) if layout::msgpack_has_ndim(schema_bytes) => {
            let _ = e;
            let f = decode_schema(schema_bytes, kind, SchemaFlavor::MsgpackNdim)?;
            let ragged =
                RaggedEncoding::fixed(Layout::V2_2, RaggedPrefix::Dims64(f.ndim.unwrap_or(0)));
            (f.schema, Layout::V2_2, ragged)
        }
        Err(e) => return Err(e),
    };
    let table_end = header.meta_len_required()?;
    if meta_len < table_end {
        return Err(Error::InvalidFormat(format!(
            "{name}/{META_FILE} is {meta_len} bytes but its {} records need {table_end}",
            header.length
        )));
    }
    if data_len < header.tail_offset {
        return Err(Error::InvalidFormat(format!(
            "{name}/{DATA_FILE} is {data_len} bytes, shorter than its committed end {}",
            header.tail_offset
        )));
    }
    Ok((header, schema, layout, ragged))
}

impl Segment {
    /// Opens the committed local store at `dir` as `kind`.
    pub(crate) fn open_local(
        dir: &Path,
        kind: Kind,
        access: DataAccess,
        verify: bool,
    ) -> Result<Segment> {
        let meta_path = dir.join(META_FILE);
        let meta_file = File::open(&meta_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound {
                path: dir.to_path_buf(),
                reason: if dir.is_dir() {
                    format!("the directory has no {META_FILE}")
                } else {
                    "no such directory".into()
                },
            },
            _ => Error::io(format!("opening {}", meta_path.display()), e),
        })?;
        io::try_lock(&meta_file, LockMode::Shared, &meta_path)?;

        let size_of = |file: &File, path: &Path| {
            file.metadata()
                .map(|m| m.len())
                .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))
        };
        let meta_len = size_of(&meta_file, &meta_path)?;
        if meta_len < PAGE_SIZE {
            return Err(Error::InvalidFormat(format!(
                "{} is {meta_len} bytes, shorter than its {PAGE_SIZE}-byte static page",
                meta_path.display()
            )));
        }
        let mut page = vec![0u8; PAGE_SIZE as usize];
        io::read_exact_at(&meta_file, &mut page, 0)
            .map_err(|e| Error::io(format!("reading {}", meta_path.display()), e))?;

        let data_path = dir.join(DATA_FILE);
        if !data_path.exists() && dir.join(sharded_file(0)).exists() {
            return Self::open_local_sharded(
                dir, kind, meta_file, meta_path, meta_len, &page, verify,
            );
        }
        let data_file = File::open(&data_path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::InvalidFormat(format!("{} is missing", data_path.display()))
            }
            _ => Error::io(format!("opening {}", data_path.display()), e),
        })?;
        let data_len = size_of(&data_file, &data_path)?;
        let name = dir.display().to_string();
        let (header, schema, layout, ragged) = parse_page(&page, kind, meta_len, data_len, &name)?;

        let dict_path = dir.join(DICT_FILE);
        let dict_size = local_dict_size(&dict_path)?;
        let sums_path = dir.join(SUMS_FILE);
        let sums_size = std::fs::metadata(&sums_path).ok().map(|m| m.len());
        let disk_bytes = meta_len + data_len + dict_size.unwrap_or(0) + sums_size.unwrap_or(0);
        let sums = match (verify, sums_size) {
            (true, Some(_)) => Some(parse_sums(
                &std::fs::read(&sums_path)
                    .map_err(|e| Error::io(format!("reading {}", sums_path.display()), e))?,
                &header,
                &name,
            )?),
            _ => None,
        };
        let dict = read_local_dict(&dict_path, dict_size, header.codec, &name)?;

        let table = Table::new(
            TableSource::Local {
                file: meta_file,
                path: meta_path,
            },
            LOCAL_TABLE_CHUNK,
            header.length,
        );
        let data = match (header.tail_offset, access.resolve(&header)) {
            (0, _) => Payload::Empty,
            (_, DataAccess::Map) => match map_file(&data_file, &data_path)? {
                Some(map) => Payload::Mapped {
                    map,
                    file: data_file,
                },
                None => Payload::Empty,
            },
            (_, _) => Payload::File(data_file),
        };
        Ok(Segment {
            name,
            header,
            schema,
            table,
            data,
            dict,
            pool: 0,
            disk_bytes,
            has_sums: sums_size.is_some(),
            sums,
            layout,
            ragged,
            shard_map: None,
        })
    }

    /// Opens a store of the sharded layouts (loaderx 2.3.3 and later):
    /// `meta.zr` with the sharded header, `data_0.zr` … `data_{n-1}.zr`.
    /// Read-only; `data_access` does not apply (records are read by `pread`).
    fn open_local_sharded(
        dir: &Path,
        kind: Kind,
        meta_file: File,
        meta_path: std::path::PathBuf,
        meta_len: u64,
        page: &[u8],
        verify: bool,
    ) -> Result<Segment> {
        let name = dir.display().to_string();
        let h = ShardedHeader::decode(page, &name)?;
        let schema_bytes = &page[h.schema.clone()];
        // 2.8.18 switched the schema to JSON; MessagePack maps never start with '{'.
        let flavor = if schema_bytes.first() == Some(&b'{') {
            SchemaFlavor::Json
        } else {
            SchemaFlavor::MsgpackNdim
        };
        let f = decode_schema(schema_bytes, kind, flavor)?;
        let layout = match flavor {
            SchemaFlavor::Json => Layout::V2_8_18,
            SchemaFlavor::MsgpackNdim if f.dtype_by_name => Layout::V2_8_12,
            SchemaFlavor::MsgpackNdim => Layout::V2_3_3,
        };
        let ndim = f.ndim.unwrap_or(0);
        let ragged = match flavor {
            // 2.8.18 and 2.8.19 write identical headers; the records decide.
            SchemaFlavor::Json => RaggedEncoding::either(
                (Layout::V2_8_18, RaggedPrefix::Dims64(ndim)),
                (Layout::V2_8_19, RaggedPrefix::Dims32(ndim)),
            ),
            SchemaFlavor::MsgpackNdim => RaggedEncoding::fixed(layout, RaggedPrefix::Dims64(ndim)),
        };
        let table_end = (h.length)
            .checked_mul(LOC_SIZE as u64)
            .and_then(|t| t.checked_add(PAGE_SIZE))
            .ok_or_else(|| {
                Error::InvalidFormat(format!("record count {} overflows the table", h.length))
            })?;
        if meta_len < table_end {
            return Err(Error::InvalidFormat(format!(
                "{name}/{META_FILE} is {meta_len} bytes but its {} records need {table_end}",
                h.length
            )));
        }
        let n = h.tails.len();
        if dir.join(sharded_file(n)).exists() {
            return Err(Error::InvalidFormat(format!(
                "{name}: its header names {n} data files but {} exists too: not a layout \
                 this version knows, or damaged",
                sharded_file(n)
            )));
        }
        let mut files = Vec::with_capacity(n);
        let mut bases = Vec::with_capacity(n);
        let mut total = 0u64;
        let mut disk_bytes = meta_len;
        for (i, &tail) in h.tails.iter().enumerate() {
            let path = dir.join(sharded_file(i));
            let file = File::open(&path).map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::InvalidFormat(format!(
                    "{} is missing (the header names {n} data files)",
                    path.display()
                )),
                _ => Error::io(format!("opening {}", path.display()), e),
            })?;
            let len = file
                .metadata()
                .map_err(|e| Error::io(format!("reading the size of {}", path.display()), e))?
                .len();
            if len < tail {
                return Err(Error::InvalidFormat(format!(
                    "{} is {len} bytes, shorter than its committed end {tail}",
                    path.display()
                )));
            }
            disk_bytes += len;
            bases.push(total);
            total += tail; // bounded by ShardedHeader::decode
            files.push(file);
        }
        let dict_path = dir.join(DICT_FILE);
        let dict_size = local_dict_size(&dict_path)?;
        disk_bytes += dict_size.unwrap_or(0);
        let dict = read_local_dict(&dict_path, dict_size, h.codec, &name)?;
        let _ = verify; // these releases wrote no checksum sidecar
        let header = Header {
            length: h.length,
            tail_offset: total,
            schema_length: schema_bytes.len() as u32,
            codec: h.codec,
        };
        let table = Table::new(
            TableSource::Local {
                file: meta_file,
                path: meta_path,
            },
            LOCAL_TABLE_CHUNK,
            header.length,
        );
        let data = if total == 0 {
            Payload::Empty
        } else {
            Payload::Shards {
                files,
                bases: bases.clone(),
            }
        };
        Ok(Segment {
            name,
            header,
            schema: f.schema,
            table,
            data,
            dict,
            pool: 0,
            disk_bytes,
            has_sums: false,
            sums: None,
            layout,
            ragged,
            shard_map: Some(ShardMap {
                tails: h.tails,
                bases,
            }),
        })
    }

    /// Opens the committed store under the object-storage folder `remote`.
    pub(crate) async fn open_remote(remote: &Remote, kind: Kind, verify: bool) -> Result<Segment> {
        let name = remote.url().to_string();
        let (meta, data, dict, sums_info) = futures::try_join!(
            remote.head(META_FILE),
            remote.head(DATA_FILE),
            remote.head(DICT_FILE),
            remote.head(SUMS_FILE)
        )?;
        let Some(meta) = meta else {
            return Err(Error::NotFound {
                path: name.into(),
                reason: format!("no {META_FILE} there"),
            });
        };
        if meta.size < PAGE_SIZE {
            return Err(Error::InvalidFormat(format!(
                "{name}/{META_FILE} is {} bytes, shorter than its {PAGE_SIZE}-byte static page",
                meta.size
            )));
        }
        let Some(data) = data else {
            if remote.head(&sharded_file(0)).await?.is_some() {
                return Err(Error::InvalidFormat(format!(
                    "{name} holds {} instead of {DATA_FILE}: a store of loaderx 2.3.3 or \
                     later, which this version reads from local disk only; copy it here \
                     (or run `loaderx convert` on a local copy)",
                    sharded_file(0)
                )));
            }
            return Err(Error::InvalidFormat(format!(
                "{name}/{DATA_FILE} is missing"
            )));
        };
        // The page, and with it the whole table when that is small.
        let first = meta.size.min(PAGE_SIZE + EAGER_TABLE_BYTES);
        let (head, _) = remote.get_range(META_FILE, 0..first, Some(&meta)).await?;
        let (header, schema, layout, ragged) =
            parse_page(&head, kind, meta.size, data.size, &name)?;
        let disk_bytes = meta.size
            + data.size
            + dict.as_ref().map_or(0, |d| d.size)
            + sums_info.as_ref().map_or(0, |d| d.size);
        let has_sums = sums_info.is_some();
        let sums = if verify && has_sums {
            match remote.get_all(SUMS_FILE).await? {
                Some((bytes, _)) => Some(parse_sums(&bytes, &header, &name)?),
                None => None,
            }
        } else {
            None
        };
        let dict = if check_dict(dict.map(|d| d.size), header.codec, &name)? {
            match remote.get_all(DICT_FILE).await? {
                Some((bytes, _)) => Some(bytes.to_vec()),
                None => {
                    return Err(Error::InvalidFormat(format!(
                        "{name}/{DICT_FILE} disappeared while the store was being opened"
                    )))
                }
            }
        } else {
            None
        };

        let table = Table::new(
            TableSource::Remote {
                remote: remote.clone(),
                info: meta,
            },
            REMOTE_TABLE_CHUNK,
            header.length,
        );
        // Chunks wholly inside what the first request brought.
        for (c, slot) in table.chunks.iter().enumerate() {
            let range = table.chunk_range(c as u64);
            if range.end > first {
                break;
            }
            let _ = slot.set(head.slice(range.start as usize..range.end as usize));
        }
        let payload = match header.tail_offset {
            0 => Payload::Empty,
            _ => Payload::Remote {
                remote: remote.clone(),
                info: data,
            },
        };
        Ok(Segment {
            name,
            header,
            schema,
            table,
            data: payload,
            dict,
            pool: 0,
            disk_bytes,
            has_sums,
            sums,
            layout,
            ragged,
            shard_map: None,
        })
    }

    /// The layout of the store, `None` for a Ragged store whose records
    /// have not settled it yet (see [`RaggedEncoding`]).
    pub(crate) fn settled_layout(&self) -> Option<Layout> {
        match self.schema.kind() {
            Kind::Dense => Some(self.layout),
            Kind::Ragged => self.ragged.layout(),
        }
    }

    /// Number of records.
    pub(crate) fn len(&self) -> u64 {
        self.header.length
    }

    /// How `data.zr` is read.
    pub(crate) fn data_access(&self) -> DataAccess {
        match self.data {
            Payload::Mapped { .. } => DataAccess::Map,
            _ => DataAccess::Read,
        }
    }

    /// For a mapped `data.zr`: checks that the file still holds the
    /// committed payload, so a file shortened under the reader fails the
    /// gather up front with a clear message. (One cut short during the gather
    /// is caught by the SIGBUS-safe copy, `io::copy_from_map`.)
    pub(crate) fn check_payload(&self) -> Result<()> {
        let Payload::Mapped { file, .. } = &self.data else {
            return Ok(());
        };
        let len = file
            .metadata()
            .map_err(|e| Error::io(format!("reading the size of {}/{DATA_FILE}", self.name), e))?
            .len();
        if len < self.header.tail_offset {
            return Err(Error::io(
                format!("reading {}/{DATA_FILE}", self.name),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!(
                        "the file was cut to {len} bytes under the reader; its committed end is {}",
                        self.header.tail_offset
                    ),
                ),
            ));
        }
        Ok(())
    }

    /// Fetches, in bulk, the remote table chunks covering `locals` that are
    /// not here yet (local chunks are read on first use instead).
    pub(crate) async fn fetch_table(&self, locals: impl Iterator<Item = u64>) -> Result<()> {
        if !matches!(self.table.source, TableSource::Remote { .. }) {
            return Ok(());
        }
        let table = &self.table;
        let mut wanted: Vec<u64> = locals
            .map(|i| i / table.chunk)
            .filter(|&c| {
                table
                    .chunks
                    .get(c as usize)
                    .is_some_and(|s| s.get().is_none())
            })
            .collect();
        wanted.sort_unstable();
        wanted.dedup();
        table.fetch_remote(&wanted).await
    }

    /// The validated table entry of local record `local`; `label` is the
    /// index callers know it by (the global one in a set), for messages.
    #[inline]
    pub(crate) fn loc(&self, local: u64, label: u64) -> Result<RecordLoc> {
        let table = &self.table;
        let c = local / table.chunk;
        let slot = &table.chunks[c as usize];
        let chunk = match slot.get() {
            Some(chunk) => chunk,
            None => {
                table.load(c)?;
                slot.get().expect("loaded")
            }
        };
        let at = ((local % table.chunk) * LOC_SIZE as u64) as usize;
        let mut loc = RecordLoc::decode(&chunk[at..at + LOC_SIZE]);
        if let Some(map) = &self.shard_map {
            loc = map.translate(local, label, loc, &self.name)?;
        }
        loc.validate(label, self.header.codec, self.header.tail_offset)?;
        Ok(loc)
    }

    /// With content verification on and a sidecar present: checks decoded
    /// record `local` (`label` for messages) against its checksum.
    #[inline]
    pub(crate) fn check_sum(&self, local: u64, label: u64, record: &[u8]) -> Result<()> {
        let Some(sums) = &self.sums else {
            return Ok(());
        };
        if xxh3_64(record) != sums[local as usize] {
            return Err(Error::Corrupt(format!(
                "record {label}: its bytes do not match the checksum in {}/{SUMS_FILE}",
                self.name
            )));
        }
        Ok(())
    }

    /// Whether this segment's zstd frames carry checksums, read off the
    /// header of its first record's frame (`None` for an empty or raw one).
    pub(crate) async fn frames_checksummed(&self) -> Result<Option<bool>> {
        if self.header.length == 0 || self.header.codec == Codec::Raw {
            return Ok(None);
        }
        // Inside async code a lone lookup must not block: fetch first.
        self.fetch_table(std::iter::once(0)).await?;
        let loc = self.loc(0, 0)?;
        let want = (loc.phys_length as usize).min(8);
        let head = match &self.data {
            Payload::Mapped { map, .. } => {
                map[loc.offset as usize..loc.offset as usize + want].to_vec()
            }
            Payload::File(_) | Payload::Shards { .. } => {
                let mut buf = vec![0u8; want];
                self.read_at(&mut buf, loc.offset)
                    .map_err(|e| Error::io(format!("reading {}/{DATA_FILE}", self.name), e))?;
                buf
            }
            Payload::Remote { remote, info } => remote
                .read_range(DATA_FILE, loc.offset..loc.offset + want as u64, info)
                .await?
                .to_vec(),
            Payload::Empty => return Ok(None),
        };
        Ok(crate::format::frame_has_checksum(&head))
    }

    /// Reads `buf.len()` bytes at absolute offset `start` of a `pread` payload
    /// (for sharded layouts, of the virtual concatenation of its files; a
    /// validated record lies inside one file).
    #[inline]
    fn read_at(&self, buf: &mut [u8], start: u64) -> std::io::Result<()> {
        match &self.data {
            Payload::File(file) => io::read_exact_at(file, buf, start),
            Payload::Shards { files, bases } => {
                // Records are non-empty, so the last file starting at or
                // before `start` is the one holding it (empty files share
                // their base with the next).
                let s = bases.partition_point(|&b| b <= start).saturating_sub(1);
                io::read_exact_at(&files[s], buf, start - bases[s])
            }
            _ => Err(std::io::Error::other("internal error: not a pread payload")),
        }
    }

    /// Decodes the record of a validated entry of a local segment into `dst`
    /// (exactly its logical size). `label` names the record in messages.
    #[inline]
    pub(crate) fn read_record(
        &self,
        label: u64,
        loc: &RecordLoc,
        dst: &mut [u8],
        dec: &mut Decoder,
    ) -> Result<()> {
        let start = loc.offset;
        let len = loc.phys_length as usize;
        // Fills a buffer with the record's stored bytes. Every byte leaves a
        // map through the SIGBUS-safe copy: a file cut short mid-gather is an
        // error, never a signal.
        let fill = |buf: &mut [u8]| {
            let done = match &self.data {
                Payload::Mapped { map, .. } => {
                    io::copy_from_map(buf, &map[start as usize..start as usize + len])
                }
                Payload::File(_) | Payload::Shards { .. } => self.read_at(buf, start),
                Payload::Remote { .. } => {
                    return Err(Error::State(
                        "internal error: a remote record was read as a local one".into(),
                    ))
                }
                Payload::Empty => {
                    return Err(Error::InvalidFormat(format!(
                        "record {label}: the store has no payload"
                    )))
                }
            };
            done.map_err(|e| {
                Error::io(
                    format!("reading record {label} from {}/{DATA_FILE}", self.name),
                    e,
                )
            })
        };
        if self.header.codec == Codec::Raw && len == dst.len() {
            // Raw records land in place: no staging copy.
            fill(dst)
        } else {
            dec.staging.resize(len, 0);
            fill(&mut dec.staging)?;
            dec.decode_staged(label, dst)
        }
    }
}

/// Name of data file `i` of the sharded layouts.
pub(crate) fn sharded_file(i: usize) -> String {
    format!("data_{i}.zr")
}

impl Table {
    fn new(source: TableSource, chunk: u64, length: u64) -> Table {
        Table {
            source,
            chunk,
            length,
            chunks: (0..length.div_ceil(chunk))
                .map(|_| OnceLock::new())
                .collect(),
        }
    }

    /// Byte range of chunk `c` in `meta.zr`.
    fn chunk_range(&self, c: u64) -> std::ops::Range<u64> {
        let first = c * self.chunk;
        let last = ((c + 1) * self.chunk).min(self.length);
        PAGE_SIZE + first * LOC_SIZE as u64..PAGE_SIZE + last * LOC_SIZE as u64
    }

    /// Reads chunk `c` now: one `pread` locally; remotely, a request (the
    /// slow path of a lone lookup: gathers fetch their chunks in bulk first).
    fn load(&self, c: u64) -> Result<()> {
        match &self.source {
            TableSource::Local { file, path } => {
                let range = self.chunk_range(c);
                let mut buf = vec![0u8; (range.end - range.start) as usize];
                io::read_exact_at(file, &mut buf, range.start).map_err(|e| {
                    Error::io(format!("reading the record table of {}", path.display()), e)
                })?;
                let _ = self.chunks[c as usize].set(Bytes::from(buf));
                Ok(())
            }
            TableSource::Remote { .. } => remote::block_on(self.fetch_remote(&[c]))?,
        }
    }

    /// Fetches remote chunks `wanted` (sorted), neighbours merged into one
    /// request, requests in parallel.
    async fn fetch_remote(&self, wanted: &[u64]) -> Result<()> {
        use futures::{StreamExt, TryStreamExt};
        let TableSource::Remote { remote, info } = &self.source else {
            return Ok(());
        };
        let tuning = remote.tuning();
        let per_request = (tuning.max_request_bytes / (self.chunk * LOC_SIZE as u64)).max(1);
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &c in wanted {
            match runs.last_mut() {
                Some((first, last)) if *last + 1 == c && c - *first < per_request => *last = c,
                _ => runs.push((c, c)),
            }
        }
        futures::stream::iter(runs)
            .map(|(first, last)| async move {
                let start = self.chunk_range(first).start;
                let end = self.chunk_range(last).end;
                let bytes = remote.read_range(META_FILE, start..end, info).await?;
                for c in first..=last {
                    let r = self.chunk_range(c);
                    let piece = bytes.slice((r.start - start) as usize..(r.end - start) as usize);
                    let _ = self.chunks[c as usize].set(piece);
                }
                Ok::<(), Error>(())
            })
            .buffer_unordered(tuning.max_in_flight)
            .try_collect::<()>()
            .await
    }
}
