//! Remote gathers: records become byte ranges, ranges that touch or lie
//! closer than [`Tuning::coalesce_bytes`] merge into one request (up to
//! [`Tuning::max_request_bytes`]), requests run concurrently on the I/O
//! runtime ([`Tuning::max_in_flight`] at most), and each range is decoded
//! into its records' slots on the worker pool as soon as it arrives, while
//! the others are still downloading.
//!
//! A failed request (after object_store's bounded retries) fails the gather
//! at once; the requests still in flight are aborted.

use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;

use crate::codec::DecoderPool;
use crate::error::{Error, Result};
use crate::format::{RecordLoc, DATA_FILE};
use crate::pool;
use crate::remote::{self, Tuning};
use crate::store::segment::{Payload, Segment};

/// One record to fetch: where it is and where it goes.
pub(crate) struct Work<'a> {
    /// The record's index as the caller knows it, for messages.
    pub label: u64,
    /// Its segment.
    pub seg: usize,
    /// Its index within the segment.
    pub local: u64,
    /// Its validated table entry.
    pub loc: RecordLoc,
    /// Its destination, exactly its logical size.
    pub slot: &'a mut [u8],
}

/// One planned request: bytes `start..end` of segment `seg`'s `data.zr`.
#[derive(Clone, Copy, Debug)]
struct Span {
    seg: usize,
    start: u64,
    end: u64,
    /// Bytes of the records it covers.
    useful: u64,
    /// Bytes of the gaps between them.
    wasted: u64,
}

impl Span {
    fn new(seg: usize, start: u64, end: u64) -> Span {
        Span {
            seg,
            start,
            end,
            useful: end - start,
            wasted: 0,
        }
    }

    /// Extends the request over the next range (ranges come sorted) when
    /// merging pays: the gap is at most `coalesce_bytes`, the request reads
    /// no more unneeded bytes than needed ones (so merging at most doubles
    /// the bytes fetched), and it stays within `max_request_bytes`.
    fn absorb(&mut self, seg: usize, start: u64, end: u64, tuning: &Tuning) -> bool {
        let gap = start.saturating_sub(self.end);
        let len = end - start;
        let merged_end = self.end.max(end);
        let pays = seg == self.seg
            && gap <= tuning.coalesce_bytes
            && self.wasted + gap <= self.useful + len
            && merged_end - self.start <= tuning.max_request_bytes;
        if pays {
            self.end = merged_end;
            self.useful += len;
            self.wasted += gap;
        }
        pays
    }
}

/// The records one request brings.
struct Group<'a> {
    span: Span,
    items: Vec<Work<'a>>,
}

/// Sorts `work` by position and merges neighbours into requests.
fn plan<'a>(mut work: Vec<Work<'a>>, tuning: &Tuning) -> Vec<Group<'a>> {
    work.sort_unstable_by_key(|w| (w.seg, w.loc.offset));
    let mut groups: Vec<Group<'_>> = Vec::new();
    for w in work {
        let start = w.loc.offset;
        let end = start + w.loc.phys_length as u64;
        if let Some(g) = groups.last_mut() {
            if g.span.absorb(w.seg, start, end, tuning) {
                g.items.push(w);
                continue;
            }
        }
        groups.push(Group {
            span: Span::new(w.seg, start, end),
            items: vec![w],
        });
    }
    groups
}

/// Number of requests a gather of records at `ranges` (segment, start, end)
/// makes under `tuning`: what merging allows. Exposed for benchmarks and tests.
pub fn request_count(ranges: &[(usize, u64, u64)], tuning: &Tuning) -> usize {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut count = 0;
    let mut current: Option<Span> = None;
    for (seg, start, end) in sorted {
        let merged = current
            .as_mut()
            .is_some_and(|span| span.absorb(seg, start, end, tuning));
        if !merged {
            count += 1;
            current = Some(Span::new(seg, start, end));
        }
    }
    count
}

/// Decodes the records of one arrived range into their slots.
fn decode(
    segments: &[Segment],
    pools: &[DecoderPool],
    group: Group<'_>,
    bytes: &Bytes,
) -> Result<()> {
    let seg = &segments[group.span.seg];
    let mut dec = pools[seg.pool].get()?;
    for w in group.items {
        let at = (w.loc.offset - group.span.start) as usize;
        let frame = &bytes[at..at + w.loc.phys_length as usize];
        dec.decode_into(w.label, frame, w.slot)?;
        seg.check_sum(w.local, w.label, w.slot)?;
    }
    Ok(())
}

