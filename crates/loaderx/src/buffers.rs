//! A small process-wide cache of large batch buffers.
//!
//! Allocations above glibc's mmap threshold (at most 32 MiB) come straight
//! from the kernel and go back to it when freed, so every large batch pays
//! a page fault and a page of zeroing per 4 KiB before a single record is
//! copied in: for a 37 MiB image batch that is about as much work as the
//! copy itself. Smaller ones (from 64 KiB) come from the heap, where a
//! zeroed allocation is a `memset` of the whole batch, a tenth of the time
//! of a 512 KiB gather of raw 2 KiB records. Recycling the few buffers a
//! loader cycles through keeps their pages mapped and skips the zeroing.
//!
//! Every buffer is a [`Buf`]: its first byte is [`ALIGN`]-byte aligned,
//! the alignment XLA's CPU client needs to take an array through DLPack
//! without copying it (and a cache line, for SIMD loads).
//!
//! The cache is bounded ([`MAX_ENTRIES`] buffers, [`MAX_BYTES`] in all) and
//! only holds buffers of at least [`MIN_BYTES`]; smaller ones are the
//! allocator's business.
//!
//! A pipeline that keeps several batches in flight (a
//! [`Loader`](crate::loader::Loader) with prefetch) sees the number of live
//! buffers swing by more than two from one moment to the next; each swing
//! past the cache's bound frees buffers that are allocated (and faulted in)
//! again a moment later. Such a pipeline [`reserve`]s room for its swing
//! while it runs. That does not raise its peak memory: a buffer is only
//! created when no cached one fits, so the buffers in circulation do not
//! outnumber the most that were alive at once.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Smallest buffer worth caching.
pub const MIN_BYTES: usize = 64 << 10;
/// Most buffers kept without a [`Reservation`].
pub const MAX_ENTRIES: usize = 2;
/// Most bytes kept without a [`Reservation`].
pub const MAX_BYTES: usize = 256 << 20;

/// Alignment of the first byte of every [`Buf`].
pub const ALIGN: usize = 64;

/// A byte buffer whose data starts at an [`ALIGN`]-byte boundary.
///
/// It comes from `calloc` with `ALIGN` bytes to spare, and starts at the
/// first aligned byte inside: unlike an aligned allocation, `calloc` hands
/// out fresh zero pages without a `memset` pass, which is most of the cost
/// of a new large batch. Every byte of the capacity is initialised, so
/// [`set_len`](Self::set_len) up to the capacity is safe.
pub struct Buf {
    /// The allocation, from `libc::calloc`/`realloc`; freed on drop.
    raw: NonNull<u8>,
    /// Offset of the first aligned byte in `raw`.
    start: usize,
    len: usize,
    cap: usize,
}

// SAFETY: a Buf owns its allocation outright, like a Vec<u8>.
unsafe impl Send for Buf {}
// SAFETY: shared access is read-only, like a Vec<u8>'s.
unsafe impl Sync for Buf {}

impl Buf {
    /// `len` zero bytes, or `None` when the allocation fails.
    pub fn zeroed(len: usize) -> Option<Buf> {
        let total = len.checked_add(ALIGN)?;
        // SAFETY: calloc with a non-zero size; the result is checked for null.
        let raw = NonNull::new(unsafe { libc::calloc(1, total) }.cast::<u8>())?;
        let start = raw.as_ptr().align_offset(ALIGN);
        Some(Buf {
            raw,
            start,
            len,
            cap: len,
        })
    }

    /// A copy of `bytes`, or `None` when the allocation fails.
    pub fn try_from_slice(bytes: &[u8]) -> Option<Buf> {
        let mut buf = Buf::zeroed(bytes.len())?;
        buf.copy_from_slice(bytes);
        Some(buf)
    }

    /// A copy of `bytes`; panics when the allocation fails (see
    /// [`try_from_slice`](Self::try_from_slice) for the fallible form).
    pub fn from_slice(bytes: &[u8]) -> Buf {
        Buf::try_from_slice(bytes).expect("memory for a buffer copy")
    }

