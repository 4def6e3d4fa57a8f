//! Memory lent to a [`Loader`](crate::loader::Loader) by its consumer.
//!
//! A training loop that copies batches to an accelerator wants them in
//! page-locked ("pinned") host memory: only from there can the copy run
//! asynchronously, overlapped with compute. Such memory is allocated by the
//! framework (CUDA's `cudaHostAlloc`, behind `torch.empty(...,
//! pin_memory=True)`), is slow to allocate and must not be allocated per
//! batch. So the consumer allocates a few regions once and lends them to a
//! [`LentPool`]; the loader gathers Dense columns straight into a free
//! region ([`LentPool::take`]) instead of into a heap buffer, and the region
//! goes back to the pool when the last view of the batch is dropped.
//!
//! # Invariants
//!
//! * A region is in exactly one place: the pool's free list, or one
//!   [`LentBuffer`]. So no two batches ever share memory, and a region the
//!   consumer still reads (or a device copy still reads) is never written:
//!   it only returns to the free list when its buffer is dropped.
//! * The pool never allocates. When no free region is large enough, `take`
//!   returns `None` and the loader falls back to an ordinary heap buffer;
//!   [`LentPool::stats`] counts both outcomes so a consumer can check that,
//!   after warm-up, every batch landed in lent memory.
//! * Each region carries an owner object that keeps its memory alive; the
//!   owner is dropped only after the region has left both the free list and
//!   every buffer, i.e. when nothing can touch the memory any more.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::buffers::Buf;

/// Keeps a lent region's memory alive (a framework tensor, typically).
pub type Owner = Box<dyn Any + Send + Sync>;

struct Region {
    ptr: NonNull<u8>,
    len: usize,
    // Never read: holding it keeps the memory valid.
    _owner: Owner,
}

// SAFETY: a region is plain memory that `LentPool::lend`'s caller promised
// stays valid and unaliased while the owner lives; it is only ever reached
// through the one place that holds the region (see the module invariants),
// and the owner is `Send + Sync`.
unsafe impl Send for Region {}

#[derive(Default)]
struct State {
    free: Vec<Region>,
    lent: u64,
    fallback: u64,
}

/// A set of consumer-owned memory regions a loader may gather into.
#[derive(Default)]
pub struct LentPool {
    state: Mutex<State>,
}

/// How a [`LentPool`] has served requests so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LentStats {
    /// Requests served with a lent region.
    pub lent: u64,
    /// Requests that found no free region large enough (the loader used a
    /// heap buffer instead).
    pub fallback: u64,
    /// Regions free right now.
    pub free: usize,
}

impl fmt::Debug for LentPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentPool")
            .field("stats", &self.stats())
            .finish()
    }
}

impl LentPool {
    /// An empty pool.
    pub fn new() -> Arc<LentPool> {
        Arc::new(LentPool::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing that holds the lock can panic half-way through an update.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds the `len` bytes at `ptr` as a free region; `owner` is dropped
    /// once the pool and every buffer taken from it are gone.
    ///
    /// # Safety
    ///
    /// While `owner` is alive, the `len` bytes at `ptr` must stay valid for
    /// reads and writes and must not be read or written by anything except
    /// through the [`LentBuffer`]s this pool hands out (and views the
    /// consumer makes of those).
    pub unsafe fn lend(&self, ptr: NonNull<u8>, len: usize, owner: Owner) {
        self.lock().free.push(Region {
            ptr,
            len,
            _owner: owner,
        });
    }

    /// The smallest free region of at least `len` bytes, as a buffer of
    /// exactly `len` bytes (contents unspecified), or `None` when there is
    /// none; both outcomes are counted in [`stats`](Self::stats).
    ///
    /// Among equally small regions the one freed last is taken, so a
    /// consumer that keeps fewer batches alive than it lent regions for
    /// cycles through the same few: the others' pages are never touched,
    /// which is what keeps lazily backed memory (a shared-memory file)
    /// from growing to the size of the whole pool.
    pub fn take(self: &Arc<Self>, len: usize) -> Option<LentBuffer> {
        let mut st = self.lock();
        // Freed regions are pushed at the end: the last of the smallest
        // candidates is the most recently freed one.
        let best = st
            .free
            .iter()
            .enumerate()
            .filter(|(_, r)| r.len >= len)
            .min_by_key(|&(i, r)| (r.len, std::cmp::Reverse(i)))
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                // `remove`, not `swap_remove`: the free list stays in the
                // order regions were freed (it holds a few dozen at most).
                let region = st.free.remove(i);
                st.lent += 1;
                Some(LentBuffer {
                    pool: Arc::clone(self),
                    region: Some(region),
                    len,
                })
            }
            None => {
                st.fallback += 1;
                None
            }
        }
    }

    /// Counts of requests served so far, and the free regions now.
    pub fn stats(&self) -> LentStats {
        let st = self.lock();
        LentStats {
            lent: st.lent,
            fallback: st.fallback,
            free: st.free.len(),
        }
    }
}

/// A lent region in use: `len` bytes of it, returned to its pool on drop.
pub struct LentBuffer {
    pool: Arc<LentPool>,
    // Some until dropped.
    region: Option<Region>,
    len: usize,
}

impl LentBuffer {
    fn region(&self) -> &Region {
        self.region
            .as_ref()
            .expect("a live buffer holds its region")
    }
}

