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
use crate::mixture::{MixtureSampler, Proportions};
use crate::pass::Pass;
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
    /// The record indices gathered (this shard's slice of the global batch);
    /// in a mixture, indices into the source named by `sources`.
    pub indices: Vec<u64>,
    /// In a mixture ([`Loader::mixture`]), the source number of each record;
    /// `None` otherwise.
    pub sources: Option<Vec<u32>>,
    /// In a finite pass ([`LoaderConfig::epochs`]), whether each record is
    /// real (`true`) or padding of an epoch's last batch; `None` when endless.
    pub mask: Option<Vec<bool>>,
    /// One column per stream, in the order the streams were given.
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
    /// device copies, typically): each Dense column is gathered (for a
    /// mixture, merged) straight into a free region of the pool when one is
    /// large enough, else into an engine buffer as without a pool.
    pub lent: Option<Arc<LentPool>>,
    /// `None`: endless. `Some(n)`: a finite pass of `n` epochs, each record
    /// once per epoch, batches padded and masked (see [`crate::pass`]);
    /// mode [`Mode::Iid`] is refused.
    pub epochs: Option<u64>,
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
            epochs: None,
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

/// Which records each step holds.
#[derive(Debug)]
enum Plan {
    /// One source, the endless batch stream of a [`Sampler`].
    Plain(Sampler),
    /// Several sources, an endless weighted mixture.
    Mixture(MixtureSampler),
    /// A finite pass; over the sources' concatenation when `offsets` (each
    /// source's first global index, then the total) is given.
    Pass {
        pass: Pass,
        offsets: Option<Vec<u64>>,
    },
}

impl Plan {
    fn batch_len(&self) -> usize {
        match self {
            Plan::Plain(s) => s.batch_len(),
            Plan::Mixture(m) => m.batch_len(),
            Plan::Pass { pass, .. } => pass.batch_len(),
        }
    }

    /// One past the last step, as a u128 so that `u64::MAX` is a step too.
    fn end(&self) -> u128 {
        match self {
            Plan::Pass { pass, .. } => u128::from(pass.steps()),
            _ => u128::from(u64::MAX) + 1,
        }
    }
}

/// A producer's buffers for one global batch.
struct Scratch {
    records: Vec<u64>,
    sources: Vec<u32>,
    mask: Vec<bool>,
}

struct Shared {
    /// `components[k][m]`: stream `m` of source `k` (one source unless mixed).
    components: Vec<Vec<Arc<dyn Source>>>,
    lent: Option<Arc<LentPool>>,
    plan: Plan,
    /// See [`Plan::end`].
    end: u128,
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

