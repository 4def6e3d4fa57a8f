//! The process-wide worker pool shared by every gather, append and loader.
//!
//! One pool keeps the process from oversubscribing its cores when several
//! stores and loaders work at once. It is a dedicated rayon pool rather than
//! rayon's global one, so an application's own use of rayon is untouched.
//!
//! A forked child inherits the pool's bookkeeping but none of its threads
//! (the common case: a store used as a map-style dataset by a forking data
//! loader). The pool therefore remembers the process that started it, and a
//! child starts its own on first use instead of waiting forever on threads
//! that do not exist.

use std::sync::Mutex;

/// The pool and the process it belongs to.
static POOL: Mutex<Option<(u32, &'static rayon::ThreadPool)>> = Mutex::new(None);

/// Environment variable that overrides the pool size.
pub const THREADS_ENV: &str = "LOADERX_NUM_THREADS";

/// The pool size used when [`THREADS_ENV`] is unset:
/// `max(physical cores, 3/4 of logical cores)`, at least 1.
///
/// Three quarters of the logical CPUs leaves room for the caller, packing and
/// transforms on SMT machines, while never using fewer threads than there are
/// physical cores.
pub fn default_threads() -> usize {
    let logical = num_cpus::get();
    let physical = num_cpus::get_physical();
    physical.max(logical * 3 / 4).max(1)
}

/// The number of threads the pool has (or will have once started).
pub fn threads() -> usize {
    pool().current_num_threads()
}

/// The shared pool of this process, started on first use.
pub fn pool() -> &'static rayon::ThreadPool {
    let pid = std::process::id();
    let mut slot = POOL.lock().unwrap_or_else(|p| p.into_inner());
    match *slot {
        Some((owner, pool)) if owner == pid => pool,
        _ => {
            let n = std::env::var(THREADS_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or_else(default_threads);
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(n)
                .thread_name(|i| format!("loaderx-{i}"))
                .build()
                .expect("failed to start the loaderx worker pool");
            // Lives for the rest of the process; after a fork the parent's
            // pool is left behind (its threads exist only in the parent).
            let pool: &'static rayon::ThreadPool = Box::leak(Box::new(pool));
            *slot = Some((pid, pool));
            pool
        }
    }
}

/// Splits `n` items into contiguous tasks for the pool: about four tasks per
/// thread for load balance, but never tasks smaller than `min_len` items, so
/// small requests run as one task without waking the pool.
pub(crate) fn task_len(n: usize, min_len: usize) -> usize {
    let target = n.div_ceil(threads() * 4);
    target.max(min_len).max(1)
}
