//! The writer behind `Dense.create` / `Ragged.create`: one store, or a store
//! set that rolls over to a new shard on its own, on local disk or in object
//! storage.
//!
//! Publication order is what makes an interrupted build detectable:
//! * a shard (or a plain store) is committed by its header, written last
//!   (see [`StoreWriter`]);
//! * in object storage a store is built in a local staging folder and
//!   uploaded on commit: `data.zr` and `dict.zr` first, `meta.zr` last, so a
//!   prefix without `meta.zr`, which no reader accepts, is all a failed
//!   upload can leave;
//! * a set's manifest is written after every shard is committed and
//!   uploaded (rename locally, one PUT remotely). Until then the set does
//!   not open.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::format::{Codec, DATA_FILE, DICT_FILE, META_FILE, SUMS_FILE};
use crate::io;
use crate::remote::{self, Remote, StorageOptions};
use crate::schema::Schema;
use crate::store::geometry::RaggedRecord;
use crate::store::manifest::{Manifest, ShardEntry, MANIFEST_FILE};
use crate::store::writer::{CreateOptions, StoreWriter};

/// When a set writer closes a shard and starts the next one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sharding {
    /// Records per shard (the last shard may hold fewer).
    pub records: Option<u64>,
    /// Payload bytes per shard: a shard takes records while its `data.zr`
    /// is below this size, and an append is split so that no shard passes
    /// it by more than one record's frame (at least one record a shard).
    pub bytes: Option<u64>,
}

/// How [`DatasetWriter::create`] builds.
#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Codec of every store.
    pub codec: Codec,
    /// Dictionary, for [`Codec::ZstdDict`].
    pub dict: Option<Vec<u8>>,
    /// `None`: one plain store. `Some`: a store set.
    pub sharding: Option<Sharding>,
    /// Content checksums (see [`CreateOptions::checksums`]).
    pub checksums: bool,
    /// zstd level of every store's frames, `None` for the codec's default
    /// (see [`CreateOptions::level`]).
    pub level: Option<i32>,
    /// Object-storage settings (see [`crate::remote`]).
    pub storage: StorageOptions,
}

/// Environment variable naming where object-storage writes are staged
/// (default: the system's temporary directory).
pub const STAGING_ENV: &str = "LOADERX_STAGING_DIR";

enum Target {
    Local(PathBuf),
    Remote {
        root: Remote,
        staging: tempfile::TempDir,
    },
}

/// Name of shard `k` of a set.
fn shard_name(k: usize) -> String {
    format!("shard-{k:06}")
}

/// Writer of a store or a store set. Appends are serialised by `&mut self`.
pub struct DatasetWriter {
    target: Target,
    location: String,
    schema: Schema,
    codec: Codec,
    dict: Option<Vec<u8>>,
    sharding: Option<Sharding>,
    checksums: bool,
    level: Option<i32>,
    /// The store being written, and its name in the set ("" for a plain store).
    current: Option<(String, StoreWriter)>,
    shards: Vec<ShardEntry>,
    closed: bool,
}

impl std::fmt::Debug for DatasetWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatasetWriter")
            .field("location", &self.location)
            .field("schema", &self.schema)
            .field("codec", &self.codec)
            .field("sharding", &self.sharding)
            .field("shards", &self.shards.len())
            .field("closed", &self.closed)
            .finish()
    }
}

/// Refuses a root that already holds something (a new or empty directory is fine).
fn claim_local_root(root: &Path) -> Result<bool> {
    match std::fs::read_dir(root) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(Error::AlreadyExists(format!(
                    "{} is not empty; build the new store at a new path",
                    root.display()
                )));
            }
            Ok(false)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(root)
                .map_err(|e| Error::io(format!("creating directory {}", root.display()), e))?;
            Ok(true)
        }
        Err(e) if root.exists() && !root.is_dir() => {
            let _ = e;
            Err(Error::AlreadyExists(format!(
                "{} exists and is not a directory",
                root.display()
            )))
        }
        Err(e) => Err(Error::io(format!("listing {}", root.display()), e)),
    }
}