    fn produce(&self, step: u64, scratch: &mut Scratch) -> Result<Batch> {
        let shard = self.shard.clone();
        let (indices, sources, mask) = match &self.plan {
            Plan::Plain(sampler) => {
                sampler.fill(step, &mut scratch.records);
                (scratch.records[shard].to_vec(), None, None)
            }
            Plan::Mixture(mixture) => {
                mixture.fill(step, &mut scratch.sources, &mut scratch.records);
                (
                    scratch.records[shard.clone()].to_vec(),
                    Some(scratch.sources[shard].to_vec()),
                    None,
                )
            }
            Plan::Pass { pass, offsets } => {
                pass.fill(step, &mut scratch.records, &mut scratch.mask);
                let mask = Some(scratch.mask[shard.clone()].to_vec());
                let mut indices = scratch.records[shard].to_vec();
                let sources = offsets.as_ref().map(|offsets| {
                    // Global index -> (source, index into the source).
                    indices
                        .iter_mut()
                        .map(|g| {
                            let k = offsets.partition_point(|&o| o <= *g) - 1;
                            *g -= offsets[k];
                            k as u32
                        })
                        .collect()
                });
                (indices, sources, mask)
            }
        };
        let streams = self.components[0].len();
        let mut columns = Vec::with_capacity(streams);
        for m in 0..streams {
            // A closed loader's step is never delivered: stop between streams.
            if self.lock().closed {
                return Err(Error::State("the loader was closed".into()));
            }
            columns.push(match &sources {
                Some(picks) if self.components.len() > 1 => {
                    self.gather_mixed(m, picks, &indices)?
                }
                _ => self.gather(self.components[0][m].as_ref(), &indices)?,
            });
        }
        Ok(Batch {
            step,
            indices,
            sources,
            mask,
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

    /// Gathers stream `m` of a mixture batch: one gather per source present,
    /// merged back into slot order. A batch drawn from a single source is
    /// that source's gather, without a copy.
    fn gather_mixed(&self, m: usize, picks: &[u32], indices: &[u64]) -> Result<Column> {
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); self.components.len()];
        for (&k, &i) in picks.iter().zip(indices) {
            per[k as usize].push(i);
        }
        let present: Vec<usize> = (0..per.len()).filter(|&k| !per[k].is_empty()).collect();
        if present.len() <= 1 {
            let k = present.first().copied().unwrap_or(0);
            return self.components[k][m].gather(&per[k]);
        }
        let mut parts: Vec<Option<Column>> = (0..per.len()).map(|_| None).collect();
        for &k in &present {
            parts[k] = Some(self.components[k][m].gather(&per[k])?);
        }
        merge_columns(parts, picks, self.lent.as_ref())
    }

    fn run_producer(&self) {
        let len = self.plan.batch_len();
        let mut scratch = Scratch {
            records: vec![0u64; len],
            sources: match self.plan {
                Plan::Mixture(_) => vec![0u32; len],
                _ => Vec::new(),
            },
            mask: match self.plan {
                Plan::Pass { .. } => vec![false; len],
                _ => Vec::new(),
            },
        };
        loop {
            let step = {
                let mut st = self.lock();
                loop {
                    // Closed, or every step of a finite pass claimed:
                    // nothing is left for this thread to do.
                    if st.closed || st.next_claim >= self.end {
                        return;
                    }
                    let used = st.next_claim - st.next_deliver + st.holding as u128;
                    if used < self.capacity as u128 && st.next_claim < self.end {
                        break;
                    }
                    st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                st.next_claim += 1;
                (st.next_claim - 1) as u64
            };
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                self.produce(step, &mut scratch)
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

/// Merges the per-source columns of a mixture stream (`parts[k]`, present
/// for the sources in `picks`) into slot order: slot `j` takes the next
/// unused record of source `picks[j]`.
fn merge_columns(
    parts: Vec<Option<Column>>,
    picks: &[u32],
    lent: Option<&Arc<LentPool>>,
) -> Result<Column> {
    let mismatch = || {
        Error::InvalidArgument("mixture sources disagree on a stream's kind or record size".into())
    };
    match parts.iter().flatten().next() {
        Some(Column::Dense(first)) => {
            let width = first.width;
            let mut dense = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    None => dense.push(None),
                    Some(Column::Dense(d)) if d.width == width => dense.push(Some(d)),
                    Some(_) => return Err(mismatch()),
                }
            }
            let bytes = picks
                .len()
                .checked_mul(width)
                .ok_or_else(|| Error::OutOfMemory("a merged batch".into()))?;
            // The merged batch is what the consumer gets: into lent memory
            // when there is a free region, as a single source's would be.
            let mut data = match lent.and_then(|pool| pool.take(bytes)) {
                Some(region) => BatchBytes::Lent(region),
                None => buffers::take(bytes)
                    .ok_or_else(|| Error::OutOfMemory(format!("a merged batch of {bytes} bytes")))?
                    .into(),
            };
            let mut next = vec![0usize; dense.len()];
            for (out, &k) in data.chunks_exact_mut(width.max(1)).zip(picks) {
                let k = k as usize;
                let part = dense
                    .get(k)
                    .and_then(Option::as_ref)
                    .filter(|d| next[k] < d.rows)
                    .ok_or_else(|| Error::State("internal error: mixture part too short".into()))?;
                let row = next[k];
                next[k] += 1;
                out.copy_from_slice(&part.data[row * width..(row + 1) * width]);
            }
            for d in dense.into_iter().flatten() {
                d.data.recycle();
            }
            Ok(Column::Dense(DenseBatch {
                data,
                rows: picks.len(),
                width,
            }))
        }
        Some(Column::Ragged(_)) => {
            let mut ragged = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    None => ragged.push(RaggedBatch::default()),
                    Some(Column::Ragged(r)) => ragged.push(r),
                    Some(_) => return Err(mismatch()),
                }
            }
            let merged = RaggedBatch::interleave(&ragged, picks)?;
            for r in ragged {
                buffers::recycle(r.into_data());
            }
            Ok(Column::Ragged(merged))
        }
        Some(Column::Packed(_)) => {
            let mut packed = Vec::with_capacity(parts.len());
            for part in parts {
                match part {
                    None => packed.push(PackedBatch::default()),
                    Some(Column::Packed(p)) => packed.push(p),
                    Some(_) => return Err(mismatch()),
                }
            }
            let merged = PackedBatch::interleave(&packed, picks)?;
            for p in packed {
                buffers::recycle(p.values);
            }
            Ok(Column::Packed(merged))
        }
        // Shaping is per batch: the binding refuses it for mixtures, whose
        // batches are merged from one gather per source.
        Some(Column::Padded(_) | Column::RowPacked(_)) => Err(Error::InvalidArgument(
            "padded or row-packed streams cannot be merged across mixture sources".into(),
        )),
        None => Err(Error::State("internal error: empty mixture batch".into())),
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

/// A step-ordered stream of batches gathered by native threads: endless, or
/// a finite pass when [`LoaderConfig::epochs`] is set, over one data set
/// ([`Loader::new`]) or a weighted mixture ([`Loader::mixture`]).
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
            .field("sources", &self.shared.components.len())
            .field("streams", &self.shared.components[0].len())
            .field("plan", &self.shared.plan)
            .field("shard", &self.shared.shard)
            .finish()
    }
}

/// The common length of `streams` (stream `m` of one source), or why not.
fn common_length(streams: &[Arc<dyn Source>], what: &str) -> Result<u64> {
    let length = match streams.first() {
        Some(s) => s.len(),
        None => {
            return Err(Error::InvalidArgument(format!(
                "{what} needs at least one stream"
            )))
        }
    };
    if let Some(bad) = streams.iter().find(|s| s.len() != length) {
        return Err(Error::InvalidArgument(format!(
            "all streams of {what} must have the same length: found {length} and {}",
            bad.len()
        )));
    }
    if length == 0 {
        return Err(Error::InvalidArgument(format!("{what} is empty")));
    }
    Ok(length)
}

impl Loader {
    /// Starts a loader over `sources` (the streams of one data set), which
    /// must be non-empty and of equal length. With
    /// [`epochs`](LoaderConfig::epochs) set it is a finite pass.
    pub fn new(sources: Vec<Arc<dyn Source>>, config: LoaderConfig) -> Result<Loader> {
        let length = common_length(&sources, "a loader")?;
        let plan = match config.epochs {
            None => Plan::Plain(Sampler::new(
                length,
                config.batch_size,
                config.mode,
                config.seed,
            )?),
            Some(epochs) => Plan::Pass {
                pass: Pass::new(length, config.batch_size, config.mode, config.seed, epochs)?,
                offsets: None,
            },
        };
        Loader::start(vec![sources], plan, config)
    }

