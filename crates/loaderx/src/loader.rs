//! The batch pipeline: sampling and gathering on native threads, delivered
//! in step order through a bounded reorder buffer.
//!
//! A [`Loader`] owns a few producer threads. Each claims the next step,
//! draws that step's global index batch from the [`Sampler`] (a pure
//! function of the step), keeps its shard's contiguous slice, and gathers
//! every source at those indices (each gather fanning out over the shared
//! [`pool`](crate::pool)). Finished batches wait in a reorder buffer and are
//! handed out strictly in step order, so the delivered sequence depends only
//! on the sources, the sampler parameters and the start step, never on
//! thread timing.
//!
//! Memory is bounded by `prefetch` slots. A claimed, undelivered step takes
//! one, and so does the batch the consumer was given last, until it asks
//! for the next one: by then a consumer is usually done with it, but a
//! Python `for` loop still holds it while the call runs (the loop variable
//! is rebound only afterwards). Counting it keeps a consumer's loop at
//! `prefetch + 1` batches alive at the peak, not `prefetch + 2`. With
//! `prefetch` 1 the loader still works one step ahead.
//!
//! ```
//! use std::sync::Arc;
//! use loaderx::loader::{Column, Loader, LoaderConfig, Source};
//! use loaderx::sampler::Mode;
//! use loaderx::store::{DenseReader, DenseWriter};
//! use loaderx::{Codec, DType};
//!
//! let dir = std::env::temp_dir().join(format!("loaderx-loader-doc-{}", std::process::id()));
//! let _ = std::fs::remove_dir_all(&dir);
//! let mut w = DenseWriter::create(&dir, DType::parse("|u1")?, &[4], Codec::Zstd, None)?;
//! w.append(&(0u8..40).collect::<Vec<u8>>())?; // 10 records of 4 bytes: record i is 4i..4i+4
//! w.close()?;
//!
//! let source: Arc<dyn Source> = Arc::new(DenseReader::open(&dir)?);
//! let config = LoaderConfig { batch_size: 5, mode: Mode::Sequential, ..LoaderConfig::default() };
//! let mut loader = Loader::new(vec![source], config)?;
//! let batch = loader.next().expect("endless")?;
//! assert_eq!(batch.step, 0);
//! assert_eq!(batch.indices, [0, 1, 2, 3, 4]);
//! match &batch.columns[0] {
//!     Column::Dense(d) => assert_eq!(&d.data[..8], &[0, 1, 2, 3, 4, 5, 6, 7]),
//!     _ => unreachable!(),
//! }
//! let second = loader.next().expect("endless")?;
//! assert_eq!(second.indices, [5, 6, 7, 8, 9]);
//! loader.close();
//! # std::fs::remove_dir_all(&dir).unwrap();
//! # Ok::<(), loaderx::Error>(())
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::buffers;
use crate::error::{Error, Result};
use crate::lent::{BatchBytes, LentPool};
use crate::sampler::{Mode, Sampler};
use crate::shape;
use crate::store::{DenseReader, PackedBatch, RaggedBatch, RaggedReader, StoreReader};

/// The Dense part of a batch: `rows` records of `width` bytes, back to back.
#[derive(Debug)]
pub struct DenseBatch {
    /// C-order record bytes: an engine buffer, or memory lent through
    /// [`LoaderConfig::lent`].
    pub data: BatchBytes,
    /// Number of records.
    pub rows: usize,
    /// Bytes per record.
    pub width: usize,
}

/// One stream's part of a batch.
#[derive(Debug)]
pub enum Column {
    /// Fixed-shape records, stacked.
    Dense(DenseBatch),
    /// Variable-shape records sharing one buffer.
    Ragged(RaggedBatch),
    /// Variable-shape records packed back to back (see [`Packed`]).
    Packed(PackedBatch),
    /// Records padded to one length (see [`shape::Padded`]).
    Padded(shape::PaddedBatch),
    /// Records packed into fixed rows (see [`shape::RowPacked`]).
    RowPacked(shape::RowPackedBatch),
}

