//! Fixed-shape batches from Ragged records: padding to a fixed length, and
//! packing into fixed rows of `max_tokens` slots.
//!
//! Accelerator compilers (XLA, `torch.compile`) specialise a step on the
//! shapes of its inputs, so a Ragged batch, whose sizes change every step,
//! recompiles it every step. Both layouts here give the same shapes for
//! every batch of a loader:
//!
//! * [`pad`]: each record becomes one row of exactly `length` items
//!   ([`PaddedBatch`]: values `[records, length, *rest]`, a mask and the
//!   lengths after truncation);
//! * [`pack`]: records are placed whole, back to back, into `rows` rows of
//!   `max_tokens` slots ([`RowPackedBatch`]: values `[rows, max_tokens, *rest]`,
//!   per-slot segment ids and positions for variable-length attention,
//!   and where each record went).
//!
//! Records have shape `(L, *rest)`: both work along the first axis, one
//! "item" (token) being a `rest`-shaped slice, and `rest` must be the same
//! for every record of a batch. Both are pure functions of the batch, so a
//! [`Loader`](crate::loader::Loader) that wraps its source in [`Padded`] or
//! [`RowPacked`] resumes and shards exactly as without them.
//!
//! Output buffers come from the batch-buffer cache ([`crate::buffers`]), and
//! no array may exceed [`MAX_SHAPED_BYTES`]: a `max_tokens * rows` that
//! would is refused with an error rather than allocated.
//!
//! ```
//! use loaderx::shape::{pack, PackSpec, Policy};
//! use loaderx::store::{RaggedBatch, RaggedRecord};
//!
//! // Three u8 records of lengths 3, 2 and 4.
//! let records: [&[u8]; 3] = [&[1, 2, 3], &[4, 5], &[6, 7, 8, 9]];
//! let mut data = Vec::new();
//! let mut ranges = Vec::new();
//! for r in records {
//!     let start = data.len();
//!     RaggedRecord { shape: &[r.len() as u64], payload: r }.encode_into(&mut data);
//!     ranges.push(start..data.len());
//! }
//! let batch = RaggedBatch::from_gather(data.into(), ranges, &[0, 1, 2], 1)?;
//!
//! // First-fit in batch order into rows of 5 slots: [1 2 3 4 5] [6 7 8 9 _].
//! let spec = PackSpec { rows: Some(2), ..PackSpec::new(5) };
//! let p = pack(&batch, &spec)?;
//! assert_eq!((p.rows, p.max_tokens, p.dropped), (2, 5, 0));
//! assert_eq!(&p.values[..], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 0]);
//! assert_eq!(p.segment_ids_vec(), [1, 1, 1, 2, 2, 1, 1, 1, 1, 0]);
//! assert_eq!(p.positions_vec(), [0, 1, 2, 0, 1, 0, 1, 2, 3, 0]);
//! // (row, first slot, tokens placed) per record, in batch order.
//! assert_eq!(p.placement, [0, 0, 3, 0, 3, 2, 1, 0, 4]);
//! assert_eq!(spec.policy, Policy::FirstFit);
//! # Ok::<(), loaderx::Error>(())
//! ```

use std::collections::BTreeSet;

use crate::buffers::{self, Buf};
use crate::error::{Error, Result};
use crate::loader::{Column, Source};
use crate::store::RaggedBatch;

/// The most bytes any one array of a shaped batch may take (4 GiB).
/// Larger requests are almost always a unit mistake (`max_tokens` in bytes,
/// a `rows` meant for the global batch) and would otherwise be allocated on
/// every step; they are refused with [`Error::InvalidArgument`].
pub const MAX_SHAPED_BYTES: usize = 1 << 32;

/// Which end of a row (padding) or record (truncation).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Side {
    /// The end: padding goes after the items; truncation keeps the first ones.
    #[default]
    Right,
    /// The start: padding goes before the items; truncation keeps the last ones.
    Left,
}

/// How [`pad`] shapes a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PadSpec {
    /// Items per row (at least 1, at most `i32::MAX`).
    pub length: usize,
    /// The bytes of one item of the records' dtype to pad with; empty
    /// means zero bytes.
    pub value: Vec<u8>,
    /// Where the padding goes.
    pub side: Side,
    /// Which items a record longer than `length` loses: [`Side::Right`]
    /// (the default) keeps its first `length` items.
    pub truncate: Side,
    /// Whether to produce [`PaddedBatch::mask`].
    pub mask: bool,
    /// Whether to produce [`PaddedBatch::lengths`].
    pub lengths: bool,
}

impl PadSpec {
    /// Right padding with zeros to `length`, keeping the first `length`
    /// items, with a mask and lengths.
    pub fn new(length: usize) -> PadSpec {
        PadSpec {
            length,
            value: Vec::new(),
            side: Side::Right,
            truncate: Side::Right,
            mask: true,
            lengths: true,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.length == 0 || self.length > i32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "pad length must be in 1..={}, got {}",
                i32::MAX,
                self.length
            )));
        }
        Ok(())
    }
}

