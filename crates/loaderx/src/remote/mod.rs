//! Object storage: where the engine reaches stores that are not local files.
//!
//! Every remote read and write goes through the [`object_store`] crate (the
//! client delta-rs, DataFusion and polars use), on one small process-wide
//! tokio runtime. Callers stay synchronous: they block on the runtime with
//! the GIL already released by the binding.
//!
//! Configuration follows that ecosystem: the standard environment variables
//! (`AWS_*`, `GOOGLE_*`, `AZURE_*`) first, then the caller's
//! [`StorageOptions`], whose keys are the object_store builders' own
//! (`aws_endpoint`, `aws_access_key_id`, `timeout`, ...), plus the loaderx
//! keys in [`Tuning`]. Credentials live only inside the client: they never
//! appear in an error, a log line or a `Debug` output.
//!
//! After `fork` the child has none of the parent's runtime threads, and the
//! client's pooled connections belong to that dead runtime; both are made
//! anew in a child on first use, as the worker [`pool`](crate::pool) is.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::http::HttpBuilder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, GetOptions, GetRange, ObjectStore, ObjectStoreExt, PutPayload,
    RetryConfig, WriteMultipart,
};
use url::Url;

use crate::error::{Error, Result};

mod cache;

use cache::BlockCache;
pub use cache::{CACHE_DIR_ENV, CACHE_LIMIT_ENV, DEFAULT_CACHE_BLOCK, DEFAULT_CACHE_LIMIT};

/// Per-call settings of remote access: object_store builder keys and the
/// loaderx keys of [`Tuning`].
pub type StorageOptions = BTreeMap<String, String>;

/// What loaderx itself reads from [`StorageOptions`] (these keys are not
/// passed on to object_store).
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning {
    /// Most requests a gather keeps in flight at once (`max_in_flight`).
    pub max_in_flight: usize,
    /// Records whose byte ranges lie at most this far apart may be fetched
    /// in one request (`coalesce_bytes`), as long as the merged request
    /// reads no more unneeded bytes than needed ones.
    pub coalesce_bytes: u64,
    /// Largest merged request (`max_request_bytes`); larger merges are split
    /// so their parts download in parallel. A single record is never split.
    pub max_request_bytes: u64,
    /// Retries of a transient failure before it is reported (`max_retries`).
    pub max_retries: usize,
    /// Time after which a failing request stops being retried, in seconds
    /// (`retry_timeout`).
    pub retry_timeout: Duration,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning {
            max_in_flight: 128,
            coalesce_bytes: 1 << 20,
            max_request_bytes: 16 << 20,
            max_retries: 4,
            retry_timeout: Duration::from_secs(20),
        }
    }
}

const TUNING_KEYS: [&str; 8] = [
    "cache_dir",
    "cache_limit",
    "cache_block_bytes",
    "max_in_flight",
    "coalesce_bytes",
    "max_request_bytes",
    "max_retries",
    "retry_timeout",
];

impl Tuning {
    fn from_options(options: &StorageOptions) -> Result<Tuning> {
        let mut t = Tuning::default();
        let num = |key: &str| -> Result<Option<u64>> {
            options
                .get(key)
                .map(|v| {
                    v.trim().parse::<u64>().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "storage option {key:?} must be a non-negative integer, got {v:?}"
                        ))
                    })
                })
                .transpose()
        };
        if let Some(n) = num("max_in_flight")? {
            t.max_in_flight = (n as usize).max(1);
        }
        if let Some(n) = num("coalesce_bytes")? {
            t.coalesce_bytes = n;
        }
        if let Some(n) = num("max_request_bytes")? {
            t.max_request_bytes = n.max(1);
        }
        if let Some(n) = num("max_retries")? {
            t.max_retries = n as usize;
        }
        if let Some(v) = options.get("retry_timeout") {
            let secs: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "storage option \"retry_timeout\" must be a number of seconds, got {v:?}"
                    ))
                })?;
            t.retry_timeout = Duration::from_secs_f64(secs);
        }
        Ok(t)
    }
}