    /// Bytes in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no bytes are in use.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes available without growing.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Uses the first `len` bytes (at most the capacity); their contents
    /// are whatever the buffer held.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "set_len {len} beyond capacity {}",
            self.cap
        );
        self.len = len;
    }

    /// Keeps the first `len` bytes (no-op when already shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Grows the capacity to at least `cap` bytes (new bytes zero), keeping
    /// the contents; `None` when the allocation fails (the buffer is then
    /// unchanged).
    pub fn grow(&mut self, cap: usize) -> Option<()> {
        if cap <= self.cap {
            return Some(());
        }
        let total = cap.checked_add(ALIGN)?;
        // SAFETY: `raw` came from calloc/realloc and is still live; on
        // failure realloc leaves it untouched and we return early.
        let raw =
            NonNull::new(unsafe { libc::realloc(self.raw.as_ptr().cast(), total) }.cast::<u8>())?;
        let start = raw.as_ptr().align_offset(ALIGN);
        // SAFETY: the new block holds `total` bytes; both ranges lie inside
        // it (start < ALIGN and old cap + ALIGN <= total), and `copy` allows
        // overlap. realloc kept the first `start_old + cap_old` bytes, so
        // the old contents sit at the old offset until moved.
        unsafe {
            if start != self.start {
                std::ptr::copy(
                    raw.as_ptr().add(self.start),
                    raw.as_ptr().add(start),
                    self.cap,
                );
            }
            std::ptr::write_bytes(raw.as_ptr().add(start + self.cap), 0, cap - self.cap);
        }
        self.raw = raw;
        self.start = start;
        self.cap = cap;
        Some(())
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `raw` came from calloc/realloc and is freed only here.
        unsafe { libc::free(self.raw.as_ptr().cast()) };
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `start + len <= start + cap`, inside the allocation, and
        // every byte of the capacity is initialised (zeroed or written).
        unsafe { std::slice::from_raw_parts(self.raw.as_ptr().add(self.start), self.len) }
    }
}

impl std::ops::DerefMut for Buf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.raw.as_ptr().add(self.start), self.len) }
    }
}

impl std::fmt::Debug for Buf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buf")
            .field("len", &self.len)
            .field("cap", &self.cap)
            .finish()
    }
}

impl Default for Buf {
    fn default() -> Self {
        Buf::zeroed(0).expect("memory for an empty buffer")
    }
}

impl From<Vec<u8>> for Buf {
    fn from(v: Vec<u8>) -> Self {
        Buf::from_slice(&v)
    }
}

impl<T: AsRef<[u8]> + ?Sized> PartialEq<T> for Buf {
    fn eq(&self, other: &T) -> bool {
        **self == *other.as_ref()
    }
}

struct Cache {
    buffers: Vec<Buf>,
    /// Sums over the live reservations.
    reserved_entries: usize,
    reserved_bytes: usize,
}

impl Cache {
    fn max_entries(&self) -> usize {
        MAX_ENTRIES.saturating_add(self.reserved_entries)
    }

    fn max_bytes(&self) -> usize {
        MAX_BYTES.saturating_add(self.reserved_bytes)
    }

    fn held(&self) -> usize {
        self.buffers.iter().map(Buf::capacity).sum()
    }

    /// Removes the oldest buffers until the bounds hold again, returning
    /// them so the caller can free them after releasing the lock.
    fn trim(&mut self) -> Vec<Buf> {
        let mut surplus = Vec::new();
        while !self.buffers.is_empty()
            && (self.buffers.len() > self.max_entries() || self.held() > self.max_bytes())
        {
            surplus.push(self.buffers.remove(0));
        }
        surplus
    }
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    buffers: Vec::new(),
    reserved_entries: 0,
    reserved_bytes: 0,
});

static REUSED: AtomicU64 = AtomicU64::new(0);
static FRESH: AtomicU64 = AtomicU64::new(0);

/// How the cache has served large requests (of at least [`MIN_BYTES`]) in
/// this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stats {
    /// Requests served from a cached buffer.
    pub reused: u64,
    /// Requests that needed a new allocation.
    pub fresh: u64,
}

/// Counts of large requests served so far.
pub fn stats() -> Stats {
    Stats {
        reused: REUSED.load(Ordering::Relaxed),
        fresh: FRESH.load(Ordering::Relaxed),
    }
}

/// The cache's current bounds: (buffers, bytes), reservations included.
pub fn limits() -> (usize, usize) {
    let c = cache();
    (c.max_entries(), c.max_bytes())
}

fn cache() -> MutexGuard<'static, Cache> {
    CACHE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Room in the cache held for one pipeline; released (and the cache trimmed
/// back) when dropped.
#[derive(Debug)]
#[must_use = "the room is released when the reservation is dropped"]
pub struct Reservation {
    entries: usize,
    bytes: usize,
}

/// Lets the cache keep `entries` more buffers and `bytes` more bytes until
/// the returned [`Reservation`] is dropped.
pub fn reserve(entries: usize, bytes: usize) -> Reservation {
    let mut c = cache();
    c.reserved_entries = c.reserved_entries.saturating_add(entries);
    c.reserved_bytes = c.reserved_bytes.saturating_add(bytes);
    Reservation { entries, bytes }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let surplus = {
            let mut c = cache();
            c.reserved_entries = c.reserved_entries.saturating_sub(self.entries);
            c.reserved_bytes = c.reserved_bytes.saturating_sub(self.bytes);
            c.trim()
        };
        // Unmapping large buffers takes a while; not under the lock.
        drop(surplus);
    }
}