    /// Starts a loader over a weighted mixture: `components[k]` holds the
    /// streams of source `k` (the same number of streams in every source,
    /// equal lengths within a source, stream `m` of every source of one
    /// kind and record layout), `weights[k]` its weight (positive, finite;
    /// normalised here).
    ///
    /// Endless ([`epochs`](LoaderConfig::epochs) `None`), each step is a
    /// batch of [`MixtureSampler`]; a finite pass instead covers every
    /// record of every source once per epoch, as one [`Pass`] over the
    /// sources laid end to end in order (so weights and `proportions` play
    /// no part: a source's share of the pass is its share of the records).
    /// Each delivered [`Batch`] carries `sources`.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use loaderx::loader::{Loader, LoaderConfig, Source};
    /// use loaderx::mixture::Proportions;
    /// use loaderx::store::{DenseReader, DenseWriter};
    /// use loaderx::{Codec, DType};
    ///
    /// let root = std::env::temp_dir().join(format!("loaderx-mix-doc-{}", std::process::id()));
    /// let _ = std::fs::remove_dir_all(&root);
    /// let mut open = |name: &str, first: u8, n: u8| -> loaderx::Result<Arc<dyn Source>> {
    ///     let dir = root.join(name);
    ///     let mut w = DenseWriter::create(&dir, DType::parse("|u1")?, &[], Codec::Raw, None)?;
    ///     w.append(&(first..first + n).collect::<Vec<u8>>())?;
    ///     w.close()?;
    ///     Ok(Arc::new(DenseReader::open(&dir)?))
    /// };
    /// let web = vec![open("web", 0, 30)?];    // records 0..30
    /// let code = vec![open("code", 100, 10)?]; // records 100..110
    /// let config = LoaderConfig { batch_size: 10, ..LoaderConfig::default() };
    /// let mut loader = Loader::mixture(vec![web, code], vec![0.7, 0.3], Proportions::Exact, config)?;
    /// let batch = loader.next().expect("endless")?;
    /// let sources = batch.sources.as_ref().unwrap();
    /// assert_eq!(sources.iter().filter(|&&k| k == 0).count(), 7);
    /// assert_eq!(sources.iter().filter(|&&k| k == 1).count(), 3);
    /// loader.close();
    /// # std::fs::remove_dir_all(&root).unwrap();
    /// # Ok::<(), loaderx::Error>(())
    /// ```
    pub fn mixture(
        components: Vec<Vec<Arc<dyn Source>>>,
        weights: Vec<f64>,
        proportions: Proportions,
        config: LoaderConfig,
    ) -> Result<Loader> {
        let streams = components.first().map_or(0, Vec::len);
        let mut lengths = Vec::with_capacity(components.len());
        for (k, streams_k) in components.iter().enumerate() {
            if streams_k.len() != streams {
                return Err(Error::InvalidArgument(format!(
                    "every mixture source needs the same streams: source 0 has {streams}, source {k} has {}",
                    streams_k.len()
                )));
            }
            lengths.push(common_length(streams_k, &format!("mixture source {k}"))?);
        }
        // Checks the weights (and the rest) even when a pass ignores them.
        let mixture = MixtureSampler::new(
            &lengths,
            &weights,
            config.batch_size,
            config.mode,
            proportions,
            config.seed,
        );
        let plan = match config.epochs {
            None => Plan::Mixture(mixture?),
            Some(epochs) => {
                crate::mixture::normalise(&weights)?;
                let mut offsets = Vec::with_capacity(lengths.len() + 1);
                let mut total = 0u64;
                offsets.push(0);
                for &len in &lengths {
                    total = total.checked_add(len).ok_or_else(|| {
                        Error::InvalidArgument(
                            "the mixture's sources hold more than 2^64 records".into(),
                        )
                    })?;
                    offsets.push(total);
                }
                let pass = Pass::new(total, config.batch_size, config.mode, config.seed, epochs)?;
                Plan::Pass {
                    pass,
                    offsets: Some(offsets),
                }
            }
        };
        Loader::start(components, plan, config)
    }