/// A padded batch: record `k` is row `k`.
#[derive(Debug)]
pub struct PaddedBatch {
    /// C-order `[rows, length, *rest]` items of the records' dtype.
    pub values: Buf,
    /// Number of rows (= records).
    pub rows: usize,
    /// Items per row.
    pub length: usize,
    /// The records' shape after the first axis.
    pub rest: Vec<u64>,
    /// `[rows, length]` bytes, 1 on slots holding a record's item, 0 on
    /// padding (a NumPy bool array); `None` unless [`PadSpec::mask`].
    pub mask: Option<Buf>,
    /// Items kept per row (after truncation); `None` unless
    /// [`PadSpec::lengths`].
    pub lengths: Option<Vec<i32>>,
}

/// How [`pack`] places records into rows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Policy {
    /// Records in batch order, each into the lowest-numbered row with room
    /// for it. Rows hold their records in batch order.
    #[default]
    FirstFit,
    /// Best-fit decreasing: records longest first (ties in batch order),
    /// each into the row with the least room that still fits it (ties to
    /// the lower row). Usually needs fewer rows than first-fit.
    BestFit,
}

/// How [`pack`] shapes a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PackSpec {
    /// Slots per row (at least 1, at most `i32::MAX`). A longer record is
    /// truncated to its first `max_tokens` items.
    pub max_tokens: usize,
    /// Rows per batch; `None` means one per record of the batch, which
    /// always has room for every record. With fewer, records that find no
    /// row with room are dropped and counted ([`RowPackedBatch::dropped`]).
    pub rows: Option<usize>,
    /// Placement order and rule.
    pub policy: Policy,
    /// The bytes of one item of the records' dtype for empty slots; empty
    /// means zero bytes.
    pub value: Vec<u8>,
}

impl PackSpec {
    /// First-fit into one row of `max_tokens` zero-padded slots per record.
    pub fn new(max_tokens: usize) -> PackSpec {
        PackSpec {
            max_tokens,
            rows: None,
            policy: Policy::FirstFit,
            value: Vec::new(),
        }
    }

    fn validate(&self) -> Result<()> {
        if self.max_tokens == 0 || self.max_tokens > i32::MAX as usize {
            return Err(Error::InvalidArgument(format!(
                "max_tokens must be in 1..={}, got {}",
                i32::MAX,
                self.max_tokens
            )));
        }
        if let Some(rows) = self.rows {
            if rows == 0 {
                return Err(Error::InvalidArgument(
                    "pack rows must be at least 1".into(),
                ));
            }
            // The int32 segment ids alone take 4 bytes a slot.
            budget("packed segment ids", &[rows, self.max_tokens, 4])?;
        }
        Ok(())
    }
}

/// A batch packed into rows.
///
/// The segment ids and positions are little-endian `i32`s in aligned
/// buffers, so they reach NumPy (and DLPack) without a copy; the `_vec`
/// methods decode them.
#[derive(Debug)]
pub struct RowPackedBatch {
    /// C-order `[rows, max_tokens, *rest]` items of the records' dtype.
    pub values: Buf,
    /// Number of rows.
    pub rows: usize,
    /// Slots per row.
    pub max_tokens: usize,
    /// The records' shape after the first axis.
    pub rest: Vec<u64>,
    /// `[rows, max_tokens]` i32: 1-based number of the record within its
    /// row, in slot order; 0 on padding.
    pub segment_ids: Buf,
    /// `[rows, max_tokens]` i32: the item's index within its record; 0 on
    /// padding.
    pub positions: Buf,
    /// `[records, 3]`, in batch order: the row, the first slot and the
    /// number of items placed for each record; `-1, -1, 0` for a dropped one.
    pub placement: Vec<i32>,
    /// Records that found no row with room (only when
    /// [`PackSpec::rows`] is smaller than the batch).
    pub dropped: usize,
}

impl RowPackedBatch {
    /// [`segment_ids`](Self::segment_ids), decoded.
    pub fn segment_ids_vec(&self) -> Vec<i32> {
        decode_i32(&self.segment_ids)
    }

    /// [`positions`](Self::positions), decoded.
    pub fn positions_vec(&self) -> Vec<i32> {
        decode_i32(&self.positions)
    }

    /// Real items over slots: how much of the batch's `values` is records.
    pub fn efficiency(&self) -> f64 {
        let slots = self.rows * self.max_tokens;
        let used: i64 = self.placement.chunks_exact(3).map(|p| p[2] as i64).sum();
        if slots == 0 {
            0.0
        } else {
            used as f64 / slots as f64
        }
    }
}

fn decode_i32(bytes: &[u8]) -> Vec<i32> {
    bytes
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The product of `factors` in bytes, refused beyond [`MAX_SHAPED_BYTES`].
fn budget(what: &str, factors: &[usize]) -> Result<usize> {
    let total = factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&t| t <= MAX_SHAPED_BYTES);
    total.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "the {what} would take {} bytes a batch, over the limit of {MAX_SHAPED_BYTES}: \
             use a smaller length, max_tokens or rows",
            factors
                .iter()
                .map(|f| f.to_string())
                .collect::<Vec<_>>()
                .join(" x ")
        ))
    })
}