/// A buffer of exactly `len` initialised bytes, reusing a cached one of
/// similar size (capacity within `len/2..=2*len`) when there is one. Its
/// contents are unspecified (zero when new); callers overwrite what they use.
/// `None` when the allocation fails.
///
/// Batches of variable-size records differ a little in size from one to the
/// next, so a cached buffer slightly smaller than the request is grown in
/// place (for large buffers the allocator remaps, keeping the pages already
/// there) rather than passed over.
pub fn take(len: usize) -> Option<Buf> {
    if len >= MIN_BYTES {
        let mut cache = cache();
        let best = cache
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len / 2 && b.capacity() / 2 <= len)
            .min_by_key(|(_, b)| b.capacity().abs_diff(len))
            .map(|(i, _)| i);
        if let Some(i) = best {
            let mut buf = cache.buffers.swap_remove(i);
            drop(cache);
            REUSED.fetch_add(1, Ordering::Relaxed);
            if buf.capacity() < len {
                buf.grow(len)?;
                buf.set_len(len);
                advise_huge_pages(&buf);
            }
            buf.set_len(len);
            return Some(buf);
        }
        drop(cache);
        FRESH.fetch_add(1, Ordering::Relaxed);
    }
    zeroed(len)
}

/// Returns a buffer for reuse (or frees it when it is small or the cache is full).
pub fn recycle(buf: Buf) {
    if buf.capacity() < MIN_BYTES {
        return;
    }
    let mut cache = cache();
    if cache.buffers.len() < cache.max_entries()
        && cache.held().saturating_add(buf.capacity()) <= cache.max_bytes()
    {
        cache.buffers.push(buf);
        return;
    }
    drop(cache);
    drop(buf);
}

/// Frees every cached buffer.
pub fn clear() {
    let all = std::mem::take(&mut cache().buffers);
    drop(all);
}

/// Bytes currently cached.
pub fn cached_bytes() -> usize {
    cache().held()
}

/// A zero-filled buffer of `len` bytes, or `None` when the allocation fails
/// (an error for the caller, not an abort).
pub(crate) fn zeroed(len: usize) -> Option<Buf> {
    let buf = Buf::zeroed(len)?;
    advise_huge_pages(&buf);
    Some(buf)
}

/// Smallest buffer backed by transparent huge pages where the kernel offers
/// them on request (the same threshold NumPy uses for its arrays).
pub const HUGE_PAGE_MIN_BYTES: usize = 4 << 20;