/// Flushes a committed local store's files and directory entry.
fn sync_store(dir: &Path) -> Result<()> {
    for name in [DATA_FILE, DICT_FILE, SUMS_FILE, META_FILE] {
        let path = dir.join(name);
        match std::fs::File::open(&path) {
            Ok(f) => f
                .sync_all()
                .map_err(|e| Error::io(format!("syncing {}", path.display()), e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(format!("opening {}", path.display()), e)),
        }
    }
    io::sync_dir(dir)
}

/// Uploads the committed store staged at `dir` to `to`, in commit order
/// (`meta.zr`, which makes it a store, last).
async fn upload_store(dir: &Path, to: &Remote) -> Result<()> {
    to.upload_file(DATA_FILE, &dir.join(DATA_FILE)).await?;
    for extra in [DICT_FILE, SUMS_FILE] {
        if dir.join(extra).exists() {
            to.upload_file(extra, &dir.join(extra)).await?;
        }
    }
    to.upload_file(META_FILE, &dir.join(META_FILE)).await
}

/// Publishes `manifest` at the root of a local set: a temporary file renamed
/// into place, so readers see all of it or none.
fn write_local_manifest(root: &Path, manifest: &Manifest, durable: bool) -> Result<()> {
    let tmp = root.join(format!(".{MANIFEST_FILE}.{}.tmp", std::process::id()));
    let path = root.join(MANIFEST_FILE);
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&manifest.to_json())?;
        if durable {
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &path)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(format!("writing {}", path.display()), e)
    })?;
    if durable {
        io::sync_dir(root)?;
    }
    Ok(())
}

/// Writes the manifest of a set whose shards `shards` are committed under
/// `location` (local or remote), then opens the set as a reader would and
/// removes the manifest again if any shard is missing or disagrees with its
/// entry (such a set never opens: readers make the same checks). This is the
/// last step of a distributed build, where independent tasks wrote the
/// shards (see [`write_shard`]).
pub fn commit_set(
    location: &str,
    schema: &Schema,
    codec: Codec,
    shards: Vec<ShardEntry>,
    storage: &StorageOptions,
) -> Result<Manifest> {
    let manifest = Manifest::new(schema, codec, shards);
    // Round-trips through the parser: the same checks a reader applies.
    let manifest = Manifest::parse(&manifest.to_json(), location)?;
    let staged_json = manifest.to_json();
    if remote::is_url(location) {
        let root = Remote::parse(location, storage)?;
        remote::block_on(root.put(MANIFEST_FILE, staged_json.into()))??;
    } else {
        write_local_manifest(&remote::local_path(location)?, &manifest, true)?;
    }
    // Open what was published, so a shard that is missing or disagrees is
    // reported now, to the builder, rather than to the first reader.
    let kind = schema.kind();
    if let Err(e) = crate::store::StoreReader::open_location(
        location,
        kind,
        crate::store::DataAccess::Read,
        storage,
    ) {
        // Unpublish: a set whose manifest names a bad shard must not open.
        if remote::is_url(location) {
            let root = Remote::parse(location, storage)?;
            let _ = remote::block_on(root.delete(MANIFEST_FILE));
        } else {
            let _ = std::fs::remove_file(remote::local_path(location)?.join(MANIFEST_FILE));
        }
        return Err(e);
    }
    Ok(manifest)
}

