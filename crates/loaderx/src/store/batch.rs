//! The results of Ragged gathers: records sharing one buffer, and the
//! packed (variable-length attention) layout.

use std::ops::Range;

use crate::buffers::Buf;
use crate::error::{Error, Result};
use crate::store::geometry::parse_ragged;

/// One Ragged gather: every record's bytes in one buffer, with their shapes.
#[derive(Debug, Default)]
pub struct RaggedBatch {
    data: Buf,
    payloads: Vec<Range<usize>>,
    shape_starts: Vec<usize>,
    dims: Vec<u64>,
    itemsize: u64,
}

impl RaggedBatch {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.payloads.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.payloads.is_empty()
    }

    /// Shape of record `i`.
    pub fn shape(&self, i: usize) -> &[u64] {
        &self.dims[self.shape_starts[i]..self.shape_starts[i + 1]]
    }

    /// Byte range of record `i`'s payload in [`data`](Self::data).
    pub fn payload_range(&self, i: usize) -> Range<usize> {
        self.payloads[i].clone()
    }

    /// C-order bytes of record `i`.
    pub fn payload(&self, i: usize) -> &[u8] {
        &self.data[self.payloads[i].clone()]
    }

    /// The shared buffer holding every record.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Bytes per item of the records' dtype.
    pub fn itemsize(&self) -> u64 {
        self.itemsize
    }

    /// Takes the shared buffer out of the batch.
    pub fn into_data(self) -> Buf {
        self.data
    }

    /// Builds the batch from [`StoreReader::gather_var`](crate::store::StoreReader::gather_var) output, parsing and
    /// checking every record's shape prefix.
    pub fn from_gather(
        data: Buf,
        ranges: Vec<Range<usize>>,
        indices: &[u64],
        itemsize: u64,
    ) -> Result<RaggedBatch> {
        Self::from_gather_with(data, ranges, indices, itemsize, parse_ragged)
    }

    /// As [`RaggedBatch::from_gather`], with the shape prefixes parsed by
    /// `parse` (the encoding of the store's layout; see
    /// [`RaggedPrefix`](crate::store::RaggedPrefix)).
    pub fn from_gather_with(
        data: Buf,
        ranges: Vec<Range<usize>>,
        indices: &[u64],
        itemsize: u64,
        parse: impl Fn(u64, &[u8], u64, &mut Vec<u64>) -> Result<usize>,
    ) -> Result<RaggedBatch> {
        let mut payloads = Vec::with_capacity(ranges.len());
        let mut shape_starts = Vec::with_capacity(ranges.len() + 1);
        let mut dims = Vec::new();
        shape_starts.push(0);
        for (r, &i) in ranges.iter().zip(indices) {
            let prefix = parse(i, &data[r.clone()], itemsize, &mut dims)?;
            payloads.push(r.start + prefix..r.end);
            shape_starts.push(dims.len());
        }
        Ok(RaggedBatch {
            data,
            payloads,
            shape_starts,
            dims,
            itemsize,
        })
    }
}

/// Ragged records packed back to back: the layout variable-length attention
/// kernels take.
///
/// `values` holds every record's elements in order, `cu_seqlens[i]..cu_seqlens[i + 1]`
/// are record `i`'s elements (in units of items, starting at 0), and
/// `shapes` holds each record's shape (`ndim` entries per record).
#[derive(Debug, Default)]
pub struct PackedBatch {
    /// All payload bytes, back to back.
    pub values: Buf,
    /// Element offsets, `len() + 1` entries, starting at 0.
    pub cu_seqlens: Vec<i32>,
    /// Shapes, row-major `(len(), ndim)`.
    pub shapes: Vec<u64>,
    /// The common rank of the records.
    pub ndim: usize,
}