/// An output buffer of `len` bytes from the batch-buffer cache.
fn take(len: usize) -> Result<Buf> {
    buffers::take(len).ok_or_else(|| Error::OutOfMemory(format!("a {len}-byte shaped batch")))
}

/// How a batch's records name themselves in errors: by store index when
/// the indices are known (inside a loader), else by batch position.
fn record_name(indices: Option<&[u64]>, k: usize) -> String {
    match indices.and_then(|ix| ix.get(k)) {
        Some(i) => format!("record {i} (batch position {k})"),
        None => format!("record {k} of the batch"),
    }
}

fn fmt_shape(shape: &[u64]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    if dims.len() == 1 {
        format!("({},)", dims[0])
    } else {
        format!("({})", dims.join(", "))
    }
}

/// The batch's items: the common `rest`, bytes per item and each record's
/// length along the first axis.
struct Items {
    rest: Vec<u64>,
    item_bytes: usize,
    lengths: Vec<usize>,
}

fn items(batch: &RaggedBatch, indices: Option<&[u64]>, what: &str, value: &[u8]) -> Result<Items> {
    let itemsize = batch.itemsize() as usize;
    if !value.is_empty() && value.len() != itemsize {
        return Err(Error::InvalidArgument(format!(
            "the {what} pad value has {} bytes, but the stream's items have {itemsize}",
            value.len()
        )));
    }
    let mut rest: Option<(usize, &[u64])> = None;
    let mut lengths = Vec::with_capacity(batch.len());
    for k in 0..batch.len() {
        let shape = batch.shape(k);
        let Some((&len, tail)) = shape.split_first() else {
            return Err(Error::InvalidArgument(format!(
                "{} is a scalar (shape ()): {what} works along the first axis and needs \
                 records of rank 1 or more",
                record_name(indices, k)
            )));
        };
        match rest {
            None => rest = Some((k, tail)),
            Some((first, want)) if want != tail => {
                return Err(Error::InvalidArgument(format!(
                    "{what} needs records that agree on every dimension after the first: \
                     {} has shape {}, {} has shape {}",
                    record_name(indices, first),
                    fmt_shape(batch.shape(first)),
                    record_name(indices, k),
                    fmt_shape(shape)
                )))
            }
            Some(_) => {}
        }
        lengths.push(usize::try_from(len).map_err(|_| {
            Error::InvalidArgument(format!("{} is too long", record_name(indices, k)))
        })?);
    }
    let rest = rest.map(|(_, r)| r.to_vec()).unwrap_or_default();
    let mut item_bytes = itemsize;
    for &d in &rest {
        item_bytes = usize::try_from(d)
            .ok()
            .and_then(|d| item_bytes.checked_mul(d))
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{what}: items of shape {rest:?} are too large"))
            })?;
    }
    // The reader checked each payload against its shape; a mismatch here
    // would mean a bug upstream, so it is reported rather than trusted.
    for (k, &len) in lengths.iter().enumerate() {
        if len.checked_mul(item_bytes) != Some(batch.payload(k).len()) {
            return Err(Error::Corrupt(format!(
                "{} has {} payload bytes for shape {}",
                record_name(indices, k),
                batch.payload(k).len(),
                fmt_shape(batch.shape(k))
            )));
        }
    }
    Ok(Items {
        rest,
        item_bytes,
        lengths,
    })
}

/// Fills `dst` with copies of the item `value` (zeros when empty or zero).
fn fill_items(dst: &mut [u8], value: &[u8]) {
    if value.iter().all(|&b| b == 0) {
        dst.fill(0);
        return;
    }
    let n = value.len();
    // Callers fill whole items; an empty run has nothing to fill.
    debug_assert_eq!(dst.len() % n, 0);
    if dst.len() < n {
        return;
    }
    dst[..n].copy_from_slice(value);
    // Doubling copies: a few memcpys however long the run.
    let mut done = n;
    while done < dst.len() {
        let step = done.min(dst.len() - done);
        dst.copy_within(..step, done);
        done += step;
    }
}