/// Copies the committed local store or store set at `local` to the empty
/// object-storage prefix `url`, in commit order (each store's `meta.zr`
/// last; a set's manifest after all its shards), after checking it opens.
pub fn upload(local: &Path, url: &str, storage: &StorageOptions) -> Result<()> {
    if !remote::is_url(url) {
        return Err(Error::InvalidArgument(format!(
            "{url:?} is not an object-storage URL"
        )));
    }
    // Only what opens is published: the same checks a reader makes.
    let read = crate::store::ReadOptions {
        access: crate::store::DataAccess::Read,
        verify_checksums: false,
        storage: storage.clone(),
    };
    let probe = crate::store::StoreReader::probe_kind(&local.display().to_string(), &read)?.1;
    let shards: Vec<String> = probe
        .manifest()
        .map(|m| m.shards.iter().map(|s| s.path.clone()).collect())
        .unwrap_or_default();
    drop(probe);
    let root = Remote::parse(url, storage)?;
    remote::block_on(async {
        if !root.is_empty().await? {
            return Err(Error::AlreadyExists(format!(
                "{} is not empty; upload to a new prefix",
                root.url()
            )));
        }
        if shards.is_empty() {
            return upload_store(local, &root).await;
        }
        for shard in &shards {
            upload_store(&local.join(shard), &root.child(shard)).await?;
        }
        root.upload_file(MANIFEST_FILE, &local.join(MANIFEST_FILE))
            .await
    })?
}

/// Writes one shard of a set being built by independent tasks: a plain
/// store at `location/name`, holding `fill`'s appends, committed (and
/// uploaded) before this returns. Hand the entries to [`commit_set`].
pub fn write_shard(
    location: &str,
    name: &str,
    schema: Schema,
    codec: Codec,
    dict: Option<Vec<u8>>,
    storage: &StorageOptions,
    fill: impl FnOnce(&mut StoreWriter) -> Result<()>,
) -> Result<ShardEntry> {
    let at = format!("{}/{}", location.trim_end_matches('/'), name);
    let mut writer = DatasetWriter::create(
        &at,
        schema,
        WriteOptions {
            codec,
            dict,
            sharding: None,
            checksums: true,
            level: None,
            storage: storage.clone(),
        },
    )?;
    let (_, store) = writer.current.as_mut().expect("open until closed");
    fill(store)?;
    let (records, bytes) = (store.len(), store.payload_bytes());
    writer.close(false)?;
    Ok(ShardEntry::new(name, records, bytes))
}

impl DatasetWriter {
    /// Creates a store (or, with `options.sharding`, a store set) at
    /// `location`, a local path or an object-storage URL, which must not
    /// exist or be empty.
    pub fn create(location: &str, schema: Schema, options: WriteOptions) -> Result<Self> {
        let WriteOptions {
            codec,
            dict,
            sharding,
            checksums,
            level,
            storage,
        } = options;
        // Refused before anything is made, locally or remotely.
        crate::codec::resolve_level(codec, level)?;
        if let Some(s) = &sharding {
            if s.records == Some(0) || s.bytes == Some(0) {
                return Err(Error::InvalidArgument(
                    "shard_records and shard_bytes must be positive".into(),
                ));
            }
            if s.records.is_none() && s.bytes.is_none() {
                return Err(Error::InvalidArgument(
                    "a store set needs shard_records or shard_bytes".into(),
                ));
            }
        }
        let first = if sharding.is_some() {
            shard_name(0)
        } else {
            String::new()
        };
        let (target, shown) = if remote::is_url(location) {
            let root = Remote::parse(location, &storage)?;
            if !remote::block_on(root.is_empty())?? {
                return Err(Error::AlreadyExists(format!(
                    "{} is not empty; build the new store at a new prefix",
                    root.url()
                )));
            }
            let base = std::env::var_os(STAGING_ENV)
                .map(PathBuf::from)
                .unwrap_or_else(std::env::temp_dir);
            let staging = tempfile::Builder::new()
                .prefix("loaderx-upload-")
                .tempdir_in(&base)
                .map_err(|e| {
                    Error::io(
                        format!("creating a staging folder in {}", base.display()),
                        e,
                    )
                })?;
            let shown = root.url().to_string();
            (Target::Remote { root, staging }, shown)
        } else {
            let path = remote::local_path(location)?;
            (Target::Local(path.clone()), path.display().to_string())
        };
        let mut writer = DatasetWriter {
            target,
            location: shown,
            schema,
            codec,
            dict,
            sharding,
            checksums,
            level,
            current: None,
            shards: Vec::new(),
            closed: false,
        };
        // A local set claims its root first; a failed first shard takes the
        // root back with it, so a retry at the same path starts clean.
        let made_root = match (&writer.target, writer.sharding.is_some()) {
            (Target::Local(root), true) => Some(claim_local_root(root)?),
            _ => None,
        };
        if let Err(e) = writer.start(first) {
            if let (Target::Local(root), Some(true)) = (&writer.target, made_root) {
                let _ = std::fs::remove_dir_all(root);
            }
            return Err(e);
        }
        Ok(writer)
    }