/// Aborts the requests of a gather that ended early.
struct AbortOnDrop(Vec<tokio::task::AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

/// Fetches and decodes every record of `work` from the remote `segments`.
pub(crate) fn fetch_into(
    segments: &[Segment],
    pools: &[DecoderPool],
    tuning: &Tuning,
    work: Vec<Work<'_>>,
) -> Result<()> {
    if work.is_empty() {
        return Ok(());
    }
    let groups = plan(work, tuning);
    let count = groups.len();
    let (tx, rx) = mpsc::channel::<(usize, Result<Bytes>)>();
    let permits = Arc::new(tokio::sync::Semaphore::new(tuning.max_in_flight));
    let mut requests = AbortOnDrop(Vec::with_capacity(count));
    for (gi, g) in groups.iter().enumerate() {
        let Payload::Remote { remote, info } = &segments[g.span.seg].data else {
            return Err(Error::State(
                "internal error: a local segment in a remote gather".into(),
            ));
        };
        let (remote, info, range) = (remote.clone(), info.clone(), g.span.start..g.span.end);
        let (tx, permits) = (tx.clone(), permits.clone());
        let task = remote::spawn(async move {
            let _permit = permits.acquire_owned().await;
            let got = remote.read_range(DATA_FILE, range, &info).await;
            let _ = tx.send((gi, got));
        })?;
        requests.0.push(task.abort_handle());
    }
    drop(tx);

    let failure: Mutex<Option<Error>> = Mutex::new(None);
    let fail = |e: Error| {
        failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert(e);
    };
    let mut pending: Vec<Option<Group<'_>>> = groups.into_iter().map(Some).collect();
    pool::pool().in_place_scope(|scope| {
        for _ in 0..count {
            let (gi, got) = match rx.recv() {
                Ok(arrival) => arrival,
                Err(_) => {
                    fail(Error::State(
                        "internal error: a remote read ended without an answer".into(),
                    ));
                    return;
                }
            };
            let bytes = match got {
                Ok(bytes) => bytes,
                Err(e) => {
                    fail(e);
                    return;
                }
            };
            if failure.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
                return;
            }
            let group = pending[gi].take().expect("each range arrives once");
            let fail = &fail;
            scope.spawn(move |_| {
                if let Err(e) = decode(segments, pools, group, &bytes) {
                    fail(e);
                }
            });
        }
    });
    drop(requests);
    match failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_follows_the_gap_and_the_request_cap() {
        let tuning = Tuning {
            coalesce_bytes: 10,
            max_request_bytes: 100,
            ..Tuning::default()
        };
        // Touching, within the gap, beyond it, another segment.
        let ranges = [(0, 0, 5), (0, 5, 10), (0, 20, 30), (0, 41, 50), (1, 0, 5)];
        assert_eq!(request_count(&ranges, &tuning), 3);
        // A gap larger than the bytes it would bring along is not worth it.
        assert_eq!(request_count(&[(0, 0, 2), (0, 8, 10)], &tuning), 2);
        assert_eq!(request_count(&[(0, 0, 2), (0, 4, 6)], &tuning), 1);
        // Waste accumulates: 2+2 useful bytes, 2+3 wasted is too much.
        assert_eq!(
            request_count(&[(0, 0, 2), (0, 4, 5), (0, 8, 9)], &tuning),
            2
        );
        // The cap splits a long run of touching records.
        let run: Vec<_> = (0..30).map(|i| (0, i * 10, i * 10 + 10)).collect();
        assert_eq!(request_count(&run, &tuning), 3);
        // A single record larger than the cap is one request.
        assert_eq!(request_count(&[(0, 0, 500)], &tuning), 1);
        let mut slots = vec![vec![0u8; 5]; 3];
        let mut it = slots.iter_mut();
        let work = vec![
            Work {
                label: 2,
                seg: 0,
                local: 2,
                loc: loc(41, 5),
                slot: it.next().unwrap(),
            },
            Work {
                label: 0,
                seg: 0,
                local: 0,
                loc: loc(0, 5),
                slot: it.next().unwrap(),
            },
            Work {
                label: 1,
                seg: 0,
                local: 1,
                loc: loc(5, 5),
                slot: it.next().unwrap(),
            },
        ];
        let groups = plan(work, &tuning);
        let shape: Vec<(u64, u64, Vec<u64>)> = groups
            .iter()
            .map(|g| {
                (
                    g.span.start,
                    g.span.end,
                    g.items.iter().map(|w| w.label).collect(),
                )
            })
            .collect();
        assert_eq!(shape, vec![(0, 10, vec![0, 1]), (41, 46, vec![2])]);
    }

    fn loc(offset: u64, len: u32) -> RecordLoc {
        RecordLoc {
            offset,
            phys_length: len,
            logic_length: len,
        }
    }
}