/// Something a loader can gather from: a store reader, typically.
pub trait Source: Send + Sync {
    /// Number of records.
    fn len(&self) -> u64;
    /// Whether the source is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Gathers records `indices`, in order.
    fn gather(&self, indices: &[u64]) -> Result<Column>;
    /// About how many bytes a gather of `rows` records allocates, so a
    /// [`Loader`] can keep that many bytes of batch buffers for reuse
    /// (see [`buffers`]). 0, the default, means unknown.
    fn batch_bytes_hint(&self, rows: usize) -> usize {
        let _ = rows;
        0
    }
    /// Bytes per record when this source gives [`Column::Dense`] batches
    /// and can gather into memory it is handed
    /// ([`gather_dense_into`](Self::gather_dense_into)); `None` otherwise.
    fn dense_width(&self) -> Option<usize> {
        None
    }
    /// Gathers records `indices` into `out` (`indices.len()` times
    /// [`dense_width`](Self::dense_width) bytes). Only called on sources
    /// with a `dense_width`.
    fn gather_dense_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        let _ = (indices, out);
        Err(Error::State(
            "this source cannot gather into lent memory".into(),
        ))
    }
}

impl Source for StoreReader {
    fn len(&self) -> u64 {
        StoreReader::len(self)
    }

    /// Dense stores give [`Column::Dense`], Ragged stores [`Column::Ragged`].
    fn gather(&self, indices: &[u64]) -> Result<Column> {
        match self.schema().record_width() {
            Some(width) => Ok(Column::Dense(DenseBatch {
                data: self.gather_dense(indices)?.into(),
                rows: indices.len(),
                width: width as usize,
            })),
            None => self.gather_ragged(indices).map(Column::Ragged),
        }
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        StoreReader::batch_bytes_hint(self, rows)
    }

    fn dense_width(&self) -> Option<usize> {
        self.schema().record_width().map(|w| w as usize)
    }

    fn gather_dense_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        match self.schema().record_width() {
            Some(width) => self.gather_fixed(indices, width as usize, out),
            None => Err(Error::State("gather_dense_into on a Ragged store".into())),
        }
    }
}

impl Source for DenseReader {
    fn len(&self) -> u64 {
        DenseReader::len(self)
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        Source::gather(self.inner(), indices)
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        self.inner().batch_bytes_hint(rows)
    }

    fn dense_width(&self) -> Option<usize> {
        Some(self.record_width())
    }

    fn gather_dense_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        self.gather_into(indices, out)
    }
}

impl Source for RaggedReader {
    fn len(&self) -> u64 {
        RaggedReader::len(self)
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        RaggedReader::gather(self, indices).map(Column::Ragged)
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        self.inner().batch_bytes_hint(rows)
    }
}

/// Wraps a Ragged source so its batches come packed back to back
/// ([`Column::Packed`]), the layout variable-length attention kernels take.
pub struct Packed<S>(pub S);

impl<S: Source> Source for Packed<S> {
    fn len(&self) -> u64 {
        self.0.len()
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        match self.0.gather(indices)? {
            Column::Ragged(batch) => batch.into_packed().map(Column::Packed),
            other => Ok(other),
        }
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        self.0.batch_bytes_hint(rows)
    }

    // Packing only changes Ragged batches; a Dense source passes through.
    fn dense_width(&self) -> Option<usize> {
        self.0.dense_width()
    }

    fn gather_dense_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        self.0.gather_dense_into(indices, out)
    }
}

impl<S: Source + ?Sized> Source for Arc<S> {
    fn len(&self) -> u64 {
        (**self).len()
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        (**self).gather(indices)
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        (**self).batch_bytes_hint(rows)
    }

    fn dense_width(&self) -> Option<usize> {
        (**self).dense_width()
    }

    fn gather_dense_into(&self, indices: &[u64], out: &mut [u8]) -> Result<()> {
        (**self).gather_dense_into(indices, out)
    }
}

/// One delivered batch.
#[derive(Debug)]
pub struct Batch {
    /// The global step this batch belongs to (0-based).
    pub step: u64,
    /// The record indices gathered (this shard's slice of the global batch).
    pub indices: Vec<u64>,
    /// One column per source, in the order the sources were given.
    pub columns: Vec<Column>,
}