/// Requests made and bytes received by this process's remote reads, for
/// benchmarks and tests (monotonic counters).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Read requests sent (metadata and ranges; retries not counted).
    pub requests: u64,
    /// Payload bytes received by those requests.
    pub bytes: u64,
}

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// The process's remote read counters so far.
pub fn stats() -> Stats {
    Stats {
        requests: REQUESTS.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

fn count(bytes: usize) {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Whether `path` names object storage (`scheme://...`) rather than a local
/// path. `file://` URLs are local.
pub fn is_url(path: &str) -> bool {
    match path.split_once("://") {
        Some((scheme, _)) => {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-')
                && scheme != "file"
        }
        None => false,
    }
}

/// The local path of a `file://` URL, or `path` itself.
pub fn local_path(path: &str) -> Result<std::path::PathBuf> {
    match path.strip_prefix("file://") {
        Some(_) => Url::parse(path)
            .ok()
            .and_then(|u| u.to_file_path().ok())
            .ok_or_else(|| Error::InvalidArgument(format!("{path:?} is not a usable file:// URL"))),
        None => Ok(std::path::PathBuf::from(path)),
    }
}

/// The process-wide runtime of remote I/O, remade in a forked child.
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

fn runtime() -> Result<&'static tokio::runtime::Runtime> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((owner, rt)) = *slot {
        if owner == pid {
            return Ok(rt);
        }
    }
    // Requests wait on the network, not the CPU: two threads keep dozens of
    // them in flight. Decoding runs on the worker pool.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("loaderx-io")
        .enable_all()
        .build()
        .map_err(|e| Error::io("starting the object-storage runtime", e))?;
    // Lives for the rest of the process; a parent's runtime is left behind
    // in a forked child, whose copy of it has no threads.
    let rt: &'static tokio::runtime::Runtime = Box::leak(Box::new(rt));
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Runs `fut` to completion on the I/O runtime, blocking the caller.
pub(crate) fn block_on<F: std::future::Future>(fut: F) -> Result<F::Output> {
    let rt = runtime()?;
    if tokio::runtime::Handle::try_current().is_ok() {
        // Blocking inside a runtime would panic (and could deadlock it).
        return Err(Error::State(
            "loaderx storage calls are blocking; call them from a thread outside any \
             tokio runtime (e.g. asyncio's run_in_executor)"
                .into(),
        ));
    }
    Ok(rt.block_on(fut))
}

/// Spawns `fut` on the I/O runtime.
pub(crate) fn spawn<F>(fut: F) -> Result<tokio::task::JoinHandle<F::Output>>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    Ok(runtime()?.spawn(fut))
}

/// `url` with any user:password removed, for messages.
fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if !shown.username().is_empty() || shown.password().is_some() {
        let _ = shown.set_username("");
        let _ = shown.set_password(None);
    }
    shown.set_query(None);
    shown.to_string().trim_end_matches('/').to_string()
}

/// How to build a client: scheme, root URL, options. Cloned per child
/// location; the client itself is shared.
struct ClientCell {
    /// `scheme://authority` the client is built for.
    base: Url,
    options: StorageOptions,
    tuning: Tuning,
    cache: Option<BlockCache>,
    client: Mutex<Option<(u32, Arc<dyn ObjectStore>)>>,
}