impl fmt::Debug for LentBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentBuffer")
            .field("len", &self.len)
            .field("region", &self.region().len)
            .finish()
    }
}

impl Deref for LentBuffer {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        let region = self.region();
        // SAFETY: the region is valid for `region.len >= self.len` bytes and
        // only this buffer reaches it (module invariants; `lend`'s contract).
        unsafe { std::slice::from_raw_parts(region.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for LentBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        let region = self.region();
        // SAFETY: as in `deref`, and `&mut self` makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(region.ptr.as_ptr(), self.len) }
    }
}

impl Drop for LentBuffer {
    fn drop(&mut self) {
        if let Some(region) = self.region.take() {
            self.pool.lock().free.push(region);
        }
    }
}

/// The bytes of a Dense batch: a heap buffer from the
/// [batch-buffer cache](crate::buffers), or a region lent by the consumer.
#[derive(Debug)]
pub enum BatchBytes {
    /// An engine-allocated buffer.
    Heap(Buf),
    /// Memory lent through a [`LentPool`].
    Lent(LentBuffer),
}

impl BatchBytes {
    /// Gives a heap buffer back to the batch-buffer cache (lent memory goes
    /// back to its pool when dropped anyway).
    pub fn recycle(self) {
        if let BatchBytes::Heap(v) = self {
            crate::buffers::recycle(v);
        }
    }
}

impl From<Buf> for BatchBytes {
    fn from(b: Buf) -> Self {
        BatchBytes::Heap(b)
    }
}

impl From<Vec<u8>> for BatchBytes {
    fn from(v: Vec<u8>) -> Self {
        BatchBytes::Heap(v.into())
    }
}

impl Deref for BatchBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            BatchBytes::Heap(v) => v,
            BatchBytes::Lent(b) => b,
        }
    }
}

impl DerefMut for BatchBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            BatchBytes::Heap(v) => v,
            BatchBytes::Lent(b) => b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn lend_vec(pool: &LentPool, len: usize, dropped: &Arc<AtomicUsize>) -> usize {
        let mut memory = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::new(memory.as_mut_ptr()).unwrap();
        let addr = ptr.as_ptr() as usize;
        // SAFETY: the box is moved into the owner, so the memory lives as
        // long as the owner and nothing else touches it.
        unsafe { pool.lend(ptr, len, Box::new((memory, Counted(Arc::clone(dropped))))) };
        addr
    }

    #[test]
    fn takes_the_smallest_fitting_region_and_gets_it_back() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = LentPool::new();
        let small = lend_vec(&pool, 100, &dropped);
        let big = lend_vec(&pool, 1000, &dropped);

        let mut a = pool.take(80).expect("fits the small region");
        assert_eq!(a.as_ptr() as usize, small);
        assert_eq!(a.len(), 80);
        a.fill(7);
        let b = pool.take(80).expect("the big region is left");
        assert_eq!(b.as_ptr() as usize, big);
        assert!(pool.take(1).is_none(), "both regions are in use");
        assert_eq!(
            pool.stats(),
            LentStats {
                lent: 2,
                fallback: 1,
                free: 0
            }
        );
        drop(a);
        let c = pool.take(100).expect("the small region came back");
        assert_eq!(c.as_ptr() as usize, small);
        assert!(
            c[..80].iter().all(|&x| x == 7),
            "contents are left as they were"
        );
        assert!(pool.take(2000).is_none(), "no region is that large");
        drop((b, c));
        assert_eq!(pool.stats().free, 2);
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(pool);
        assert_eq!(dropped.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn reuses_the_region_freed_last_among_equals() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = LentPool::new();
        let regions: Vec<usize> = (0..4).map(|_| lend_vec(&pool, 64, &dropped)).collect();
        // A consumer that keeps at most two batches alive touches two
        // regions only, however long it runs.
        let mut seen = std::collections::HashSet::new();
        let mut held = std::collections::VecDeque::new();
        for _ in 0..20 {
            let buf = pool.take(64).expect("a free region");
            seen.insert(buf.as_ptr() as usize);
            held.push_back(buf);
            if held.len() == 2 {
                held.pop_front();
            }
        }
        assert_eq!(seen.len(), 2, "{seen:?} of {regions:?}");
        // The last one freed comes back first.
        let last = held.pop_front().unwrap();
        let addr = last.as_ptr() as usize;
        drop(last);
        assert_eq!(pool.take(64).unwrap().as_ptr() as usize, addr);
    }

    #[test]
    fn owners_outlive_the_pool_while_buffers_are_out() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = LentPool::new();
        lend_vec(&pool, 64, &dropped);
        let mut buf = pool.take(64).unwrap();
        drop(pool);
        buf.fill(1); // the memory is still ours
        assert_eq!(dropped.load(Ordering::SeqCst), 0);
        drop(buf);
        assert_eq!(dropped.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn batch_bytes_read_both_kinds() {
        let dropped = Arc::new(AtomicUsize::new(0));
        let pool = LentPool::new();
        lend_vec(&pool, 4, &dropped);
        let mut lent = BatchBytes::Lent(pool.take(3).unwrap());
        lent.copy_from_slice(&[1, 2, 3]);
        assert_eq!(&lent[..], &[1, 2, 3]);
        let heap = BatchBytes::from(vec![4u8, 5]);
        assert_eq!(&heap[..], &[4, 5]);
        lent.recycle();
        heap.recycle();
        assert_eq!(pool.stats().free, 1);
    }
}