/// How a [`Loader`] samples, shards and prefetches.
#[derive(Clone, Debug)]
pub struct LoaderConfig {
    /// Global batch size: records per step summed over all shards.
    pub batch_size: u64,
    /// Sampling mode.
    pub mode: Mode,
    /// Sampler seed.
    pub seed: u64,
    /// First step to deliver (resume point).
    pub start_step: u64,
    /// Batch slots (at least 1): steps claimed but not yet delivered, plus
    /// the batch delivered last until the consumer asks for the next one.
    /// A value of 1 acts as 2, so one step is always being worked on.
    pub prefetch: usize,
    /// This process's shard, in `0..shard_count`.
    pub shard_index: u64,
    /// Number of shards the global batch is split into; must divide `batch_size`.
    pub shard_count: u64,
    /// Producer threads (at least 1; capped at `prefetch`).
    pub producers: usize,
    /// Memory the consumer lends for Dense columns (pinned host memory for
    /// device copies, typically): each Dense column is gathered straight
    /// into a free region of the pool when one is large enough, else into
    /// an engine buffer as without a pool.
    pub lent: Option<Arc<LentPool>>,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 256,
            mode: Mode::Cyclic,
            seed: 42,
            start_step: 0,
            prefetch: 4,
            shard_index: 0,
            shard_count: 1,
            producers: 2,
            lent: None,
        }
    }
}

/// What [`Loader::next_timeout`] found.
#[derive(Debug)]
pub enum Next {
    /// The next batch in step order, or the error that produced it.
    Ready(Result<Batch>),
    /// The loader was closed (or stopped after delivering an error).
    Closed,
    /// Nothing arrived within the timeout.
    Pending,
}

/// Step counters are u128 so that the last step, `u64::MAX`, can be claimed
/// and delivered like any other; past it the loader is exhausted.
struct State {
    next_claim: u128,
    next_deliver: u128,
    ready: BTreeMap<u64, Result<Batch>>,
    closed: bool,
    /// Whether the consumer may still hold the batch delivered last (it
    /// holds a slot until the consumer's next call).
    holding: bool,
}

struct Shared {
    sources: Vec<Arc<dyn Source>>,
    lent: Option<Arc<LentPool>>,
    sampler: Sampler,
    shard: std::ops::Range<usize>,
    /// Slots: claimed undelivered steps plus the held batch.
    capacity: u64,
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic inside a producer is caught before it can poison the lock;
        // recover the guard anyway rather than cascade.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn produce(&self, step: u64, global: &mut [u64]) -> Result<Batch> {
        self.sampler.fill(step, global);
        let indices = global[self.shard.clone()].to_vec();
        let mut columns = Vec::with_capacity(self.sources.len());
        for source in &self.sources {
            // A closed loader's step is never delivered: stop between sources.
            if self.lock().closed {
                return Err(Error::State("the loader was closed".into()));
            }
            columns.push(self.gather(source.as_ref(), &indices)?);
        }
        Ok(Batch {
            step,
            indices,
            columns,
        })
    }

    /// One source's column, in lent memory when the source is Dense and a
    /// region is free.
    fn gather(&self, source: &dyn Source, indices: &[u64]) -> Result<Column> {
        if let (Some(pool), Some(width)) = (&self.lent, source.dense_width()) {
            let len = indices.len().checked_mul(width).ok_or_else(|| {
                Error::OutOfMemory(format!("{} records of {width} bytes", indices.len()))
            })?;
            if let Some(mut buf) = pool.take(len) {
                source.gather_dense_into(indices, &mut buf)?;
                return Ok(Column::Dense(DenseBatch {
                    data: BatchBytes::Lent(buf),
                    rows: indices.len(),
                    width,
                }));
            }
        }
        source.gather(indices)
    }

    fn run_producer(&self) {
        let mut global = vec![0u64; self.sampler.batch_len()];
        loop {
            let step = {
                let mut st = self.lock();
                loop {
                    if st.closed {
                        return;
                    }
                    let used = st.next_claim - st.next_deliver + st.holding as u128;
                    if used < self.capacity as u128 && st.next_claim <= u64::MAX as u128 {
                        break;
                    }
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                st.next_claim += 1;
                (st.next_claim - 1) as u64
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.produce(step, &mut global)
            }))
            .unwrap_or_else(|panic| {
                let what = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::State(format!(
                    "internal error while gathering step {step}: {what}"
                )))
            });
            let mut st = self.lock();
            st.ready.insert(step, result);
            self.changed.notify_all();
        }
    }
}