impl ClientCell {
    fn build(&self) -> Result<Arc<dyn ObjectStore>> {
        // Precedence: loaderx's defaults, then the environment, then the
        // caller's options (the order object_store's `from_env` +
        // `with_config` give, with our defaults underneath).
        let defaults = ClientOptions::new()
            .with_connect_timeout(Duration::from_secs(5))
            .with_timeout(Duration::from_secs(60));
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: self.tuning.max_retries,
            retry_timeout: self.tuning.retry_timeout,
        };
        let url = self.base.as_str();
        let options: Vec<(&String, &String)> = self
            .options
            .iter()
            .filter(|(k, _)| !TUNING_KEYS.contains(&k.as_str()))
            .collect();
        let from_env = |prefix: Option<&str>| -> Vec<(String, String)> {
            let Some(prefix) = prefix else {
                return Vec::new();
            };
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
                .filter(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.to_ascii_lowercase(), v))
                .collect()
        };
        // One builder type per scheme, configured the same way.
        macro_rules! configure {
            ($builder:expr, $client:expr, $env:expr, $what:expr) => {{
                let mut b = $builder
                    .with_url(url)
                    .with_client_options($client)
                    .with_retry(retry.clone());
                for (k, v) in from_env($env) {
                    // Unrelated variables sharing the prefix are not ours to refuse.
                    if let Ok(key) = k.parse() {
                        b = b.with_config(key, v);
                    }
                }
                for (k, v) in &options {
                    let key = k.to_ascii_lowercase().parse().map_err(|_| {
                        Error::InvalidArgument(format!(
                            "storage option {k:?} is not one of the {} settings",
                            $what
                        ))
                    })?;
                    b = b.with_config(key, v.as_str());
                }
                b.build().map(|s| Arc::new(s) as Arc<dyn ObjectStore>)
            }};
        }
        let built = match self.base.scheme() {
            "s3" | "s3a" => configure!(AmazonS3Builder::new(), defaults, Some("AWS_"), "S3"),
            "gs" => configure!(
                GoogleCloudStorageBuilder::new(),
                defaults,
                Some("GOOGLE_"),
                "GCS"
            ),
            "az" | "azure" | "abfs" | "abfss" | "adl" => {
                configure!(
                    MicrosoftAzureBuilder::new(),
                    defaults,
                    Some("AZURE_"),
                    "Azure"
                )
            }
            // Plain http:// is what the user asked for by writing it.
            "http" | "https" => {
                configure!(
                    HttpBuilder::new(),
                    defaults.with_allow_http(true),
                    None,
                    "HTTP"
                )
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported URL scheme {other:?}: expected s3://, gs://, az://, \
                     http(s):// or file://"
                )))
            }
        };
        built.map_err(|e| {
            Error::InvalidArgument(format!(
                "cannot configure object storage for {}: {e}",
                redact(&self.base)
            ))
        })
    }

    fn client(&self) -> Result<Arc<dyn ObjectStore>> {
        let pid = std::process::id();
        let mut slot = self.client.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((owner, client)) = &*slot {
            if *owner == pid {
                return Ok(client.clone());
            }
        }
        let client = self.build()?;
        *slot = Some((pid, client.clone()));
        Ok(client)
    }
}

/// A folder (prefix) in object storage: a store, a set, or a shard of one.
#[derive(Clone)]
pub struct Remote {
    cell: Arc<ClientCell>,
    /// Object key prefix of this folder (no trailing slash).
    prefix: ObjectPath,
    /// The folder's URL, credentials removed, for messages.
    shown: String,
}

impl std::fmt::Debug for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Remote").field(&self.shown).finish()
    }
}

