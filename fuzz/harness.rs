//! The `open_gather` harness: one copy, shared by the libFuzzer target
//! (`fuzz/fuzz_targets/open_gather.rs`) and the stable replay test
//! (`crates/loaderx/tests/fuzz_corpus.rs`), each of which includes this file
//! with `#[path = ...] mod harness;` and installs [`CountingAlloc`] as its
//! global allocator.
//!
//! # Input encoding
//!
//! ```text
//! byte 0            flags: bit 0 = meta section is compact,
//!                          bit 1 = write dict.zr,
//!                          bit 2 = leave data.zr out
//! u32 LE + bytes    meta section
//! u32 LE + bytes    data.zr
//! u32 LE + bytes    dict.zr
//! rest              index script (random gather batches)
//! ```
//!
//! A length that runs past the input is clamped to what is left. A compact
//! meta section is `u16 LE p`, then `p` bytes of static page (zero-padded to
//! 4096 bytes), then the record table verbatim; a non-compact one is
//! `meta.zr` verbatim (so short and odd-sized files are reachable too).
//!
//! # What is checked
//!
//! The store is opened as Dense and as Ragged, through the typed readers and
//! through [`StoreReader`] with `data.zr` both mapped and read. Whatever
//! opens is gathered in full (in chunks of at most [`GATHER_CAP`] logical
//! bytes) and with the batches of the index script, with every gather form
//! (into a buffer, into a new buffer, Ragged batches, packed batches). Every call
//! must return `Ok` or `Err` (a panic is a crash), results must agree with
//! record-by-record gathers and across gather forms, a store must open (or
//! not) the same way whatever the data access, and no call may allocate
//! (through the Rust allocator) more than the logical size of the records it
//! was asked for plus a small per-record and fixed allowance (and, when
//! `data.zr` is read rather than mapped, one staged frame).

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use loaderx::store::{DataAccess, DenseReader, RaggedReader, StoreReader};
use loaderx::{Error, Kind};

/// Largest logical size one harness gather asks for. Larger requests are
/// legitimate (records go up to 2 GiB) but only slow the fuzzer down;
/// `tests/test_bounds.py` covers the huge-claim path.
pub const GATHER_CAP: u64 = 16 << 20;
/// Records compared one by one against the batch gathers.
const DIFF_RECORDS: u64 = 32;
/// Fixed allocation allowance per call (decoder pool entries, rayon
/// bookkeeping on first use, error messages).
const FIXED_SLACK: usize = 1 << 20;
/// Allocation allowance per requested record (slot alignment, ranges,
/// table entries, work items, up to 64 dims of shape).
const PER_RECORD_SLACK: usize = 1024;

pub const FLAG_COMPACT_META: u8 = 1;
pub const FLAG_DICT: u8 = 2;
pub const FLAG_NO_DATA: u8 = 4;

// ---------------------------------------------------------------------------
// allocation accounting
// ---------------------------------------------------------------------------

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and their peak.
pub struct CountingAlloc;