impl PackedBatch {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.cu_seqlens.len().saturating_sub(1)
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl RaggedBatch {
    /// Packs the payloads back to back, in place (one pass of moves, no new
    /// buffer). Records must share one rank, and the batch may hold at most
    /// `i32::MAX` elements, the range of `cu_seqlens`.
    pub fn into_packed(self) -> Result<PackedBatch> {
        let n = self.len();
        let itemsize = self.itemsize.max(1);
        let ndim = if n == 0 { 0 } else { self.shape(0).len() };
        if let Some(k) = (0..n).find(|&k| self.shape(k).len() != ndim) {
            return Err(Error::InvalidArgument(format!(
                "records of different ranks cannot be packed: record 0 has rank {ndim}, \
                 record {k} has rank {}",
                self.shape(k).len()
            )));
        }
        let mut cu_seqlens = Vec::with_capacity(n + 1);
        cu_seqlens.push(0i32);
        let mut shapes = Vec::with_capacity(n * ndim);
        let mut elements: u64 = 0;
        for k in 0..n {
            shapes.extend_from_slice(self.shape(k));
            elements += self.payloads[k].len() as u64 / itemsize;
            let offset = i32::try_from(elements).map_err(|_| {
                Error::InvalidArgument(format!(
                    "a packed batch holds at most {} elements; these records hold more",
                    i32::MAX
                ))
            })?;
            cu_seqlens.push(offset);
        }
        let RaggedBatch {
            mut data, payloads, ..
        } = self;
        let mut write = 0usize;
        for r in payloads {
            let len = r.len();
            data.copy_within(r, write);
            write += len;
        }
        data.truncate(write);
        Ok(PackedBatch {
            values: data,
            cu_seqlens,
            shapes,
            ndim,
        })
    }
}

/// Takes the next unused record of `parts[picks[j]]` for each `j`; the
/// cursor bookkeeping shared by the interleaving merges of mixtures.
fn interleave_order(lens: &[usize], picks: &[u32]) -> Result<Vec<(usize, usize)>> {
    let mut next = vec![0usize; lens.len()];
    picks
        .iter()
        .map(|&p| {
            let p = p as usize;
            match (lens.get(p), next.get_mut(p)) {
                (Some(&len), Some(i)) if *i < len => {
                    *i += 1;
                    Ok((p, *i - 1))
                }
                _ => Err(Error::State(format!(
                    "internal error: no record left in mixture part {p}"
                ))),
            }
        })
        .collect()
}

impl RaggedBatch {
    /// Interleaves the records of `parts` (one batch per mixture source)
    /// into one batch: record `j` is the next unused record of part
    /// `picks[j]`. Every part must share one item size.
    pub fn interleave(parts: &[RaggedBatch], picks: &[u32]) -> Result<RaggedBatch> {
        let lens: Vec<usize> = parts.iter().map(RaggedBatch::len).collect();
        let order = interleave_order(&lens, picks)?;
        let itemsize = parts
            .iter()
            .find(|b| !b.is_empty())
            .map_or(1, |b| b.itemsize);
        if parts
            .iter()
            .any(|b| !b.is_empty() && b.itemsize != itemsize)
        {
            return Err(Error::InvalidArgument(
                "mixture sources disagree on a Ragged stream's item size".into(),
            ));
        }
        let total: usize = order.iter().map(|&(p, i)| parts[p].payloads[i].len()).sum();
        let mut data = crate::buffers::take(total)
            .ok_or_else(|| Error::OutOfMemory(format!("a merged batch of {total} bytes")))?;
        let mut payloads = Vec::with_capacity(order.len());
        let mut shape_starts = Vec::with_capacity(order.len() + 1);
        let mut dims = Vec::new();
        shape_starts.push(0);
        let mut at = 0usize;
        for (p, i) in order {
            let src = parts[p].payload(i);
            data[at..at + src.len()].copy_from_slice(src);
            payloads.push(at..at + src.len());
            at += src.len();
            dims.extend_from_slice(parts[p].shape(i));
            shape_starts.push(dims.len());
        }
        Ok(RaggedBatch {
            data,
            payloads,
            shape_starts,
            dims,
            itemsize,
        })
    }
}

impl PackedBatch {
    /// Interleaves packed batches (one per mixture source) like
    /// [`RaggedBatch::interleave`]: record `j` is the next unused record of
    /// part `picks[j]`. Parts must share one rank and one item size.
    pub fn interleave(parts: &[PackedBatch], picks: &[u32]) -> Result<PackedBatch> {
        let lens: Vec<usize> = parts.iter().map(PackedBatch::len).collect();
        let order = interleave_order(&lens, picks)?;
        let mismatch = |what: &str| {
            Error::InvalidArgument(format!(
                "mixture sources disagree on a packed stream's {what}"
            ))
        };
        // A packed batch keeps no item size: it is bytes over elements.
        let mut itemsize = None;
        let mut ndim = None;
        for b in parts.iter().filter(|b| !b.is_empty()) {
            if ndim.replace(b.ndim).is_some_and(|d| d != b.ndim) {
                return Err(mismatch("rank"));
            }
            let elements = *b.cu_seqlens.last().unwrap_or(&0) as usize;
            if let Some(size) = b.values.len().checked_div(elements) {
                if itemsize.replace(size).is_some_and(|s| s != size) {
                    return Err(mismatch("item size"));
                }
            }
        }
        let (itemsize, ndim) = (itemsize.unwrap_or(1), ndim.unwrap_or(0));
        let span = |p: usize, i: usize| {
            let cu = &parts[p].cu_seqlens;
            (cu[i] as usize * itemsize)..(cu[i + 1] as usize * itemsize)
        };
        let total: usize = order.iter().map(|&(p, i)| span(p, i).len()).sum();
        let mut values = crate::buffers::take(total)
            .ok_or_else(|| Error::OutOfMemory(format!("a merged batch of {total} bytes")))?;
        let mut cu_seqlens = Vec::with_capacity(order.len() + 1);
        cu_seqlens.push(0i32);
        let mut shapes = Vec::with_capacity(order.len() * ndim);
        let mut at = 0usize;
        for (p, i) in order {
            let r = span(p, i);
            values[at..at + r.len()].copy_from_slice(&parts[p].values[r.clone()]);
            at += r.len();
            let elements = i32::try_from(at / itemsize).map_err(|_| {
                Error::InvalidArgument(format!(
                    "a packed batch holds at most {} elements; these records hold more",
                    i32::MAX
                ))
            })?;
            cu_seqlens.push(elements);
            shapes.extend_from_slice(&parts[p].shapes[i * ndim..(i + 1) * ndim]);
        }
        Ok(PackedBatch {
            values,
            cu_seqlens,
            shapes,
            ndim,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RaggedRecord;

    fn batch_of(records: &[(&[u64], &[u8])]) -> RaggedBatch {
        let mut data = Vec::new();
        let mut ranges = Vec::new();
        for (shape, payload) in records {
            let start = data.len().next_multiple_of(16);
            data.resize(start, 0);
            RaggedRecord { shape, payload }.encode_into(&mut data);
            ranges.push(start..data.len());
        }
        let indices: Vec<u64> = (0..records.len() as u64).collect();
        RaggedBatch::from_gather(data.into(), ranges, &indices, 2).unwrap()
    }

    #[test]
    fn packs_payloads_back_to_back() {
        let b = batch_of(&[
            (&[2], &[1, 0, 2, 0]),
            (&[1], &[3, 0]),
            (&[3], &[4, 0, 5, 0, 6, 0]),
        ]);
        assert_eq!(b.shape(2), &[3]);
        assert_eq!(b.payload(1), &[3, 0]);
        let p = b.into_packed().unwrap();
        assert_eq!(p.values, [1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0]);
        assert_eq!(p.cu_seqlens, [0, 2, 3, 6]);
        assert_eq!(p.shapes, [2, 1, 3]);
        assert_eq!((p.ndim, p.len()), (1, 3));
    }

    #[test]
    fn packs_multi_dimensional_and_scalar_records() {
        let p = batch_of(&[(&[1, 2], &[1, 0, 2, 0]), (&[2, 1], &[3, 0, 4, 0])])
            .into_packed()
            .unwrap();
        assert_eq!(p.shapes, [1, 2, 2, 1]);
        assert_eq!(p.cu_seqlens, [0, 2, 4]);
        let s = batch_of(&[(&[], &[7, 0]), (&[], &[8, 0])])
            .into_packed()
            .unwrap();
        assert_eq!(
            (s.ndim, s.cu_seqlens.as_slice(), &s.values[..]),
            (0, &[0, 1, 2][..], &[7, 0, 8, 0][..])
        );
    }

    #[test]
    fn mixed_ranks_are_refused() {
        let err = batch_of(&[(&[1], &[1, 0]), (&[1, 1], &[2, 0])])
            .into_packed()
            .unwrap_err();
        assert!(err.to_string().contains("different ranks"), "{err}");
    }

    #[test]
    fn empty_batch_packs_to_nothing() {
        let p = RaggedBatch::default().into_packed().unwrap();
        assert_eq!(p.cu_seqlens, [0]);
        assert!(p.is_empty() && p.values.is_empty());
    }

    #[test]
    fn interleave_takes_records_in_pick_order() {
        let a = batch_of(&[(&[2], &[1, 0, 2, 0]), (&[1], &[3, 0])]);
        let b = batch_of(&[(&[1, 2], &[9, 0, 8, 0])]);
        let picks = [1u32, 0, 0];
        let merged = RaggedBatch::interleave(&[a, b], &picks).unwrap();
        assert_eq!(merged.len(), 3);
        assert_eq!(
            (merged.shape(0), merged.payload(0)),
            (&[1u64, 2][..], &[9u8, 0, 8, 0][..])
        );
        assert_eq!(
            (merged.shape(1), merged.payload(1)),
            (&[2u64][..], &[1u8, 0, 2, 0][..])
        );
        assert_eq!(
            (merged.shape(2), merged.payload(2)),
            (&[1u64][..], &[3u8, 0][..])
        );
        // Asking a part for more records than it has is an error, not a panic.
        let a = batch_of(&[(&[1], &[3, 0])]);
        assert!(RaggedBatch::interleave(&[a], &[0, 0]).is_err());

        let a = batch_of(&[(&[2], &[1, 0, 2, 0]), (&[1], &[3, 0])])
            .into_packed()
            .unwrap();
        let b = batch_of(&[(&[3], &[7, 0, 8, 0, 9, 0])])
            .into_packed()
            .unwrap();
        let merged = PackedBatch::interleave(&[a, b], &[0, 1, 0]).unwrap();
        assert_eq!(merged.values, [1, 0, 2, 0, 7, 0, 8, 0, 9, 0, 3, 0]);
        assert_eq!(merged.cu_seqlens, [0, 2, 5, 6]);
        assert_eq!(merged.shapes, [2, 3, 1]);
        let flat = batch_of(&[(&[1], &[3, 0])]).into_packed().unwrap();
        let square = batch_of(&[(&[1, 1], &[3, 0])]).into_packed().unwrap();
        assert!(PackedBatch::interleave(&[flat, square], &[0, 1]).is_err());
    }
}