impl Remote {
    /// Parses a store URL. Nothing is contacted until the first request.
    pub fn parse(url: &str, options: &StorageOptions) -> Result<Remote> {
        let parsed = Url::parse(url)
            .map_err(|e| Error::InvalidArgument(format!("{url:?} is not a valid URL: {e}")))?;
        let tuning = Tuning::from_options(options)?;
        let (base, prefix) = match parsed.scheme() {
            // The bucket (or container) is the authority; the key is the path.
            "s3" | "s3a" | "gs" | "az" | "azure" | "abfs" | "abfss" | "adl" => {
                if parsed.host_str().is_none_or(str::is_empty) {
                    return Err(Error::InvalidArgument(format!(
                        "{} names no bucket",
                        redact(&parsed)
                    )));
                }
                let mut base = parsed.clone();
                base.set_path("");
                base.set_query(None);
                (base, parsed.path().to_string())
            }
            // An HTTP store is rooted at the server; the path is the key.
            "http" | "https" => {
                let mut base = parsed.clone();
                base.set_path("");
                base.set_query(None);
                (base, parsed.path().to_string())
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "unsupported URL scheme {other:?} in {}: expected s3://, gs://, az://, \
                     http(s):// or file://",
                    redact(&parsed)
                )))
            }
        };
        let prefix = ObjectPath::parse(prefix.trim_matches('/')).map_err(|e| {
            Error::InvalidArgument(format!(
                "{} is not a usable object key: {e}",
                redact(&parsed)
            ))
        })?;
        Ok(Remote {
            cell: Arc::new(ClientCell {
                base,
                options: options.clone(),
                tuning,
                cache: BlockCache::from_options(options)?,
                client: Mutex::new(None),
            }),
            shown: redact(&parsed),
            prefix,
        })
    }

    /// The subfolder `name` (one or more `/`-separated parts).
    pub fn child(&self, name: &str) -> Remote {
        let mut prefix = self.prefix.clone();
        for part in name.split('/').filter(|p| !p.is_empty()) {
            prefix = prefix.clone().join(part);
        }
        Remote {
            cell: self.cell.clone(),
            prefix,
            shown: format!("{}/{}", self.shown, name.trim_matches('/')),
        }
    }

    /// The folder's URL, without credentials.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// The loaderx tuning of this location.
    pub fn tuning(&self) -> &Tuning {
        &self.cell.tuning
    }

    fn key(&self, name: &str) -> ObjectPath {
        self.prefix.clone().join(name)
    }

    fn shown(&self, name: &str) -> String {
        format!("{}/{}", self.shown, name)
    }

    /// Metadata of object `name`; `Ok(None)` when it does not exist.
    pub(crate) async fn head(&self, name: &str) -> Result<Option<ObjectInfo>> {
        let client = self.cell.client()?;
        count(0);
        match client.head(&self.key(name)).await {
            Ok(meta) => Ok(Some(ObjectInfo {
                size: meta.size,
                etag: meta.e_tag,
            })),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("reading the metadata of", name, e)),
        }
    }

    /// The whole object `name`, with its metadata; `Ok(None)` when it does not exist.
    pub(crate) async fn get_all(&self, name: &str) -> Result<Option<(Bytes, ObjectInfo)>> {
        let client = self.cell.client()?;
        let got = match client
            .get_opts(&self.key(name), GetOptions::default())
            .await
        {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.error("reading", name, e)),
        };
        let info = ObjectInfo {
            size: got.meta.size,
            etag: got.meta.e_tag.clone(),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.error("reading", name, e))?;
        count(bytes.len());
        if bytes.len() as u64 != info.size {
            return Err(Error::Remote(format!(
                "{}: received {} bytes of a {}-byte object",
                self.shown(name),
                bytes.len(),
                info.size
            )));
        }
        Ok(Some((bytes, info)))
    }

    /// Bytes `range` of object `name`, checked to come from the version
    /// `expect` describes (same ETag, when the server gives one).
    pub(crate) async fn get_range(
        &self,
        name: &str,
        range: Range<u64>,
        expect: Option<&ObjectInfo>,
    ) -> Result<(Bytes, ObjectInfo)> {
        let client = self.cell.client()?;
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            ..GetOptions::default()
        };
        let got = client
            .get_opts(&self.key(name), options)
            .await
            .map_err(|e| self.error("reading", name, e))?;
        let info = ObjectInfo {
            size: got.meta.size,
            etag: got.meta.e_tag.clone(),
        };
        if let Some(expect) = expect {
            expect.check_same(&info, &self.shown(name))?;
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.error("reading", name, e))?;
        count(bytes.len());
        let want = range.end - range.start;
        if bytes.len() as u64 != want {
            return Err(Error::Remote(format!(
                "{}: asked for bytes {}..{} and received {} bytes (is the object shorter \
                 than its store says?)",
                self.shown(name),
                range.start,
                range.end,
                bytes.len()
            )));
        }
        Ok((bytes, info))
    }

    /// Bytes `range` of object `name`, whose version at open was `expect`:
    /// from the local block cache where configured (fetching and caching the
    /// blocks it lacks), else straight from the server.
    pub(crate) async fn read_range(
        &self,
        name: &str,
        range: Range<u64>,
        expect: &ObjectInfo,
    ) -> Result<Bytes> {
        let Some(cache) = &self.cell.cache else {
            return Ok(self.get_range(name, range, Some(expect)).await?.0);
        };
        let url = self.shown(name);
        let key = format!(
            "{url}\0{}\0{}",
            expect.size,
            expect.etag.as_deref().unwrap_or("")
        );
        let Ok(dir) = cache.object_dir(&key) else {
            // An unusable cache folder must not fail the read.
            return Ok(self.get_range(name, range, Some(expect)).await?.0);
        };
        let b = cache.block();
        let first = range.start / b;
        let last = (range.end.max(range.start + 1) - 1) / b;
        let mut blocks: Vec<Option<Bytes>> = (first..=last).map(|i| cache.get(&dir, i)).collect();
        // Missing blocks, fetched a run of neighbours per request.
        let mut i = 0;
        while i < blocks.len() {
            if blocks[i].is_some() {
                i += 1;
                continue;
            }
            let mut j = i;
            while j + 1 < blocks.len() && blocks[j + 1].is_none() {
                j += 1;
            }
            let start = (first + i as u64) * b;
            let end = ((first + j as u64 + 1) * b).min(expect.size);
            let (bytes, _) = self.get_range(name, start..end, Some(expect)).await?;
            for (n, slot) in blocks[i..=j].iter_mut().enumerate() {
                let at = n * b as usize;
                let block = bytes.slice(at..(at + b as usize).min(bytes.len()));
                cache.put(&dir, first + (i + n) as u64, &block);
                *slot = Some(block);
            }
            i = j + 1;
        }
        let mut out = Vec::with_capacity((range.end - range.start) as usize);
        for (k, block) in blocks.into_iter().enumerate() {
            let block = block.expect("every block fetched");
            let base = (first + k as u64) * b;
            let from = range.start.saturating_sub(base) as usize;
            let to = ((range.end - base) as usize).min(block.len());
            if from > to {
                return Err(Error::Remote(format!(
                    "{url}: cached block {} is shorter than the object says",
                    first + k as u64
                )));
            }
            out.extend_from_slice(&block[from..to]);
        }
        if out.len() as u64 != range.end - range.start {
            return Err(Error::Remote(format!(
                "{url}: bytes {}..{} are past the end of the cached object",
                range.start, range.end
            )));
        }
        Ok(Bytes::from(out))
    }

    /// Stores `bytes` as object `name` in one request.
    pub(crate) async fn put(&self, name: &str, bytes: Bytes) -> Result<()> {
        let client = self.cell.client()?;
        client
            .put(&self.key(name), PutPayload::from_bytes(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.error("writing", name, e))
    }

    /// Uploads the local file `path` as object `name`: one request when
    /// small, a multipart upload otherwise (aborted if any part fails).
    pub(crate) async fn upload_file(&self, name: &str, path: &std::path::Path) -> Result<()> {
        const PART: usize = 16 << 20;
        let local_err = |e| Error::io(format!("reading {} for upload", path.display()), e);
        let size = std::fs::metadata(path).map_err(local_err)?.len();
        if size <= PART as u64 {
            let bytes = std::fs::read(path).map_err(local_err)?;
            return self.put(name, Bytes::from(bytes)).await;
        }
        let client = self.cell.client()?;
        let upload = client
            .put_multipart(&self.key(name))
            .await
            .map_err(|e| self.error("starting the upload of", name, e))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART);
        let mut file = std::fs::File::open(path).map_err(local_err)?;
        let mut buf = vec![0u8; PART];
        loop {
            let n = read_full(&mut file, &mut buf).map_err(local_err)?;
            if n == 0 {
                break;
            }
            // Keeps at most a few parts in memory while they upload.
            writer
                .wait_for_capacity(4)
                .await
                .map_err(|e| self.error("uploading", name, e))?;
            writer.write(&buf[..n]);
        }
        writer
            .finish()
            .await
            .map(|_| ())
            .map_err(|e| self.error("finishing the upload of", name, e))
    }

    /// Deletes object `name` (missing is fine).
    pub(crate) async fn delete(&self, name: &str) -> Result<()> {
        let client = self.cell.client()?;
        match client.delete(&self.key(name)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("deleting", name, e)),
        }
    }

    /// Whether anything at all is stored under this folder.
    pub(crate) async fn is_empty(&self) -> Result<bool> {
        use futures::StreamExt;
        let client = self.cell.client()?;
        let prefix = self.prefix.clone();
        let mut listing = client.list(Some(&prefix));
        match listing.next().await {
            None => Ok(true),
            Some(Ok(_)) => Ok(false),
            Some(Err(e)) => Err(self.error("listing", "", e)),
        }
    }

    /// Turns an object_store error into the engine's, naming the object and
    /// saying what happened without any credential.
    fn error(&self, doing: &str, name: &str, e: object_store::Error) -> Error {
        let url = if name.is_empty() {
            self.shown.clone()
        } else {
            self.shown(name)
        };
        match e {
            object_store::Error::NotFound { .. } => Error::NotFound {
                path: url.into(),
                reason: "no such object (or no such bucket)".into(),
            },
            object_store::Error::PermissionDenied { source, .. }
            | object_store::Error::Unauthenticated { source, .. } => Error::Remote(format!(
                "{doing} {url}: access denied (check the credentials and the bucket): {source}"
            )),
            object_store::Error::Precondition { .. } | object_store::Error::NotModified { .. } => {
                Error::Remote(format!(
                    "{doing} {url}: the object changed while it was being read"
                ))
            }
            other => Error::Remote(format!("{doing} {url}: {other}")),
        }
    }
}