    fn start(
        components: Vec<Vec<Arc<dyn Source>>>,
        plan: Plan,
        config: LoaderConfig,
    ) -> Result<Loader> {
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
        let end = plan.end();
        if u128::from(config.start_step) > end {
            return Err(Error::InvalidArgument(format!(
                "start_step {} is past the end of the pass ({end} steps)",
                config.start_step
            )));
        }
        // Cyclic over a space smaller than one batch draws all of it; shards
        // then split what there is.
        let drawn = plan.batch_len() as u64;
        let per_shard = drawn / config.shard_count;
        let lo = (config.shard_index * per_shard) as usize;
        let hi = if config.shard_index + 1 == config.shard_count {
            drawn as usize
        } else {
            lo + per_shard as usize
        };
        // A prefetch of 1 acts as 2 (see `LoaderConfig::prefetch`).
        let slots = config.prefetch.max(2);
        // Merged mixture batches come from the cache as well as the parts.
        let mut hinted: Vec<Arc<dyn Source>> = components.iter().flatten().cloned().collect();
        if components.len() > 1 {
            hinted.extend(components[0].iter().cloned());
        }
        let reservation = reserve_buffers(&hinted, hi - lo, slots);
        let shared = Arc::new(Shared {
            components,
            lent: config.lent.clone(),
            plan,
            end,
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

    /// Steps of a finite pass (see [`LoaderConfig::epochs`]); `None` when
    /// endless.
    pub fn steps(&self) -> Option<u64> {
        match &self.shared.plan {
            Plan::Pass { pass, .. } => Some(pass.steps()),
            _ => None,
        }
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
            if st.next_deliver >= self.shared.end {
                // Past the last step (of a finite pass, or of u64).
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
    use crate::mixture::MixtureSampler;
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

    /// A source whose record i is the 8-byte value `tag * 1000 + i`.
    struct Tagged {
        len: u64,
        tag: u64,
    }

    impl Source for Tagged {
        fn len(&self) -> u64 {
            self.len
        }
        fn gather(&self, indices: &[u64]) -> Result<Column> {
            Ok(Column::Dense(DenseBatch {
                data: indices
                    .iter()
                    .flat_map(|i| (self.tag * 1000 + i).to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
                rows: indices.len(),
                width: 8,
            }))
        }
    }

    fn tagged(lengths: &[u64]) -> Vec<Vec<Arc<dyn Source>>> {
        lengths
            .iter()
            .enumerate()
            .map(|(k, &len)| {
                let s: Arc<dyn Source> = Arc::new(Tagged { len, tag: k as u64 });
                vec![s.clone(), s]
            })
            .collect()
    }

    #[test]
    fn a_finite_pass_covers_every_record_once_on_any_shard_count() {
        for shards in [1u64, 2, 3, 4] {
            let mut seen = Vec::new();
            for shard in 0..shards {
                let mut loader = Loader::new(
                    vec![counting(53)],
                    LoaderConfig {
                        batch_size: 12,
                        epochs: Some(2),
                        shard_index: shard,
                        shard_count: shards,
                        ..LoaderConfig::default()
                    },
                )
                .unwrap();
                assert_eq!(loader.steps(), Some(10));
                let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
                assert_eq!(batches.len(), 10, "every shard takes every step");
                for b in batches {
                    let mask = b.mask.clone().unwrap();
                    assert_eq!(mask.len() as u64, 12 / shards);
                    assert_eq!(values(&b), b.indices);
                    let epoch = b.step / 5;
                    seen.extend(
                        b.indices
                            .iter()
                            .zip(&mask)
                            .filter(|(_, &m)| m)
                            .map(|(&i, _)| (epoch, i)),
                    );
                }
                assert!(loader.next().is_none());
            }
            seen.sort_unstable();
            let want: Vec<(u64, u64)> = (0..2).flat_map(|e| (0..53).map(move |i| (e, i))).collect();
            assert_eq!(seen, want, "{shards} shards");
        }
    }

    #[test]
    fn a_finite_pass_resumes_and_refuses_to_start_past_its_end() {
        let config = |start_step| LoaderConfig {
            batch_size: 8,
            epochs: Some(1),
            start_step,
            ..LoaderConfig::default()
        };
        let full: Vec<Vec<u64>> = Loader::new(vec![counting(30)], config(0))
            .unwrap()
            .map(|b| b.unwrap().indices)
            .collect();
        assert_eq!(full.len(), 4);
        let resumed: Vec<Vec<u64>> = Loader::new(vec![counting(30)], config(3))
            .unwrap()
            .map(|b| b.unwrap().indices)
            .collect();
        assert_eq!(resumed, &full[3..]);
        let mut at_end = Loader::new(vec![counting(30)], config(4)).unwrap();
        assert!(at_end.next().is_none());
        assert!(Loader::new(vec![counting(30)], config(5)).is_err());
        let iid = LoaderConfig {
            mode: Mode::Iid,
            ..config(0)
        };
        assert!(Loader::new(vec![counting(30)], iid).is_err());
    }

    #[test]
    fn mixture_batches_follow_the_mixture_sampler_on_every_shard() {
        let lengths = [40u64, 25, 9];
        let weights = vec![5.0, 2.0, 1.0];
        for proportions in [Proportions::Exact, Proportions::Iid] {
            let sampler =
                MixtureSampler::new(&lengths, &weights, 16, Mode::Cyclic, proportions, 3).unwrap();
            for shards in [1u64, 2, 4] {
                let mut joined: Vec<(Vec<u32>, Vec<u64>)> = vec![Default::default(); 6];
                for shard in 0..shards {
                    let config = LoaderConfig {
                        batch_size: 16,
                        seed: 3,
                        shard_index: shard,
                        shard_count: shards,
                        start_step: 2,
                        ..LoaderConfig::default()
                    };
                    let loader =
                        Loader::mixture(tagged(&lengths), weights.clone(), proportions, config)
                            .unwrap();
                    for (b, joint) in loader.take(6).zip(joined.iter_mut()) {
                        let b = b.unwrap();
                        let sources = b.sources.clone().unwrap();
                        assert!(b.mask.is_none());
                        let want: Vec<u64> = sources
                            .iter()
                            .zip(&b.indices)
                            .map(|(&k, &i)| u64::from(k) * 1000 + i)
                            .collect();
                        assert_eq!(values(&b), want);
                        joint.0.extend(sources);
                        joint.1.extend(b.indices);
                    }
                }
                for (t, joint) in joined.into_iter().enumerate() {
                    assert_eq!(joint, sampler.batch_at(2 + t as u64), "{shards} shards");
                }
            }
        }
    }

    #[test]
    fn a_finite_mixture_pass_takes_every_source_once() {
        let lengths = [10u64, 7, 3];
        for mode in [Mode::Sequential, Mode::Cyclic] {
            let config = LoaderConfig {
                batch_size: 6,
                mode,
                epochs: Some(1),
                ..LoaderConfig::default()
            };
            let loader = Loader::mixture(
                tagged(&lengths),
                vec![1.0, 1.0, 1.0],
                Proportions::Exact,
                config,
            )
            .unwrap();
            assert_eq!(loader.steps(), Some(4));
            let mut seen = Vec::new();
            for b in loader {
                let b = b.unwrap();
                let mask = b.mask.clone().unwrap();
                for ((&v, &m), (&k, &i)) in values(&b)
                    .iter()
                    .zip(&mask)
                    .zip(b.sources.as_ref().unwrap().iter().zip(&b.indices))
                {
                    assert_eq!(v, u64::from(k) * 1000 + i);
                    if m {
                        seen.push(v);
                    }
                }
            }
            if mode == Mode::Sequential {
                // Sources laid end to end, in order.
                let want: Vec<u64> = (0..10).chain(1000..1007).chain(2000..2003).collect();
                assert_eq!(seen, want);
            }
            seen.sort_unstable();
            let want: Vec<u64> = (0..10).chain(1000..1007).chain(2000..2003).collect();
            assert_eq!(seen, want, "{mode}");
        }
    }

    #[test]
    fn bad_mixtures_are_refused() {
        let config = LoaderConfig {
            batch_size: 4,
            ..LoaderConfig::default()
        };
        let mixture = |c: Vec<Vec<Arc<dyn Source>>>, w: Vec<f64>| {
            Loader::mixture(c, w, Proportions::Exact, config.clone())
        };
        assert!(mixture(vec![], vec![]).is_err());
        assert!(mixture(tagged(&[5, 5]), vec![1.0]).is_err());
        assert!(mixture(tagged(&[5, 5]), vec![1.0, f64::NAN]).is_err());
        assert!(mixture(tagged(&[5, 0]), vec![1.0, 1.0]).is_err());
        let mut uneven = tagged(&[5, 5]);
        uneven[1].pop();
        assert!(mixture(uneven, vec![1.0, 1.0]).is_err());
        let mut unequal = tagged(&[5, 5]);
        unequal[1][1] = Arc::new(Tagged { len: 6, tag: 1 });
        let err = mixture(unequal, vec![1.0, 1.0]).unwrap_err();
        assert!(err.to_string().contains("mixture source 1"), "{err}");
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