/// Asks the kernel to back the 2 MiB-aligned interior of a large buffer
/// with transparent huge pages before it is first written.
///
/// A fresh 37 MiB batch otherwise takes about 9,500 page faults as the
/// gather writes into it, and the faults (not the zeroing) were most of the
/// loader's system time; huge pages cut them 512-fold. This is advice: where
/// THP is off (`never`), unsupported, or no huge page is free, the call
/// changes nothing and the buffer works the same. `LOADERX_HUGE_PAGES=0`
/// turns it off (for hosts where the kernel's compaction stalls hurt more
/// than the faults).
fn advise_huge_pages(buf: &[u8]) {
    #[cfg(target_os = "linux")]
    {
        const HUGE: usize = 2 << 20;
        static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if buf.len() < HUGE_PAGE_MIN_BYTES
            || !*ENABLED
                .get_or_init(|| std::env::var_os("LOADERX_HUGE_PAGES").is_none_or(|v| v != "0"))
        {
            return;
        }
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE);
        let end = (buf.as_ptr() as usize + buf.len()) / HUGE * HUGE;
        if end > start {
            // SAFETY: [start, end) lies inside `buf`'s allocation, and
            // MADV_HUGEPAGE only changes how the kernel backs those pages,
            // never their contents; errors (EINVAL where THP is compiled
            // out) are harmless and ignored.
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = buf;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Held by every test that looks at the process-wide cache or its bounds.
    pub(crate) static TEST_LOCK: Mutex<()> = Mutex::new(());

    pub(crate) fn test_lock() -> MutexGuard<'static, ()> {
        TEST_LOCK.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[test]
    fn bufs_are_aligned_and_keep_their_bytes_when_grown() {
        for len in [0usize, 1, 63, 64, 1000, MIN_BYTES + 3] {
            let mut b = Buf::zeroed(len).unwrap();
            assert_eq!(b.as_ptr() as usize % ALIGN, 0, "len {len}");
            assert!(b.iter().all(|&x| x == 0));
            for (i, x) in b.iter_mut().enumerate() {
                *x = (i % 251) as u8;
            }
            // Growing by a lot makes realloc move the block, to an address
            // with another offset to the next aligned byte now and then.
            for step in 1..6 {
                let cap = (len + 1) * 7 * step + 4096 * step;
                b.grow(cap).unwrap();
                assert_eq!(b.len(), len);
                assert_eq!(b.as_ptr() as usize % ALIGN, 0);
                assert!(b.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8));
                b.set_len(cap);
                assert!(b[len..].iter().all(|&x| x == 0), "new bytes are zero");
                b.set_len(len);
            }
            b.truncate(len / 2);
            assert_eq!(b.len(), len / 2);
        }
        assert_eq!(Buf::from_slice(&[1, 2, 3]), [1u8, 2, 3]);
        assert_eq!(Buf::try_from_slice(&[7; 65]).unwrap(), [7u8; 65]);
        assert_eq!(Buf::from(vec![4u8; 70]), vec![4u8; 70]);
        assert!(Buf::default().is_empty());
    }

    #[test]
    fn reuses_fitting_buffers_only() {
        let _serial = test_lock();
        clear();
        let before = stats();
        let a = take(3 * MIN_BYTES + 17).unwrap();
        assert_eq!(
            (a.len(), a.capacity()),
            (3 * MIN_BYTES + 17, 3 * MIN_BYTES + 17)
        );
        let ptr = a.as_ptr();
        recycle(a);
        let b = take(3 * MIN_BYTES).unwrap();
        assert_eq!((b.as_ptr(), b.len()), (ptr, 3 * MIN_BYTES));
        recycle(b);
        // A slightly larger request takes it too, grown to fit.
        let c = take(3 * MIN_BYTES + 1000).unwrap();
        assert_eq!(c.len(), 3 * MIN_BYTES + 1000);
        assert!(c.capacity() >= 3 * MIN_BYTES + 1000);
        recycle(c);
        assert_eq!(cache().buffers.len(), 1);
        // Far smaller requests do not take a much larger buffer.
        let d = take(MIN_BYTES + 5).unwrap();
        assert_eq!(d.len(), MIN_BYTES + 5);
        assert_eq!(cache().buffers.len(), 1);
        let after = stats();
        assert_eq!(
            (after.reused - before.reused, after.fresh - before.fresh),
            (2, 2)
        );
        let small = take(10).unwrap();
        assert_eq!(small, vec![0; 10]);
        recycle(small); // ignored
    }

    #[test]
    fn reservations_widen_the_bounds_until_dropped() {
        let _serial = test_lock();
        clear();
        assert_eq!(limits(), (MAX_ENTRIES, MAX_BYTES));
        let fill = |n: usize| {
            for _ in 0..n {
                recycle(zeroed(2 * MIN_BYTES).unwrap());
            }
        };
        fill(MAX_ENTRIES + 3);
        assert_eq!(cache().buffers.len(), MAX_ENTRIES);

        let r = reserve(3, 6 * MIN_BYTES);
        assert_eq!(limits(), (MAX_ENTRIES + 3, MAX_BYTES + 6 * MIN_BYTES));
        fill(5);
        assert_eq!(cache().buffers.len(), MAX_ENTRIES + 3);
        // More bytes than the base bound are kept under a reservation.
        clear();
        let big = MAX_BYTES + 8 * MIN_BYTES; // beyond the room `r` adds
        recycle(zeroed(big).unwrap());
        assert_eq!(cached_bytes(), 0, "over the bound without room for it");
        let r2 = reserve(0, big);
        recycle(zeroed(big).unwrap());
        assert_eq!(cached_bytes(), big);
        drop(r2);
        assert_eq!(cached_bytes(), 0, "trimmed when the room goes");

        fill(5);
        assert_eq!(cache().buffers.len(), MAX_ENTRIES + 3);
        drop(r);
        assert_eq!(limits(), (MAX_ENTRIES, MAX_BYTES));
        assert_eq!(cache().buffers.len(), MAX_ENTRIES);
        clear();
    }

    /// Large fresh buffers carry the huge-page advice (VmFlags `hg` on
    /// their mapping); the check is skipped where the kernel has no THP.
    #[cfg(target_os = "linux")]
    #[test]
    fn large_buffers_are_advised_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage/enabled").exists() {
            return;
        }
        let buf = zeroed(HUGE_PAGE_MIN_BYTES + (3 << 20)).unwrap();
        let probe = (buf.as_ptr() as usize).next_multiple_of(2 << 20);
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut flags = None;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) =
                        (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
                    {
                        inside = (a..b).contains(&probe);
                        continue;
                    }
                }
            }
            if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    flags = Some(f.split_whitespace().map(str::to_owned).collect::<Vec<_>>());
                }
            }
        }
        let flags = flags.expect("the buffer's mapping is in smaps");
        assert!(flags.iter().any(|f| f == "hg"), "{flags:?}");
    }
}