fn read_full(file: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::io::Read;
    let mut done = 0;
    while done < buf.len() {
        match file.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Size and version of a remote object, as seen when a store was opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ObjectInfo {
    pub size: u64,
    pub etag: Option<String>,
}

impl ObjectInfo {
    /// Refuses a response from another version of the object than the one
    /// the store was opened on: its bytes would belong to different records.
    fn check_same(&self, seen: &ObjectInfo, url: &str) -> Result<()> {
        let etag_changed = matches!((&self.etag, &seen.etag), (Some(a), Some(b)) if a != b);
        if etag_changed || seen.size != self.size {
            return Err(Error::Remote(format!(
                "{url} changed after the store was opened (size {} -> {}, ETag {:?} -> {:?}); \
                 reopen the store",
                self.size, seen.size, self.etag, seen.etag
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_local_paths() {
        assert!(is_url("s3://bucket/key"));
        assert!(is_url("https://host/x"));
        assert!(!is_url("file:///tmp/x"));
        assert!(!is_url("/tmp/x"));
        assert!(!is_url("relative/dir"));
        assert!(!is_url("weird:/x"));
        assert_eq!(
            local_path("file:///tmp/a%20b").unwrap(),
            std::path::PathBuf::from("/tmp/a b")
        );
        assert_eq!(local_path("x/y").unwrap(), std::path::PathBuf::from("x/y"));
    }

    #[test]
    fn parse_keeps_credentials_out_of_messages() {
        let r = Remote::parse(
            "https://user:secret@host:8080/a/b/?sig=xyz",
            &StorageOptions::new(),
        )
        .unwrap();
        assert_eq!(r.url(), "https://host:8080/a/b");
        assert!(!format!("{r:?}").contains("secret"));
        let c = r.child("part-1");
        assert_eq!(c.url(), "https://host:8080/a/b/part-1");
        assert_eq!(c.key("meta.zr").as_ref(), "a/b/part-1/meta.zr");
    }

    #[test]
    fn bad_urls_and_options_are_refused() {
        let opts = StorageOptions::new();
        let e = Remote::parse("ftp://h/x", &opts).unwrap_err();
        assert!(
            e.to_string().contains("unsupported URL scheme \"ftp\""),
            "{e}"
        );
        let e = Remote::parse("s3:///key", &opts).unwrap_err();
        assert!(e.to_string().contains("names no bucket"), "{e}");
        let bad: StorageOptions = [("max_in_flight".to_string(), "many".to_string())].into();
        let e = Remote::parse("s3://b/k", &bad).unwrap_err();
        assert!(e
            .to_string()
            .contains("\"max_in_flight\" must be a non-negative integer"));
        let unknown: StorageOptions = [("no_such_key".to_string(), "1".to_string())].into();
        let r = Remote::parse("s3://bucket/k", &unknown).unwrap();
        let e = r.cell.client().map(|_| ()).unwrap_err();
        assert!(
            e.to_string()
                .contains("\"no_such_key\" is not one of the S3 settings"),
            "{e}"
        );
    }

    #[test]
    fn tuning_keys() {
        let opts: StorageOptions = [
            ("max_in_flight", "4"),
            ("coalesce_bytes", "0"),
            ("max_request_bytes", "1024"),
            ("max_retries", "1"),
            ("retry_timeout", "0.5"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let t = Tuning::from_options(&opts).unwrap();
        assert_eq!(
            t,
            Tuning {
                max_in_flight: 4,
                coalesce_bytes: 0,
                max_request_bytes: 1024,
                max_retries: 1,
                retry_timeout: Duration::from_millis(500),
            }
        );
    }
}