fn put_i32(dst: &mut [u8], v: i32) {
    for c in dst.chunks_exact_mut(4) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// 0, 1, 2, ... (at most `max_tokens`, which fits an i32).
fn put_positions(dst: &mut [u8]) {
    for (j, c) in dst.chunks_exact_mut(4).enumerate() {
        c.copy_from_slice(&(j as i32).to_le_bytes());
    }
}

/// Pads (or truncates) every record of `batch` to `spec.length` items
/// along its first axis. Row `k` is record `k`; see [`PadSpec`] for where
/// padding goes and which items a long record keeps.
pub fn pad(batch: &RaggedBatch, spec: &PadSpec) -> Result<PaddedBatch> {
    pad_records(batch, spec, None)
}

fn pad_records(
    batch: &RaggedBatch,
    spec: &PadSpec,
    indices: Option<&[u64]>,
) -> Result<PaddedBatch> {
    spec.validate()?;
    let Items {
        rest,
        item_bytes,
        lengths,
    } = items(batch, indices, "padding", &spec.value)?;
    let rows = lengths.len();
    let length = spec.length;
    let row_bytes = budget("padded values", &[length, item_bytes])?;
    let mut values = take(budget("padded values", &[rows, length, item_bytes])?)?;
    let mut mask = if spec.mask {
        Some(take(budget("padding mask", &[rows, length])?)?)
    } else {
        None
    };
    let mut kept = Vec::with_capacity(if spec.lengths { rows } else { 0 });
    for (k, &len) in lengths.iter().enumerate() {
        let keep = len.min(length);
        let from = match spec.truncate {
            Side::Right => 0,
            Side::Left => len - keep,
        };
        let at = match spec.side {
            Side::Right => 0,
            Side::Left => length - keep,
        };
        let src = &batch.payload(k)[from * item_bytes..(from + keep) * item_bytes];
        let row = &mut values[k * row_bytes..(k + 1) * row_bytes];
        let (before, tail) = row.split_at_mut(at * item_bytes);
        let (data, after) = tail.split_at_mut(keep * item_bytes);
        data.copy_from_slice(src);
        fill_items(before, &spec.value);
        fill_items(after, &spec.value);
        if let Some(mask) = mask.as_mut() {
            let row = &mut mask[k * length..(k + 1) * length];
            row.fill(0);
            row[at..at + keep].fill(1);
        }
        if spec.lengths {
            // keep <= length <= i32::MAX (validated).
            kept.push(keep as i32);
        }
    }
    Ok(PaddedBatch {
        values,
        rows,
        length,
        rest,
        mask,
        lengths: spec.lengths.then_some(kept),
    })
}

/// Where each record goes when `lengths` (already at most `max_tokens`)
/// are packed into `rows` rows of `max_tokens` slots under `policy`:
/// `(row, first slot)` per record in batch order, `None` for a record no
/// row has room for.
///
/// Records are appended to their row, so a row's records sit in the order
/// they were placed. A record of length 0 takes no slot but is still
/// placed (it fits anywhere).
///
/// ```
/// use loaderx::shape::{plan, Policy};
///
/// let lengths = [3, 5, 2, 4];
/// // First-fit in batch order into 6-slot rows: 3 -> row 0, 5 -> row 1,
/// // 2 -> row 0 (after the 3), 4 -> row 2.
/// assert_eq!(
///     plan(&lengths, 6, 3, Policy::FirstFit),
///     [Some((0, 0)), Some((1, 0)), Some((0, 3)), Some((2, 0))]
/// );
/// // Best-fit decreasing: 5 -> row 0, 4 -> row 1, 3 -> row 2, 2 -> row 1.
/// assert_eq!(
///     plan(&lengths, 6, 3, Policy::BestFit),
///     [Some((2, 0)), Some((0, 0)), Some((1, 4)), Some((1, 0))]
/// );
/// // Two rows: first-fit has no room left for the 4.
/// assert_eq!(plan(&lengths, 6, 2, Policy::FirstFit)[3], None);
/// ```
pub fn plan(
    lengths: &[usize],
    max_tokens: usize,
    rows: usize,
    policy: Policy,
) -> Vec<Option<(usize, usize)>> {
    let mut out = vec![None; lengths.len()];
    if rows == 0 {
        return out;
    }
    match policy {
        Policy::FirstFit => {
            let mut room = RoomTree::new(rows, max_tokens);
            for (k, &len) in lengths.iter().enumerate() {
                if let Some(row) = room.first_with(len) {
                    let left = room.get(row);
                    room.set(row, left - len);
                    out[k] = Some((row, max_tokens - left));
                }
            }
        }
        Policy::BestFit => {
            let mut order: Vec<usize> = (0..lengths.len()).collect();
            // Stable: equal lengths keep their batch order.
            order.sort_by_key(|&k| std::cmp::Reverse(lengths[k]));
            // (room left, row): the first entry at or above a length is the
            // tightest row that fits, the lower row on ties.
            let mut room: BTreeSet<(usize, usize)> = (0..rows).map(|r| (max_tokens, r)).collect();
            for k in order {
                let len = lengths[k];
                if let Some(&(left, row)) = room.range((len, 0)..).next() {
                    room.remove(&(left, row));
                    room.insert((left - len, row));
                    out[k] = Some((row, max_tokens - left));
                }
            }
        }
    }
    out
}

/// Room left per row, as a max segment tree, so first-fit finds the lowest
/// row with room for `n` in O(log rows) instead of scanning every row.
struct RoomTree {
    leaves: usize,
    /// Node `i` holds the most room among its leaves; leaves at
    /// `leaves..2*leaves`. Leaves past the last row hold -1 (never fit).
    max: Vec<i64>,
}

impl RoomTree {
    fn new(rows: usize, room: usize) -> RoomTree {
        let leaves = rows.next_power_of_two();
        let mut max = vec![-1i64; 2 * leaves];
        max[leaves..leaves + rows].fill(room as i64);
        for i in (1..leaves).rev() {
            max[i] = max[2 * i].max(max[2 * i + 1]);
        }
        RoomTree { leaves, max }
    }

    fn get(&self, row: usize) -> usize {
        self.max[self.leaves + row] as usize
    }

    fn set(&mut self, row: usize, room: usize) {
        let mut i = self.leaves + row;
        self.max[i] = room as i64;
        while i > 1 {
            i /= 2;
            self.max[i] = self.max[2 * i].max(self.max[2 * i + 1]);
        }
    }

    fn first_with(&self, n: usize) -> Option<usize> {
        let n = n as i64;
        if self.max[1] < n {
            return None;
        }
        let mut i = 1;
        while i < self.leaves {
            i = if self.max[2 * i] >= n {
                2 * i
            } else {
                2 * i + 1
            };
        }
        Some(i - self.leaves)
    }
}

/// Packs the records of `batch` whole into rows of `spec.max_tokens` slots
/// (see [`PackSpec`], [`Policy`] and [`plan`]); every item placed lands in
/// exactly one `(row, slot)`.
pub fn pack(batch: &RaggedBatch, spec: &PackSpec) -> Result<RowPackedBatch> {
    pack_records(batch, spec, None)
}

fn pack_records(
    batch: &RaggedBatch,
    spec: &PackSpec,
    indices: Option<&[u64]>,
) -> Result<RowPackedBatch> {
    spec.validate()?;
    let Items {
        rest,
        item_bytes,
        lengths,
    } = items(batch, indices, "packing", &spec.value)?;
    let mt = spec.max_tokens;
    let rows = spec.rows.unwrap_or(lengths.len());
    let placed: Vec<usize> = lengths.iter().map(|&l| l.min(mt)).collect();
    let row_bytes = budget("packed values", &[mt, item_bytes])?;
    let mut values = take(budget("packed values", &[rows, mt, item_bytes])?)?;
    let mut segment_ids = take(budget("packed segment ids", &[rows, mt, 4])?)?;
    let mut positions = take(budget("packed positions", &[rows, mt, 4])?)?;
    let at = plan(&placed, mt, rows, spec.policy);

    let mut placement = vec![0i32; 3 * lengths.len()];
    let mut dropped = 0;
    // (row, slot, record) of the records with items, in slot order within
    // each row, which is what numbers their segments.
    let mut order = Vec::with_capacity(lengths.len());
    for (k, spot) in at.iter().enumerate() {
        // rows * max_tokens fits the budget, so row, slot and length fit i32
        // (max_tokens <= i32::MAX; rows <= 2^32 / 4 / max_tokens).
        let entry = match *spot {
            Some((row, slot)) => {
                if placed[k] > 0 {
                    order.push((row, slot, k));
                }
                [row as i32, slot as i32, placed[k] as i32]
            }
            None => {
                dropped += 1;
                [-1, -1, 0]
            }
        };
        placement[3 * k..3 * k + 3].copy_from_slice(&entry);
    }
    order.sort_unstable();

    let mut fill = vec![0usize; rows];
    let mut segments = vec![0i32; rows];
    for &(row, slot, k) in &order {
        let len = placed[k];
        debug_assert_eq!(fill[row], slot);
        let first = row * mt + slot;
        values[first * item_bytes..(first + len) * item_bytes]
            .copy_from_slice(&batch.payload(k)[..len * item_bytes]);
        segments[row] += 1;
        put_i32(
            &mut segment_ids[4 * first..4 * (first + len)],
            segments[row],
        );
        put_positions(&mut positions[4 * first..4 * (first + len)]);
        fill[row] = slot + len;
    }
    for (row, &used) in fill.iter().enumerate() {
        let (from, to) = (row * mt + used, (row + 1) * mt);
        fill_items(&mut values[from * item_bytes..to * item_bytes], &spec.value);
        segment_ids[4 * from..4 * to].fill(0);
        positions[4 * from..4 * to].fill(0);
    }
    debug_assert_eq!(values.len(), rows * row_bytes);
    Ok(RowPackedBatch {
        values,
        rows,
        max_tokens: mt,
        rest,
        segment_ids,
        positions,
        placement,
        dropped,
    })
}

/// Wraps a Ragged source so its batches come padded ([`Column::Padded`]).
/// A source that gives anything but Ragged batches is an error at the
/// first gather.
pub struct Padded<S> {
    source: S,
    spec: PadSpec,
}

impl<S: Source> Padded<S> {
    /// Pads `source`'s batches as `spec` says; refuses an invalid spec.
    pub fn new(source: S, spec: PadSpec) -> Result<Padded<S>> {
        spec.validate()?;
        Ok(Padded { source, spec })
    }
}

/// Wraps a Ragged source so its batches come packed into rows
/// ([`Column::RowPacked`]). A source that gives anything but Ragged batches
/// is an error at the first gather.
pub struct RowPacked<S> {
    source: S,
    spec: PackSpec,
}

impl<S: Source> RowPacked<S> {
    /// Packs `source`'s batches as `spec` says; refuses an invalid spec
    /// (including a `rows * max_tokens` over [`MAX_SHAPED_BYTES`]).
    pub fn new(source: S, spec: PackSpec) -> Result<RowPacked<S>> {
        spec.validate()?;
        Ok(RowPacked { source, spec })
    }
}

/// Gathers a Ragged batch from `source` and shapes it, recycling the
/// Ragged buffer once its records are copied out.
fn shaped<S: Source, T>(
    source: &S,
    indices: &[u64],
    what: &str,
    shape: impl FnOnce(&RaggedBatch) -> Result<T>,
) -> Result<T> {
    match source.gather(indices)? {
        Column::Ragged(batch) => {
            let out = shape(&batch);
            buffers::recycle(batch.into_data());
            out
        }
        _ => Err(Error::InvalidArgument(format!(
            "{what} needs a Ragged stream; this one has fixed-shape records already"
        ))),
    }
}

impl<S: Source> Source for Padded<S> {
    fn len(&self) -> u64 {
        self.source.len()
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        shaped(&self.source, indices, "padding", |b| {
            pad_records(b, &self.spec, Some(indices))
        })
        .map(Column::Padded)
    }

    // The Ragged gather's buffer is the one hint the source can give; it
    // goes back to the cache as soon as the batch is shaped.
    fn batch_bytes_hint(&self, rows: usize) -> usize {
        self.source.batch_bytes_hint(rows)
    }
}

impl<S: Source> Source for RowPacked<S> {
    fn len(&self) -> u64 {
        self.source.len()
    }

    fn gather(&self, indices: &[u64]) -> Result<Column> {
        shaped(&self.source, indices, "packing", |b| {
            pack_records(b, &self.spec, Some(indices))
        })
        .map(Column::RowPacked)
    }

    fn batch_bytes_hint(&self, rows: usize) -> usize {
        self.source.batch_bytes_hint(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RaggedRecord;

    /// A batch of u16 records with the given shapes; record k's items count
    /// up from 1000 * (k + 1), so every item is distinct.
    fn batch(shapes: &[Vec<u64>]) -> RaggedBatch {
        let mut data = Vec::new();
        let mut ranges = Vec::new();
        for (k, shape) in shapes.iter().enumerate() {
            let n: u64 = shape.iter().product();
            let payload: Vec<u8> = (0..n)
                .flat_map(|j| (1000 * (k as u16 + 1) + j as u16).to_le_bytes())
                .collect();
            let start = data.len().next_multiple_of(16);
            data.resize(start, 0);
            RaggedRecord {
                shape,
                payload: &payload,
            }
            .encode_into(&mut data);
            ranges.push(start..data.len());
        }
        let indices: Vec<u64> = (0..shapes.len() as u64).collect();
        RaggedBatch::from_gather(data.into(), ranges, &indices, 2).unwrap()
    }

    fn lens(lengths: &[u64]) -> RaggedBatch {
        batch(&lengths.iter().map(|&l| vec![l]).collect::<Vec<_>>())
    }

    fn u16s(bytes: &[u8]) -> Vec<u16> {
        bytes
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    fn item(k: usize, j: usize) -> u16 {
        1000 * (k as u16 + 1) + j as u16
    }

    /// A small deterministic generator (splitmix64), so the tests need no
    /// dependency and every seed is reproducible.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    #[test]
    fn pads_and_truncates_on_either_side() {
        let b = lens(&[2, 4, 1, 6]);
        let mut spec = PadSpec::new(4);
        spec.value = 7u16.to_le_bytes().to_vec();
        let p = pad(&b, &spec).unwrap();
        assert_eq!((p.rows, p.length, p.rest.as_slice()), (4, 4, &[][..]));
        assert_eq!(
            u16s(&p.values),
            [1000, 1001, 7, 7, 2000, 2001, 2002, 2003, 3000, 7, 7, 7, 4000, 4001, 4002, 4003]
        );
        assert_eq!(
            p.mask.as_deref().unwrap(),
            [1, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1]
        );
        assert_eq!(p.lengths, Some(vec![2, 4, 1, 4]));

        spec.side = Side::Left;
        spec.truncate = Side::Left;
        spec.lengths = false;
        let p = pad(&b, &spec).unwrap();
        assert_eq!(
            u16s(&p.values),
            [7, 7, 1000, 1001, 2000, 2001, 2002, 2003, 7, 7, 7, 3000, 4002, 4003, 4004, 4005]
        );
        assert_eq!(
            p.mask.as_deref().unwrap(),
            [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1]
        );
        assert!(p.lengths.is_none());
    }

    #[test]
    fn pads_multi_dimensional_records_along_the_first_axis() {
        let b = batch(&[vec![1, 3], vec![3, 3]]);
        let mut spec = PadSpec::new(2);
        spec.mask = false;
        let p = pad(&b, &spec).unwrap();
        assert_eq!(p.rest, [3]);
        assert!(p.mask.is_none());
        assert_eq!(
            u16s(&p.values),
            [1000, 1001, 1002, 0, 0, 0, 2000, 2001, 2002, 2003, 2004, 2005]
        );
        assert_eq!(p.lengths, Some(vec![1, 2]));
    }

    #[test]
    fn mismatched_rest_dims_and_scalars_are_named() {
        let err = pad(
            &batch(&[vec![2, 3], vec![1, 3], vec![2, 4]]),
            &PadSpec::new(4),
        )
        .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("record 0 of the batch has shape (2, 3)")
                && msg.contains("record 2 of the batch has shape (2, 4)"),
            "{msg}"
        );
        let err = pack(&batch(&[vec![2], vec![]]), &PackSpec::new(4)).unwrap_err();
        assert!(
            err.to_string()
                .contains("record 1 of the batch is a scalar"),
            "{err}"
        );
        // Inside a loader the store index comes first.
        let err = pack_records(
            &batch(&[vec![2], vec![]]),
            &PackSpec::new(4),
            Some(&[17, 23]),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("record 23 (batch position 1)"),
            "{err}"
        );
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(pad(&lens(&[1]), &PadSpec::new(0)).is_err());
        assert!(pack(&lens(&[1]), &PackSpec::new(0)).is_err());
        let mut spec = PadSpec::new(3);
        spec.value = vec![1, 2, 3];
        let err = pad(&lens(&[1]), &spec).unwrap_err();
        assert!(err.to_string().contains("pad value has 3 bytes"), "{err}");
        // Absurd sizes are refused before anything is allocated.
        let huge = PackSpec {
            rows: Some(1 << 20),
            ..PackSpec::new(1 << 20)
        };
        let err = huge.validate().unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        let err = pad(&lens(&[1; 64]), &PadSpec::new(i32::MAX as usize)).unwrap_err();
        assert!(err.to_string().contains("over the limit"), "{err}");
        assert!(PackSpec {
            rows: Some(0),
            ..PackSpec::new(4)
        }
        .validate()
        .is_err());
    }

    /// Checks every invariant of a packed batch against its records.
    fn check_packed(b: &RaggedBatch, spec: &PackSpec, p: &RowPackedBatch) {
        let mt = spec.max_tokens;
        let rows = spec.rows.unwrap_or(b.len());
        assert_eq!((p.rows, p.max_tokens), (rows, mt));
        assert_eq!(p.values.len(), rows * mt * 2);
        let values = u16s(&p.values);
        let seg = p.segment_ids_vec();
        let pos = p.positions_vec();
        let mut claimed = vec![false; rows * mt];
        let mut dropped = 0;
        for k in 0..b.len() {
            let len = b.shape(k)[0] as usize;
            let q = &p.placement[3 * k..3 * k + 3];
            if q[0] < 0 {
                assert_eq!(q, [-1, -1, 0]);
                assert!(spec.rows.is_some(), "nothing drops with a row per record");
                dropped += 1;
                continue;
            }
            let (row, slot, n) = (q[0] as usize, q[1] as usize, q[2] as usize);
            assert_eq!(n, len.min(mt), "record {k}: truncated to max_tokens");
            assert!(slot + n <= mt);
            for j in 0..n {
                let s = row * mt + slot + j;
                assert!(!claimed[s], "slot {s} taken twice");
                claimed[s] = true;
                assert_eq!(values[s], item(k, j));
                assert_eq!(pos[s], j as i32);
                assert_eq!(seg[s], seg[row * mt + slot]);
            }
        }
        assert_eq!(p.dropped, dropped);
        for s in 0..rows * mt {
            if !claimed[s] {
                assert_eq!((values[s], seg[s], pos[s]), (0, 0, 0), "padding at {s}");
            }
        }
        // Segment ids run 1, 2, ... in slot order along each row, changing
        // exactly where a record starts, and padding only trails.
        for row in 0..rows {
            let ids = &seg[row * mt..(row + 1) * mt];
            let poss = &pos[row * mt..(row + 1) * mt];
            let mut last = 0;
            for (s, &id) in ids.iter().enumerate() {
                if id == 0 {
                    assert!(
                        ids[s..].iter().all(|&i| i == 0),
                        "row {row}: padding then data"
                    );
                    break;
                }
                assert!(id == last || id == last + 1, "row {row}: {ids:?}");
                assert_eq!(id != last, poss[s] == 0, "row {row} slot {s}");
                last = id;
            }
        }
    }

    #[test]
    fn every_item_lands_in_exactly_one_slot() {
        for seed in 0..40u64 {
            let mut rng = Rng(seed);
            let n = 1 + rng.below(40) as usize;
            let mt = 1 + rng.below(64) as usize;
            let lengths: Vec<u64> = (0..n)
                .map(|_| match rng.below(6) {
                    0 => 1,
                    1 => mt as u64,
                    2 => mt as u64 + 1 + rng.below(10),
                    _ => 1 + rng.below(mt as u64),
                })
                .collect();
            let b = lens(&lengths);
            for policy in [Policy::FirstFit, Policy::BestFit] {
                for rows in [None, Some(1), Some(1 + n / 3)] {
                    let spec = PackSpec {
                        rows,
                        policy,
                        ..PackSpec::new(mt)
                    };
                    let p = pack(&b, &spec).unwrap();
                    check_packed(&b, &spec, &p);
                    // A pure function of the batch.
                    let again = pack(&b, &spec).unwrap();
                    assert_eq!(&p.values[..], &again.values[..]);
                    assert_eq!(p.placement, again.placement);
                }
            }
        }
    }

    #[test]
    fn first_fit_and_best_fit_differ_where_they_should() {
        // 6-slot rows. First-fit in batch order fills [2 3 1] [4] [5] [3]:
        // 4 rows; best-fit decreasing fills [5 1] [4 2] [3 3]: 3 rows.
        let lengths = [2usize, 3, 4, 5, 1, 3];
        let ff = plan(&lengths, 6, 6, Policy::FirstFit);
        let bf = plan(&lengths, 6, 6, Policy::BestFit);
        assert_eq!(
            ff,
            [
                Some((0, 0)),
                Some((0, 2)),
                Some((1, 0)),
                Some((2, 0)),
                Some((0, 5)),
                Some((3, 0))
            ]
        );
        // Decreasing: 5 -> r0, 4 -> r1, 3 -> r2, 3 -> r2, 2 -> r1, 1 -> r0.
        assert_eq!(
            bf,
            [
                Some((1, 4)),
                Some((2, 0)),
                Some((1, 0)),
                Some((0, 0)),
                Some((0, 5)),
                Some((2, 3))
            ]
        );
        let rows_used = |p: &[Option<(usize, usize)>]| {
            p.iter()
                .flatten()
                .map(|&(r, _)| r)
                .max()
                .map_or(0, |r| r + 1)
        };
        assert_eq!((rows_used(&ff), rows_used(&bf)), (4, 3));
        // Best-fit goes to the tightest row, first-fit to the first one.
        let lengths = [4usize, 5, 1];
        assert_eq!(plan(&lengths, 6, 2, Policy::FirstFit)[2], Some((0, 4)));
        assert_eq!(plan(&lengths, 6, 2, Policy::BestFit)[2], Some((0, 5)));
    }

    #[test]
    fn fixed_rows_drop_and_count_what_does_not_fit() {
        let b = lens(&[5, 5, 5, 1]);
        let spec = PackSpec {
            rows: Some(2),
            ..PackSpec::new(6)
        };
        let p = pack(&b, &spec).unwrap();
        assert_eq!(p.dropped, 1);
        assert_eq!(&p.placement[6..9], [-1, -1, 0]);
        assert_eq!(&p.placement[9..12], [0, 5, 1]);
        check_packed(&b, &spec, &p);
        assert!((p.efficiency() - 11.0 / 12.0).abs() < 1e-12);
    }

    #[test]
    fn packs_multi_dimensional_items_with_a_pad_value() {
        let b = batch(&[vec![2, 2], vec![1, 2]]);
        let spec = PackSpec {
            value: 9u16.to_le_bytes().to_vec(),
            ..PackSpec::new(4)
        };
        let p = pack(&b, &spec).unwrap();
        assert_eq!((p.rows, p.rest.as_slice()), (2, &[2][..]));
        assert_eq!(
            u16s(&p.values),
            [1000, 1001, 1002, 1003, 2000, 2001, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9]
        );
        assert_eq!(p.segment_ids_vec(), [1, 1, 2, 0, 0, 0, 0, 0]);
        assert_eq!(p.positions_vec(), [0, 1, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn empty_batches_and_records() {
        let p = pack(&RaggedBatch::default(), &PackSpec::new(8)).unwrap();
        assert_eq!((p.rows, p.values.len(), p.dropped), (0, 0, 0));
        let p = pad(&RaggedBatch::default(), &PadSpec::new(8)).unwrap();
        assert_eq!((p.rows, p.values.len()), (0, 0));
        // Stores hold no zero-byte records, but other sources may give
        // them: they are placed at their row's fill point and take no slot.
        assert_eq!(
            plan(&[0, 3, 0], 4, 3, Policy::FirstFit),
            [Some((0, 0)), Some((0, 0)), Some((0, 3))]
        );
        assert_eq!(
            plan(&[0, 3, 0], 4, 3, Policy::BestFit),
            [Some((0, 3)), Some((0, 0)), Some((0, 3))]
        );
    }

    #[test]
    fn fill_items_repeats_the_pattern() {
        let mut dst = [0u8; 11];
        fill_items(&mut dst[..10], &[1, 2]);
        assert_eq!(dst, [1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 0]);
        fill_items(&mut dst, &[]);
        assert_eq!(dst, [0; 11]);
    }

    /// A Dense source, to check the wrappers refuse it.
    struct DenseOnly;
    impl Source for DenseOnly {
        fn len(&self) -> u64 {
            4
        }
        fn gather(&self, indices: &[u64]) -> Result<Column> {
            Ok(Column::Dense(crate::loader::DenseBatch {
                data: vec![0u8; indices.len()].into(),
                rows: indices.len(),
                width: 1,
            }))
        }
    }

    #[test]
    fn wrappers_refuse_dense_sources_and_bad_specs() {
        let err = Padded::new(DenseOnly, PadSpec::new(3))
            .unwrap()
            .gather(&[0, 1])
            .unwrap_err();
        assert!(
            err.to_string().contains("padding needs a Ragged stream"),
            "{err}"
        );
        let err = RowPacked::new(DenseOnly, PackSpec::new(3))
            .unwrap()
            .gather(&[0])
            .unwrap_err();
        assert!(
            err.to_string().contains("packing needs a Ragged stream"),
            "{err}"
        );
        assert!(Padded::new(DenseOnly, PadSpec::new(0)).is_err());
        assert!(RowPacked::new(DenseOnly, PackSpec::new(0)).is_err());
    }
}