/// Reserves cache room for every batch buffer a loader can have in
/// circulation: its slots, the consumer's previous batch while the next one
/// is handed over, and one to spare. Batches a consumer keeps beyond that
/// (transform threads, say) fall to the cache's own bound. Ragged batch
/// sizes vary, so their estimate gets a quarter more.
fn reserve_buffers(sources: &[Arc<dyn Source>], rows: usize, slots: usize) -> buffers::Reservation {
    let in_flight = slots.saturating_add(2);
    let (mut entries, mut bytes) = (0usize, 0usize);
    for source in sources {
        let hint = source.batch_bytes_hint(rows);
        if hint >= buffers::MIN_BYTES {
            entries = entries.saturating_add(in_flight);
            bytes = bytes.saturating_add(in_flight.saturating_mul(hint.saturating_add(hint / 4)));
        }
    }
    buffers::reserve(entries, bytes)
}

/// An endless, step-ordered stream of batches gathered by native threads.
pub struct Loader {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Room in the batch-buffer cache for the batches this loader keeps in
    /// flight; released by `close()`.
    buffers: Mutex<Option<buffers::Reservation>>,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("sources", &self.shared.sources.len())
            .field("sampler", &self.shared.sampler)
            .field("shard", &self.shared.shard)
            .finish()
    }
}

impl Loader {
    /// Starts a loader over `sources`, which must be non-empty and of equal length.
    pub fn new(sources: Vec<Arc<dyn Source>>, config: LoaderConfig) -> Result<Loader> {
        let length = match sources.first() {
            Some(s) => s.len(),
            None => {
                return Err(Error::InvalidArgument(
                    "a loader needs at least one source".into(),
                ))
            }
        };
        if let Some(bad) = sources.iter().find(|s| s.len() != length) {
            return Err(Error::InvalidArgument(format!(
                "all sources must have the same length: found {length} and {}",
                bad.len()
            )));
        }
        if length == 0 {
            return Err(Error::InvalidArgument("the sources are empty".into()));
        }
        if config.shard_count == 0 || config.shard_index >= config.shard_count {
            return Err(Error::InvalidArgument(format!(
                "shard_index {} must be in 0..shard_count {}",
                config.shard_index, config.shard_count
            )));
        }
        if !config.batch_size.is_multiple_of(config.shard_count) {
            return Err(Error::InvalidArgument(format!(
                "batch_size {} must be divisible by shard_count {}",
                config.batch_size, config.shard_count
            )));
        }
        if config.prefetch == 0 {
            return Err(Error::InvalidArgument("prefetch must be at least 1".into()));
        }
        let mut sampler = Sampler::new(length, config.batch_size, config.mode, config.seed)
            .map_err(|e| Error::InvalidArgument(e.to_string()))?;
        sampler.seek(config.start_step);
        // Cyclic over a space smaller than one batch draws all of it; shards
        // then split what there is.
        let drawn = sampler.batch_len() as u64;
        let per_shard = drawn / config.shard_count;
        let lo = (config.shard_index * per_shard) as usize;
        let hi = if config.shard_index + 1 == config.shard_count {
            drawn as usize
        } else {
            lo + per_shard as usize
        };
        // A prefetch of 1 acts as 2 (see `LoaderConfig::prefetch`).
        let slots = config.prefetch.max(2);
        let reservation = reserve_buffers(&sources, hi - lo, slots);
        let shared = Arc::new(Shared {
            sources,
            lent: config.lent.clone(),
            sampler,
            shard: lo..hi,
            capacity: slots as u64,
            state: Mutex::new(State {
                next_claim: config.start_step as u128,
                next_deliver: config.start_step as u128,
                ready: BTreeMap::new(),
                closed: false,
                holding: false,
            }),
            changed: Condvar::new(),
        });
        let producers = config.producers.clamp(1, config.prefetch);
        let mut threads = Vec::with_capacity(producers);
        for i in 0..producers {
            let worker = Arc::clone(&shared);
            let handle = std::thread::Builder::new()
                .name(format!("loaderx-loader-{i}"))
                .spawn(move || worker.run_producer())
                .map_err(|e| Error::io("starting a loader thread", e));
            match handle {
                Ok(h) => threads.push(h),
                Err(e) => {
                    let partial = Loader {
                        shared,
                        threads: Mutex::new(threads),
                        buffers: Mutex::new(Some(reservation)),
                    };
                    partial.close();
                    return Err(e);
                }
            }
        }
        Ok(Loader {
            shared,
            threads: Mutex::new(threads),
            buffers: Mutex::new(Some(reservation)),
        })
    }