    /// Where the store being written lives on local disk.
    fn local_dir(&self, name: &str) -> PathBuf {
        let base = match &self.target {
            Target::Local(root) => root.as_path(),
            Target::Remote { staging, .. } => staging.path(),
        };
        match (name.is_empty(), &self.target) {
            (true, Target::Local(_)) => base.to_path_buf(),
            (true, Target::Remote { .. }) => base.join("store"),
            (false, _) => base.join(name),
        }
    }

    fn start(&mut self, name: String) -> Result<()> {
        let dir = self.local_dir(&name);
        let store = StoreWriter::create(
            &dir,
            self.schema.clone(),
            CreateOptions {
                codec: self.codec,
                dict: self.dict.clone(),
                checksums: self.checksums,
                level: self.level,
            },
        )?;
        self.current = Some((name, store));
        Ok(())
    }

    /// The path or URL being written (URLs without credentials).
    pub fn location(&self) -> &str {
        &self.location
    }

    /// The schema of every record.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    /// The codec of every store.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// Whether the stores carry a dictionary.
    pub fn has_dict(&self) -> bool {
        self.dict.is_some()
    }

    /// Whether [`close`](Self::close) has completed.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Shards committed so far (a plain store has none until closed).
    pub fn shards(&self) -> &[ShardEntry] {
        &self.shards
    }

    /// Records appended so far.
    pub fn len(&self) -> u64 {
        let done: u64 = self.shards.iter().map(|s| s.records).sum();
        done + self.current.as_ref().map_or(0, |(_, w)| w.len())
    }