impl CountingAlloc {
    #[inline]
    fn grew(by: usize) {
        let now = LIVE.fetch_add(by, Ordering::Relaxed) + by;
        PEAK.fetch_max(now, Ordering::Relaxed);
    }
    #[inline]
    fn shrank(by: usize) {
        LIVE.fetch_sub(by, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`; only counters change.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc_zeroed(layout);
        if !p.is_null() {
            Self::grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        Self::shrank(layout.size());
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            if new_size >= layout.size() {
                Self::grew(new_size - layout.size());
            } else {
                Self::shrank(layout.size() - new_size);
            }
        }
        p
    }
}

/// Runs `f` and returns its result with the peak growth of live heap bytes
/// during the call (0 when [`CountingAlloc`] is not the global allocator).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed);
    (out, peak.saturating_sub(base))
}

fn check_budget(what: &str, used: usize, logical: u64, records: usize, extra: usize) {
    let budget = (logical as usize)
        .saturating_add(records.saturating_mul(PER_RECORD_SLACK))
        .saturating_add(FIXED_SLACK)
        .saturating_add(extra);
    assert!(
        used <= budget,
        "{what}: allocated {used} bytes for {records} records of {logical} logical bytes \
         (budget {budget})"
    );
}

// ---------------------------------------------------------------------------
// input encoding
// ---------------------------------------------------------------------------

/// The files of one decoded input, plus the index script.
pub struct Files<'a> {
    pub meta: Vec<u8>,
    pub data: Option<&'a [u8]>,
    pub dict: Option<&'a [u8]>,
    pub script: &'a [u8],
}

fn take<'a>(rest: &mut &'a [u8], n: usize) -> &'a [u8] {
    let n = n.min(rest.len());
    let (head, tail) = rest.split_at(n);
    *rest = tail;
    head
}

fn take_section<'a>(rest: &mut &'a [u8]) -> &'a [u8] {
    let len = take(rest, 4);
    let mut word = [0u8; 4];
    word[..len.len()].copy_from_slice(len);
    take(rest, u32::from_le_bytes(word) as usize)
}

/// Decodes an input (any byte string decodes to something).
pub fn decode(input: &[u8]) -> Files<'_> {
    let mut rest = input;
    let flags = take(&mut rest, 1).first().copied().unwrap_or(0);
    let meta_section = take_section(&mut rest);
    let data = take_section(&mut rest);
    let dict = take_section(&mut rest);
    let meta = if flags & FLAG_COMPACT_META != 0 {
        let mut m = meta_section;
        let p = take(&mut m, 2);
        let mut word = [0u8; 2];
        word[..p.len()].copy_from_slice(p);
        let prefix = take(&mut m, (u16::from_le_bytes(word) as usize).min(4096));
        let mut out = Vec::with_capacity(4096 + m.len());
        out.extend_from_slice(prefix);
        out.resize(4096, 0);
        out.extend_from_slice(m);
        out
    } else {
        meta_section.to_vec()
    };
    Files {
        meta,
        data: (flags & FLAG_NO_DATA == 0).then_some(data),
        dict: (flags & FLAG_DICT != 0).then_some(dict),
        script: rest,
    }
}

/// Encodes store files (compact meta when it starts with a 4096-byte page).
pub fn encode(meta: &[u8], data: Option<&[u8]>, dict: Option<&[u8]>, script: &[u8]) -> Vec<u8> {
    let mut flags = 0u8;
    let mut meta_section = Vec::new();
    if meta.len() >= 4096 {
        flags |= FLAG_COMPACT_META;
        let page = &meta[..4096];
        let used = page.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        meta_section.extend_from_slice(&(used as u16).to_le_bytes());
        meta_section.extend_from_slice(&page[..used]);
        meta_section.extend_from_slice(&meta[4096..]);
    } else {
        meta_section.extend_from_slice(meta);
    }
    if dict.is_some() {
        flags |= FLAG_DICT;
    }
    if data.is_none() {
        flags |= FLAG_NO_DATA;
    }
    let mut out = vec![flags];
    for section in [&meta_section[..], data.unwrap_or(&[]), dict.unwrap_or(&[])] {
        out.extend_from_slice(&(section.len() as u32).to_le_bytes());
        out.extend_from_slice(section);
    }
    out.extend_from_slice(script);
    out
}

/// Index batches from the script: a count byte (0..=16), then that many u16
/// values, each mapped into `0..len + 2` (so some are out of range; 0xFFFF
/// becomes `u64::MAX`). At most 8 batches.
fn index_batches(script: &[u8], len: u64) -> Vec<Vec<u64>> {
    let mut rest = script;
    let mut batches = Vec::new();
    while batches.len() < 8 && !rest.is_empty() {
        let n = take(&mut rest, 1)[0] % 17;
        let mut batch = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let w = take(&mut rest, 2);
            if w.len() < 2 {
                break;
            }
            let v = u16::from_le_bytes([w[0], w[1]]);
            batch.push(if v == u16::MAX {
                u64::MAX
            } else {
                v as u64 % len.saturating_add(2)
            });
        }
        batches.push(batch);
    }
    batches
}

// ---------------------------------------------------------------------------
// the harness
// ---------------------------------------------------------------------------

/// Writes the files of `input` into `dir` (replacing it) and runs every check.
pub fn run(input: &[u8], dir: &Path) {
    let files = decode(input);
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("creating the work directory");
    std::fs::write(dir.join("meta.zr"), &files.meta).expect("writing meta.zr");
    if let Some(d) = files.data {
        std::fs::write(dir.join("data.zr"), d).expect("writing data.zr");
    }
    if let Some(d) = files.dict {
        std::fs::write(dir.join("dict.zr"), d).expect("writing dict.zr");
    }
    let data_len = files.data.map_or(0, <[u8]>::len);
    let dict_len = files.dict.map_or(0, <[u8]>::len);
    // open reads the static page and the whole dictionary, keeps one copy
    // for its decoder pool and hands one to the first decoder.
    let open_extra = 4096 + 3 * dict_len;
    // A gather that reads data.zr (rather than mapping it) stages each
    // frame in a per-decoder buffer of at most one frame, at most the file.
    let gather_extra = data_len;

    // The typed readers (data access as the environment says).
    let (dense, used) = measure(|| DenseReader::open(dir));
    check_budget("DenseReader::open", used, 0, 0, open_extra);
    let (ragged, used) = measure(|| RaggedReader::open(dir));
    check_budget("RaggedReader::open", used, 0, 0, open_extra);
    assert!(
        !(dense.is_ok() && ragged.is_ok()),
        "the store opened both as Dense and as Ragged"
    );
    for e in [dense.as_ref().err(), ragged.as_ref().err()]
        .into_iter()
        .flatten()
    {
        let _ = (e.to_string(), e.code());
    }
    if let Ok(r) = &dense {
        typed_dense(r);
    }
    if let Ok(r) = &ragged {
        typed_ragged(r, gather_extra);
    }
    let opened_as = match (&dense, &ragged) {
        (Ok(_), _) => Some(Kind::Dense),
        (_, Ok(_)) => Some(Kind::Ragged),
        _ => None,
    };
    drop((dense, ragged));

    // The untyped reader, with data.zr mapped and with data.zr read.
    for access in [DataAccess::Map, DataAccess::Read] {
        for kind in [Kind::Dense, Kind::Ragged] {
            let (r, used) = measure(|| StoreReader::open_with(dir, kind, access));
            check_budget("StoreReader::open_with", used, 0, 0, open_extra);
            // Whether a store opens does not depend on how data.zr is read.
            assert_eq!(
                r.is_ok(),
                opened_as == Some(kind),
                "open as {kind:?} with {access:?}: {:?}",
                r.as_ref().err()
            );
            let Ok(r) = r else { continue };
            match kind {
                Kind::Dense => check_dense(&r, files.script, gather_extra),
                Kind::Ragged => check_ragged(&r, files.script, gather_extra),
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

fn valid_logical(reader: &StoreReader, indices: &[u64]) -> u64 {
    indices
        .iter()
        .map(|&i| reader.loc(i).map_or(0, |l| l.logic_length as u64))
        .sum()
}

/// The typed Dense reader agrees with its schema and gathers its first record.
fn typed_dense(r: &DenseReader) {
    let width = r.record_width();
    assert!(
        width >= 1 && width as u64 <= 1 << 31,
        "record width {width} out of range"
    );
    assert_eq!(
        r.item_shape().iter().product::<u64>() * r.inner().schema().dtype().itemsize(),
        width as u64
    );
    if !r.is_empty() && width as u64 <= GATHER_CAP {
        let mut out = vec![0u8; width];
        let _ = r.gather_into(&[0], &mut out);
        // A buffer of the wrong size is refused before anything else.
        let mut wrong = vec![0u8; width + 1];
        assert!(matches!(
            r.gather_into(&[0], &mut wrong),
            Err(Error::BufferTooSmall(_))
        ));
    }
}

/// The typed Ragged reader's batch and packed gathers of the first records.
fn typed_ragged(r: &RaggedReader, extra: usize) {
    let idx: Vec<u64> = (0..r.len().min(DIFF_RECORDS)).collect();
    let logical = valid_logical(r.inner(), &idx);
    if logical > GATHER_CAP {
        return;
    }
    let (batch, used) = measure(|| r.gather(&idx));
    check_budget("RaggedReader::gather", used, logical, idx.len(), extra);
    let (packed, used) = measure(|| r.gather_packed(&idx));
    check_budget(
        "RaggedReader::gather_packed",
        used,
        logical,
        idx.len(),
        extra,
    );
    match (batch, packed) {
        (Ok(b), Ok(p)) => {
            let total: usize = (0..b.len()).map(|k| b.payload(k).len()).sum();
            assert_eq!(p.values.len(), total);
            assert_eq!(p.len(), b.len());
        }
        // Packing may refuse mixed ranks, but never succeed where the gather failed.
        (Err(e), Ok(_)) => panic!("gather failed ({e}) but gather_packed succeeded"),
        _ => {}
    }
}

fn check_dense(r: &StoreReader, script: &[u8], extra: usize) {
    let n = r.len();
    let width = r
        .schema()
        .record_width()
        .expect("a Dense store has a width") as usize;
    if width as u64 > GATHER_CAP {
        // Only the index checks run without a destination of that size.
        assert!(r.gather_fixed(&[], width, &mut []).is_ok());
        return;
    }
    let per_chunk = (GATHER_CAP / width as u64).max(1);
    let mut start = 0u64;
    while start < n {
        // The first chunk is small enough to compare record by record.
        let end = if start == 0 {
            n.min(DIFF_RECORDS)
        } else {
            n.min(start + per_chunk)
        };
        let idx: Vec<u64> = (start..end).collect();
        dense_gather_checked(r, width, &idx, extra);
        start = end;
    }
    for batch in index_batches(script, n) {
        dense_gather_checked(r, width, &batch, extra);
    }
}

fn dense_gather_checked(r: &StoreReader, width: usize, idx: &[u64], extra: usize) {
    let mut out = vec![0u8; idx.len() * width];
    let (res, used) = measure(|| r.gather_fixed(idx, width, &mut out));
    check_budget("Dense gather", used, 0, idx.len(), extra);
    // The allocating form returns the same bytes (or the same failure).
    let (owned, used) = measure(|| r.gather_dense(idx));
    check_budget(
        "gather_dense",
        used,
        (idx.len() * width) as u64,
        idx.len(),
        extra,
    );
    match (&res, &owned) {
        (Ok(()), Ok(v)) => assert_eq!(&out[..], &v[..], "gather_dense differs from gather_fixed"),
        (Err(_), Err(_)) => {}
        _ => panic!(
            "gather_fixed and gather_dense disagree: {:?} vs {:?}",
            res.as_ref().err(),
            owned.as_ref().err()
        ),
    }
    if refused_out_of_range(r, idx, &res) {
        return;
    }
    if idx.len() as u64 > DIFF_RECORDS {
        return;
    }
    let mut one = vec![0u8; width];
    check_against_singles(idx, res.as_ref().err(), |k, i| {
        r.gather_fixed(&[i], width, &mut one)?;
        if res.is_ok() {
            assert_eq!(
                &out[k * width..(k + 1) * width],
                &one[..],
                "record {i} differs"
            );
        }
        Ok(())
    });
}

/// Cross-checks a batch gather against gathering each record alone:
/// `single(k, i)` gathers record `i` by itself (and, when the batch
/// succeeded, compares it with the batch's position `k`). A record that
/// fails alone must have failed the batch, with a storage code; a failed
/// batch must hold a record that fails alone.
fn check_against_singles(
    idx: &[u64],
    batch_err: Option<&Error>,
    mut single: impl FnMut(usize, u64) -> Result<(), Error>,
) {
    let mut any_err = false;
    for (k, &i) in idx.iter().enumerate() {
        if let Err(e) = single(k, i) {
            any_err = true;
            assert!(
                batch_err.is_some(),
                "batch gather succeeded but record {i} alone fails: {e}"
            );
            assert!(
                e.code().is_some(),
                "record {i}: error without a storage code: {e}"
            );
        }
    }
    if let Some(e) = batch_err {
        assert!(
            any_err || idx.is_empty(),
            "batch gather failed but every record alone succeeds: {e}"
        );
    }
}

fn check_ragged(r: &StoreReader, script: &[u8], extra: usize) {
    let n = r.len();
    // Chunks of at most GATHER_CAP logical bytes; records over the cap on
    // their own are left out (their table entry was still validated).
    let mut chunks: Vec<Vec<u64>> = Vec::new();
    let mut cur: Vec<u64> = Vec::new();
    let mut cur_bytes = 0u64;
    for i in 0..n {
        let logical = r.loc(i).map_or(0, |l| l.logic_length as u64);
        if logical > GATHER_CAP {
            continue;
        }
        let limit = if chunks.is_empty() {
            DIFF_RECORDS as usize
        } else {
            usize::MAX
        };
        if cur_bytes + logical > GATHER_CAP || cur.len() >= limit {
            chunks.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur.push(i);
        cur_bytes += logical;
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    for chunk in &chunks {
        ragged_gather_checked(r, chunk, extra);
    }
    for batch in index_batches(script, n) {
        if valid_logical(r, &batch) <= GATHER_CAP {
            ragged_gather_checked(r, &batch, extra);
        }
    }
}

/// True when `idx` holds an index past the store's end, after checking that
/// the gather refused it as out of range (and nothing else).
fn refused_out_of_range<T: std::fmt::Debug>(
    r: &StoreReader,
    idx: &[u64],
    res: &Result<T, Error>,
) -> bool {
    let n = r.len();
    if !idx.iter().any(|&i| i >= n) {
        return false;
    }
    assert!(
        matches!(res, Err(Error::IndexOutOfRange(_))),
        "out-of-range index accepted: {res:?}"
    );
    true
}

fn ragged_gather_checked(r: &StoreReader, idx: &[u64], extra: usize) {
    let logical = valid_logical(r, idx);
    let itemsize = r.schema().dtype().itemsize();
    let (res, used) = measure(|| r.gather_ragged(idx));
    check_budget("Ragged gather", used, logical, idx.len(), extra);
    if refused_out_of_range(r, idx, &res) {
        return;
    }
    if let Ok(b) = &res {
        assert_eq!(b.len(), idx.len());
        for k in 0..b.len() {
            let shape = b.shape(k);
            assert!(shape.len() <= 64);
            let elems = shape
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .expect("checked shape");
            assert_eq!(elems * itemsize, b.payload(k).len() as u64);
            assert!(b.payload_range(k).end <= b.data().len());
        }
    }
    if idx.len() as u64 <= DIFF_RECORDS {
        check_against_singles(idx, res.as_ref().err(), |k, i| {
            let one = r.gather_ragged(&[i])?;
            if let Ok(b) = &res {
                assert_eq!(b.shape(k), one.shape(0), "record {i}: shape differs");
                assert_eq!(b.payload(k), one.payload(0), "record {i}: payload differs");
            }
            Ok(())
        });
    }
    if let Ok(b) = res {
        let count = b.len();
        let payload_bytes: usize = (0..count).map(|k| b.payload(k).len()).sum();
        let (packed, used) = measure(|| b.into_packed());
        check_budget("into_packed", used, 0, count, 0);
        if let Ok(p) = packed {
            assert_eq!(p.len(), count);
            assert_eq!(p.values.len(), payload_bytes);
            assert_eq!(p.shapes.len(), count * p.ndim);
            assert!(p.cu_seqlens.windows(2).all(|w| w[0] <= w[1]));
            assert_eq!(
                *p.cu_seqlens.last().unwrap() as u64 * itemsize,
                payload_bytes as u64
            );
        }
    }
}