    /// The step of the next batch to be delivered (saturating at
    /// `u64::MAX` once the last step has been delivered).
    pub fn step(&self) -> u64 {
        self.shared.lock().next_deliver.min(u64::MAX as u128) as u64
    }

    /// Records per delivered batch (this shard's slice).
    pub fn shard_batch_len(&self) -> usize {
        self.shared.shard.len()
    }

    /// Waits up to `timeout` for the next batch in step order.
    pub fn next_timeout(&self, timeout: Duration) -> Next {
        let deadline = Instant::now() + timeout;
        let mut st = self.shared.lock();
        if st.holding {
            // Asking for the next batch releases the last one's slot.
            st.holding = false;
            self.shared.changed.notify_all();
        }
        loop {
            if st.closed {
                return Next::Closed;
            }
            if st.next_deliver > u64::MAX as u128 {
                return Next::Closed;
            }
            let step = st.next_deliver as u64;
            if let Some(result) = st.ready.remove(&step) {
                st.next_deliver += 1;
                st.holding = true;
                if result.is_err() {
                    // A failed step stops the loader: later steps are not delivered.
                    st.closed = true;
                    st.ready.clear();
                }
                self.shared.changed.notify_all();
                return Next::Ready(result);
            }
            let now = Instant::now();
            if now >= deadline {
                return Next::Pending;
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Signals every thread to stop and wakes every waiter, without waiting.
    pub fn request_close(&self) {
        let mut st = self.shared.lock();
        st.closed = true;
        st.ready.clear();
        self.shared.changed.notify_all();
    }

    /// Stops the loader and waits for its threads to finish their current
    /// gather. Idempotent.
    pub fn close(&self) {
        self.request_close();
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
        self.buffers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
    }

    /// Whether the loader has been closed or stopped by an error.
    pub fn is_closed(&self) -> bool {
        self.shared.lock().closed
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    /// Blocks until the next batch; `None` once closed.
    fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            match self.next_timeout(Duration::from_secs(3600)) {
                Next::Ready(r) => return Some(r),
                Next::Closed => return None,
                Next::Pending => continue,
            }
        }
    }
}

impl Drop for Loader {
    /// Stops the loader without waiting: a producer still inside a gather
    /// finishes it on its own (it holds what it gathers from) and exits.
    /// Waiting here would block whoever dropped the last handle, a Python
    /// thread holding the GIL, say; call [`Loader::close`] to wait.
    fn drop(&mut self) {
        self.request_close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A source whose record i is the 8-byte little-endian value i.
    struct Counting {
        len: u64,
        fail_at: Option<u64>,
        calls: AtomicUsize,
    }

    impl Source for Counting {
        fn len(&self) -> u64 {
            self.len
        }
        fn gather(&self, indices: &[u64]) -> Result<Column> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if let Some(bad) = self.fail_at {
                if indices.contains(&bad) {
                    return Err(Error::Corrupt(format!("record {bad} is broken")));
                }
            }
            Ok(Column::Dense(DenseBatch {
                data: indices
                    .iter()
                    .flat_map(|i| i.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
                rows: indices.len(),
                width: 8,
            }))
        }
    }

    fn counting(len: u64) -> Arc<dyn Source> {
        Arc::new(Counting {
            len,
            fail_at: None,
            calls: AtomicUsize::new(0),
        })
    }

    /// A counting source, and the same as the loader takes it.
    fn observed(len: u64) -> (Arc<Counting>, Arc<dyn Source>) {
        let source = Arc::new(Counting {
            len,
            fail_at: None,
            calls: AtomicUsize::new(0),
        });
        let as_dyn: Arc<dyn Source> = source.clone();
        (source, as_dyn)
    }

    /// Waits (up to a generous guard) for `calls` to reach `want`, then
    /// checks that it stays there: work ahead is bounded, not just slow.
    fn settles_at(calls: &AtomicUsize, want: usize) {
        let guard = Instant::now() + Duration::from_secs(10);
        while calls.load(Ordering::SeqCst) < want && Instant::now() < guard {
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(calls.load(Ordering::SeqCst), want);
    }

    fn values(batch: &Batch) -> Vec<u64> {
        match &batch.columns[0] {
            Column::Dense(d) => d
                .data
                .chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            _ => unreachable!(),
        }
    }

    /// A source of wide records whose batch buffers come from the cache.
    struct Wide {
        width: usize,
    }

    impl Source for Wide {
        fn len(&self) -> u64 {
            64
        }
        fn gather(&self, indices: &[u64]) -> Result<Column> {
            let data = buffers::take(indices.len() * self.width).expect("memory");
            Ok(Column::Dense(DenseBatch {
                data: data.into(),
                rows: indices.len(),
                width: self.width,
            }))
        }
        fn batch_bytes_hint(&self, rows: usize) -> usize {
            rows * self.width
        }
    }

    #[test]
    fn keeps_its_batch_buffers_in_circulation() {
        let _serial = buffers::tests::test_lock();
        buffers::clear();
        let (entries, bytes) = buffers::limits();
        let batch = 4 * (1 << 19); // 2 MiB: four 512 KiB records
        let config = LoaderConfig {
            batch_size: 4,
            prefetch: 3,
            ..LoaderConfig::default()
        };
        // One big source and one too small to matter.
        let sources: Vec<Arc<dyn Source>> = vec![Arc::new(Wide { width: 1 << 19 }), counting(64)];
        let mut loader = Loader::new(sources, config).unwrap();
        // prefetch + 2 batches of the big source, a quarter extra in bytes.
        assert_eq!(
            buffers::limits(),
            (entries + 5, bytes + 5 * (batch + batch / 4))
        );

        // The consumer takes three batches, then lets go of all three at
        // once: a swing the unreserved cache (two buffers) cannot absorb.
        let before = buffers::stats();
        for _ in 0..20 {
            let held: Vec<Batch> = (0..3).map(|_| loader.next().unwrap().unwrap()).collect();
            for b in held {
                for column in b.columns {
                    if let Column::Dense(d) = column {
                        d.data.recycle();
                    }
                }
            }
        }
        let after = buffers::stats();
        // Never more buffers than were alive at once: 3 claimed + 3 held.
        assert!(after.fresh - before.fresh <= 6, "{before:?} -> {after:?}");
        assert!(
            after.reused - before.reused >= 60 - 6,
            "{before:?} -> {after:?}"
        );
        loader.close();
        assert_eq!(buffers::limits(), (entries, bytes));
        buffers::clear();
    }

    #[test]
    fn a_loop_holding_its_last_batch_peaks_at_prefetch_plus_one() {
        let _serial = buffers::tests::test_lock();
        buffers::clear();
        let config = LoaderConfig {
            batch_size: 4,
            prefetch: 3,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(vec![Arc::new(Wide { width: 1 << 19 })], config).unwrap();
        let before = buffers::stats();
        let release = |b: Batch| {
            for column in b.columns {
                if let Column::Dense(d) = column {
                    d.data.recycle();
                }
            }
        };
        // Like a Python for loop: the previous batch is let go only after
        // the next one has arrived (and here, a while after).
        let mut previous = loader.next().unwrap().unwrap();
        for _ in 0..30 {
            let batch = loader.next().unwrap().unwrap();
            std::thread::sleep(Duration::from_millis(3));
            release(std::mem::replace(&mut previous, batch));
        }
        release(previous);
        let after = buffers::stats();
        // Every buffer made was alive at once with the others, and the
        // loader never had more than prefetch + 1 batches out.
        assert!(after.fresh - before.fresh <= 4, "{before:?} -> {after:?}");
        loader.close();
        buffers::clear();
    }

    #[test]
    fn delivers_in_step_order_matching_the_sampler() {
        let config = LoaderConfig {
            batch_size: 7,
            producers: 3,
            prefetch: 5,
            ..LoaderConfig::default()
        };
        let sampler = Sampler::new(100, 7, Mode::Cyclic, 42).unwrap();
        let mut loader = Loader::new(vec![counting(100)], config).unwrap();
        for step in 0..50 {
            let batch = loader.next().unwrap().unwrap();
            assert_eq!(batch.step, step);
            assert_eq!(batch.indices, sampler.batch_at(step));
            assert_eq!(values(&batch), batch.indices);
        }
        assert_eq!(loader.step(), 50);
    }

    #[test]
    fn resume_continues_the_sequence() {
        let config = |start_step| LoaderConfig {
            batch_size: 8,
            mode: Mode::Iid,
            seed: 7,
            start_step,
            ..LoaderConfig::default()
        };
        let full: Vec<Vec<u64>> = Loader::new(vec![counting(1000)], config(0))
            .unwrap()
            .take(20)
            .map(|b| b.unwrap().indices)
            .collect();
        let resumed: Vec<Vec<u64>> = Loader::new(vec![counting(1000)], config(12))
            .unwrap()
            .take(8)
            .map(|b| b.unwrap().indices)
            .collect();
        assert_eq!(&full[12..], &resumed[..]);
    }

    #[test]
    fn shards_partition_the_global_batch() {
        let global: Vec<Vec<u64>> = Loader::new(
            vec![counting(97)],
            LoaderConfig {
                batch_size: 12,
                ..LoaderConfig::default()
            },
        )
        .unwrap()
        .take(10)
        .map(|b| b.unwrap().indices)
        .collect();
        for shards in [2u64, 3, 4] {
            let mut joined = vec![Vec::new(); 10];
            for shard in 0..shards {
                let loader = Loader::new(
                    vec![counting(97)],
                    LoaderConfig {
                        batch_size: 12,
                        shard_index: shard,
                        shard_count: shards,
                        ..LoaderConfig::default()
                    },
                )
                .unwrap();
                for (step, b) in loader.take(10).enumerate() {
                    let b = b.unwrap();
                    assert_eq!(b.indices.len() as u64, 12 / shards);
                    joined[step].extend(b.indices);
                }
            }
            assert_eq!(joined, global, "{shards} shards");
        }
    }

    #[test]
    fn bad_configs_are_refused() {
        let cfg = |f: fn(&mut LoaderConfig)| {
            let mut c = LoaderConfig::default();
            f(&mut c);
            c
        };
        assert!(Loader::new(vec![], LoaderConfig::default()).is_err());
        assert!(Loader::new(vec![counting(10), counting(11)], LoaderConfig::default()).is_err());
        assert!(Loader::new(vec![counting(10)], cfg(|c| c.shard_count = 3)).is_err());
        assert!(Loader::new(vec![counting(10)], cfg(|c| c.shard_index = 1)).is_err());
        assert!(Loader::new(vec![counting(10)], cfg(|c| c.prefetch = 0)).is_err());
        assert!(Loader::new(vec![counting(0)], LoaderConfig::default()).is_err());
    }

    #[test]
    fn an_error_is_delivered_in_order_then_the_loader_stops() {
        let source: Arc<dyn Source> = Arc::new(Counting {
            len: 10,
            fail_at: Some(7),
            calls: AtomicUsize::new(0),
        });
        let config = LoaderConfig {
            batch_size: 2,
            mode: Mode::Sequential,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(vec![source], config).unwrap();
        for _ in 0..3 {
            assert!(loader.next().unwrap().is_ok());
        }
        let err = loader.next().unwrap().unwrap_err();
        assert!(err.to_string().contains("record 7 is broken"), "{err}");
        assert!(loader.next().is_none());
    }

    #[test]
    fn prefetch_bounds_work_ahead() {
        let (source, as_dyn) = observed(1000);
        let mut loader = Loader::new(
            vec![as_dyn],
            LoaderConfig {
                batch_size: 4,
                prefetch: 3,
                producers: 2,
                ..LoaderConfig::default()
            },
        )
        .unwrap();
        settles_at(&source.calls, 3);
        // The delivered batch keeps its slot until the next call.
        let first = loader.next().unwrap().unwrap();
        settles_at(&source.calls, 3);
        drop(first);
        let second = loader.next().unwrap().unwrap();
        assert_eq!(second.step, 1);
        settles_at(&source.calls, 4);
        loader.close();
        assert!(loader.next().is_none());
    }

    #[test]
    fn prefetch_one_still_works_a_step_ahead() {
        let (source, as_dyn) = observed(1000);
        let config = LoaderConfig {
            batch_size: 4,
            prefetch: 1,
            mode: Mode::Sequential,
            ..LoaderConfig::default()
        };
        let mut loader = Loader::new(vec![as_dyn], config).unwrap();
        let first = loader.next().unwrap().unwrap();
        // While the consumer holds step 0, step 1 is gathered, and no more.
        settles_at(&source.calls, 2);
        assert_eq!(first.indices, [0, 1, 2, 3]);
        let second = loader.next().unwrap().unwrap();
        assert_eq!(second.indices, [4, 5, 6, 7]);
        settles_at(&source.calls, 3);
        loader.close();
    }

    #[test]
    fn the_last_step_is_delivered_then_the_loader_ends() {
        let config = LoaderConfig {
            batch_size: 3,
            mode: Mode::Sequential,
            start_step: u64::MAX - 1,
            ..LoaderConfig::default()
        };
        let sampler = Sampler::new(10, 3, Mode::Sequential, 42).unwrap();
        let mut loader = Loader::new(vec![counting(10)], config).unwrap();
        for step in [u64::MAX - 1, u64::MAX] {
            let batch = loader.next().unwrap().unwrap();
            assert_eq!(
                (batch.step, &batch.indices),
                (step, &sampler.batch_at(step))
            );
        }
        assert!(loader.next().is_none());
        assert_eq!(loader.step(), u64::MAX);
    }

    #[test]
    fn close_wakes_a_blocked_consumer() {
        let l = Loader::new(
            vec![counting(10)],
            LoaderConfig {
                batch_size: 2,
                ..LoaderConfig::default()
            },
        )
        .unwrap();
        l.request_close();
        assert!(matches!(
            l.next_timeout(Duration::from_secs(5)),
            Next::Closed
        ));
    }

    /// A source whose gathers take `delay`, counting those that finish.
    struct Slow {
        delay: Duration,
        started: AtomicUsize,
        finished: AtomicUsize,
    }

    impl Source for Slow {
        fn len(&self) -> u64 {
            100
        }
        fn gather(&self, indices: &[u64]) -> Result<Column> {
            self.started.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(self.delay);
            self.finished.fetch_add(1, Ordering::SeqCst);
            counting(100).gather(indices)
        }
    }

    #[test]
    fn dropping_a_loader_does_not_wait_for_gathers_and_close_does() {
        let slow = Arc::new(Slow {
            delay: Duration::from_millis(600),
            started: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
        });
        let source: Arc<dyn Source> = slow.clone();
        // The second source is never reached once the first one's gather
        // ends after the drop: closed loaders stop between sources.
        let (second, second_dyn) = observed(100);
        let config = LoaderConfig {
            batch_size: 4,
            producers: 1,
            prefetch: 1,
            ..LoaderConfig::default()
        };
        let loader = Loader::new(vec![source.clone(), second_dyn], config.clone()).unwrap();
        while slow.started.load(Ordering::SeqCst) == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let t0 = Instant::now();
        drop(loader);
        assert!(
            t0.elapsed() < Duration::from_millis(200),
            "{:?}",
            t0.elapsed()
        );
        settles_at(&slow.finished, 1);
        assert_eq!(second.calls.load(Ordering::SeqCst), 0);
        assert_eq!(slow.started.load(Ordering::SeqCst), 1);

        // close() is the call that waits for the gather in flight.
        let loader = Loader::new(vec![source], config).unwrap();
        while slow.started.load(Ordering::SeqCst) == 1 {
            std::thread::sleep(Duration::from_millis(5));
        }
        loader.close();
        assert_eq!(slow.finished.load(Ordering::SeqCst), 2);
    }
}