    /// Whether nothing has been appended.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn open_store(&mut self) -> Result<&mut StoreWriter> {
        if self.closed {
            return Err(Error::State("the writer is closed".into()));
        }
        match &mut self.current {
            Some((_, w)) => Ok(w),
            None => Err(Error::State("the writer is closed".into())),
        }
    }

    /// How many of `n` records of `bytes(k)` total logical bytes the
    /// current shard takes before it is full (at least one).
    fn room(&self, n: usize, bytes: impl Fn(usize) -> u64) -> usize {
        let Some(s) = self.sharding else { return n };
        let (_, w) = self.current.as_ref().expect("open");
        let mut k = n;
        if let Some(r) = s.records {
            k = k.min(r.saturating_sub(w.len()) as usize);
        }
        if let Some(b) = s.bytes {
            // Logical bytes bound the frames (a frame is at most a few bytes
            // over its record), so a shard fills up in a few steps.
            let room = b.saturating_sub(w.payload_bytes());
            let (mut lo, mut hi) = (0usize, k);
            while lo < hi {
                let mid = (lo + hi).div_ceil(2);
                if bytes(mid) <= room {
                    lo = mid;
                } else {
                    hi = mid - 1;
                }
            }
            k = lo;
        }
        k.max(1)
    }

    /// Starts the next shard when the current one is full.
    fn roll_if_full(&mut self) -> Result<()> {
        let Some(s) = self.sharding else {
            return Ok(());
        };
        let (_, w) = self.current.as_ref().expect("open");
        let full = s.records.is_some_and(|r| w.len() >= r)
            || s.bytes.is_some_and(|b| w.payload_bytes() >= b);
        if full {
            self.finish_current(false)?;
            self.start(shard_name(self.shards.len()))?;
        }
        Ok(())
    }

    /// Appends Dense records (whole records of the schema's width, back to
    /// back). In a set, an append split over shards keeps the parts written
    /// before a failure.
    pub fn append_dense(&mut self, data: &[u8]) -> Result<()> {
        self.open_store()?;
        if self.sharding.is_none() || data.is_empty() {
            return self.open_store()?.append_dense(data);
        }
        let width = self
            .schema
            .record_width()
            .ok_or_else(|| Error::State("append_dense on a Ragged store".into()))?
            as usize;
        if !data.len().is_multiple_of(width) {
            return Err(Error::InvalidArgument(format!(
                "{} bytes are not a whole number of {width}-byte records",
                data.len()
            )));
        }
        let mut rest = data;
        while !rest.is_empty() {
            self.roll_if_full()?;
            let k = self.room(rest.len() / width, |k| (k * width) as u64);
            let (now, later) = rest.split_at(k * width);
            self.open_store()?.append_dense(now)?;
            rest = later;
        }
        Ok(())
    }

    /// Appends Ragged records (all validated before any is written, per shard part).
    pub fn append_ragged(&mut self, records: &[RaggedRecord<'_>]) -> Result<()> {
        self.open_store()?;
        if self.sharding.is_none() || records.is_empty() {
            return self.open_store()?.append_ragged(records);
        }
        // Validate everything first, so a bad record fails the whole call.
        let itemsize = self.schema.dtype().itemsize();
        for (i, r) in records.iter().enumerate() {
            r.validate(i, itemsize)?;
        }
        let mut prefix = Vec::with_capacity(records.len() + 1);
        prefix.push(0u64);
        for r in records {
            prefix.push(prefix.last().unwrap() + r.encoded_len());
        }
        let mut at = 0usize;
        while at < records.len() {
            self.roll_if_full()?;
            let k = self.room(records.len() - at, |k| prefix[at + k] - prefix[at]);
            self.open_store()?.append_ragged(&records[at..at + k])?;
            at += k;
        }
        Ok(())
    }

    /// Commits the current store: closes it, uploads it when remote, and
    /// records its entry. Safe to call again after a failed upload.
    fn finish_current(&mut self, durable: bool) -> Result<()> {
        let Some((name, w)) = self.current.as_mut() else {
            return Ok(());
        };
        w.close(durable)?;
        let entry = ShardEntry::new(name.clone(), w.len(), w.payload_bytes());
        let dir = w.path().to_path_buf();
        if let Target::Remote { root, .. } = &self.target {
            let to = if name.is_empty() {
                root.clone()
            } else {
                root.child(name)
            };
            remote::block_on(upload_store(&dir, &to))??;
            // The staged copy is no longer needed: free the disk for the next shard.
            let _ = std::fs::remove_dir_all(&dir);
        }
        self.current = None;
        self.shards.push(entry);
        Ok(())
    }

    /// Commits everything: the last store, then (for a set) the manifest.
    /// `durable` flushes every local file to stable storage first. A failed
    /// close may be retried; closing twice is harmless.
    pub fn close(&mut self, durable: bool) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        if self.sharding.is_none() {
            self.finish_current(durable)?;
            self.closed = true;
            return Ok(());
        }
        // A set's trailing shard that got no record is dropped (unless it is
        // the only one: an empty set is one empty shard).
        let trailing_empty = self
            .current
            .as_ref()
            .is_some_and(|(_, w)| w.is_empty() && !self.shards.is_empty());
        if trailing_empty {
            let (_, mut w) = self.current.take().expect("checked");
            w.close(false)?;
            let dir = w.path().to_path_buf();
            drop(w);
            std::fs::remove_dir_all(&dir)
                .map_err(|e| Error::io(format!("removing the empty shard {}", dir.display()), e))?;
        } else {
            self.finish_current(durable)?;
        }
        let manifest = Manifest::new(&self.schema, self.codec, self.shards.clone());
        match &self.target {
            Target::Local(root) => {
                if durable {
                    for s in &self.shards {
                        sync_store(&root.join(&s.path))?;
                    }
                }
                write_local_manifest(root, &manifest, durable)?;
            }
            Target::Remote { root, .. } => {
                remote::block_on(root.put(MANIFEST_FILE, manifest.to_json().into()))??;
            }
        }
        self.closed = true;
        Ok(())
    }
}
